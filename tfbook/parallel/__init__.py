"""Parallel training (chapter 18): data parallelism by hand, and PyTorch's engines under ``torchrun``.

One module per job:

- :mod:`~tfbook.parallel.config`: the shared config (:class:`DPConfig`), model, data and shards;
- :mod:`~tfbook.parallel.launch`: the launcher that starts the worker processes of this machine;
- :mod:`~tfbook.parallel.ddp`: data parallelism, written by hand and as ``DistributedDataParallel``;
- :mod:`~tfbook.parallel.zero`: ZeRO-1 and FSDP (sharded optimiser state, gradients, parameters);
- :mod:`~tfbook.parallel.tensor`: tensor parallelism, a Megatron block split with DTensor;
- :mod:`~tfbook.parallel.context`: context parallelism, online-softmax merges and ring attention;
- :mod:`~tfbook.parallel.pipeline`: pipeline parallelism, two stages under GPipe and 1F1B, and the bubble;
- :mod:`~tfbook.parallel.expert`: expert parallelism, a mixture-of-experts layer's experts split over the
  ranks, tokens dispatched and combined with ``all_to_all_single`` (chapter 19's; scheme ``expert``);
- :mod:`~tfbook.parallel.torchrun`: every engine as one ``torchrun`` script;
- :mod:`~tfbook.parallel.cli`: the command line, ``python -m tfbook.parallel``
  (``--schemes ddp,zero1,fsdp,tp,ring,pipeline --out DIR`` under ``torchrun``).

The names the chapters use are re-exported below.
"""

from __future__ import annotations

from . import config, context, ddp, expert, launch, pipeline, tensor, torchrun, zero
from .config import DPConfig, make_batches, make_model, shard
from .context import merge_softmax_states, ring_attention, ring_data, run_context_parallel, softmax_state
from .ddp import accumulate_gradients, ddp_buckets, run_data_parallel, single_process_run
from .expert import dispatch_plan, expert_owner, expert_parallel_moe, single_process_moe
from .launch import default_start_method
from .pipeline import bubble_fraction, in_flight, split_stages, timeline
from .tensor import MegatronBlock, tp_data, tp_plan
from .torchrun import KNOWN_SCHEMES, SCHEMES, run_engines, run_torchrun, torchrun_command
from .zero import single_process_adamw

__all__ = [
    "DPConfig",
    "make_model",
    "make_batches",
    "shard",
    "merge_softmax_states",
    "softmax_state",
    "single_process_run",
    "run_data_parallel",
    "run_context_parallel",
    "accumulate_gradients",
    "default_start_method",
    "SCHEMES",
    "KNOWN_SCHEMES",
    "run_torchrun",
    "run_engines",
    "torchrun_command",
    "single_process_adamw",
    "ring_attention",
    "ring_data",
    "MegatronBlock",
    "tp_plan",
    "tp_data",
    "ddp_buckets",
    "split_stages",
    "timeline",
    "bubble_fraction",
    "in_flight",
    "expert_owner",
    "dispatch_plan",
    "expert_parallel_moe",
    "single_process_moe",
]
