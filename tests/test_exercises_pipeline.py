"""The graded-exercise pipeline end to end on chapter 0: release, then grade a folder of
deliberately broken submissions, then check the table, the feedback and that no
submission file was touched."""

from __future__ import annotations

import copy
import csv
import hashlib
import os
import stat
from pathlib import Path

import nbformat
import pytest

from tfbook import course

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "00_setup_and_notation"
MASTER = ROOT / "notebooks" / f"{CHAPTER}.ipynb"
CELL_TIMEOUT = 10  # seconds per cell: long enough for imports, short for the looping student

pytestmark = pytest.mark.skipif(not MASTER.exists(), reason="chapter 0 not written yet")


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    out = tmp_path_factory.mktemp("release")
    written = course.release(out=out, verbose=False)  # every chapter notebook
    return written


def test_release_has_stubs_and_no_secrets(released):
    assert CHAPTER in released
    for name, path in released.items():
        assert path == path.parent.parent / name / f"{name}.ipynb"
        master = nbformat.read(str(ROOT / "notebooks" / f"{name}.ipynb"), as_version=4)
        student = nbformat.read(str(path), as_version=4)
        text = course.notebook_text(student)
        secrets = course.secret_lines(master)
        assert secrets["hidden"], f"{name}: no hidden tests in the master?"
        assert secrets["solution"], f"{name}: no solutions in the master?"
        assert course.find_leaks(master, text) == [], name
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS"):
            assert marker not in text, (name, marker)
        solution_cells = [c for c in student.cells if course._nbgrader(c).get("solution")]
        assert solution_cells and all("raise NotImplementedError()" in c.source
                                      for c in solution_cells if "def " in c.source)
        assert all("# YOUR CODE HERE" in c.source for c in solution_cells)
        # no outputs at all in a student notebook (they could show solution results)
        assert not any(c.get("outputs") for c in student.cells if c.cell_type == "code")
        # the graded cells keep their points
        assert course.max_score(student) == course.max_score(master) > 0


def test_find_leaks_detects_a_leak():
    master = nbformat.read(str(MASTER), as_version=4)
    hidden = course.secret_lines(master)["hidden"][0]
    solution = course.secret_lines(master)["solution"][0]
    assert course.find_leaks(master, "print(1)") == []
    assert course.find_leaks(master, f"x\n{hidden}\n") == [f"hidden: {hidden}"]
    assert course.find_leaks(master, solution) == [f"solution: {solution}"]
    assert course.find_leaks(master, solution, kinds=("hidden",)) == []


def _solutions(master):
    return {course._nbgrader(c)["grade_id"]: c.source for c in master.cells
            if course._nbgrader(c).get("solution")}


def _answer(student, answers: dict[str, str]):
    nb = copy.deepcopy(student)
    for cell in nb.cells:
        gid = course._nbgrader(cell).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return nb


@pytest.fixture(scope="module")
def graded(released, tmp_path_factory):
    master = nbformat.read(str(MASTER), as_version=4)
    student = nbformat.read(str(released[CHAPTER]), as_version=4)
    right = _solutions(master)
    wrong_axis = right["ex0-1-softmax"].replace("axis=axis, keepdims", "axis=0, keepdims")
    assert wrong_axis != right["ex0-1-softmax"]
    loop = "def softmax(x, axis=-1):\n    while True:\n        pass\n"
    subs = tmp_path_factory.mktemp("submissions")
    notebooks = {
        "ada_correct": _answer(student, right),
        "ben_wrong": _answer(student, {**right, "ex0-1-softmax": wrong_axis,
                                       "ex0-2-prediction": "prediction = (2, 4, 5, 3)",
                                       "ex0-4-prediction": "prediction = 0.5"}),
        "cat_raises": _answer(student, {**right, "ex0-3-scores":
                                        "def scores(Q, K):\n    raise RuntimeError('not today')\n"}),
        "dan_loops": _answer(student, {**right, "ex0-1-softmax": loop}),
        "eve_syntax": _answer(student, {**right, "ex0-3-scores": "def scores(Q, K)\n    return Q\n"}),
        "gus_deleted": None,
        "hal_blank": student,  # opened and submitted without answering
    }
    deleted = _answer(student, right)
    deleted.cells = [c for c in deleted.cells
                     if course._nbgrader(c).get("grade_id") not in ("ex0-3-scores", "ex0-3-scores-tests")]
    notebooks["gus_deleted"] = deleted
    for name, nb in notebooks.items():
        path = subs / name / CHAPTER / f"{CHAPTER}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, str(path))
    raw = {
        "fay_corrupt": MASTER.read_text(encoding="utf-8")[:500],  # truncated JSON
        "ivy_empty": "",
    }
    for name, text in raw.items():
        path = subs / name / CHAPTER / f"{CHAPTER}.ipynb"
        path.parent.mkdir(parents=True)
        path.write_text(text, encoding="utf-8")
    files = sorted(p for p in subs.rglob("*") if p.is_file())
    for p in files:
        p.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)  # read-only, as the task promises
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    out = tmp_path_factory.mktemp("grades")
    rows = course.grade(subs, out=out, timeout=CELL_TIMEOUT, total_timeout=120, verbose=False)
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(subs.rglob("*"))
             if p.is_file()}
    return {"rows": rows, "out": out, "before": before, "after": after, "master": master}


def test_submissions_are_untouched(graded):
    assert graded["after"] == graded["before"]
    assert len(graded["before"]) == 9


# score, max_score, status, and a fragment the reason must contain
EXPECTED = {
    "ada_correct": (7, "graded", ""),
    "ben_wrong": (2, "graded", "ex0-1-softmax-tests"),  # only 0.3 (2 points) right
    "cat_raises": (5, "graded", "ex0-3-scores-tests"),
    "dan_loops": (4, "timeout", "longer than 10 s"),
    "eve_syntax": (5, "graded", "ex0-3-scores: SyntaxError"),
    "fay_corrupt": (0, "unreadable", "not a notebook"),
    # nbgrader 0.9 grades what is left; the deleted exercise scores 0 and the reason says so
    "gus_deleted": (5, "graded", "cells deleted: ex0-3-scores, ex0-3-scores-tests"),
    "hal_blank": (0, "graded", "ex0-4-prediction-tests"),
    "ivy_empty": (0, "unreadable", "empty file"),
}


def test_grades_csv(graded):
    with open(graded["out"] / "grades.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == course.CSV_FIELDS
    got = {r["student"]: r for r in rows}
    assert set(got) == set(EXPECTED)
    for student, (score, status, reason) in EXPECTED.items():
        r = got[student]
        assert r["assignment"] == CHAPTER
        assert (float(r["score"]), float(r["max_score"]), r["status"]) == (score, 7.0, status), r
        assert reason in r["reason"], r
    assert got["ada_correct"]["reason"] == ""


def test_feedback_has_no_hidden_tests(graded):
    master = graded["master"]
    hidden = course.secret_lines(master)["hidden"]
    pages = sorted((graded["out"] / "feedback").rglob("*.html"))
    students = {p.parts[-3] for p in pages}
    # every student who was autograded gets a page; the unreadable ones do not
    assert students == {"ada_correct", "ben_wrong", "cat_raises", "dan_loops", "eve_syntax",
                        "gus_deleted", "hal_blank"}
    for page in pages:
        assert page.name == f"{CHAPTER}.html"
        text = course.html_text(page.read_text(encoding="utf-8"))
        assert course.find_leaks(master, text, kinds=("hidden",)) == [], page
        assert not any(line in text for line in hidden), page
        assert "hidden tests: not shown" in text
    ben = course.html_text((graded["out"] / "feedback" / "ben_wrong" / CHAPTER / f"{CHAPTER}.html")
                           .read_text(encoding="utf-8"))
    assert "softmax over axis" in ben or "you normalised over axis 0" in ben  # the visible hint


def test_hide_hidden_tests_scrubs_tracebacks():
    cell = nbformat.v4.new_code_cell("check(a)\n### BEGIN HIDDEN TESTS\nassert secret_value == 42\n"
                                     "### END HIDDEN TESTS")
    cell.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="",
                                           traceback=["----> 3 assert secret_value == 42", "Err"]),
                    nbformat.v4.new_output("stream", name="stdout",
                                           text="note: assert secret_value == 42\n")]
    nb = nbformat.v4.new_notebook(cells=[cell])
    course.hide_hidden_tests(nb)
    text = course.notebook_text(nb)
    assert "secret_value" not in text
    assert "HIDDEN" not in nb.cells[0].source and course.HIDDEN_PLACEHOLDER in nb.cells[0].source
    assert nb.cells[0].outputs[0]["traceback"] == ["AssertionError: "]
