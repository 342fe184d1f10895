"""Make the first code cell of every chapter start with the Colab install snippet, and put an
"Open in Colab" link under each chapter's title (a markdown cell, id ``colab-link``).

The rocket button of a chapter opens the notebook in Google Colab, which has NumPy,
PyTorch and Matplotlib but not tfbook. The snippet installs the book's package there
(from the repository and branch under ``repository:`` in ``_config.yml``) and does
nothing anywhere else: it prints nothing, so the stored outputs and nbval are
unaffected. Usage (re-execute nothing; the outputs of the cell stay valid)::

    python tools/colab_cell.py                  # every notebooks/*.ipynb
    python tools/colab_cell.py notebooks/03_why_scale.ipynb --config _config.yml
    python tools/colab_cell.py --check          # exit 1 if a notebook lacks the current snippet

Idempotent: a snippet already there (recognised by its first line, up to its
``%pip install`` line) is replaced by the current one, never added twice; a snippet
found in any other code cell is removed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout: the package next to tools/
from tfbook._colab import MARKER, badge, is_badge_cell, snippet, strip_snippet  # noqa: E402,F401  (MARKER: for the tests)


def repository(config: Path = ROOT / "_config.yml") -> tuple[str, str]:
    """``(url, branch)`` from the ``repository:`` section of ``_config.yml``."""
    repo = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("repository") or {}
    url, branch = str(repo.get("url") or "").strip().rstrip("/"), str(repo.get("branch") or "main").strip()
    if not url.startswith("https://"):
        raise SystemExit(f"{config}: repository.url must be an https URL, got {url!r}")
    return url, branch


def apply(nb, text: str) -> bool:
    """Put ``text`` at the top of the first code cell of ``nb``; True if ``nb`` changed."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    if not code:
        return False
    before = [c.source for c in code]
    for cell in code:
        cell.source = strip_snippet(cell.source)
    rest = code[0].source
    code[0].source = text.rstrip("\n") + ("\n\n" + rest if rest.strip() else "")
    return [c.source for c in code] != before


def apply_badge(nb, text: str) -> bool:
    """Put the Colab link cell ``text`` right after the first cell (the title); True if changed."""
    import nbformat

    old = [c for c in nb.cells if is_badge_cell(c)]
    if len(old) == 1 and nb.cells.index(old[0]) == 1 and old[0].source == text:
        return False
    nb.cells = [c for c in nb.cells if not is_badge_cell(c)]
    cell = nbformat.v4.new_markdown_cell(text)
    cell.id = "colab-link"
    nb.cells.insert(1, cell)
    return True


def has_badge(nb, text: str) -> bool:
    return len(nb.cells) > 1 and is_badge_cell(nb.cells[1]) and nb.cells[1].source == text


def has_snippet(nb, text: str) -> bool:
    code = [c for c in nb.cells if c.cell_type == "code"]
    return bool(code) and code[0].source.startswith(text.rstrip("\n"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--config", type=Path, default=ROOT / "_config.yml")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook lacks it")
    args = parser.parse_args(argv)
    url, branch = repository(args.config)
    text = snippet(url, branch)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    bad = []
    for path in paths:
        nb = nbformat.read(str(path), as_version=4)
        link = badge(url, branch, f"notebooks/{Path(path).name}")  # where the chapter lives in the repository
        if args.check:
            if not (has_snippet(nb, text) and has_badge(nb, link)):
                bad.append(path)
        elif apply(nb, text) | apply_badge(nb, link):
            nbformat.write(nb, str(path))
            print(f"updated {path}")
    for path in bad:
        print(f"{path}: the first code cell does not start with the Colab snippet, or the Colab link "
              f"does not follow the title (run python tools/colab_cell.py)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
