"""Build chapter notebooks from a Python script.

A chapter author writes a short script that lists the cells, in order, and
saves the notebook; then runs ``tools/execute_notebooks.py`` on it. Example::

    import sys; sys.path.insert(0, "tools")
    from nbauthor import Notebook

    nb = Notebook()
    nb.md("# 2. Attention as a weighted average\\n\\nWhy is ...?")
    nb.code("import numpy as np")
    nb.md("## Exercises")
    nb.solution("ex1-softmax", '''
        def softmax(x, axis=-1):
            ### BEGIN SOLUTION
            ...
            ### END SOLUTION
    ''')
    nb.tests("ex1-softmax-tests", points=2, source='''
        from tfbook.checks import check_softmax
        check_softmax(softmax)
        ### BEGIN HIDDEN TESTS
        ...
        ### END HIDDEN TESTS
    ''')
    nb.save("notebooks/02_attention_as_averaging.ipynb")

Every cell gets a stable id (so regenerating a notebook gives a small diff),
and every nbgrader cell gets the metadata the course pipeline expects
(``schema_version: 3``; see CONTRIBUTING.md). Sources are dedented and
stripped, so triple-quoted strings can be indented like the script.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NBGRADER_SCHEMA = 3
SOLUTION_BEGIN, SOLUTION_END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
NBVAL_IGNORE = "# NBVAL_IGNORE_OUTPUT"

_GRADE_ID = re.compile(r"^[A-Za-z0-9_-]+$")


def _clean(source: str) -> str:
    return textwrap.dedent(source).strip("\n").rstrip()


def markdown(source: str, **metadata) -> nbformat.NotebookNode:
    """A markdown cell."""
    cell = new_markdown_cell(_clean(source))
    cell.metadata.update(metadata)
    return cell


def code(source: str, tags: list[str] | None = None, ignore_output: bool = False,
         **metadata) -> nbformat.NotebookNode:
    """A plain code cell.

    ``ignore_output=True`` puts ``# NBVAL_IGNORE_OUTPUT`` on the first line (use it
    for output that varies run to run: timings, device names). ``tags`` become cell
    tags, e.g. ``["raises-exception"]`` for a cell that raises on purpose.
    """
    source = _clean(source)
    if ignore_output and not source.startswith(NBVAL_IGNORE):
        source = f"{NBVAL_IGNORE}\n{source}"
    cell = new_code_cell(source)
    if tags:
        cell.metadata["tags"] = list(tags)
    cell.metadata.update(metadata)
    return cell


def _check_grade_id(grade_id: str) -> None:
    if not _GRADE_ID.match(grade_id):
        raise ValueError(f"grade_id={grade_id!r}: use letters, digits, '-' and '_' only")


def solution(grade_id: str, source: str) -> nbformat.NotebookNode:
    """An autograded answer cell: the student's code goes here.

    The reference answer must sit between ``### BEGIN SOLUTION`` and
    ``### END SOLUTION``; nbgrader replaces that region with
    ``# YOUR CODE HERE`` / ``raise NotImplementedError()`` in the student copy.
    """
    _check_grade_id(grade_id)
    source = _clean(source)
    if SOLUTION_BEGIN not in source or SOLUTION_END not in source:
        raise ValueError(f"solution cell {grade_id!r} needs {SOLUTION_BEGIN!r} ... {SOLUTION_END!r}")
    cell = new_code_cell(source)
    cell.metadata["nbgrader"] = {
        "schema_version": NBGRADER_SCHEMA,
        "solution": True,
        "grade": False,
        "locked": False,
        "task": False,
        "grade_id": grade_id,
    }
    return cell


def tests(grade_id: str, source: str, points: int | float = 1,
          require_hidden: bool = True) -> nbformat.NotebookNode:
    """An autograder test cell worth ``points``.

    Visible tests come first (they call ``tfbook.checks`` helpers); hidden tests sit
    between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS`` and never reach a
    student notebook, the rendered book, or a feedback page.
    """
    _check_grade_id(grade_id)
    if not points > 0:
        raise ValueError(f"test cell {grade_id!r}: points must be positive, got {points!r}")
    source = _clean(source)
    has_begin, has_end = HIDDEN_BEGIN in source, HIDDEN_END in source
    if has_begin != has_end:
        raise ValueError(f"test cell {grade_id!r}: unbalanced hidden-test markers")
    if require_hidden and not has_begin:
        raise ValueError(f"test cell {grade_id!r} has no hidden tests (pass require_hidden=False "
                         "if that is intended)")
    if SOLUTION_BEGIN in source:
        raise ValueError(f"test cell {grade_id!r} contains a solution region")
    cell = new_code_cell(source)
    cell.metadata["nbgrader"] = {
        "schema_version": NBGRADER_SCHEMA,
        "solution": False,
        "grade": True,
        "locked": True,
        "points": points,
        "grade_id": grade_id,
    }
    return cell



def _kernel_metadata(kernel: str) -> dict:
    """``tools/execute_notebooks.py``'s kernel metadata (imported from beside this file)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_execute_notebooks", Path(__file__).with_name("execute_notebooks.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.kernel_metadata(kernel)

class Notebook:
    """An ordered list of cells with one method per cell kind, saved with stable ids."""

    def __init__(self, kernel: str = "python3"):
        self.cells: list[nbformat.NotebookNode] = []
        self.kernel = kernel

    def md(self, source: str, **metadata):
        self.cells.append(markdown(source, **metadata))
        return self

    def code(self, source: str, tags: list[str] | None = None, ignore_output: bool = False,
             **metadata):
        self.cells.append(code(source, tags=tags, ignore_output=ignore_output, **metadata))
        return self

    def solution(self, grade_id: str, source: str):
        self.cells.append(solution(grade_id, source))
        return self

    def tests(self, grade_id: str, source: str, points: int | float = 1,
              require_hidden: bool = True):
        self.cells.append(tests(grade_id, source, points=points, require_hidden=require_hidden))
        return self

    def build(self) -> nbformat.NotebookNode:
        """Return the notebook: stable cell ids, unique grade ids, validated."""
        seen: set[str] = set()
        for i, cell in enumerate(self.cells):
            meta = cell.metadata.get("nbgrader")
            if meta:
                gid = meta["grade_id"]
                if gid in seen:
                    raise ValueError(f"grade_id {gid!r} is used twice")
                seen.add(gid)
                cell["id"] = gid
            else:
                cell["id"] = f"c{i:03d}"
        nb = new_notebook(cells=self.cells)
        # the metadata JupyterLab and tools/execute_notebooks.py write (display name
        # "Python 3 (ipykernel)", the kernel's own spec), so that a new chapter passes
        # tests/test_notebook_metadata.py before it is first executed
        nb.metadata.update(_kernel_metadata(self.kernel))
        nbformat.validate(nb)
        return nb

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(self.build(), str(path))
        return path
