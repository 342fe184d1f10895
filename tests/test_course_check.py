"""``python -m tfbook.course check NOTEBOOK``, the students' command (issue 25): one line per
exercise labelled as the book labels it ("Exercise 0.1"), "not answered yet" for an untouched
stub, points and a total, the checks' own ✘ lines for a wrong answer, never a bare exception
or a grade id; ``--help`` explains it; released notebooks say how to check and install."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from grader_release import released_chapters

from tfbook.course import __main__ as course_main
from tfbook.course import demo as course_demo
from tfbook.course import check as course_check
from tfbook.course import rows as course_rows
from tfbook.course import release as course_release

ROOT = Path(__file__).resolve().parents[1]
CH0 = course_demo.CH0
MASTER = ROOT / "notebooks" / f"{CH0}.ipynb"

pytestmark = pytest.mark.skipif(not MASTER.exists(), reason="chapter 0 not written yet")


@pytest.fixture(scope="module")
def released():
    return released_chapters()[CH0]


def _check(path, capsys) -> tuple[int, str]:
    failed = course_check.check_notebook(path, timeout=60)
    return failed, capsys.readouterr().out


def test_a_fresh_notebook_is_not_answered_yet(released, capsys):
    failed, out = _check(released, capsys)
    assert failed == 4
    for n, points in (("0.1", 3), ("0.2", 1), ("0.3", 2), ("0.4", 1)):
        assert f"Exercise {n}: not answered yet (0/{points} points)" in out, out
    assert "Total: 0/7 points from the visible checks; 4 not answered yet" in out
    for raw in ("NotImplementedError", "NameError", "prediction_0_2", "ex0-1-softmax-tests", "Traceback"):
        assert raw not in out, raw


def test_points_total_and_diagnosis(released, tmp_path, capsys):
    master = nbformat.read(str(MASTER), as_version=4)
    right = course_demo.solutions(master)
    wrong_axis = right["ex0-1-softmax"].replace("axis=axis, keepdims", "axis=0, keepdims")
    assert wrong_axis != right["ex0-1-softmax"]
    student = nbformat.read(str(released), as_version=4)
    nb = course_demo._answer(student, {"ex0-1-softmax": wrong_axis, "ex0-2-prediction": right["ex0-2-prediction"],
                                       "ex0-3-scores": right["ex0-3-scores"]})
    path = tmp_path / f"{CH0}.ipynb"
    nbformat.write(nb, str(path))
    failed, out = _check(path, capsys)
    assert failed == 2, out
    lines = out.splitlines()
    assert "Exercise 0.1: 0/3 points" in lines and "Exercise 0.2: 1/1 points" in lines
    assert "Exercise 0.3: 2/2 points" in lines and "Exercise 0.4: not answered yet (0/1 points)" in lines
    after = lines[lines.index("Exercise 0.1: 0/3 points") + 1:]
    assert after[0].strip().startswith("✘") and "axis" in after[0]  # the checks' own diagnosis
    assert "Total: 3/7 points from the visible checks; 1 not answered yet" in out
    assert "ex0-" not in out and "NotImplementedError" not in out


def test_diagnosis_without_a_cross_is_a_sentence():
    rec = {"status": "error", "ename": "NameError", "evalue": "name 'prediction_0_2' is not defined", "out": ""}
    assert course_check._check_diagnosis(rec, None, 60) == \
        "✘ `prediction_0_2` is not defined: run your answer cell (and the cells above it) first"
    rec = {"status": "error", "ename": "LEAKX_1_2", "evalue": "x", "out": ""}
    assert "LEAKX" not in course_check._check_diagnosis(rec, None, 60)
    assert "answer cell raised SyntaxError" in course_check._check_diagnosis(
        {"status": "error", "ename": "NameError", "evalue": "", "out": ""},
        {"status": "error", "ename": "SyntaxError"}, 60)
    rec["out"] = "✔ shape\n✘ softmax: rows do not sum to 1\n"
    assert course_check._check_diagnosis(rec, None, 60) == "✘ softmax: rows do not sum to 1"


def test_exercise_labels():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("### Exercise 12.3 (predict): x"),
                                         nbformat.v4.new_code_cell("a"), nbformat.v4.new_code_cell("b")])
    assert course_rows.exercise_label(nb, 2, "ex12-3-x-tests") == "Exercise 12.3"
    assert course_rows.exercise_label(nb, 0, "exA-2-longest-fit-tests") == "Exercise A.2"
    assert course_rows.exercise_label(nb, 0, "odd") == "test cell 1"


def test_help_explains(capsys):
    with pytest.raises(SystemExit):
        course_main.main(["check", "--help"])
    out = capsys.readouterr().out
    for words in ("not answered yet", "hidden tests", "Total:", "Exit status"):
        assert words in out, words
    with pytest.raises(SystemExit):
        course_main.main(["--help"])
    assert "python -m tfbook.course check NOTEBOOK" in capsys.readouterr().out


def test_released_notebook_says_how_to_check_and_install(released):
    nb = nbformat.read(str(released), as_version=4)
    howto = next(c for c in nb.cells if c.get("id") == course_release.HOWTO_ID)
    assert f"python -m tfbook.course check {CH0}.ipynb" in howto.source
    install = next(c for c in nb.cells if c.get("id") == course_release.INSTALL_ID)
    assert '"google.colab" in sys.modules' in install.source
    assert "%pip install" in install.source and "tfbook[book,check]" in install.source
    assert nb.cells.index(howto) == 1 and nb.cells.index(install) == 2  # right after the title
    master = nbformat.read(str(MASTER), as_version=4)
    assert course_release.find_leaks(master, course_release.notebook_text(nb)) == []
    # an instructor's own requirement (a wheel, when the repository must stay private)
    mine = course_release.add_student_cells(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t")]),
                                            CH0, "https://example.org/tfbook-0.1.0-py3-none-any.whl")
    assert "tfbook-0.1.0-py3-none-any.whl" in mine.cells[2].source
