"""A student's install checks exercises without nbgrader; an instructor's grades with it (issue 28).

The released notebooks' Colab cell installs ``tfbook[book,check]``; ``check`` (nbformat and
IPython) is what ``python -m tfbook.course check`` needs, and nothing in its dependency closure
is nbgrader, nbconvert or nbclient. The ``course`` extra (instructors) keeps them all. The
second test runs ``check`` for real in an empty venv that sees only the closure of
``tfbook[book,check]`` (the distributions of ``.venv``, symlinked, as ``tests/test_install.py``
does for a wheel) plus the sources, and finds release refusing there with the extra's name.

Mutations: ``check`` given nbgrader (or the Colab cell installing ``[book,course]``) fails the
first test; ``tfbook/course/__init__.py`` requiring nbgrader again fails the second.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest
from grader_release import released_chapters
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from test_install import _applies, link_closure

from tfbook.course import release as course_release

ROOT = Path(__file__).resolve().parents[1]
CH0 = "00_setup_and_notation"
INSTRUCTORS_ONLY = {"nbgrader", "nbconvert", "nbclient"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def closure(extras) -> dict[str, md.Distribution]:
    """The distributions of .venv that `pip install tfbook[extras]` would install (from pyproject.toml)."""
    project = _project()
    reqs = list(project["dependencies"]) + [r for e in extras for r in project["optional-dependencies"][e]]
    todo, found, done = [Requirement(r) for r in reqs], {}, {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in done and set(req.extras) <= done[name]:
            continue
        found[name] = found.get(name) or md.distribution(req.name)
        done[name] = done.get(name, set()) | set(req.extras)
        todo += [r for r in map(Requirement, found[name].requires or []) if _applies(r, done[name])]
    return found


def test_the_readers_extra_has_no_nbgrader_and_the_colab_cell_installs_it():
    extras = _project()["optional-dependencies"]
    names = {e: {canonicalize_name(Requirement(r).name) for r in reqs} for e, reqs in extras.items()}
    assert names["check"] <= names["course"]  # an instructor can check too
    assert INSTRUCTORS_ONLY <= names["course"]
    assert not INSTRUCTORS_ONLY & set(closure(["book", "check"]))  # not even pulled in indirectly
    assert INSTRUCTORS_ONLY <= set(closure(["course"]))
    nb = nbformat.read(str(released_chapters()[CH0]), as_version=4)
    install = next(c for c in nb.cells if c.get("id") == course_release.INSTALL_ID)
    assert '"tfbook[book,check] @ git+' in install.source


@pytest.mark.skipif(sys.platform != "linux", reason="symlinked site-packages, as tests/test_install.py")
def test_check_runs_in_the_readers_install_and_release_asks_for_the_course_extra(tmp_path):
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    link_closure(closure(["book", "check"]), tmp_path / "deps")
    Path(site, "_tfbook_test.pth").write_text(f"{tmp_path / 'deps'}\n{ROOT}\n")
    env = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "MPLBACKEND": "Agg",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    probe = subprocess.run([str(python), "-c", "import importlib.util as u; "
                            "print([m for m in ('nbgrader', 'nbconvert', 'nbclient') if u.find_spec(m)])"],
                           env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[]"  # the environment really lacks them
    stub = tmp_path / f"{CH0}.ipynb"
    stub.write_bytes(released_chapters()[CH0].read_bytes())
    done = subprocess.run([str(python), "-m", "tfbook.course", "check", stub.name], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]  # ran; the exercises are not answered yet
    assert "Exercise 0.1: not answered yet" in done.stdout and "Total: 0/" in done.stdout, done.stdout
    refused = subprocess.run([str(python), "-m", "tfbook.course", "release", "--out", str(tmp_path / "r")],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "needs the [course] extra" in refused.stderr, refused.stderr[-2000:]
    assert not (tmp_path / "r").exists()
    assert os.listdir(tmp_path / "deps")  # the closure was linked (the check above can fail)
