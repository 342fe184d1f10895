"""The package reference page (book/api.md) is generated from the package and up to date.

`python tools/api_page.py` writes it; `--check` fails when the committed page differs from
what the package gives now (a new function, a changed signature or docstring). The tests
below also read the page itself, without the generator, to show that every public name of
both backends is on it, that each function says truly which backends have it, and that every
entry renders as a term and its definition.
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


@pytest.fixture(scope="module")
def generated() -> str:
    """The page as the package gives it now (generating takes seconds: import it once)."""
    return api_page.generate()


def _page() -> str:
    return PAGE.read_text(encoding="utf-8")


def _entries(text: str) -> dict[str, list[str]]:
    """Name -> the definitions of the list entries whose term (a code span) starts with it."""
    lines = text.splitlines()
    entries: dict[str, list[str]] = {}
    for term, definition in zip(lines, lines[1:]):
        m = re.match(r"`(?:class )?([A-Za-z_][A-Za-z0-9_.]*)", term)
        if m and definition.startswith(": "):
            entries.setdefault(m.group(1), []).append(definition[2:])
    return entries


def test_check_passes_on_the_committed_page():
    """The CLI a contributor runs: exit 0, or a message saying which command fixes it."""
    out = subprocess.run([sys.executable, str(TOOL), "--check"], cwd=ROOT, capture_output=True, text=True,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, f"book/api.md is stale:\n{out.stderr}"


@pytest.mark.parametrize("mutation", ["delete a definition", "edit a summary", "drop the last newline"])
def test_check_fails_on_a_changed_page(tmp_path, capsys, monkeypatch, generated, mutation):
    """The check can fail: a page with one line gone (or changed) is refused, with the fix named."""
    monkeypatch.setattr(api_page, "generate", lambda: generated)
    lines = generated.split("\n")
    row = next(i for i, line in enumerate(lines) if line.startswith("`rope(")) + 1  # its definition
    if mutation == "delete a definition":
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
    entries = _entries(_page())
    missing = [n for n in list(tnp.__all__) + list(ttorch.__all__) if n not in entries]
    assert missing == [], f"book/api.md lacks {missing}: run python tools/api_page.py"


def test_each_function_says_which_backends_have_it():
    """Read off the page, checked against the modules (not against the generator)."""
    text = _page()
    section = text.split("## Functions in both backends", 1)[1].split("\n## ", 1)[0]
    said = {name: defs[0].split(".*", 1)[0] + ".*" for name, defs in _entries(section).items()}
    assert len(said) == len(_entries(section)) and all(len(d) == 1 for d in _entries(section).values())
    for name in set(tnp.__all__) | set(tf.__all__):
        want = {(True, True): "*NumPy and PyTorch.*", (True, False): "*NumPy only.*",
                (False, True): "*PyTorch only.*"}[name in tnp.__all__, name in tf.__all__]
        assert said.get(name) == want, f"{name}: the page says {said.get(name)!r}, the package has {want!r}"


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
    headings = set(re.findall(r"^## (\S+)$", text, flags=re.M))
    terms = set(re.findall(r"^`(tfbook[\w.]*)`$", text, flags=re.M))  # task and course modules
    # the backends' function modules and tfbook.torch (which re-exports) make up the section
    # "Functions in both backends", whose completeness the name tests above check
    backends = {"tfbook.numpy", "tfbook.torch", "tfbook.torch.functional"}
    assert all(f"`{m}`" in text.split("## Functions in both backends", 1)[1][:800] for m in backends)
    absent = [m for m in modules if m not in headings | terms | backends]
    assert absent == [], f"modules missing from book/api.md: {absent}"


def test_every_entry_renders_as_a_term_and_its_definition():
    """MyST's own parser (markdown-it with the deflist plugin): one <dt> with a code span and
    one <dd> per entry, and no markup character of a docstring left as a visible backslash."""
    from mdit_py_plugins.deflist import deflist_plugin

    text = _page()
    html = MarkdownIt("commonmark").use(deflist_plugin).render(text)
    terms = sum(len(v) for v in _entries(text).values())
    assert terms > 100
    assert html.count("<dt>") == html.count("<dd>") >= terms
    assert len(re.findall(r"<dt><code>", html)) == html.count("<dt>")
    prose = re.sub(r"<code>.*?</code>", "", html, flags=re.S)
    assert not re.search(r"\\[^\sA-Za-z0-9]", prose), re.search(r".{40}\\[^\sA-Za-z0-9].{40}", prose)


def test_page_is_deterministic_and_machine_free(generated):
    text = api_page.generate()
    assert text == generated
    assert not re.search(r"0x[0-9a-fA-F]{6,}", text), "an object address reached the page"
    assert str(ROOT) not in text and "/home/" not in text and "site-packages" not in text


def _example(X, path=SOME_PATH, *, eps=1e-5, dtype=None, **kwargs):
    """First line.

    Second paragraph, not shown."""


def test_all_naming_a_missing_object_stops_the_generator():
    import types

    with pytest.raises(SystemExit, match="lists 'ghost'"):
        api_page.member(types.ModuleType("tfbook.fake"), "ghost")


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


def test_a_definition_never_opens_a_block():
    assert api_page.definitions([("`f()`", "- not a list")]) == ["`f()`", ": \\- not a list", ""]
    assert api_page.definitions([("`f()`", "1. not a list")])[1] == ": 1\\. not a list"
