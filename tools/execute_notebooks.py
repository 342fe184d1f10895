"""Execute chapter notebooks in place: fresh kernel, top to bottom, with a timeout.

    python tools/execute_notebooks.py notebooks/00_setup_and_notation.ipynb
    python tools/execute_notebooks.py            # every notebooks/*.ipynb

Each notebook runs with its own directory as the working directory (as Jupyter
and nbval do), so execution counts come out 1..n and outputs are what nbval will
compare. A cell that raises stops the run with a non-zero exit code, unless the
cell is tagged ``raises-exception``. Prints one line per notebook with its wall
time; a notebook over ``--budget`` seconds (default 60) is reported and makes the
exit code non-zero, because chapters must run in under a minute on 2 CPU cores.

The notebook-level metadata is written as JupyterLab writes it when it opens the notebook
with the pinned ipykernel, so that opening a chapter does not mark it modified:
``kernelspec`` is the kernel's own spec (``display_name`` "Python 3 (ipykernel)", as
ipykernel installs it; nbclient would keep whatever the file had) and ``language_info`` is
the kernel's reply, as nbclient already stores it. ``--metadata-only`` rewrites just those
two entries (from ipykernel, without starting a kernel) and leaves cells and outputs alone;
``tests/test_notebook_metadata.py`` checks every committed chapter.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]


def kernel_metadata(kernel: str = "python3", language_info: dict | None = None) -> dict:
    """The notebook-level ``kernelspec`` and ``language_info`` JupyterLab writes for ``kernel``.

    JupyterLab copies ``name``, ``display_name`` and ``language`` from the kernel's spec, and
    ``language_info`` from the kernel's info reply (``language_info``: that reply, e.g. as
    nbclient stored it; None: ipykernel's, which is what the reply holds for this Python)."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(kernel)
    if language_info is None:
        from ipykernel.ipkernel import IPythonKernel

        language_info = dict(IPythonKernel.language_info)
    return {"kernelspec": {"display_name": spec.display_name, "language": spec.language, "name": kernel},
            "language_info": language_info}


def set_kernel_metadata(nb, kernel: str = "python3") -> bool:
    """Write :func:`kernel_metadata` into ``nb.metadata``; True if anything changed."""
    want = kernel_metadata(kernel, nb.metadata.get("language_info"))
    if all(nb.metadata.get(k) == v for k, v in want.items()):
        return False
    nb.metadata.update(nbformat.from_dict(want))
    return True


def execute(path: Path, timeout: int = 120, kernel: str = "python3") -> float:
    """Execute ``path`` in place and return the wall time in seconds.

    The kernel starts with ``IPYTHONDIR=tools/ipython``, whose one startup file stores each
    figure's alt text, read from the figure (``tools/figure_alt.py``), in its output's metadata."""
    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute(env={**os.environ, "IPYTHONDIR": str(ROOT / "tools" / "ipython")})
    elapsed = time.perf_counter() - start
    set_kernel_metadata(nb, kernel)     # language_info: the kernel's reply, which nbclient stored
    nbformat.write(nb, str(path))
    return elapsed


def rewrite_metadata(path: Path, kernel: str = "python3") -> bool:
    """Only the notebook-level kernel metadata of ``path`` (no kernel started, cells untouched).

    ``language_info`` comes from ipykernel (its kernel-info reply for the Python running this
    script). Returns True if the file was rewritten."""
    nb = nbformat.read(str(path), as_version=4)
    want = kernel_metadata(kernel)
    if all(nb.metadata.get(k) == v for k, v in want.items()):
        return False
    nb.metadata.update(nbformat.from_dict(want))
    nbformat.write(nb, str(path))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to execute (default: every notebooks/*.ipynb)")
    parser.add_argument("--timeout", type=int, default=120,
                        help="per-cell timeout in seconds (default 120)")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="wall-time budget per notebook in seconds (default 60)")
    parser.add_argument("--metadata-only", action="store_true",
                        help="rewrite only the notebook-level kernelspec and language_info (no execution)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.metadata_only:
        for path in paths:
            print(("rewrote   " if rewrite_metadata(path) else "unchanged ") + str(path))
        return 0
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
