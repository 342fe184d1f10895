"""A submission's row: the record that grades.csv, rows.json and the feedback page are written
from (:class:`Row`), and the words its reason uses for exercises and cells ("Exercise 0.1",
"cell 4 (ex0-1-softmax)").

Filled by :mod:`tfbook.course.submission` (one graded notebook) and :mod:`tfbook.course.collect`
(a row that cannot be graded, with its status and reason)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tfbook.course import judge as judge_mod


@dataclass
class Row:
    student: str
    assignment: str
    score: float = 0.0
    max_score: float = 0.0
    status: str = "graded"
    reason: str = ""
    notebook: Path | None = field(default=None, repr=False)
    exercises: list = field(default_factory=list, repr=False)  # per test cell: dicts
    cells: dict = field(default_factory=dict, repr=False)  # submission index -> record
    seconds: float = 0.0
    attempts: int = 0


NO_ASSIGNMENT = "(none)"  # a row about a student's whole folder


_EXERCISE = re.compile(r"Exercise\s+([0-9A-Z]+\.\d+)")


def test_label(t) -> str:
    """"Exercise 0.1": the exercise as the book names it (its heading, else its grade id's numbers)."""
    m = _EXERCISE.search(t.task or "")
    if m:
        return f"Exercise {m.group(1)}"
    m = re.match(r"ex([0-9A-Za-z]+)-(\d+)-", t.gid or "")
    return f"Exercise {m.group(1)}.{m.group(2)}" if m else t.gid


def exercise_label(nb, index: int, gid: str | None) -> str:
    """"Exercise 0.1" for the test cell at ``index``: from the last heading above it that names
    an exercise, else from its grade id (ex0-1-...), else "test cell N"."""
    for cell in reversed(nb.cells[:index]):
        if cell.cell_type == "markdown":
            heads = [l for l in cell.source.splitlines() if l.lstrip().startswith("#")]
            for line in reversed(heads):
                m = _EXERCISE.search(line)
                if m:
                    return f"Exercise {m.group(1)}"
    m = re.match(r"ex([0-9A-Za-z]+)-(\d+)-", gid or "")
    return f"Exercise {m.group(1)}.{m.group(2)}" if m else f"test cell {index + 1}"


def first_cross(text: str) -> str:
    for line in (text or "").splitlines():
        if line.startswith("✘"):
            return line[:240]
    return ""


def cell_label(cell: dict | None, sub, index, known=()) -> str:
    if isinstance(index, int) and index < len(sub.cells):
        gid = judge_mod._nbgrader(sub.cells[index]).get("grade_id")
        known = gid if isinstance(gid, str) and gid in known else None  # never a made-up id
        return f"cell {index + 1}" + (f" ({known})" if known else "")
    if cell and cell.get("gid"):
        return f"test {cell['gid']}"
    return "a cell"


__all__ = ["Row", "NO_ASSIGNMENT", "test_label", "exercise_label", "cell_label", "first_cross"]
