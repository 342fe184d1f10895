"""The package reference page (book/api.md) is generated from the package and up to date.

`python tools/api_page.py` writes it; `--check` fails when the committed page differs from
what the package gives now (a new function, a changed signature or docstring). The tests
below also read the page itself, without the generator, to show that every public name of
both backends is on it, that the backends column says the truth, and that its tables parse.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

import tfbook.numpy as tnp
import tfbook.torch as ttorch
import tfbook.torch.functional as tf

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "book" / "api.md"
TOOL = ROOT / "tools" / "api_page.py"

_spec = importlib.util.spec_from_file_location("api_page", TOOL)
api_page = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(api_page)

SOME_PATH = Path("/somewhere/on/this/machine.json")


def _page() -> str:
    return PAGE.read_text(encoding="utf-8")


def _row_names(text: str) -> dict[str, list[str]]:
    """Name -> the table rows (as lists of cells) whose first cell's code span starts with it."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"\| `(?:class )?([A-Za-z_][A-Za-z0-9_.]*)", line)
        if m:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            rows.setdefault(m.group(1), []).append(cells)
    return rows


def test_check_passes_on_the_committed_page():
    """The CLI a contributor runs: exit 0, or a message saying which command fixes it."""
    out = subprocess.run([sys.executable, str(TOOL), "--check"], cwd=ROOT, capture_output=True, text=True,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, f"book/api.md is stale:\n{out.stderr}"


@pytest.mark.parametrize("mutation", ["delete a row", "edit a summary", "drop the last newline"])
def test_check_fails_on_a_changed_page(tmp_path, capsys, mutation):
    """The check can fail: a page with one line gone (or changed) is refused, with the fix named."""
    lines = _page().split("\n")
    row = next(i for i, line in enumerate(lines) if line.startswith("| `rope("))
    if mutation == "delete a row":
        del lines[row]
    elif mutation == "edit a summary":
        lines[row] = lines[row].replace("Rotary", "Rotational")
    stale = "\n".join(lines)
    if mutation == "drop the last newline":
        stale = stale.rstrip("\n")
    path = tmp_path / "api.md"
    path.write_text(stale, encoding="utf-8")
    assert api_page.main(["--check", "--out", str(path)]) == 1
    err = capsys.readouterr().err
    assert "out of date" in err and "python tools/api_page.py" in err, err
    assert api_page.main(["--check", "--out", str(tmp_path / "missing.md")]) == 1


def test_every_public_name_of_both_backends_is_on_the_page():
    rows = _row_names(_page())
    missing = [n for n in list(tnp.__all__) + list(ttorch.__all__) if n not in rows]
    assert missing == [], f"book/api.md lacks {missing}: run python tools/api_page.py"


def test_backends_column_says_which_backend_has_each_function():
    """Read off the page, checked against the modules (not against the generator)."""
    text = _page()
    section = text.split("## Functions in both backends", 1)[1].split("\n## ", 1)[0]
    seen = {}
    for name, cells_list in _row_names(section).items():
        (cells,) = cells_list
        seen[name] = cells[1]
    for name in set(tnp.__all__) | set(tf.__all__):
        want = ", ".join(b for b, has in (("NumPy", name in tnp.__all__), ("PyTorch", name in tf.__all__)) if has)
        assert seen.get(name) == want, f"{name}: the page says {seen.get(name)!r}, the package has {want!r}"


def test_every_public_module_has_a_section():
    """Modules found on disk (not by the generator's own walk) each appear on the page."""
    text = _page()
    modules = []
    for path in sorted((ROOT / "tfbook").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue
        modules.append(".".join(parts))
    assert "tfbook.numpy" in modules and "tfbook.torch.modules" in modules
    absent = [m for m in modules
              if f"`{m}`" not in text and f"`{m.rsplit('.', 1)[-1]}`" not in text.split("tfbook.tasks", 1)[-1]]
    assert absent == [], f"modules missing from book/api.md: {absent}"


def test_tables_parse_with_one_cell_per_column():
    """A stray `|` would split a cell: every body row has as many cells as its header."""
    html = MarkdownIt("commonmark").enable("table").render(_page())
    tables = re.findall(r"<table>(.*?)</table>", html, flags=re.S)
    assert len(tables) >= 10
    for t in tables:
        width = len(re.findall(r"<th[ >]", t))
        for body_row in re.findall(r"<tr>(.*?)</tr>", t.split("<tbody>", 1)[1], flags=re.S):
            assert len(re.findall(r"<td[ >]", body_row)) == width, body_row[:200]
    # every table row of the source became a row (none fell out of its table)
    source_rows = sum(1 for line in _page().splitlines() if line.startswith("| ") and not line.startswith("| name |"))
    assert html.count("<tr>") >= source_rows - len(tables)


def test_page_is_deterministic_and_machine_free():
    text = api_page.generate()
    assert text == api_page.generate()
    assert not re.search(r"0x[0-9a-fA-F]{6,}", text), "an object address reached the page"
    assert str(ROOT) not in text and "/home/" not in text and "site-packages" not in text


def _example(X, path=SOME_PATH, *, eps=1e-5, dtype=None, **kwargs):
    """First line.

    Second paragraph, not shown."""


def test_signature_shows_defaults_as_written():
    assert api_page.signature("_example", _example) == "_example(X, path=SOME_PATH, *, eps=1e-5, dtype=None, **kwargs)"
    assert api_page.summary(sys.modules[__name__], "_example", _example) == "First line."


@pytest.mark.parametrize("rst, myst", [
    ("``Q K^T * scale`` and :func:`~tfbook.numpy.softmax`", "`Q K^T * scale` and `softmax()`"),
    ("a * b_c [x] $5 {y} <z> #", "a \\* b\\_c \\[x\\] \\$5 \\{y\\} \\<z\\> \\#"),
    ("the *Book* here", "the *Book* here"),
    ("see :class:`the loop <tfbook.torch.training.History>`", "see `the loop`"),
])
def test_rst_becomes_myst(rst, myst):
    assert api_page.rst_to_myst(rst) == myst


def test_a_pipe_stays_inside_its_cell():
    assert api_page.table(["a", "b"], [["`|x|`", "p | q"]])[2] == "| `\\|x\\|` | p \\| q |"
