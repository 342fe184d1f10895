"""Every chapter's own solutions, submitted as a student's notebook, score full marks with
the sandboxed grader: the record-and-replay judge handles every exercise of the book with
no per-exercise code. Slow (every chapter notebook runs twice: in its judge and in its
sandbox), so it runs when TFBOOK_GRADE_ALL=1 (e.g. before a course starts, or after a
chapter gained an exercise)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

from tfbook.course import (
    demo as course_demo,
    grade as course_grade,
    release as course_release,
    sandbox as course_sandbox,
)

pytestmark = pytest.mark.skipif(os.environ.get("TFBOOK_GRADE_ALL") != "1",
                                reason="slow: set TFBOOK_GRADE_ALL=1")


def test_every_chapters_solutions_score_full_marks(tmp_path):
    if course_sandbox.available():
        pytest.skip(course_sandbox.available())
    released = course_release.release(out=tmp_path / "rel", verbose=False)
    for a, path in released.items():
        master = nbformat.read(str(course_release.NOTEBOOKS / f"{a}.ipynb"), as_version=4)
        nb = course_demo._answer(nbformat.read(str(path), as_version=4), course_demo.solutions(master))
        course_demo._write(tmp_path / "subs", "solutions", a, nb)
    rows = course_grade.grade(tmp_path / "subs", out=tmp_path / "out", timeout=120, total_timeout=900,
                        verbose=False)
    assert len(rows) == len(released) >= 17
    bad = [(r.assignment, r.score, r.max_score, r.status, r.reason) for r in rows
           if (r.score, r.status) != (r.max_score, "graded")]
    assert bad == []
