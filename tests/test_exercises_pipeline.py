"""The graded-exercise pipeline end to end: release every chapter, then grade a generated
class (tfbook/course/demo.py) of honest, broken, cheating and attacking submissions, each
in its bubblewrap sandbox, and check every row of grades.csv, the feedback pages, the
per-exercise table, that no submission changed on disk, that no process was left behind
and that nothing was written outside the sandboxes' scratch folders."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import socket
import stat
import statistics
import time
import uuid
from pathlib import Path

import nbformat
import numpy as np
import pytest
from conftest import processes_with
from grader_release import released_chapters

from tfbook.course import (
    check as course_check,
    demo as course_demo,
    grade as course_grade,
    release as course_release,
    report as course_report,
    sandbox as course_sandbox,
)

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = course_demo.CH0
MASTER = ROOT / "notebooks" / f"{CHAPTER}.ipynb"
# CPU seconds per cell (load does not use them up): the class's costliest honest cells, the
# imports of chapters 4 and 7, take about 2 s of CPU; the loopers burn all of it
CELL_TIMEOUT = 10

pytestmark = pytest.mark.skipif(not MASTER.exists(), reason="chapter 0 not written yet")


@pytest.fixture(scope="module")
def released():
    return released_chapters()  # every chapter notebook, released once per test process


def test_release_has_stubs_and_no_secrets(released):
    assert CHAPTER in released
    for name, path in released.items():
        assert path == path.parent.parent / name / f"{name}.ipynb"
        master = nbformat.read(str(ROOT / "notebooks" / f"{name}.ipynb"), as_version=4)
        student = nbformat.read(str(path), as_version=4)
        text = course_release.notebook_text(student)
        secrets = course_release.secret_lines(master)
        assert secrets["hidden"], f"{name}: no hidden tests in the master?"
        assert secrets["solution"], f"{name}: no solutions in the master?"
        assert course_release.find_leaks(master, text) == [], name
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", "NBVAL_"):
            assert marker not in text, (name, marker)
        solution_cells = [c for c in student.cells if course_release._nbgrader(c).get("solution")]
        assert solution_cells and all("raise NotImplementedError()" in c.source
                                      for c in solution_cells if "def " in c.source)
        assert all("# YOUR CODE HERE" in c.source for c in solution_cells)
        assert not any(c.get("outputs") for c in student.cells if c.cell_type == "code")
        assert course_release.max_score(student) == course_release.max_score(master) > 0


def test_generated_notebooks_have_unique_cell_ids(released, tmp_path):
    """The class's duplicated cells are copies as JupyterLab pastes them: the grade id kept, a
    cell id of their own (a copied id made nbformat warn DuplicateCellId and rewrite it)."""
    import json
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # DuplicateCellId would fail here
        course_demo.make_class(tmp_path / "subs", released, tmp_path / "out", "ids", 9, names=["dup_cells"])
    nb = json.loads((tmp_path / "subs" / "dup_cells" / CHAPTER / f"{CHAPTER}.ipynb").read_text(encoding="utf-8"))
    ids = [c["id"] for c in nb["cells"]]
    assert len(set(ids)) == len(ids)
    gids = [c["metadata"].get("nbgrader", {}).get("grade_id") for c in nb["cells"]]
    assert gids.count("ex0-1-softmax-tests") == 2 and gids.count("ex0-3-scores") == 2  # still duplicates


def test_release_strips_test_markers():
    master = nbformat.read(str(MASTER), as_version=4)
    assert "NBVAL_IGNORE_OUTPUT" in course_release.notebook_text(master)  # the check can fail
    stripped = course_release.strip_test_markers(master)
    assert "NBVAL_" not in course_release.notebook_text(stripped)


def test_find_leaks_detects_a_leak():
    master = nbformat.read(str(MASTER), as_version=4)
    hidden = course_release.secret_lines(master)["hidden"][0]
    solution = course_release.secret_lines(master)["solution"][0]
    assert course_release.find_leaks(master, "print(1)") == []
    assert course_release.find_leaks(master, f"x\n{hidden}\n") == [f"hidden: {hidden}"]
    assert course_release.find_leaks(master, solution) == [f"solution: {solution}"]
    assert course_release.find_leaks(master, solution, kinds=("hidden",)) == []




@pytest.fixture(scope="module")
def graded(released, tmp_path_factory):
    if course_sandbox.available() and not course_sandbox.bwrap_path():
        course_sandbox.install_bwrap()  # as `make grade` does (Debian's bubblewrap)
    if course_sandbox.available():
        pytest.skip(f"no sandbox here: {course_sandbox.available()}")
    tag = uuid.uuid4().hex[:12]
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    subs = tmp_path_factory.mktemp("submissions")
    out = tmp_path_factory.mktemp("grades")
    masters = tmp_path_factory.mktemp("notebooks")  # the class's chapters and the synthetic one
    for a in (course_demo.CH0, course_demo.CH4, course_demo.CH7):
        (masters / f"{a}.ipynb").write_bytes((ROOT / "notebooks" / f"{a}.ipynb").read_bytes())
    nbformat.write(course_demo.synthetic_master(), str(masters / f"{course_demo.SYNTH}.ipynb"))
    expected = course_demo.make_class(subs, released, out, tag, server.getsockname()[1])
    # the students' own files (never a symbolic link's target: /etc/passwd, the master notebook)
    files = sorted(Path(d, f) for d, _, fs in os.walk(subs) for f in fs if not os.path.islink(Path(d, f)))
    for p in files:
        p.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)  # read-only, as the task promises
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    outside = [ROOT / "_build" / f"tfbook-attack-{tag}.txt", out / f"attack-{tag}.txt",
               Path("/tmp") / f"tfbook-attack-{tag}.txt"]
    start = time.perf_counter()
    rows = course_grade.grade(subs, out=out, timeout=CELL_TIMEOUT, total_timeout=180, verbose=False,
                              notebooks_dir=masters)
    seconds = time.perf_counter() - start
    server.close()
    console = io.StringIO()
    course_report.print_summary(rows, seconds, "", {}, stream=console)
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    load = os.getloadavg()[1]  # over the last 5 minutes, the grading's own 2 jobs included
    left = processes_with(f"tfbook-detached-{tag}")
    written = [p for p in outside if p.exists()]
    for p in written:
        p.unlink()
    return {"rows": rows, "out": out, "before": before, "after": after, "expected": expected,
            "left": left, "written": written, "seconds": seconds, "tag": tag, "load": load,
            "masters": masters, "console": console.getvalue(), "subs": subs}


def test_every_row(graded):
    with open(graded["out"] / "grades.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == course_release.CSV_FIELDS
    want = {(s, a): e for s, per in graded["expected"].items() for a, e in per.items()}
    got = {(r["student"], r["assignment"]): r for r in rows}
    want = {(course_report.csv_cell(s), a): e for (s, a), e in want.items()}  # a formula-like name, quoted
    assert set(got) == set(want)
    assert len(want) == 30 + 22  # the class, and one student per attack on the grading (issue 28)
    for key, (score, status, reason) in want.items():
        r = got[key]
        master = graded["masters"] / f"{key[1]}.ipynb"
        nb = None if key[1] == "(none)" else nbformat.read(str(master), as_version=4)
        max_score = 0 if nb is None else course_release.max_score(nb)
        score = course_demo.expected_score(score, nb)
        assert (float(r["score"]), float(r["max_score"]), r["status"]) == (score, max_score, status), r
        assert reason in r["reason"], r
    for a in (course_demo.CH0, course_demo.CH4, course_demo.CH7):
        assert got[("ada_correct", a)]["reason"] == ""


def test_submissions_untouched_and_nothing_written_outside(graded):
    assert graded["after"] == graded["before"]  # the classmate-overwrite attack included
    assert graded["written"] == []  # the checkout, the gradebook's folder, the host's /tmp
    assert graded["left"] == []  # the detached process died with its sandbox


def test_hidden_checks_do_not_leak(graded):
    master = nbformat.read(str(MASTER), as_version=4)
    hidden = course_release.secret_lines(master)["hidden"]
    for row in graded["rows"]:
        if "hidden case" in row.reason:
            assert "expected" not in row.reason.split("hidden case", 1)[1], row.reason
    ben4 = next(r for r in graded["rows"] if (r.student, r.assignment) == ("ben_wrong", course_demo.CH4))
    assert "1e3" not in ben4.reason and "(1, 4, 7)" not in ben4.reason
    # the hidden inputs of ex0-1 never reach the leaky student's page, however encoded
    page = (graded["out"] / "feedback" / "leaky" / CHAPTER / f"{CHAPTER}.html").read_text(encoding="utf-8")
    secret_inputs = [np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]]), np.array([0.3, -1.2]),
                     np.random.default_rng(7).normal(size=(2, 3)).astype(np.float32)]
    for x in secret_inputs:
        assert base64.b64encode(x.tobytes()).decode()[:40] not in page
    assert "LEAK:" in page  # it did print its visible inputs, so the check can fail
    for line in hidden:
        assert line not in course_release.html_text(page)


def test_feedback_pages(graded):
    master = nbformat.read(str(MASTER), as_version=4)
    fb = graded["out"] / "feedback"
    pages = sorted(fb.rglob("*.html"))
    students = {p.parts[-3] for p in pages if p.parts[-2] == CHAPTER}
    ran = {s for (s, per) in graded["expected"].items() for a, e in per.items()
           if a == CHAPTER and e[1] not in ("unreadable", "missing", "refused", "skipped")}
    assert students == ran
    for page in pages:
        if page.parts[-2] != CHAPTER:
            continue
        raw = page.read_text(encoding="utf-8")
        text = course_release.html_text(raw)
        assert course_release.find_leaks(master, text, kinds=("hidden",)) == [], page
        assert "hidden tests: not shown" in text
        for q in "'\"":  # no CDN: math renders offline (a student's printed URL is text, not a source)
            assert f"src={q}http" not in raw and f"href={q}http" not in raw, page
        assert "../../_mathjax/tex-chtml.js" in raw
    assert (fb / "_mathjax" / "tex-chtml.js").is_file()
    # 30 MB printed and files past the limits: a short excerpt on the page, nothing on disk
    assert (fb / "flood" / CHAPTER / f"{CHAPTER}.html").stat().st_size < 100_000
    assert not list(Path("/tmp").glob("tfbook-flood-*"))
    ben = course_release.html_text((fb / "ben_wrong" / CHAPTER / f"{CHAPTER}.html").read_text(encoding="utf-8"))
    assert "you normalised over axis 0" in ben  # the visible hint


def test_exercise_table_and_plot(graded):
    with open(graded["out"] / "exercises.csv", encoding="utf-8") as f:
        table = {r["exercise"]: r for r in csv.DictReader(f)}
    assert set(table) >= {"ex0-1-softmax-tests", "ex4-1-self-attention-tests", "ex7-2-rotary-tests"}
    ex = table["ex0-1-softmax-tests"]
    assert 0 < float(ex["share_passing"]) < 1 and ex["most_common_diagnosis"]
    assert (graded["out"] / "exercises.png").stat().st_size > 1000


def test_speed(graded):
    """Each notebook's time includes its judging; printed (a benchmark's job is to compare them)."""
    times = [r.seconds for r in graded["rows"] if r.seconds]
    load = graded["load"]
    print(f"graded {len(times)} notebooks in {graded['seconds']:.0f} s: median {statistics.median(times):.1f} s, "
          f"max {max(times):.1f} s per notebook, judging included (load average {load:.1f} on "
          f"{os.cpu_count()} cores)")
    ran = [r for r in graded["rows"] if r.status in ("graded", "timeout", "crashed")]
    assert ran and all(r.seconds > 0 for r in ran)
    assert "per notebook (its sandbox runs and its judging)" in graded["console"]


def test_attacks_on_the_grading_leave_no_trace(graded):
    """Issue 28: nothing the student controls reaches grades.csv, a page or the console unless
    escaped for it; hidden inputs never come back; symbolic links are never followed."""
    csv_text = (graded["out"] / "grades.csv").read_text(encoding="utf-8")
    pages = {p: p.read_text(encoding="utf-8") for p in (graded["out"] / "feedback").rglob("*.html")}
    for text in [csv_text, graded["console"]]:
        assert "LEAKX_" not in text  # inputs encoded in an exception's or a type's name: never passed on
    for text in [csv_text, graded["console"], *pages.values()]:
        # the hidden inputs of ex0-1 (cases A and C) never come back; the visible ones may, on the
        # student's own page, as what their notebook printed in the visible phase
        assert "LEAKX_10000_10000_0" not in text and "LEAKX_0_1" not in text
        assert "root:" not in text  # the first line of /etc/passwd
        assert "\x1b" not in text and "\x07" not in text  # terminal escapes
    raised = pages[graded["out"] / "feedback" / "atk_raise_name" / CHAPTER / f"{CHAPTER}.html"]
    assert "LEAKX_10000_0_10000" in raised  # the visible inputs' encoding is there: the check can fail
    with open(graded["out"] / "grades.csv", encoding="utf-8") as f:
        cells = [c for row in csv.reader(f) for c in row]
    assert "'" + course_demo.FORMULA_NAME in cells and course_demo.FORMULA_NAME not in cells
    assert not any(c[:1] in "=+-@" for c in cells if c)
    # the student's printed MathJax stays text: the page typesets only the exercises' own text
    page = pages[graded["out"] / "feedback" / "atk_print_html" / CHAPTER / f"{CHAPTER}.html"]
    assert "javascript:alert" in page  # shown, escaped, inside elements MathJax ignores
    assert "ignoreHtmlClass:'tex2jax_ignore'" in page and "<body class='tex2jax_ignore" in page
    for pre in page.split("<pre")[1:]:
        assert pre.startswith(" class='tex2jax_ignore mathjax_ignore'>")
    outside = re.sub(r"<pre class='tex2jax_ignore mathjax_ignore'>.*?</pre>", "", page, flags=re.S)
    assert "javascript:" not in outside  # nowhere but in the escaped, untypeset excerpts
    # the phase attack: its page says what failed, never "All checks passed" for ex0-1
    phase = pages[graded["out"] / "feedback" / "atk_phase" / CHAPTER / f"{CHAPTER}.html"]
    section = phase.split("<h2 class='fail'>ex0-1-softmax-tests: 0 / 3</h2>")[1].split("<h2")[0]
    assert "What failed: " in section and "All checks passed" not in section


def test_hide_hidden_tests_scrubs_tracebacks():
    cell = nbformat.v4.new_code_cell("check(a)\n### BEGIN HIDDEN TESTS\nassert secret_value == 42\n"
                                     "### END HIDDEN TESTS")
    cell.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="",
                                           traceback=["----> 3 assert secret_value == 42", "Err"]),
                    nbformat.v4.new_output("stream", name="stdout",
                                           text="note: assert secret_value == 42\n")]
    nb = nbformat.v4.new_notebook(cells=[cell])
    course_release.hide_hidden_tests(nb)
    text = course_release.notebook_text(nb)
    assert "secret_value" not in text
    assert "HIDDEN" not in nb.cells[0].source and course_release.HIDDEN_PLACEHOLDER in nb.cells[0].source
    assert nb.cells[0].outputs[0]["traceback"] == ["AssertionError: "]


def test_check_command_gives_the_graders_messages(graded, capsys):

    sub = next(p for p in graded["before"] if p.parts[-3] == "ben_wrong" and p.parts[-2] == CHAPTER)
    failed = course_check.check_notebook(sub, timeout=60)
    printed = capsys.readouterr().out
    assert failed == 3
    row = next(r for r in graded["rows"] if (r.student, r.assignment) == ("ben_wrong", CHAPTER))
    crosses = [line.strip() for line in printed.splitlines() if line.strip().startswith("✘")]
    assert len(crosses) == 3
    for line in crosses:
        assert line in row.reason  # the same words locally and in grades.csv
