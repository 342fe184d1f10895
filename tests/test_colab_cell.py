"""The Colab install snippet (tools/colab_cell.py) is at the top of every chapter.

The rocket button opens a chapter in Colab, which lacks tfbook: the first code cell
installs it there, from the repository and branch in _config.yml, and does nothing
(prints nothing) anywhere else.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

_spec = importlib.util.spec_from_file_location("colab_cell", ROOT / "tools" / "colab_cell.py")
colab_cell = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(colab_cell)


def _config_install_line() -> str:
    """The install line, built here from _config.yml (not by the tool under test)."""
    repo = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]
    url = repo["url"].rstrip("/")
    assert url.startswith("https://") and "<" not in url, f"repository.url in _config.yml: {url!r}"
    return f'%pip install --quiet "tfbook[book] @ git+{url}@{repo["branch"]}"'


def _first_code(nb):
    return next(c for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_first_code_cell_installs_tfbook_on_colab(path):
    source = _first_code(nbformat.read(str(path), as_version=4)).source
    lines = source.splitlines() + [""] * 4
    hint = "run `python tools/colab_cell.py` and commit the notebooks"
    assert lines[:3] == [lines[0], "import sys", 'if "google.colab" in sys.modules:'] \
        and lines[0].startswith(colab_cell.MARKER), f"{path.name}: no Colab snippet at the top; {hint}"
    assert lines[3] == "    " + _config_install_line(), \
        f"{path.name}: the Colab snippet installs {lines[3].strip()!r}, not the repository of _config.yml; {hint}"
    assert source.count(colab_cell.MARKER) == 1 and sum(
        colab_cell.MARKER in c.source for c in nbformat.read(str(path), as_version=4).cells) == 1, \
        f"{path.name}: the Colab snippet appears more than once"


@pytest.fixture
def copies(tmp_path):
    out = []
    for p in NOTEBOOKS[:2]:
        nb = nbformat.read(str(p), as_version=4)
        _first_code(nb).source = colab_cell.strip_snippet(_first_code(nb).source)  # as before the tool
        nbformat.write(nb, str(tmp_path / p.name))
        out.append(tmp_path / p.name)
    return out


def _config(tmp_path, url, branch):
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    cfg["repository"].update(url=url, branch=branch)
    path = tmp_path / f"config-{branch}.yml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def test_tool_inserts_updates_and_never_duplicates(copies, tmp_path):
    originals = [nbformat.read(str(p), as_version=4) for p in copies]
    args = [str(p) for p in copies]
    assert colab_cell.main(["--check", *args]) == 1

    assert colab_cell.main(args) == 0
    once = [p.read_text(encoding="utf-8") for p in copies]
    assert colab_cell.main(args) == 0
    assert [p.read_text(encoding="utf-8") for p in copies] == once, "a second run changed the notebooks"
    assert colab_cell.main(["--check", *args]) == 0

    fork = _config(tmp_path, "https://github.com/someone/fork/", "dev")
    assert colab_cell.main(["--config", str(fork), *args]) == 0
    assert colab_cell.main(["--check", *args]) == 1  # no longer the URL of _config.yml
    for path, before in zip(copies, originals):
        nb = nbformat.read(str(path), as_version=4)
        first = _first_code(nb)
        assert first.source.count("%pip install") == 1
        assert first.source.splitlines()[3] == '    %pip install --quiet "tfbook[book] @ git+https://github.com/someone/fork@dev"'
        # the rest of the notebook is as it was: the cell's own code, outputs, other cells
        assert colab_cell.strip_snippet(first.source) == _first_code(before).source
        assert first.outputs == _first_code(before).outputs
        assert [c.source for c in nb.cells if c is not first and not colab_cell.is_badge_cell(c)] == \
            [c.source for c in before.cells if c is not _first_code(before) and not colab_cell.is_badge_cell(c)]
        # the Colab link follows the fork too
        assert "colab.research.google.com/github/someone/fork/blob/dev/notebooks/" in nb.cells[1].source

    # a snippet that ended up in a later code cell (a cell was inserted above) moves up
    nb = nbformat.read(str(copies[0]), as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell("x = 1"))
    nbformat.write(nb, str(copies[0]))
    assert colab_cell.main([str(copies[0])]) == 0
    nb = nbformat.read(str(copies[0]), as_version=4)
    assert sum(colab_cell.MARKER in c.source for c in nb.cells) == 1
    assert colab_cell.main(["--check", str(copies[0])]) == 0


def test_snippet_is_silent_off_colab_and_installs_on_colab(capfd, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    calls = []
    shell.register_magic_function(lambda line: calls.append(line), magic_kind="line", magic_name="pip")
    snippet = colab_cell.snippet(*colab_cell.repository())
    try:
        assert shell.run_cell(snippet).success
        assert calls == []
        out, err = capfd.readouterr()
        assert out == "" and err == "", "the snippet printed something outside Colab"

        monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
        assert shell.run_cell(snippet).success
        assert calls == [_config_install_line().removeprefix("%pip ")]
    finally:
        InteractiveShell.clear_instance()



def test_released_student_notebooks_install_the_package_not_the_snippet(tmp_path):
    """Release drops the chapter's Colab snippet (it clones the whole repository, notebooks and
    solutions included) and puts in its place one pip line that installs the package alone (a
    wheel built from the sources holds no notebook). By default that line names the repository
    the chapter installs from, whose published book already shows the solutions; an instructor
    who keeps a class's repository private passes ``install`` (a wheel on the course site), and
    then the repository is named nowhere. Mutation: release keeping the snippet fails the
    MARKER assertion; ignoring ``install`` fails the last one."""
    from tfbook.course.release import release

    url = colab_cell.repository()[0].split("://", 1)[1]
    chapter = ROOT / "notebooks" / "00_setup_and_notation.ipynb"
    assert url in chapter.read_text(encoding="utf-8")              # the master names it
    written = release([chapter], out=tmp_path / "default", verbose=False)
    student = next(iter(written.values())).read_text(encoding="utf-8")
    assert colab_cell.MARKER not in student
    assert "git clone" not in student
    assert f'tfbook[book,check] @ git+https://{url}' in student
    wheel = "https://course.example.org/tfbook-0-py3-none-any.whl"
    written = release([chapter], out=tmp_path / "private", verbose=False, install=f"tfbook[book,course] @ {wheel}")
    student = next(iter(written.values())).read_text(encoding="utf-8")
    assert url not in student and wheel in student


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_colab_link_follows_the_title(path):
    """Issue 38: each notebook carries an "Open in Colab" link under its title (a plain link: the
    book loads nothing from another host), for readers who open the file itself."""
    nb = nbformat.read(str(path), as_version=4)
    url, branch = colab_cell.repository()
    assert colab_cell.has_badge(nb, colab_cell.badge(url, branch, f"notebooks/{path.name}")), \
        f"{path.name}: no Colab link after the title; run `python tools/colab_cell.py`"
    assert sum(colab_cell.is_badge_cell(c) for c in nb.cells) == 1


def test_colab_link_is_left_out_of_every_edition(tmp_path):
    """The site has launch buttons, and the course edition must not link to the repository."""
    from tfbook._colab import strip_badge

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Title"),
                                         nbformat.v4.new_markdown_cell(colab_cell.badge(
                                             "https://github.com/a/b", "main", "notebooks/x.ipynb")),
                                         nbformat.v4.new_code_cell("1")])
    assert "colab.research.google.com/github/a/b/blob/main/notebooks/x.ipynb" in nb.cells[1].source
    strip_badge(nb)
    assert [c.cell_type for c in nb.cells] == ["markdown", "code"]


def test_released_notebooks_lose_the_colab_link():
    """A student's released notebook must not link to the repository's copy (it holds the solutions)."""
    from tfbook.course.release import strip_test_markers

    nb = nbformat.read(str(ROOT / "notebooks" / "03_why_scale.ipynb"), as_version=4)
    assert any(colab_cell.is_badge_cell(c) for c in nb.cells)
    strip_test_markers(nb)
    assert not any(colab_cell.is_badge_cell(c) for c in nb.cells)
    assert not any("colab.research.google.com" in c.source for c in nb.cells)
