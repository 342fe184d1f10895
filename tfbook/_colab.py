"""The Colab install snippet that starts the first code cell of every chapter, and the
"Open in Colab" link under each chapter's title.

On Colab (which has NumPy, PyTorch and Matplotlib but not tfbook) it installs the book's
package from the repository; elsewhere it does nothing and prints nothing.
``tools/colab_cell.py`` writes it into the notebooks; the course edition of the book and
the released student notebooks drop it (:func:`strip_snippet`), since it names the
repository, which holds the solutions.
"""

from __future__ import annotations

MARKER = "# On Colab only: install the book's package"
TEMPLATE = (
    MARKER + " (does nothing elsewhere)\n"
    "import sys\n"
    'if "google.colab" in sys.modules:\n'
    '    %pip install --quiet "tfbook[book] @ git+{url}@{branch}"\n'
)


def snippet(url: str, branch: str) -> str:
    """The snippet for the repository ``url`` and ``branch``."""
    return TEMPLATE.format(url=url, branch=branch)


def strip_snippet(source: str) -> str:
    """``source`` without a leading snippet (any version of it) and the blank line after it."""
    lines = source.splitlines(keepends=True)
    if not lines or not lines[0].startswith(MARKER):
        return source
    for i, line in enumerate(lines):
        if line.lstrip().startswith("%pip install"):
            rest = lines[i + 1:]
            if rest and not rest[0].strip():
                rest = rest[1:]
            return "".join(rest)
    return source  # a marker without its install line: not ours, leave it


BADGE_MARKER = "<!-- tfbook: open in Colab -->"
BADGE_TEMPLATE = (BADGE_MARKER + "\n"
                  "[Open this chapter in Google Colab]({colab}/github/{owner_repo}/blob/{branch}/{path})"
                  " (runs in the browser; the first code cell installs the book's package there).")


def badge(url: str, branch: str, path: str, colab: str = "https://colab.research.google.com") -> str:
    """The markdown of the Colab link for the notebook at ``path`` (relative to the repository's
    root) of the GitHub repository ``url``: a plain link, no image (the book loads nothing from
    another host)."""
    owner_repo = url.removeprefix("https://github.com/").strip("/")
    return BADGE_TEMPLATE.format(colab=colab.rstrip("/"), owner_repo=owner_repo, branch=branch, path=path)


def is_badge_cell(cell) -> bool:
    """Whether a notebook cell is the Colab link cell written by ``tools/colab_cell.py``."""
    return cell.get("cell_type") == "markdown" and str(cell.get("source", "")).startswith(BADGE_MARKER)


def strip_badge(nb) -> None:
    """Drop the Colab link cell from ``nb`` (in place): the web editions have launch buttons, and
    the course edition and released notebooks must not link to the repository."""
    nb.cells = [c for c in nb.cells if not is_badge_cell(c)]
