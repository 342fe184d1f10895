"""Check a reader's environment: ``python -m tfbook.doctor``.

Prints one line per thing the book needs or can use, with a ✔ (fine), a ! (works, but not as
the book was made: the figures may differ in the last digits, or a chapter is slower) or a ✘
(a chapter will fail), and what to do about it:

* Python (the floor is 3.11) and the platform;
* PyTorch: its version against the pin, its build (CPU, CUDA or ROCm) and the devices it sees
  (what :func:`tfbook.device` would pick), its thread count;
* NumPy, SciPy, Matplotlib, scikit-learn, JupyterLab and the MyST extension against the pins
  of ``requirements-reader.txt`` (in a source checkout; an installed package checks presence only);
* the optional programs some pages use: ``7zz`` (chapter 13's PPMd baseline), ``bwrap`` (the
  grader's sandbox), ``chromium`` (the browser tests), ``xelatex`` (``make pdf``).

Exit code 1 when a ✘ line was printed, else 0. ``--json`` prints the same as a JSON list.
Nothing is downloaded and nothing is installed.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import sys
from pathlib import Path

OK, WARN, FAIL = "✔", "!", "✘"
PY_FLOOR = (3, 11)
#: the reader's pins (requirements-reader.txt), as far as this check looks at them
PINNED = ("torch", "numpy", "scipy", "matplotlib", "scikit-learn", "tqdm", "threadpoolctl",
          "ipykernel", "jupyterlab", "jupyterlab-myst")
PROGRAMS = {
    "7zz": "chapter 13's PPMd baseline (Debian/Ubuntu: apt install 7zip)",
    "bwrap": "the grader's sandbox, for instructors (apt install bubblewrap)",
    "chromium": "the browser tests, for contributors (apt install chromium)",
    "xelatex": "make pdf, for contributors (apt install texlive-xetex)",
}


def _pins() -> dict[str, str]:
    """``name -> version`` from requirements-reader.txt beside the package (a source checkout)."""
    path = Path(__file__).resolve().parents[1] / "requirements-reader.txt"
    out = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s#;]+)", line)
            if m:
                out[m.group(1).lower()] = m.group(2)
    return out


def _version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def checks() -> list[dict]:
    """The rows: ``{"status", "what", "found", "advice"}``."""
    rows = []

    def row(status, what, found, advice=""):
        rows.append(dict(status=status, what=what, found=found, advice=advice))

    v = sys.version_info
    row(OK if v >= PY_FLOOR else FAIL, "Python", f"{platform.python_version()} on {platform.system()} "
        f"{platform.machine()}", "" if v >= PY_FLOOR else "tfbook needs Python >= 3.11")
    pins = _pins()
    for name in PINNED:
        found, pin = _version(name), pins.get(name)
        if found is None:
            needed = name in ("torch", "numpy", "scipy", "matplotlib", "scikit-learn")
            row(FAIL if needed else WARN, name, "not installed",
                "pip install -r requirements-reader.txt" + ("" if needed else " (needed to run notebooks)"))
        elif pin is not None and found.split("+")[0] != pin:
            row(WARN, name, f"{found} (the book pins {pin})", "figures may differ in the last digits")
        else:
            row(OK, name, found)
    try:
        import torch
    except ImportError:
        return rows
    build = ("CUDA " + torch.version.cuda if torch.version.cuda else
             "ROCm " + torch.version.hip if getattr(torch.version, "hip", None) else "CPU")
    row(OK, "PyTorch build", f"{build} ({torch.__version__})")
    from tfbook import device

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) + (
        ["mps"] if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else [])
    picked = str(device())
    row(OK, "devices", f"{', '.join(devices)}; tfbook.device() picks {picked}"
        + (f" (TFBOOK_DEVICE={os.environ['TFBOOK_DEVICE']})" if os.environ.get("TFBOOK_DEVICE") else ""),
        "the chapters compute on the CPU whatever is picked")
    threads = torch.get_num_threads()
    row(OK, "threads", f"PyTorch {threads}, CPUs {os.cpu_count()}")
    for prog, use in PROGRAMS.items():
        path = shutil.which(prog)
        row(OK if path else WARN, prog, path or "not found", "" if path else f"optional: {use}")
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rows = checks()
    if "--json" in argv:
        print(json.dumps(rows, ensure_ascii=False, indent=1))
    else:
        for r in rows:
            print(f"{r['status']} {r['what']:<16} {r['found']}" + (f"  ({r['advice']})" if r["advice"] else ""))
        bad = sum(r["status"] == FAIL for r in rows)
        print(f"{len(rows)} checks, {bad} failing" + ("" if bad else ": ready to run the book"))
    return 1 if any(r["status"] == FAIL for r in rows) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
