"""Parallel training (chapter 18): data parallelism by hand, and PyTorch's engines under ``torchrun``.

:func:`run_data_parallel` starts ``world_size`` processes (forked on CPU-only Linux, spawned
wherever CUDA is present and on other systems, :func:`default_start_method`: a spawned worker
is a fresh interpreter, so the worker function :func:`_data_parallel_worker` lives here, in an
importable module). Every process builds
the same small float64 :class:`~tfbook.torch.models.DecoderLM` from the same seed, takes
its contiguous shard of each global batch, computes the mean loss of its shard, and
averages the gradients with ``all_reduce(SUM) / world_size`` before a plain SGD step.
:func:`single_process_run` does the same training on one process with the whole batch;
the two must agree to float64 round-off.

:func:`run_context_parallel` is the other split, *within* one sequence: each process
(:func:`_context_parallel_worker`) holds a contiguous slice of the keys and values, computes
the online-softmax state ``(m, l, acc)`` of every query over its slice, and the states of
all ranks are gathered and merged (:func:`merge_softmax_states`). :func:`accumulate_gradients`
is the one-process relative of data parallelism: micro-batches one after the other.

:func:`run_torchrun` runs this module as a ``torchrun`` script (``python -m tfbook.parallel
--schemes ddp,zero1,fsdp,tp,ring --out DIR``) on several processes, with NCCL when each has
a GPU and gloo otherwise: ``DistributedDataParallel`` (buckets, overlap, ``no_sync``), ZeRO-1
(``ZeroRedundancyOptimizer``), FSDP2 (``fully_shard``), tensor parallelism with DTensor's
column/row styles on a :class:`MegatronBlock`, and :func:`ring_attention`, each rank's results
written to a file for the caller to check against one process.

Everything is bounded in time: the process group has a timeout, and the parent kills any
worker still alive after ``timeout`` seconds. Communication stays on the loopback
interface (``GLOO_SOCKET_IFNAME`` is set to it unless already set).

Command line: ``python -m tfbook.parallel`` prints the largest gradient difference.
"""

from __future__ import annotations

import datetime
import math
import os
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

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
]


@dataclass(frozen=True)
class DPConfig:
    """A tiny decoder-only LM and its training run (float64, plain SGD)."""

    vocab_size: int = 13  # token ids 0..12
    block_size: int = 12  # T of every training window
    d_model: int = 16  # D
    num_heads: int = 2  # H
    num_layers: int = 2  # blocks
    d_ff: int = 32  # MLP hidden width
    batch_size: int = 8  # the GLOBAL batch; every rank gets batch_size / world_size rows
    steps: int = 4  # SGD steps
    lr: float = 0.2  # SGD learning rate
    seed: int = 0  # model init and data
    attn_T: int = 24  # context-parallel attention: sequence length
    attn_D: int = 8  # context-parallel attention: D_K = D_V

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "d_model", "num_heads", "num_layers", "d_ff",
                     "batch_size", "steps", "seed", "attn_T", "attn_D"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "seed" else 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr!r}")


def make_model(cfg: DPConfig):
    """The float64 DecoderLM of ``cfg``, initialised from ``cfg.seed`` (identical on every rank)."""
    from .torch.models import DecoderLM, DecoderLMConfig

    torch.manual_seed(cfg.seed)
    lm_cfg = DecoderLMConfig(vocab_size=cfg.vocab_size, block_size=cfg.block_size, d_model=cfg.d_model,
                             num_heads=cfg.num_heads, num_layers=cfg.num_layers, d_ff=cfg.d_ff)
    return DecoderLM(lm_cfg).double()


def make_batches(cfg: DPConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``cfg.steps`` global batches ``(x, y)``, each ``(batch_size, block_size)`` int64, seeded by
    ``cfg.seed`` (the same on every rank).

    Each row counts modulo ``vocab_size`` from a random start with a random stride of 1, 2
    or 3, so there is something to learn: the next token follows from the previous two.
    """
    g = torch.Generator().manual_seed(1000 + cfg.seed)
    k = torch.arange(cfg.block_size + 1)
    out = []
    for _ in range(cfg.steps):
        start = torch.randint(0, cfg.vocab_size, (cfg.batch_size, 1), generator=g)
        stride = torch.randint(1, 4, (cfg.batch_size, 1), generator=g)
        w = (start + stride * k) % cfg.vocab_size  # (B, T + 1)
        out.append((w[:, :-1], w[:, 1:]))
    return out


def shard(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rows ``rank * n .. (rank + 1) * n - 1`` of ``x``, ``n = len(x) / world_size`` (must divide)."""
    if not (isinstance(world_size, int) and world_size >= 1):
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank!r}")
    if x.shape[0] % world_size:
        raise ValueError(f"the batch of {x.shape[0]} rows (x: {tuple(x.shape)}) does not split evenly "
                         f"into world_size={world_size} shards")
    n = x.shape[0] // world_size
    return x[rank * n:(rank + 1) * n]


def _loss(model, x, y):
    from .torch.models import lm_loss

    return lm_loss(model, x, y)


def _sgd_step(model, lr: float) -> None:
    """Plain SGD, ``p <- p - lr * grad`` (by hand: importing ``torch.optim`` costs seconds)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-lr)


def single_process_run(cfg: DPConfig = DPConfig()) -> dict:
    """Train on one process with the whole batch; return losses, first-step gradients, final params."""
    model = make_model(cfg)
    losses, grads = [], None
    for x, y in make_batches(cfg):
        model.zero_grad(set_to_none=True)
        loss = _loss(model, x, y)
        loss.backward()
        if grads is None:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        _sgd_step(model, cfg.lr)
        losses.append(loss.item())
    return {"losses": losses, "grads": grads,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


# ---------------------------------------------------------------------------------------
# Online-softmax states (chapter 17) for context parallelism
# ---------------------------------------------------------------------------------------


def softmax_state(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, scale: float | None = None):
    """The online-softmax state of queries ``Q (T_q, D_K)`` over keys ``K (T_k, D_K)``, values ``V``.

    Returns ``(m, l, acc)``: the row maxima ``(T_q, 1)``, ``l = sum_j exp(s_ij - m_i)`` and
    ``acc = sum_j exp(s_ij - m_i) v_j`` ``(T_q, D_V)``. Attention over these keys is ``acc / l``.
    """
    scale = 1.0 / math.sqrt(Q.shape[-1]) if scale is None else scale
    S = (Q @ K.transpose(-1, -2)) * scale  # (T_q, T_k)
    m = S.amax(dim=-1, keepdim=True)
    E = torch.exp(S - m)
    return m, E.sum(dim=-1, keepdim=True), E @ V


def merge_softmax_states(states):
    """Merge online-softmax states computed over disjoint key sets into one, exactly.

    With ``m = max_r m_r``, each part is rescaled by ``exp(m_r - m)``; the merged
    ``acc / l`` is attention over the union of the key sets.
    """
    states = list(states)
    if not states:
        raise ValueError("states is empty: need at least one (m, l, acc) triple")
    m = torch.stack([s[0] for s in states]).amax(dim=0)
    l = sum(torch.exp(s[0] - m) * s[1] for s in states)
    acc = sum(torch.exp(s[0] - m) * s[2] for s in states)
    return m, l, acc


def _attention_data(cfg: DPConfig):
    g = torch.Generator().manual_seed(2000 + cfg.seed)
    shape = (cfg.attn_T, cfg.attn_D)
    return tuple(torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))


# ---------------------------------------------------------------------------------------
# The worker and the launcher
# ---------------------------------------------------------------------------------------


def _loopback_name() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):  # pragma: no cover - platforms without if_nameindex
        return None
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return None


def _init_group(rank: int, world_size: int, port: int, timeout: float):
    """Join the gloo process group on 127.0.0.1 (one CPU thread per process)."""
    import torch.distributed as dist

    torch.set_num_threads(1)  # several processes on a shared CPU: one thread each
    lo = _loopback_name()
    if lo is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout))
    return dist


def _data_parallel_worker(rank: int, world_size: int, port: int, cfg_dict: dict, out_dir: str,
                          timeout: float) -> None:
    """One rank of data parallelism: DDP-style SGD on its shard of every batch; saves ``rank<r>.pt``.

    The time spent inside the gradients' ``all_reduce`` (the communication) is measured apart
    from the rest of the step (the computation); so is the one-number ``all_reduce`` of the loss
    that each step makes for the report only (``report_seconds``), which training does not need.
    """
    dist = _init_group(rank, world_size, port, timeout)
    cfg = DPConfig(**cfg_dict)
    try:
        model = make_model(cfg)
        # what DistributedDataParallel does at start: every rank takes rank 0's parameters
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
        local_losses, losses, grads = [], [], None
        comm = report = 0.0
        dist.barrier()  # start the clocks together
        t0 = time.perf_counter()
        for x, y in make_batches(cfg):
            xs, ys = shard(x, rank, world_size), shard(y, rank, world_size)
            model.zero_grad(set_to_none=True)
            loss = _loss(model, xs, ys)  # mean over this rank's tokens
            loss.backward()
            tc = time.perf_counter()
            for p in model.parameters():  # the all-reduce: sum, then divide by the number of ranks
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= world_size
            comm += time.perf_counter() - tc
            if grads is None:
                grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
            _sgd_step(model, cfg.lr)
            total = loss.detach().clone()
            tr = time.perf_counter()
            dist.all_reduce(total, op=dist.ReduceOp.SUM)  # for the report only, not part of training
            report += time.perf_counter() - tr
            local_losses.append(loss.item())
            losses.append(total.item() / world_size)
        seconds = time.perf_counter() - t0
        torch.save({"rank": rank, "world_size": world_size, "losses": losses, "local_losses": local_losses,
                    "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()},
                    "seconds": seconds, "comm_seconds": comm, "report_seconds": report},
                   Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _context_parallel_worker(rank: int, world_size: int, port: int, cfg_dict: dict, out_dir: str,
                             timeout: float) -> None:
    """One rank of context parallelism: attention of every query over this rank's slice of keys.

    Rank ``r`` holds key/value rows ``[lo_k, hi_k)`` of one ``(attn_T, attn_D)`` problem, computes
    the online-softmax states of all queries over them, gathers every rank's states and merges
    them (:func:`merge_softmax_states`); saves ``rank<r>.pt`` with the merged attention.
    """
    dist = _init_group(rank, world_size, port, timeout)
    cfg = DPConfig(**cfg_dict)
    try:
        Q, K, V = _attention_data(cfg)
        bounds = [round(r * cfg.attn_T / world_size) for r in range(world_size + 1)]
        lo_k, hi_k = bounds[rank], bounds[rank + 1]
        state = torch.cat(softmax_state(Q, K[lo_k:hi_k], V[lo_k:hi_k]), dim=-1)  # (T, 2 + D_V)
        gathered = [torch.empty_like(state) for _ in range(world_size)]
        dist.all_gather(gathered, state)
        parts = [(s[:, :1], s[:, 1:2], s[:, 2:]) for s in gathered]
        _, l, acc = merge_softmax_states(parts)
        torch.save({"rank": rank, "world_size": world_size, "attention": acc / l, "key_rows": (lo_k, hi_k),
                    "local_attention": state[:, 2:] / state[:, 1:2]},
                   Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(worker, cfg: DPConfig, world_size: int, timeout: float, start_method: str | None,
            extra_args: tuple = ()) -> list[dict]:
    """Start ``world_size`` processes running ``worker``; wait at most ``timeout`` s; return their results.

    Each worker is called as ``worker(rank, world_size, port, cfg_dict, out_dir, timeout, *extra_args)``.
    """
    import torch.multiprocessing as mp

    if not isinstance(cfg, DPConfig):
        raise ValueError(f"cfg must be a DPConfig, got {type(cfg).__name__}")
    if not (isinstance(world_size, int) and world_size >= 1):
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    if start_method is None:
        start_method = default_start_method()
    if start_method not in ("spawn", "fork"):
        raise ValueError(f"start_method must be 'spawn' or 'fork', got {start_method!r}")
    with tempfile.TemporaryDirectory(prefix="tfbook-dp-") as out_dir:
        ctx = mp.start_processes(worker, args=(world_size, _free_port(), asdict(cfg), out_dir, timeout) + tuple(extra_args),
                                 nprocs=world_size, join=False, start_method=start_method)
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"parallel run did not finish within {timeout:g} s")
        finally:
            for p in ctx.processes:  # never leave a worker behind
                if p.is_alive():
                    p.terminate()
                    p.join(5)
                if p.is_alive():  # pragma: no cover - a worker that ignores SIGTERM
                    p.kill()
                    p.join(5)
        results = [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
        for r in results:
            r["start_method"] = start_method
        return results


def _accelerator_present() -> bool:
    """Whether this PyTorch sees a CUDA (or other) accelerator; does not initialise CUDA."""
    if torch.cuda.is_available():
        return True
    acc = getattr(torch, "accelerator", None)  # torch >= 2.6
    try:
        return bool(acc is not None and acc.is_available())
    except Exception:  # pragma: no cover - a backend that fails to answer counts as absent
        return False


def default_start_method() -> str:
    """``"fork"`` on Linux without an accelerator, ``"spawn"`` everywhere else.

    PyTorch's rule (the ``torch.multiprocessing`` notes): the CUDA runtime does not support
    ``fork``, and once autograd has run in a process that sees a GPU, its device threads exist
    and a forked child fails at its first ``backward`` ("Unable to handle autograd's threading
    in combination with fork-based multiprocessing"). So wherever CUDA (or another
    accelerator) is present the workers are spawned, fresh interpreters. On a CPU-only Linux
    machine fork is safe (no device threads) and starts the workers in a fraction of a
    second; macOS and Windows spawn (fork is unsafe or absent there).
    """
    if not sys.platform.startswith("linux") or _accelerator_present():
        return "spawn"
    return "fork"


def run_data_parallel(cfg: DPConfig = DPConfig(), world_size: int = 2, timeout: float = 120.0,
                      start_method: str | None = None) -> list[dict]:
    """Train ``cfg`` with ``world_size`` gloo processes on 127.0.0.1; return one result dict per rank.

    Each dict has ``losses`` (global mean loss per step), ``local_losses``, ``grads`` (the
    all-reduced gradients of the first step), ``params`` (after the last step),
    ``seconds`` (the training loop's wall time), ``comm_seconds`` (the part of it spent
    in the gradient all-reduce) and ``report_seconds`` (the part spent in the loss's
    report-only all-reduce). Raises ``TimeoutError`` (after killing every worker) if the
    run takes longer than ``timeout`` seconds, and re-raises a worker's error.

    ``start_method`` is ``"spawn"`` (a fresh interpreter per worker: safe everywhere, but each
    worker pays for importing torch, seconds on a busy machine) or ``"fork"`` (the workers
    start as copies of this process in a fraction of a second; safe only without CUDA: they
    use the CPU only and leave through ``os._exit``). The default, ``None``, is
    :func:`default_start_method`: ``"fork"`` on CPU-only Linux, ``"spawn"`` wherever CUDA is
    present and on macOS and Windows. Each result also records the ``start_method`` used.
    """
    if isinstance(cfg, DPConfig) and isinstance(world_size, int) and world_size >= 1 and cfg.batch_size % world_size:
        raise ValueError(f"batch_size={cfg.batch_size} does not split evenly into world_size={world_size} shards")
    return _launch(_data_parallel_worker, cfg, world_size, timeout, start_method)


def run_context_parallel(cfg: DPConfig = DPConfig(), world_size: int = 2, timeout: float = 120.0,
                         start_method: str | None = None) -> list[dict]:
    """Context-parallel attention of one ``(attn_T, attn_D)`` problem over ``world_size`` processes.

    Each result dict has ``attention`` (the merged output, ``(attn_T, attn_D)``, the same on
    every rank), ``local_attention`` (attention over the rank's own key slice only) and
    ``key_rows`` (the rank's slice ``(lo, hi)``). Timeouts and errors as :func:`run_data_parallel`.
    """
    if isinstance(cfg, DPConfig) and isinstance(world_size, int) and world_size > cfg.attn_T:
        raise ValueError(f"world_size={world_size} is more than attn_T={cfg.attn_T} key rows")
    return _launch(_context_parallel_worker, cfg, world_size, timeout, start_method)


def accumulate_gradients(model, x: torch.Tensor, y: torch.Tensor, micro_batches: int) -> None:
    """Gradient accumulation: ``micro_batches`` backward passes whose summed gradient is the big batch's.

    Splits the batch ``x, y (B, T)`` into ``micro_batches`` equal contiguous parts and calls
    ``backward`` on each part's mean loss divided by ``micro_batches``; the gradients add up in
    ``p.grad``, so afterwards they equal those of the mean loss over the whole batch (one
    backward pass at a time: the activations of one micro-batch only).
    """
    if not (isinstance(micro_batches, int) and micro_batches >= 1):
        raise ValueError(f"micro_batches must be a positive int, got {micro_batches!r}")
    if x.shape[0] % micro_batches:
        raise ValueError(f"batch of {x.shape[0]} rows does not split into micro_batches={micro_batches} equal parts")
    model.zero_grad(set_to_none=True)
    for k in range(micro_batches):
        xs, ys = shard(x, k, micro_batches), shard(y, k, micro_batches)
        (_loss(model, xs, ys) / micro_batches).backward()


# ---------------------------------------------------------------------------------------
# PyTorch's own engines, launched by torchrun (chapter 18): one script, every scheme
# ---------------------------------------------------------------------------------------

SCHEMES = ("ddp", "zero1", "fsdp", "tp", "ring")


def single_process_adamw(cfg: DPConfig = DPConfig(), lr: float = 0.01, weight_decay: float = 0.1) -> dict:
    """:func:`single_process_run` with ``torch.optim.AdamW`` instead of SGD (the reference of ZeRO and FSDP)."""
    model = make_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for x, y in make_batches(cfg):
        opt.zero_grad(set_to_none=True)
        loss = _loss(model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def ddp_buckets(nbytes, cap_bytes: int, first_cap_bytes: int | None = None) -> list[list[int]]:
    """The buckets ``DistributedDataParallel`` all-reduces, by the rule its documentation states.

    ``nbytes[i]`` is the size in bytes of parameter ``i``'s gradient, parameters in the order the
    model defines them (``model.parameters()``), all of one dtype and device (DDP keeps a separate
    stream of buckets per dtype and device). The rule, from DDP's documentation and the comments
    of ``torch/nn/parallel/distributed.py``: from the second iteration on, buckets follow the order
    in which gradients become ready, roughly the reverse of the definition order (the last
    layer's gradient is computed first; this function takes exactly the reverse); each gradient
    joins the open bucket, which is closed as soon as it holds ``cap_bytes`` or more (so a bucket
    passes the cap by its last tensor, and a tensor larger than the cap fills a bucket alone);
    the first bucket closes at ``first_cap_bytes`` instead (DDP's default: 1 MiB first, then
    ``bucket_cap_mb=25`` MiB; with an explicit ``bucket_cap_mb`` every bucket, the first too, has
    that cap); what is left forms the last bucket.

    Returns the buckets in the order they are all-reduced, each a list of parameter indices in
    the order its flat buffer lays them out. Written independently of DDP's own assignment
    function; ``tests/test_ddp_buckets.py`` checks it against the buckets that a communication
    hook (``DistributedDataParallel.register_comm_hook``) receives from a real DDP model.
    """
    sizes = [int(n) for n in nbytes]
    if any(n < 0 for n in sizes) or len(sizes) != len(list(nbytes)):
        raise ValueError(f"nbytes must be non-negative byte counts, got {list(nbytes)!r}")
    for name, cap in (("cap_bytes", cap_bytes), ("first_cap_bytes", first_cap_bytes)):
        if cap is not None and not cap > 0:
            raise ValueError(f"{name} must be positive, got {cap!r}")
    limit = cap_bytes if first_cap_bytes is None else first_cap_bytes
    buckets, current, size = [], [], 0
    for i in reversed(range(len(sizes))):
        current.append(i)
        size += sizes[i]
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0, cap_bytes
    if current:
        buckets.append(current)
    return buckets


def _tensor_bytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor) and t.dim() > 0)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this rank stores: a DTensor's local shard, else ``t`` itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole of ``t``: a DTensor gathered from every rank, else ``t`` itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _collectives(last: bool):
    """A ``CommDebugMode`` (it counts every collective issued while it is active) on the last step, else
    a context that counts nothing; ``_counts`` reads it."""
    import contextlib

    from torch.distributed.tensor.debug import CommDebugMode

    return CommDebugMode() if last else contextlib.nullcontext()


def _counts(mode) -> dict:
    """``{collective: calls}`` that a ``CommDebugMode`` counted (``c10d.allreduce_``, ``c10d.broadcast_``, ...)."""
    return {str(k): v for k, v in mode.get_comm_counts().items() if v}


def _optimizer_state_bytes(opt) -> int:
    return _tensor_bytes(_local(v) for st in opt.state.values() for v in st.values())


def _ddp_scheme(cfg: DPConfig, rank: int, world: int, device) -> dict:
    """DistributedDataParallel: buckets, overlap with backward, no_sync; SGD as the hand-written worker."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = make_model(cfg).to(device)
    # a small bucket cap (10 kB), so that even this 39 kB model is sent in several buckets
    ddp = DDP(model, bucket_cap_mb=0.01, device_ids=None if device.type == "cpu" else [device])
    clock, calls = {}, []

    def hook(state, bucket):  # DDP calls this when a bucket's gradients are all computed
        calls.append({"t": time.perf_counter(), "numel": bucket.buffer().numel(), "tensors": len(bucket.gradients()),
                      "sizes": [g.numel() for g in bucket.gradients()]})
        return default_hooks.allreduce_hook(None, bucket)  # divide by world size, all-reduce (async)

    ddp.register_comm_hook(None, hook)
    # the last gradient autograd computes is that of the position table (used first in forward)
    model.pos.weight.register_hook(lambda g: clock.__setitem__("last_grad", time.perf_counter()))
    losses, grads, buckets = [], None, []
    for step, (x, y) in enumerate(make_batches(cfg)):
        xs, ys = shard(x, rank, world).to(device), shard(y, rank, world).to(device)
        ddp.zero_grad(set_to_none=True)
        calls.clear()
        with _collectives(step == cfg.steps - 1) as mode:  # the collectives of the last step, counted
            loss = _loss(ddp, xs, ys)
            loss.backward()
        if step == cfg.steps - 1:
            step_comm = _counts(mode)
        if grads is None:
            grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
        if step == 1:  # after the first step DDP rebuilds its buckets in the order gradients became ready
            buckets = [{k: c[k] for k in ("numel", "tensors", "sizes")} for c in calls]
            overlap = calls[0]["t"] < clock["last_grad"]  # a bucket was sent before backward had finished
        _sgd_step(model, cfg.lr)
        losses.append(loss.item())
    # no_sync: gradient accumulation over 2 micro-batches, one all-reduce per step instead of 2
    acc = make_model(cfg).to(device)
    ddp2 = DDP(acc, bucket_cap_mb=0.01, device_ids=None if device.type == "cpu" else [device])
    counted = []

    def counting_hook(state, bucket):
        counted.append(bucket.buffer().numel())
        return default_hooks.allreduce_hook(None, bucket)

    ddp2.register_comm_hook(None, counting_hook)
    x, y = make_batches(cfg)[0]
    xs, ys = shard(x, rank, world).to(device), shard(y, rank, world).to(device)
    half = xs.shape[0] // 2
    with ddp2.no_sync():  # gradients accumulate locally, nothing is sent
        (_loss(ddp2, xs[:half], ys[:half]) / 2).backward()
    sent_in_no_sync = len(counted)
    (_loss(ddp2, xs[half:], ys[half:]) / 2).backward()  # this backward all-reduces the sum
    # one flattened all-reduce against one per tensor (what the hand-written worker does)
    ts = [p.detach().clone() for p in model.parameters()]
    per_tensor, flat = [], []
    for _ in range(10):
        dist.barrier()
        t0 = time.perf_counter()
        for t in ts:
            dist.all_reduce(t)
        per_tensor.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(torch.cat([t.flatten() for t in ts]))
        flat.append(time.perf_counter() - t0)
    return {"losses": losses, "grads": grads,
            "params": {n: p.detach().cpu().clone() for n, p in model.named_parameters()},
            "buckets": buckets, "overlap": overlap, "step_comm": step_comm,
            "no_sync_sent": sent_in_no_sync, "no_sync_buckets_after": len(counted) - sent_in_no_sync,
            "no_sync_grads": {n: p.grad.detach().cpu().clone() for n, p in acc.named_parameters()},
            "allreduce_per_tensor_s": sorted(per_tensor)[len(per_tensor) // 2],
            "allreduce_flat_s": sorted(flat)[len(flat) // 2], "num_tensors": len(ts)}


def _zero1_scheme(cfg: DPConfig, rank: int, world: int, device, lr=0.01, weight_decay=0.1) -> dict:
    """ZeRO stage 1: DDP for the gradients, AdamW's state sharded by ZeroRedundancyOptimizer."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = make_model(cfg).to(device)
    ddp = DDP(model, device_ids=None if device.type == "cpu" else [device])
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr,
                                  weight_decay=weight_decay)
    for step, (x, y) in enumerate(make_batches(cfg)):
        opt.zero_grad(set_to_none=True)
        with _collectives(step == cfg.steps - 1) as mode:  # the collectives of the last step, counted
            _loss(ddp, shard(x, rank, world).to(device), shard(y, rank, world).to(device)).backward()
            opt.step()  # each rank updates its own parameters, then broadcasts them to the others
        if step == cfg.steps - 1:
            step_comm = _counts(mode)
    local_opt = getattr(opt, "optim", opt)  # the optimiser of this rank's share (all of it without ZeRO)
    owned = sum(p.numel() for g in local_opt.param_groups for p in g["params"])
    return {"params": {n: p.detach().cpu().clone() for n, p in model.named_parameters()},
            "owned_numel": owned, "state_bytes": _optimizer_state_bytes(local_opt), "step_comm": step_comm,
            "param_bytes": _tensor_bytes(model.parameters()),
            "grad_bytes": _tensor_bytes(p.grad for p in model.parameters() if p.grad is not None)}


def _fsdp_scheme(cfg: DPConfig, rank: int, world: int, device, lr=0.01, weight_decay=0.1) -> dict:
    """FSDP2 (``fully_shard``): parameters, gradients and AdamW's state all sharded (ZeRO stage 3)."""
    from torch.distributed.fsdp import fully_shard

    model = make_model(cfg).to(device)
    for block in model.blocks:
        fully_shard(block)  # each block gathers its parameters just before it runs, frees them after
    fully_shard(model)  # the rest: embeddings, final norm
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    for step, (x, y) in enumerate(make_batches(cfg)):
        opt.zero_grad(set_to_none=True)
        with _collectives(step == cfg.steps - 1) as mode:  # the collectives of the last step, counted
            _loss(model, shard(x, rank, world).to(device), shard(y, rank, world).to(device)).backward()
            opt.step()
        if step == cfg.steps - 1:
            step_comm = _counts(mode)
    local = {n: _local(p).numel() for n, p in model.named_parameters()}
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    return {"params": {n: _full(p).detach().cpu().clone() for n, p in model.named_parameters()},
            "local_numel": local, "shapes": shapes, "step_comm": step_comm,
            "param_bytes": _tensor_bytes(_local(p) for p in model.parameters()),
            "grad_bytes": _tensor_bytes(_local(p.grad) for p in model.parameters() if p.grad is not None),
            "state_bytes": _optimizer_state_bytes(opt)}


class MegatronBlock(torch.nn.Module):
    """A Pre-LN transformer block with ``nn.Linear`` projections (what DTensor's parallel styles shard).

    ``attn_q, attn_k, attn_v (D -> D)``, ``attn_o (D -> D)``, ``mlp_up (D -> 4D)``, ``mlp_down (4D -> D)``.
    The number of heads a rank computes is read off the width of its ``attn_q`` output, so the
    same code runs whole (all ``H`` heads) and column-sharded (``H / N_w`` heads per rank).
    """

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        D = d_model
        self.head_dim = D // num_heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.attn_q, self.attn_k, self.attn_v, self.attn_o = (torch.nn.Linear(D, D) for _ in range(4))
        self.mlp_up, self.mlp_down = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, X):
        B, T, _ = X.shape
        Y = self.norm1(X)
        q, k, v = (lin(Y) for lin in (self.attn_q, self.attn_k, self.attn_v))  # (B, T, D or D / N_w)
        h = q.shape[-1] // self.head_dim  # the heads this rank holds
        q, k, v = (z.view(B, T, h, self.head_dim).transpose(1, 2) for z in (q, k, v))
        Z = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        X = X + self.attn_o(Z.transpose(1, 2).reshape(B, T, h * self.head_dim))
        return X + self.mlp_down(torch.nn.functional.gelu(self.mlp_up(self.norm2(X))))


def tp_plan():
    """Megatron's split as DTensor styles: Q, K, V and the MLP's first layer by columns (whole
    heads, whole hidden units per rank), the output projections by rows (their sum is all-reduced)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"attn_q": ColwiseParallel(), "attn_k": ColwiseParallel(), "attn_v": ColwiseParallel(),
            "attn_o": RowwiseParallel(), "mlp_up": ColwiseParallel(), "mlp_down": RowwiseParallel()}


def tp_data(cfg: DPConfig):
    """The tensor-parallel check's block (float64, seeded) and input ``(2, block_size, d_model)``."""
    torch.manual_seed(cfg.seed + 7)
    block = MegatronBlock(cfg.d_model, cfg.num_heads).double()
    X = torch.randn(2, cfg.block_size, cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    return block, X


def _tp_scheme(cfg: DPConfig, rank: int, world: int, device) -> dict:
    """Tensor parallelism: one block split Megatron-style over the ranks; outputs, gradients, collectives."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(device.type, (world,))
    block, X = tp_data(cfg)
    block, X = block.to(device), X.to(device).requires_grad_(True)
    parallelize_module(block, mesh, tp_plan())
    G = torch.randn((2, cfg.block_size, cfg.d_model), dtype=torch.float64,
                    generator=torch.Generator().manual_seed(9)).to(device)  # dL/dY of a random linear loss
    comm = CommDebugMode()  # counts the collectives DTensor issues
    with comm:
        Y = block(X)
        fwd = {str(k): v for k, v in comm.get_comm_counts().items()}
        Y.backward(G)
        total = {str(k): v for k, v in comm.get_comm_counts().items()}
    bwd = {k: v - fwd.get(k, 0) for k, v in total.items() if v - fwd.get(k, 0)}
    return {"Y": Y.detach().cpu(), "dX": X.grad.detach().cpu(),
            "grads": {n: p.grad.full_tensor().detach().cpu() if hasattr(p.grad, "full_tensor") else p.grad.detach().cpu()
                      for n, p in block.named_parameters()},
            "local_numel": {n: _local(p).numel() for n, p in block.named_parameters()},
            "comm_forward": fwd, "comm_backward": bwd}


def ring_data(cfg: DPConfig, heads: int = 2):
    """Queries, keys, values ``(heads, attn_T, attn_D)`` of the ring-attention check (float64, seeded)."""
    g = torch.Generator().manual_seed(3000 + cfg.seed)
    return tuple(torch.randn(heads, cfg.attn_T, cfg.attn_D, generator=g, dtype=torch.float64) for _ in range(3))


def ring_attention(q, k, v, rank: int, world: int, causal: bool = True, chunks: int = 4):
    """Attention of this rank's queries over the whole sequence; no rank ever holds the whole sequence.

    The sequence is cut into ``world`` equal blocks of ``n`` positions; rank ``r`` holds block
    ``r`` of the queries, keys and values (``q, k, v (..., n, D)``). For ``world`` rounds it
    folds the key/value block it holds into its online-softmax state (chapter 17) and passes
    the block on to rank ``r + 1`` while receiving rank ``r - 1``'s. The passing goes in
    ``chunks`` pieces of ``n / chunks`` rows: a piece is sent once it has been used and the
    incoming piece takes its place, so a rank holds ``n + n / chunks`` key/value rows at most,
    fewer than the ``2 n`` of sending the block whole (which is the whole sequence when
    ``world = 2``). With ``causal``, blocks of later ranks are passed on unused and the own
    block gets the causal mask. Returns ``(Z, rows_held)``: the output rows of this rank's
    queries and the most key/value rows this rank held at once.
    """
    import torch.distributed as dist

    n = q.shape[-2]
    if n % chunks:
        raise ValueError(f"a block of {n} rows does not split into chunks={chunks} pieces")
    c = n // chunks
    scale = 1.0 / math.sqrt(q.shape[-1])
    m = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=q.dtype, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    kv = torch.cat([k, v], dim=-1)  # (..., n, D_K + D_V): the block this rank holds now
    incoming = torch.empty_like(kv[..., :c, :])  # one piece of the next block
    rows_held = kv.shape[-2] + incoming.shape[-2]
    i_q = torch.arange(n, device=q.device)[:, None]
    for step in range(world):
        src = (rank - step) % world  # the rank whose block this is
        for j in range(chunks):
            piece = kv[..., j * c:(j + 1) * c, :]
            if not (causal and src > rank):  # a later rank's block is entirely in the future
                kb, vb = piece[..., :k.shape[-1]], piece[..., k.shape[-1]:]
                S = (q @ kb.transpose(-1, -2)) * scale  # (..., n, c)
                if causal and src == rank:  # key position j * c + t may be seen by queries i >= it
                    S = S.masked_fill(torch.arange(j * c, (j + 1) * c, device=q.device)[None, :] > i_q, -math.inf)
                m_new = torch.maximum(m, S.amax(dim=-1, keepdim=True))
                m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows that saw nothing yet
                E = torch.exp(S - m_safe)
                alpha = torch.exp(m - m_safe)
                l = alpha * l + E.sum(dim=-1, keepdim=True)
                acc = alpha * acc + E @ vb
                m = m_new
            if step < world - 1:  # pass this piece on, take the previous rank's piece in its place
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, piece.contiguous(), (rank + 1) % world),
                                               dist.P2POp(dist.irecv, incoming, (rank - 1) % world)])
                for r in reqs:
                    r.wait()
                kv[..., j * c:(j + 1) * c, :] = incoming
    return acc / l, rows_held


def _ring_scheme(cfg: DPConfig, rank: int, world: int, device) -> dict:
    Q, K, V = ring_data(cfg)
    if cfg.attn_T % world:
        raise ValueError(f"attn_T={cfg.attn_T} does not split into world_size={world} blocks")
    n = cfg.attn_T // world
    lo, hi = rank * n, (rank + 1) * n
    q, k, v = (t[..., lo:hi, :].clone().to(device) for t in (Q, K, V))  # this rank's block only
    del Q, K, V
    Z, rows_held = ring_attention(q, k, v, rank, world, causal=True)
    Z_nc, _ = ring_attention(q, k, v, rank, world, causal=False)
    return {"Z": Z.cpu(), "Z_noncausal": Z_nc.cpu(), "rows": (lo, hi), "rows_held": rows_held}


_SCHEME_FNS = {"ddp": _ddp_scheme, "zero1": _zero1_scheme, "fsdp": _fsdp_scheme, "tp": _tp_scheme,
               "ring": _ring_scheme}


def _engines_main(argv) -> int:
    """What ``torchrun ... -m tfbook.parallel --schemes ddp,fsdp --out DIR`` runs on every rank."""
    import argparse
    import json

    import torch.distributed as dist

    ap = argparse.ArgumentParser(prog="python -m tfbook.parallel")
    ap.add_argument("--schemes", required=True, help="comma-separated, from " + ",".join(SCHEMES))
    ap.add_argument("--out", required=True, help="folder for rank<r>.pt")
    ap.add_argument("--cfg", default="{}", help="DPConfig fields as JSON")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    schemes = args.schemes.split(",")
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown:
        raise ValueError(f"schemes {unknown} are not among {SCHEMES}")
    cfg = DPConfig(**json.loads(args.cfg))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world:  # one GPU per process, NCCL
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        torch.set_num_threads(1)
        lo = _loopback_name()
        if lo is not None and os.environ.get("MASTER_ADDR", "127.0.0.1") in ("127.0.0.1", "localhost"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    try:
        out = {"rank": rank, "world_size": world, "backend": backend}
        for name in schemes:
            dist.barrier()
            t0 = time.perf_counter()
            out[name] = _SCHEME_FNS[name](cfg, rank, world, device)
            out[name]["seconds"] = time.perf_counter() - t0
        torch.save(out, Path(args.out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    return 0


def _engines_worker(rank: int, world_size: int, port: int, cfg_dict: dict, out_dir: str, timeout: float,
                    schemes: tuple) -> None:
    """What :func:`_engines_main` runs on each rank, started by :func:`_launch` (gloo on the CPU)."""
    dist = _init_group(rank, world_size, port, timeout)
    cfg = DPConfig(**cfg_dict)
    try:
        out = {"rank": rank, "world_size": world_size, "backend": "gloo"}
        for name in schemes:
            dist.barrier()
            t0 = time.perf_counter()
            scheme = globals()[f"_{name}_scheme"]  # looked up now: a function redefined here is the one run
            out[name] = scheme(cfg, rank, world_size, torch.device("cpu"))
            out[name]["seconds"] = time.perf_counter() - t0
        torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_engines(schemes=SCHEMES, cfg: DPConfig = DPConfig(), world_size: int = 2, timeout: float = 120.0,
                start_method: str | None = None) -> list[dict]:
    """The schemes of :func:`run_torchrun`, started by this process's own launcher instead of torchrun.

    Same results (one dict per rank, a key per scheme), on the CPU with gloo, through the
    launcher of :func:`run_data_parallel`. With ``start_method="fork"`` (the default on
    CPU-only Linux) the workers are copies of this process, so they run its code as it is
    now: the chapter's mutations use that to rerun one scheme with a bug put into this
    module, which a ``torchrun`` subprocess, a fresh interpreter, would not see.
    """
    schemes = [schemes] if isinstance(schemes, str) else list(schemes)
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown or not schemes:
        raise ValueError(f"schemes must be a non-empty list from {SCHEMES}, got {schemes!r}")
    if (start_method or default_start_method()) == "fork":
        _import_engines()  # once, here: the forked workers inherit the modules instead of each importing them
    return _launch(_engines_worker, cfg, world_size, timeout, start_method, extra_args=(tuple(schemes),))


def _import_engines() -> None:
    """Import what the schemes import (seconds: DDP's constructor alone imports ``torch._dynamo``)."""
    import warnings

    with warnings.catch_warnings():  # torch.jit's deprecation notices, raised while these import
        warnings.simplefilter("ignore", DeprecationWarning)
        import torch._dynamo  # noqa: F401
        import torch.distributed.fsdp  # noqa: F401
        import torch.distributed.optim  # noqa: F401
        import torch.distributed.tensor.debug  # noqa: F401
        import torch.distributed.tensor.parallel  # noqa: F401
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: F401


def torchrun_command(schemes, out_dir, cfg: DPConfig = DPConfig(), nproc: int = 2) -> list[str]:
    """The command line: ``torchrun --standalone --nproc-per-node N -m tfbook.parallel ...``.

    ``--standalone`` is one machine (a free port on localhost). On several machines, replace it
    with ``--nnodes M --node-rank k --rdzv-backend c10d --rdzv-endpoint HOST:PORT``: the script
    is the same.
    """
    import json

    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "tfbook.parallel", "--schemes", ",".join(schemes), "--out", str(out_dir),
            "--cfg", json.dumps(asdict(cfg))]


def run_torchrun(schemes=SCHEMES, cfg: DPConfig = DPConfig(), nproc: int = 2, timeout: float = 180.0) -> list[dict]:
    """Run ``schemes`` under ``torchrun`` with ``nproc`` processes (a subprocess); one result dict per rank.

    Raises ``RuntimeError`` with the end of the workers' output if torchrun fails, and
    ``TimeoutError`` (after killing it) if it takes longer than ``timeout`` seconds.
    """
    import subprocess

    schemes = [schemes] if isinstance(schemes, str) else list(schemes)
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown or not schemes:
        raise ValueError(f"schemes must be a non-empty list from {SCHEMES}, got {schemes!r}")
    if not (isinstance(nproc, int) and nproc >= 1):
        raise ValueError(f"nproc must be a positive int, got {nproc!r}")
    if not isinstance(cfg, DPConfig):
        raise ValueError(f"cfg must be a DPConfig, got {type(cfg).__name__}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHELASTIC_ERROR_FILE": ""}
    root = str(Path(__file__).resolve().parents[1])  # tfbook importable in the workers
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="tfbook-torchrun-") as out_dir:
        cmd = torchrun_command(schemes, out_dir, cfg, nproc)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                                  start_new_session=True)
        except subprocess.TimeoutExpired as e:
            raise TimeoutError(f"torchrun did not finish within {timeout:g} s") from e
        if proc.returncode != 0:
            ranks = [line for line in proc.stderr.splitlines() if line.startswith("[rank")]
            raise RuntimeError(f"torchrun failed (exit {proc.returncode}):\n"
                               + "\n".join((ranks or proc.stderr.splitlines())[-40:]))
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(nproc)]


def _main() -> int:  # pragma: no cover - exercised by hand
    if "--schemes" in sys.argv[1:]:
        return _engines_main(sys.argv[1:])
    cfg = DPConfig()
    ref = single_process_run(cfg)
    results = run_data_parallel(cfg)
    err = max((r["grads"][n] - ref["grads"][n]).abs().max().item() for r in results for n in ref["grads"])
    print(f"largest |gradient difference| between 2-process and 1-process training: {err:.1e}")
    return 0 if err < 1e-12 else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())
