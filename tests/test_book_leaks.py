"""No solution reaches the course site; no hidden test reaches either site.

The master notebooks in notebooks/ hold the solutions (between ``### BEGIN SOLUTION``
and ``### END SOLUTION`` in solution cells) and the hidden tests (between ``### BEGIN
HIDDEN TESTS`` and ``### END HIDDEN TESTS``). Every line of those regions that does
not also appear in the visible part of the notebooks is searched for in every text
file of the built sites (pages, the downloadable notebooks, sources), after stripping
HTML tags and collapsing whitespace. Lines shorter than MIN_CHARS are skipped: a bare
``return Z`` says nothing about a solution and may well appear in the text.
"""

from __future__ import annotations

import html
import json
import os
import re
from functools import lru_cache
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = Path(os.environ.get("TFBOOK_NOTEBOOKS", ROOT / "notebooks"))
SITES = {"public": ROOT / "_build" / "html", "course": ROOT / "_build" / "course" / "html"}
TEXT_SUFFIXES = {".html", ".ipynb", ".md", ".txt", ".py", ".js", ".json"}
MIN_CHARS = 12  # non-blank characters a line needs to count as evidence of a leak
REGIONS = {
    "solution": ("BEGIN SOLUTION", "END SOLUTION"),
    "hidden test": ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS"),
}


def squash(text: str) -> str:
    return " ".join(text.split())


def split_regions(source: str, begin: str, end: str) -> tuple[list[str], list[str]]:
    """Lines inside begin/end marker regions, and the lines outside them."""
    inside, outside, in_region = [], [], False
    for line in source.splitlines():
        if begin in line:
            in_region = True
        elif end in line:
            in_region = False
        elif in_region:
            inside.append(line)
        else:
            outside.append(line)
    return inside, outside


@lru_cache(maxsize=None)
def secret_lines() -> dict[str, list[tuple[str, str]]]:
    """{"solution": [(notebook, line)], "hidden test": [...]}: lines that must not leak."""
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    if not paths:
        pytest.fail(f"no notebooks in {NOTEBOOKS}")
    secret: dict[str, list[tuple[str, str]]] = {kind: [] for kind in REGIONS}
    visible: set[str] = set()
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            source = cell.source
            is_solution = cell.get("metadata", {}).get("nbgrader", {}).get("solution", False)
            sol, rest = split_regions(source, *REGIONS["solution"])
            if is_solution and not sol and "BEGIN SOLUTION" not in source:
                sol, rest = source.splitlines(), []  # a whole-cell solution (nbgrader stubs it all)
            hidden, rest = split_regions("\n".join(rest), *REGIONS["hidden test"])
            secret["solution"] += [(path.name, line) for line in sol]
            secret["hidden test"] += [(path.name, line) for line in hidden]
            visible.update(squash(line) for line in rest)
            for output in cell.get("outputs", []):  # outputs are shown in the public book
                text = output.get("text") or output.get("data", {}).get("text/plain") or ""
                visible.update(squash(line) for line in "".join(text).splitlines())
    # The search below matches substrings of a page, so a secret line that is a substring
    # of a visible line (e.g. the same code with a trailing comment in the chapter's own
    # "Build it" cell) is visible too, not evidence of a leak.
    visible_text = "\n".join(visible)
    return {
        kind: [(nb, squash(line)) for nb, line in lines
               if len(squash(line).replace(" ", "")) >= MIN_CHARS and squash(line) not in visible_text]
        for kind, lines in secret.items()
    }


def text_of(path: Path) -> str:
    raw = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".html":
        raw = re.sub(r"<(script|style)\b.*?</\1>", " ", raw, flags=re.S | re.I)
        raw = html.unescape(re.sub(r"<[^>]+>", "", raw))
    elif path.suffix == ".ipynb":
        nb = json.loads(raw)
        parts = []
        for cell in nb.get("cells", []):
            parts.append("".join(cell.get("source", "")))
            for output in cell.get("outputs", []):
                parts.append("".join(output.get("text", "")))
                parts.extend("".join(v) for v in output.get("data", {}).values() if isinstance(v, (str, list)))
        raw = "\n".join(parts)
    return squash(raw)


@lru_cache(maxsize=None)
def site_texts(edition: str) -> dict[str, str]:
    site = SITES[edition]
    if not (site / "index.html").is_file():
        pytest.fail(f"{site}/index.html is missing: the {edition} book build failed or did not run")
    return {str(p.relative_to(site)): text_of(p)
            for p in sorted(site.rglob("*")) if p.is_file() and p.suffix in TEXT_SUFFIXES
            and "_static" not in p.parts}


def leaks(edition: str, kind: str) -> list[str]:
    found = []
    for page, text in site_texts(edition).items():
        for notebook, line in secret_lines()[kind]:
            if line in text:
                found.append(f"{page}: {kind} line from {notebook}: {line!r}")
    return found


def test_the_notebooks_have_secrets_to_protect():
    """Without solution and hidden-test lines the leak tests below could not fail."""
    secrets = secret_lines()
    assert secrets["solution"], "no solution lines found in the notebooks' solution cells"
    assert secrets["hidden test"], "no hidden-test lines found in the notebooks' test cells"


def test_public_book_shows_the_solutions():
    """Positive control: the same search finds the solutions where they belong."""
    texts = site_texts("public")
    rendered = [(nb, line) for nb, line in secret_lines()["solution"]
                if f"notebooks/{Path(nb).stem}.html" in texts]  # chapters listed in _toc.yml
    assert rendered, "no chapter with exercises is in the public book"
    missing = [line for nb, line in rendered
               if line not in texts[f"notebooks/{Path(nb).stem}.html"]]
    assert not missing, f"solution lines not found in the public book: {missing[:5]}"


@pytest.mark.parametrize("edition", ["public", "course"])
def test_no_hidden_tests_in_any_page(edition):
    found = leaks(edition, "hidden test")
    assert found == [], "\n".join(found[:20])


def test_no_solutions_in_the_course_book():
    found = leaks("course", "solution")
    assert found == [], "\n".join(found[:20])


def _repository_url() -> str:
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    return str(config["repository"]["url"]).rstrip("/")


def test_course_book_does_not_name_the_repository():
    """The repository holds the solutions: no course page or download links to it (the
    Colab snippet of the first code cell is stripped there); the public book does."""
    url = _repository_url().split("://", 1)[1]          # also catches git+https://...
    course = [page for page, text in site_texts("course").items() if url in text]
    assert course == [], f"{len(course)} course pages name {url}: {course[:5]}"
    assert any(url in text for text in site_texts("public").values()), \
        f"positive control: the public book should name {url}"


def test_leak_search_can_fail(tmp_path):
    """A page with a hidden-test line in highlighted HTML is caught."""
    page = tmp_path / "p.html"
    page.write_text('<pre><span class="n">_h</span> <span class="o">=</span> '
                    '<span class="n">np</span>.array([[1e4, -1e4]])</pre>', encoding="utf-8")
    assert squash("_h = np.array([[1e4, -1e4]])") in text_of(page)
    inside, outside = split_regions("a\n### BEGIN HIDDEN TESTS\nsecret\n### END HIDDEN TESTS\nb",
                                    *REGIONS["hidden test"])
    assert (inside, outside) == (["secret"], ["a", "b"])
