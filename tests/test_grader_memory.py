"""A test cell that measures the memory of the student's call (chapter 17's exercise 17.1 asks
for attention by key blocks, never the whole T x T score matrix) is judged on the memory the
student's function used in the sandbox, not on the memory of the grader's replay.

The replay returns recorded values, so a tracemalloc measurement around it sees almost nothing:
before the sandbox measured each such call, a full-matrix answer with the right values scored
full marks. Now the driver measures the call's peak (``tracemalloc``) and the replay allocates
the same number of bytes once."""

from __future__ import annotations

import nbformat
import pytest

from tfbook.course import (
    demo as course_demo,
    grade as course_grade,
    judge as course_judge,
    release as course_release,
    sandbox as course_sandbox,
)

CH17 = "17_efficient_attention"
GID = "ex17-1-attention-by-blocks"

FULL_MATRIX = '''def attention_by_blocks(Q, K, V, block_size):
    S = Q @ K.T / math.sqrt(Q.shape[-1])      # the whole (T_q, T_k) matrix at once: right values
    P = np.exp(S - S.max(axis=1, keepdims=True))
    return (P / P.sum(axis=1, keepdims=True)) @ V
'''


def test_the_memory_measuring_cells_are_found():
    plan = course_judge.Judge(course_release.NOTEBOOKS / f"{CH17}.ipynb").plan
    assert course_judge.memory_measuring_tests(plan) == [f"{GID}-tests"]


def test_a_full_matrix_answer_loses_the_memory_points(tmp_path):
    if course_sandbox.available():
        pytest.skip(course_sandbox.available())
    released = course_release.release([course_release.NOTEBOOKS / f"{CH17}.ipynb"], out=tmp_path / "rel", verbose=False)
    master = nbformat.read(str(course_release.NOTEBOOKS / f"{CH17}.ipynb"), as_version=4)
    student = nbformat.read(str(released[CH17]), as_version=4)
    right = course_demo.solutions(master)
    course_demo._write(tmp_path / "subs", "blocks", CH17, course_demo._answer(student, right))
    course_demo._write(tmp_path / "subs", "full_matrix", CH17,
                       course_demo._answer(student, {**right, GID: FULL_MATRIX}))
    rows = {r.student: r for r in course_grade.grade(tmp_path / "subs", out=tmp_path / "out", timeout=120,
                                               total_timeout=600, verbose=False)}
    points = next(float(course_release._nbgrader(c)["points"]) for c in master.cells
                  if course_release._nbgrader(c).get("grade_id") == f"{GID}-tests")
    assert (rows["blocks"].score, rows["blocks"].status) == (rows["blocks"].max_score, "graded")
    assert rows["full_matrix"].score == rows["full_matrix"].max_score - points, rows["full_matrix"].reason
    assert f"{GID}-tests" in rows["full_matrix"].reason and "MiB" in rows["full_matrix"].reason
