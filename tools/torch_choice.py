#!/usr/bin/env python3
"""Which PyTorch build to install: prints the pip arguments of a step run before the requirements.

    python tools/torch_choice.py [VARIANT]        # VARIANT defaults to $TORCH_VARIANT, else "auto"

Variants:

* ``auto`` (what ``make venv`` uses unless told otherwise): ``cuda`` if an NVIDIA GPU is
  present (``nvidia-smi -L`` runs and lists one), else ``cpu``, as long as PyTorch's CPU index
  answers: on Linux its host is first tried once (a TCP connection, 3 s at most), and where it
  cannot be reached (an offline machine, a mirror-only network such as CI's) the choice falls
  back to ``default`` and says so, instead of leaving pip to retry for minutes.
  ``TFBOOK_TORCH_INDEX_REACHABLE=0/1`` answers that probe without the network (tests).
* ``default``: print nothing, so pip installs ``torch`` from the requirements
  like any other package, from the package index pip is configured with. Nothing is detected
  and PyTorch's own wheel index is never contacted (the project's machines and CI cannot reach
  it, and pip would retry for minutes). On PyPI, Linux x86_64 gets the CUDA build (about
  2.7 GB with its NVIDIA packages); macOS and Windows get the CPU build.
* ``cpu``: on Linux, PyTorch's CPU build from PyTorch's CPU wheel index
  (``--index-url https://download.pytorch.org/whl/cpu torch==<pinned version>``,
  no NVIDIA packages); on macOS and Windows PyPI's wheel already is the CPU build,
  so nothing is printed.
* ``cuda``: on Linux, PyPI's wheel (the CUDA build): nothing is printed. Elsewhere there is
  no CUDA wheel on PyPI: exits with an error that points to pytorch.org.

The version is the one pinned in requirements.txt. ``make venv`` installs what this prints
first (if anything), then the requirements, which keep the torch already installed because
``torch==X`` accepts ``X+cpu``. How the choice was made goes to stderr.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

VARIANTS = ("default", "auto", "cpu", "cuda")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
ROOT = Path(__file__).resolve().parents[1]


def pinned_torch(requirements: Path = ROOT / "requirements.txt") -> str:
    """The ``torch==X`` line of the requirements."""
    for line in requirements.read_text().splitlines():
        m = re.match(r"\s*torch\s*==\s*([^\s#;]+)", line)
        if m:
            return f"torch=={m.group(1)}"
    raise SystemExit(f"torch_choice: no 'torch==<version>' pin in {requirements}")


def has_nvidia_gpu() -> bool:
    """True when ``nvidia-smi -L`` runs, succeeds and lists at least one GPU."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def index_reachable(timeout: float = 3.0) -> bool:
    """Whether PyTorch's CPU index host takes a TCP connection (``TFBOOK_TORCH_INDEX_REACHABLE``
    answers instead, where set to 0 or 1)."""
    forced = os.environ.get("TFBOOK_TORCH_INDEX_REACHABLE", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    import socket
    from urllib.parse import urlsplit

    try:
        socket.create_connection((urlsplit(CPU_INDEX).hostname, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def choose(variant: str, *, gpu: bool | None, system: str, torch_pin: str,
           reachable: bool | None = True) -> tuple[list[str], str]:
    """(pip arguments, reason). ``gpu`` is only consulted for ``auto`` (None: not detected);
    ``reachable`` (whether PyTorch's CPU index answers) only for ``auto`` choosing the CPU
    build on Linux: where it is False, ``auto`` falls back to ``default``."""
    if variant not in VARIANTS:
        raise ValueError(f"TORCH_VARIANT={variant!r} is not one of {VARIANTS}")
    if variant == "default":
        return [], "TORCH_VARIANT=default: torch comes from the requirements, from pip's configured index"
    if variant == "auto":
        if gpu is None:
            raise ValueError("variant 'auto' needs the GPU detection (gpu=True/False)")
        variant = "cuda" if gpu else "cpu"
        how = f"TORCH_VARIANT=auto: nvidia-smi -L {'lists' if gpu else 'lists no'} NVIDIA GPU -> {variant}"
    else:
        how = f"TORCH_VARIANT={variant}"
    if variant == "cpu":
        if system == "Linux" and how.startswith("TORCH_VARIANT=auto") and reachable is False:
            return [], (f"{how}, but {CPU_INDEX} cannot be reached: torch comes from the requirements, "
                        "from pip's configured index (as TORCH_VARIANT=default)")
        if system == "Linux":
            return ["--index-url", CPU_INDEX, torch_pin], f"{how}: the CPU build from {CPU_INDEX}"
        return [], f"{how}: PyPI's torch is the CPU build on {system}"
    if system == "Linux":
        return [], f"{how}: PyPI's torch, the CUDA build on Linux"
    raise ValueError(f"{how}: there is no CUDA build of torch on PyPI for {system}; "
                     "see https://pytorch.org/get-started/locally/ for the index to use")


def main(argv: list[str]) -> int:
    variant = (argv[0] if argv else os.environ.get("TORCH_VARIANT", "")).strip().lower() or "auto"
    if variant not in VARIANTS:
        print(f"torch_choice: TORCH_VARIANT={variant!r} is not one of {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    gpu = has_nvidia_gpu() if variant == "auto" else None
    reachable = index_reachable() if variant == "auto" and gpu is False and platform.system() == "Linux" else None
    try:
        args, why = choose(variant, gpu=gpu, system=platform.system(), torch_pin=pinned_torch(), reachable=reachable)
    except ValueError as err:
        print(f"torch_choice: {err}", file=sys.stderr)
        return 2
    print(f"torch_choice: {why}", file=sys.stderr)
    print(" ".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
