"""The command line: ``python -m tfbook.parallel`` (one check), or one rank of ``torchrun ... --schemes``."""

from __future__ import annotations

import sys

from .config import DPConfig
from .ddp import run_data_parallel, single_process_run
from .torchrun import _engines_main


def main(argv=None) -> int:  # pragma: no cover - exercised by hand
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--schemes" in argv:
        return _engines_main(argv)
    cfg = DPConfig()
    ref = single_process_run(cfg)
    results = run_data_parallel(cfg)
    err = max((r["grads"][n] - ref["grads"][n]).abs().max().item() for r in results for n in ref["grads"])
    print(f"largest |gradient difference| between 2-process and 1-process training: {err:.1e}")
    return 0 if err < 1e-12 else 1
