"""Sharded data parallelism: ZeRO stage 1 (``ZeroRedundancyOptimizer``) and FSDP2 (``fully_shard``).

Both must train as one process with ``torch.optim.AdamW`` does (:func:`single_process_adamw`);
each rank reports the parameters, gradients and optimiser state it holds.
"""

from __future__ import annotations

import torch

from ._report import _bytes, _collectives, _counts, _full, _local, _optimizer_state_bytes, _tensor_bytes
from .config import DPConfig, _loss, make_batches, make_model, shard

__all__ = ["single_process_adamw"]


def single_process_adamw(cfg: DPConfig = DPConfig(), lr: float = 0.01, weight_decay: float = 0.1) -> dict:
    """:func:`~tfbook.parallel.ddp.single_process_run` with ``torch.optim.AdamW`` instead of SGD (the
    reference of ZeRO and FSDP), through the one loop (:func:`tfbook.torch.training.train`: constant
    rate, no clipping, the batches of :func:`make_batches` in order)."""
    from ..torch.training import train

    model = make_model(cfg)
    batches = iter(make_batches(cfg))
    history = train(model, _loss, lambda generator: next(batches), cfg.steps, lr=lr, weight_decay=weight_decay,
                    grad_clip=None, disable=True)
    return {"losses": history.loss, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


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
            step_comm, step_bytes = _counts(mode), _bytes(mode)
    local_opt = getattr(opt, "optim", opt)  # the optimiser of this rank's share (all of it without ZeRO)
    owned = sum(p.numel() for g in local_opt.param_groups for p in g["params"])
    return {"params": {n: p.detach().cpu().clone() for n, p in model.named_parameters()},
            "owned_numel": owned, "state_bytes": _optimizer_state_bytes(local_opt), "step_comm": step_comm, "step_bytes": step_bytes,
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
            step_comm, step_bytes = _counts(mode), _bytes(mode)
    local = {n: _local(p).numel() for n, p in model.named_parameters()}
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    return {"params": {n: _full(p).detach().cpu().clone() for n, p in model.named_parameters()},
            "local_numel": local, "shapes": shapes, "step_comm": step_comm, "step_bytes": step_bytes,
            "param_bytes": _tensor_bytes(_local(p) for p in model.parameters()),
            "grad_bytes": _tensor_bytes(_local(p.grad) for p in model.parameters() if p.grad is not None),
            "state_bytes": _optimizer_state_bytes(opt)}
