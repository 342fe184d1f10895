"""The launcher: start ``world_size`` processes on this machine, join them in a gloo group, collect results.

:func:`default_start_method` picks fork or spawn; :func:`_launch` starts a worker function on every
rank, bounded in time (the parent kills any worker still alive after ``timeout`` seconds), and
loads each rank's ``rank<r>.pt``. Communication stays on the loopback interface
(``GLOO_SOCKET_IFNAME`` is set to it unless already set).
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .config import DPConfig

__all__ = ["default_start_method"]


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
