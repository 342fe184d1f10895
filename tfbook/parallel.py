"""Data parallelism on one machine: several processes, ``torch.distributed`` with gloo, 127.0.0.1 only.

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

    The time spent inside ``all_reduce`` (the communication) is measured apart from the rest
    of the step (the computation).
    """
    dist = _init_group(rank, world_size, port, timeout)
    cfg = DPConfig(**cfg_dict)
    try:
        model = make_model(cfg)
        # what DistributedDataParallel does at start: every rank takes rank 0's parameters
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
        local_losses, losses, grads = [], [], None
        comm = 0.0
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
            dist.all_reduce(total, op=dist.ReduceOp.SUM)  # for the report only, not part of training
            local_losses.append(loss.item())
            losses.append(total.item() / world_size)
        seconds = time.perf_counter() - t0
        torch.save({"rank": rank, "world_size": world_size, "losses": losses, "local_losses": local_losses,
                    "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()},
                    "seconds": seconds, "comm_seconds": comm},
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


def _launch(worker, cfg: DPConfig, world_size: int, timeout: float, start_method: str | None) -> list[dict]:
    """Start ``world_size`` processes running ``worker``; wait at most ``timeout`` s; return their results."""
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
        ctx = mp.start_processes(worker, args=(world_size, _free_port(), asdict(cfg), out_dir, timeout),
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
        results = [torch.load(Path(out_dir) / f"rank{r}.pt") for r in range(world_size)]
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
    ``seconds`` (the training loop's wall time) and ``comm_seconds`` (the part of it spent
    in the gradient all-reduce). Raises ``TimeoutError`` (after killing every worker) if the
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


def _main() -> int:  # pragma: no cover - exercised by hand
    cfg = DPConfig()
    ref = single_process_run(cfg)
    results = run_data_parallel(cfg)
    err = max((r["grads"][n] - ref["grads"][n]).abs().max().item() for r in results for n in ref["grads"])
    print(f"largest |gradient difference| between 2-process and 1-process training: {err:.1e}")
    return 0 if err < 1e-12 else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())
