"""The Colab install snippet that starts the first code cell of every chapter.

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
