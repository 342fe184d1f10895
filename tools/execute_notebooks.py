"""Execute chapter notebooks in place: fresh kernel, top to bottom, with a timeout.

    python tools/execute_notebooks.py notebooks/00_setup_and_notation.ipynb
    python tools/execute_notebooks.py            # every notebooks/*.ipynb

Each notebook runs with its own directory as the working directory (as Jupyter
and nbval do), so execution counts come out 1..n and outputs are what nbval will
compare. A cell that raises stops the run with a non-zero exit code, unless the
cell is tagged ``raises-exception``. Prints one line per notebook with its wall
time; a notebook over ``--budget`` seconds (default 60) is reported and makes the
exit code non-zero, because chapters must run in under a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]


def execute(path: Path, timeout: int = 120, kernel: str = "python3") -> float:
    """Execute ``path`` in place and return the wall time in seconds."""
    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    nbformat.write(nb, str(path))
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to execute (default: every notebooks/*.ipynb)")
    parser.add_argument("--timeout", type=int, default=120,
                        help="per-cell timeout in seconds (default 120)")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="wall-time budget per notebook in seconds (default 60)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    status = 0
    for path in paths:
        try:
            elapsed = execute(path, timeout=args.timeout)
        except CellExecutionError as exc:
            print(f"FAILED {path}: {str(exc).splitlines()[-1] if str(exc) else exc!r}")
            print(exc, file=sys.stderr)
            status = 1
            continue
        over = elapsed > args.budget
        print(f"{elapsed:7.1f} s  {path}" + (f"  OVER the {args.budget:.0f} s budget" if over else ""))
        status |= int(over)
    return status


if __name__ == "__main__":
    sys.exit(main())
