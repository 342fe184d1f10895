"""A reader's fresh environment runs chosen chapters with the book's outputs (opt-in, needs the registry).

The README tells a reader who wants only the package and the chapters' imports to run
``pip install "tfbook[book]"``. This test does exactly that, in a new ``python -m venv``
that sees nothing of ``.venv``: it builds the wheel from a copy of this checkout (nothing is
written into the checkout), installs ``"tfbook[book] @ file://<wheel>"`` with the venv's own
pip, every dependency resolved by pip from the package registry (whatever versions it picks
today: the point is a reader's install, not the pins of requirements.txt), then adds the test
harness alone (pytest and nbval, at the pins of requirements.txt; nbval brings ipykernel, which
any Jupyter front end brings too) and runs ``pytest --nbval`` on copies of chapters 3, 11 and 13
in a folder outside the checkout, so the kernel imports the installed ``tfbook``. Every output
must equal the committed one after ``nbval_sanitize.cfg``, as in ``make test``; an unexpected
stderr line (``TqdmWarning: IProgress not found``, issue 24) is a difference too.

It needs the package registry (several GB on Linux: PyPI's torch is the CUDA build) and
minutes, so ``make test``, which must run offline, skips it: it runs only with
``TFBOOK_FRESH_ENV=1`` (``make fresh-env-check``). ``TFBOOK_FRESH_ENV_CHAPTERS`` overrides the
chapter list (stems or numbers separated by spaces); ``TFBOOK_FRESH_ENV_KEEP=DIR`` builds the
environment in DIR and keeps it for inspection (with ``TFBOOK_FRESH_ENV_REUSE=1`` a kept
environment is reused: only the tfbook wheel is reinstalled); ``TFBOOK_FRESH_ENV_REF=HEAD`` takes
the package and the chapters from that commit instead of the working tree (a shared tree where
someone's uncommitted change to ``tfbook`` would differ from the committed chapters).

Matplotlib's first import in a new home folder prints "Matplotlib is building the font cache;
this may take a moment." on stderr, once per machine: a reader sees it in the first chapter they
run, never again. The test builds that cache before running the chapters (and records whether
the message appeared), so that the comparison is about the book's outputs.

``test_book_extra_declares_the_chapters_imports`` is its offline half, in the suite always:
the ``book`` extra of pyproject.toml, with the core dependencies, declares a distribution for
every third-party module a chapter imports.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from notebook_imports import imported_modules

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ("03", "11", "13")
OPT_IN = os.environ.get("TFBOOK_FRESH_ENV") == "1"

# The distribution that provides each top-level module the chapters may import (where the
# names differ, and for modules that belong to no distribution the extra could declare).
MODULE_TO_DIST = {"sklearn": "scikit-learn", "mpl_toolkits": "matplotlib", "IPython": "ipython",
                  "PIL": "pillow", "yaml": "pyyaml", "ipywidgets": "ipywidgets"}
# Imported by chapters only inside a guard that skips when absent (never needed by a reader):
# the module and why.
GUARDED = {"transformers": "peer checks behind `try: import transformers` (contributors' requirements.txt)"}


def _notebook_imports(path: Path) -> set[str]:
    """Top-level names of the modules a notebook's code cells import."""
    return {name.split(".")[0] for name in imported_modules(path)}


def declared(extra: str = "book", pyproject: Path = ROOT / "pyproject.toml") -> set[str]:
    """Canonical names of the distributions `pip install "tfbook[extra]"` asks for directly."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    reqs = project["dependencies"] + project["optional-dependencies"][extra]
    return {canonicalize_name(Requirement(r).name) for r in reqs}


def undeclared_imports(notebooks, dists: set[str]) -> dict[str, list[str]]:
    """Third-party modules the notebooks import whose distribution is not in ``dists``: {module: [notebooks]}."""
    missing: dict[str, list[str]] = {}
    for nb in notebooks:
        for mod in sorted(_notebook_imports(nb)):
            if mod in sys.stdlib_module_names or mod in ("tfbook", "__future__") or mod in GUARDED:
                continue
            if canonicalize_name(MODULE_TO_DIST.get(mod, mod)) not in dists:
                missing.setdefault(mod, []).append(nb.name)
    return missing


def test_book_extra_declares_the_chapters_imports():
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 20
    missing = undeclared_imports(notebooks, declared("book"))
    assert not missing, f"chapters import modules that tfbook[book] does not declare: {missing}"
    # the check can fail: without the extra (the core dependencies alone) matplotlib is missing,
    # and a notebook that imports an undeclared module is found
    assert "matplotlib" in undeclared_imports(notebooks, declared("book") - {"matplotlib"})
    # and the guarded peer import is really guarded: every cell importing it catches ImportError
    for nb in notebooks:
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] == "code" and re.search(r"^\s*(import|from) transformers\b", src, re.M):
                assert re.search(r"except\s*\(?\s*(ImportError|ModuleNotFoundError)", src), \
                    f"{nb.name}: a cell imports transformers without catching ImportError"


def _run(cmd, log, **kw):
    t0 = time.perf_counter()
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    log.append(f"[{time.perf_counter() - t0:6.1f} s] {' '.join(map(str, cmd))[:200]} -> {proc.returncode}")
    return proc


def _pin(name: str) -> str:
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and canonicalize_name(Requirement(line).name) == canonicalize_name(name):
            return line
    raise LookupError(name)


def _chapters() -> list[Path]:
    wanted = os.environ.get("TFBOOK_FRESH_ENV_CHAPTERS", " ".join(CHAPTERS)).split()
    found = []
    for w in wanted:
        (nb,) = [p for p in sorted((ROOT / "notebooks").glob("*.ipynb")) if p.stem == w or p.stem.split("_")[0] == w]
        found.append(nb)
    return found


@pytest.mark.skipif(not OPT_IN, reason="opt-in: needs the package registry and several minutes "
                                       "(TFBOOK_FRESH_ENV=1, or make fresh-env-check)")
def test_fresh_book_install_runs_chapters_clean(tmp_path):
    keep = os.environ.get("TFBOOK_FRESH_ENV_KEEP")
    work = Path(keep) if keep else tmp_path
    work.mkdir(parents=True, exist_ok=True)
    reuse = bool(keep) and os.environ.get("TFBOOK_FRESH_ENV_REUSE") == "1" and (work / "env" / "bin" / "python").exists()
    log: list[str] = []
    t_start = time.perf_counter()
    root = ROOT
    ref = os.environ.get("TFBOOK_FRESH_ENV_REF")
    if ref:   # the package and the chapters as committed at `ref`
        root = work / "ref"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "tfbook", "notebooks", "pyproject.toml",
                                  "README.md", "nbval_sanitize.cfg", "requirements.txt"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
        log.append(f"package and chapters from {ref} "
                   f"({subprocess.run(['git', '-C', str(ROOT), 'rev-parse', '--short', ref], capture_output=True, text=True).stdout.strip()})")
    # 1. the wheel, from a copy of the sources (as tests/test_install.py builds it)
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, src / name)
    shutil.copytree(root / "tfbook", src / "tfbook", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = work / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src], log)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = dist.glob("tfbook-*.whl")
    # 2. a fresh venv with its own pip, from the Python that runs the tests (>= 3.11), and nothing else
    env_dir = work / "env"
    py = env_dir / "bin" / "python"
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    clean_env["PATH"] = f"{env_dir / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    if reuse:   # a kept environment: only tfbook itself is replaced
        proc = _run([py, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", whl], log, env=clean_env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        freeze_reader = freeze_all = _run([py, "-m", "pip", "freeze"], log, env=clean_env).stdout
    else:
        shutil.rmtree(env_dir, ignore_errors=True)
        proc = _run([sys.executable, "-m", "venv", env_dir], log)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # 3. the README's line, nothing more
        proc = _run([py, "-m", "pip", "install", "-q", f"tfbook[book] @ {whl.as_uri()}"], log, env=clean_env)
        assert proc.returncode == 0, f"pip install tfbook[book] failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        freeze_reader = _run([py, "-m", "pip", "freeze"], log, env=clean_env).stdout
        # 4. the harness (what runs the notebooks and compares them)
        proc = _run([py, "-m", "pip", "install", "-q", _pin("pytest"), _pin("nbval")], log, env=clean_env)
        assert proc.returncode == 0, f"installing the harness failed:\n{proc.stderr[-3000:]}"
        freeze_all = _run([py, "-m", "pip", "freeze"], log, env=clean_env).stdout
    # 5. the chapters, copied outside the checkout, under nbval as make test runs them
    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    shutil.copy2(root / "nbval_sanitize.cfg", run_dir)
    (run_dir / "pytest.ini").write_text("[pytest]\n")    # not the checkout's configuration
    chapters = [root / "notebooks" / nb.name for nb in _chapters()]
    for nb in chapters:
        shutil.copy2(nb, run_dir / nb.name)
    nb_env = {**clean_env, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "HOME": str(work)}
    # matplotlib's one-time font cache (its message on stderr is not the book's output)
    warm = _run([py, "-c", "import matplotlib.pyplot"], log, cwd=run_dir, env=nb_env)
    assert warm.returncode == 0, warm.stderr[-2000:]
    log.append(f"matplotlib's first import printed: {warm.stderr.strip()!r}")
    proc = _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
                 "--nbval-sanitize-with", "nbval_sanitize.cfg", "--nbval-cell-timeout", "300",
                 *[nb.name for nb in chapters]], log, cwd=run_dir, env=nb_env)
    where = _run([py, "-c", "import tfbook, torch, numpy; print(tfbook.__file__, torch.__version__, numpy.__version__)"],
                 log, cwd=run_dir, env=nb_env).stdout.strip()
    log.append(f"total {time.perf_counter() - t_start:.0f} s; tfbook, torch, numpy: {where}")
    report = "\n".join(log) + "\n\n== pip freeze after `pip install tfbook[book]`:\n" + freeze_reader \
        + "\n== added by the harness:\n" + "\n".join(sorted(set(freeze_all.split()) - set(freeze_reader.split())))
    (work / "fresh_env_report.txt").write_text(report + "\n\n== nbval:\n" + proc.stdout[-20000:])
    print(report)
    assert str(env_dir) in where, f"the kernel did not import the installed tfbook: {where}"
    assert proc.returncode == 0, f"nbval in the fresh environment failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
