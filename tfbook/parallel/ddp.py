"""Data parallelism: written by hand (:func:`run_data_parallel`) and as PyTorch's ``DistributedDataParallel``.

:func:`run_data_parallel` starts ``world_size`` processes; every one builds the same model, takes
its contiguous shard of each global batch, and averages the gradients with
``all_reduce(SUM) / world_size`` before a plain SGD step (:func:`_data_parallel_worker`).
:func:`single_process_run` is the same training on one process, the reference it must equal to
float64 round-off; :func:`accumulate_gradients` is its one-process relative (micro-batches one
after the other). :func:`_ddp_scheme` is the torchrun engine (buckets, overlap, ``no_sync``) and
:func:`ddp_buckets` the bucketing rule DDP documents.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ._report import _bytes, _collectives, _counts
from .config import DPConfig, _loss, _sgd_step, make_batches, make_model, shard
from .launch import _init_group, _launch

__all__ = ["single_process_run", "run_data_parallel", "accumulate_gradients", "ddp_buckets"]


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
            step_comm, step_bytes = _counts(mode), _bytes(mode)
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
            "buckets": buckets, "overlap": overlap, "step_comm": step_comm, "step_bytes": step_bytes,
            "no_sync_sent": sent_in_no_sync, "no_sync_buckets_after": len(counted) - sent_in_no_sync,
            "no_sync_grads": {n: p.grad.detach().cpu().clone() for n, p in acc.named_parameters()},
            "allreduce_per_tensor_s": sorted(per_tensor)[len(per_tensor) // 2],
            "allreduce_flat_s": sorted(flat)[len(flat) // 2], "num_tensors": len(ts)}


#: global batch sizes (sequences of ``block_size`` tokens) of the step-time measurement (scheme ``steptime``)
STEPTIME_BATCHES = (8, 32, 128, 512, 2048)


def _steptime_scheme(cfg: DPConfig, rank: int, world: int, device, batches=None, repeats: int = 3) -> dict:
    """Step times of data parallelism on this machine, for chapter 18's step-time model (measured, not checked).

    For each global batch size ``B`` of ``batches`` (default :data:`STEPTIME_BATCHES`; ``n = B *
    block_size`` tokens per step), ``repeats + 1`` SGD steps (the first a warm-up, not counted) of
    two kinds, each starting when both ranks have reached a barrier:

    - one process: this rank alone on the whole batch (forward, backward, SGD step);
    - data parallel: this rank's shard, its gradients flattened into one tensor, all-reduced
      once (as DDP's single default bucket sends them, here without overlap), divided by
      ``world`` and copied back, then the SGD step.

    Computation is timed in CPU seconds of this thread (``time.thread_time``, one thread: the time
    the thread ran, not the time other programs held the core); whole steps in wall seconds
    (``time.perf_counter``: waiting for the other rank and for a core included). Then the
    flattened all-reduce alone, ``max(repeats + 1, 10)`` times after a barrier each (no waiting
    for a late rank), in wall seconds. Returns ``{"tokens": [n...], "num_params": N_theta, key:
    [per B]}`` with the minimum over the counted steps of ``full_cpu``, ``full_wall``,
    ``shard_cpu`` (the data-parallel step less its all-reduce), ``step_wall`` and ``allreduce``;
    and ``param_gap``, per B, the largest difference between the parameters the two kinds of
    step reached (float64 round-off: the timed data-parallel steps are real ones).
    """
    from dataclasses import replace

    import torch.distributed as dist

    from ..measure import threads

    batches = STEPTIME_BATCHES if batches is None else batches
    keys = ("full_cpu", "full_wall", "shard_cpu", "step_wall", "allreduce")
    out = {k: [] for k in keys + ("param_gap",)}
    with threads(1):
        for B in batches:
            c = replace(cfg, batch_size=B, steps=repeats + 1)
            full, model = make_model(c).to(device), make_model(c).to(device)
            params = list(model.parameters())
            rec = {k: [] for k in keys}
            for x, y in make_batches(c):
                x, y = x.to(device), y.to(device)
                dist.barrier()
                w0, t0 = time.perf_counter(), time.thread_time()
                full.zero_grad(set_to_none=True)
                _loss(full, x, y).backward()
                _sgd_step(full, c.lr)
                rec["full_cpu"].append(time.thread_time() - t0)
                rec["full_wall"].append(time.perf_counter() - w0)
                dist.barrier()
                w0, t0 = time.perf_counter(), time.thread_time()
                model.zero_grad(set_to_none=True)
                _loss(model, shard(x, rank, world), shard(y, rank, world)).backward()
                flat = torch.cat([p.grad.flatten() for p in params])
                t_before = time.thread_time() - t0
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                t1 = time.thread_time()
                flat /= world
                offset = 0
                for p in params:
                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
                _sgd_step(model, c.lr)
                rec["shard_cpu"].append(t_before + time.thread_time() - t1)
                rec["step_wall"].append(time.perf_counter() - w0)
            for _ in range(max(repeats + 1, 10)):  # a fraction of a millisecond each
                dist.barrier()
                w0 = time.perf_counter()
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                rec["allreduce"].append(time.perf_counter() - w0)
            for k in keys:
                out[k].append(min(rec[k][1:]))  # the first is a warm-up
            out["param_gap"].append(max((p - q).abs().max().item() for p, q in zip(params, full.parameters())))
    out["tokens"] = [B * cfg.block_size for B in batches]
    out["num_params"] = sum(p.numel() for p in params)
    return out
