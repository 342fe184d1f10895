"""PyTorch's engines launched as users launch them: one script for every rank, every scheme.

``torchrun ... -m tfbook.parallel --schemes ddp,zero1,fsdp,tp,ring,pipeline --out DIR`` runs
:func:`_engines_main` on every rank (NCCL when each process has a GPU, gloo otherwise);
:func:`run_torchrun` starts that as a subprocess, :func:`run_engines` runs the same schemes
through this package's own launcher (forked workers run this process's code as it is now).
Each scheme is a function ``_<name>_scheme(cfg, rank, world, device) -> dict`` in its engine's
module, looked up there when it runs.
"""

from __future__ import annotations

import datetime
import importlib
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .config import DPConfig
from .launch import _init_group, _launch, _loopback_name, default_start_method

__all__ = ["SCHEMES", "KNOWN_SCHEMES", "run_torchrun", "run_engines", "torchrun_command"]

SCHEMES = ("ddp", "zero1", "fsdp", "tp", "ring", "pipeline")  # chapter 18's, run by default
# every scheme that runs by name: chapter 18's, expert parallelism (chapter 19's, :mod:`~tfbook.parallel.expert`)
# and the step-time measurement (:func:`~tfbook.parallel.ddp._steptime_scheme`)
KNOWN_SCHEMES = SCHEMES + ("expert", "steptime")

# the module of this package that defines each scheme's function ``_<name>_scheme``
_SCHEME_MODULES = {"ddp": "ddp", "zero1": "zero", "fsdp": "zero", "tp": "tensor", "ring": "context",
                   "pipeline": "pipeline", "expert": "expert", "steptime": "ddp"}


def _scheme_fn(name: str):
    """``_<name>_scheme`` of its engine's module, looked up now: a function redefined there is the one run."""
    return getattr(importlib.import_module(f"{__package__}.{_SCHEME_MODULES[name]}"), f"_{name}_scheme")


def _engines_main(argv) -> int:
    """What ``torchrun ... -m tfbook.parallel --schemes ddp,fsdp --out DIR`` runs on every rank."""
    import argparse
    import json

    import torch.distributed as dist

    ap = argparse.ArgumentParser(prog="python -m tfbook.parallel")
    ap.add_argument("--schemes", required=True, help="comma-separated, from " + ",".join(KNOWN_SCHEMES))
    ap.add_argument("--out", required=True, help="folder for rank<r>.pt")
    ap.add_argument("--cfg", default="{}", help="DPConfig fields as JSON")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    schemes = args.schemes.split(",")
    unknown = [s for s in schemes if s not in KNOWN_SCHEMES]
    if unknown:
        raise ValueError(f"schemes {unknown} are not among {KNOWN_SCHEMES}")
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
            out[name] = _scheme_fn(name)(cfg, rank, world, device)
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
            out[name] = _scheme_fn(name)(cfg, rank, world_size, torch.device("cpu"))
            out[name]["seconds"] = time.perf_counter() - t0
        torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_engines(schemes=SCHEMES, cfg: DPConfig = DPConfig(), world_size: int = 2, timeout: float = 120.0,
                start_method: str | None = None) -> list[dict]:
    """The schemes of :func:`run_torchrun`, started by this process's own launcher instead of torchrun.

    Same results (one dict per rank, a key per scheme), on the CPU with gloo, through the
    launcher of :func:`~tfbook.parallel.ddp.run_data_parallel`. With ``start_method="fork"``
    (the default on CPU-only Linux) the workers are copies of this process, so they run its
    code as it is now: the chapter's mutations use that to rerun one scheme with a bug put
    into its engine's module (``tfbook.parallel.ddp``, ``zero``, ``tensor``, ``context``, ``pipeline`` or ``expert``),
    which a ``torchrun`` subprocess, a fresh interpreter, would not see.
    """
    schemes = [schemes] if isinstance(schemes, str) else list(schemes)
    unknown = [s for s in schemes if s not in KNOWN_SCHEMES]
    if unknown or not schemes:
        raise ValueError(f"schemes must be a non-empty list from {KNOWN_SCHEMES}, got {schemes!r}")
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
        import torch.distributed.pipelining  # noqa: F401
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
    unknown = [s for s in schemes if s not in KNOWN_SCHEMES]
    if unknown or not schemes:
        raise ValueError(f"schemes must be a non-empty list from {KNOWN_SCHEMES}, got {schemes!r}")
    if not (isinstance(nproc, int) and nproc >= 1):
        raise ValueError(f"nproc must be a positive int, got {nproc!r}")
    if not isinstance(cfg, DPConfig):
        raise ValueError(f"cfg must be a DPConfig, got {type(cfg).__name__}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHELASTIC_ERROR_FILE": ""}
    root = str(Path(__file__).resolve().parents[2])  # tfbook importable in the workers
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
