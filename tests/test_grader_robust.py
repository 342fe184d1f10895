"""Issue 37: a grader no student can stall, no file name can break, and no shard can lose a row.

A small synthetic chapter (three exercises, 4 points) and a class of students, graded once in
the sandbox with 1 s limits; each student is one finding of the issue, scored as its honest work
deserves. Unit tests beside it cover the wire's cost, the shard plan, the copied test cells, the
precision rule and the instructor's log.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest

from tfbook.course import attempt as course_attempt
from tfbook.course import budget as course_budget
from tfbook.course import grade as course_grade
from tfbook.course import job as course_job
from tfbook.course import judge as course_judge
from tfbook.course import report as course_report
from tfbook.course import rows as course_rows
from tfbook.course import sandbox as course_sandbox
from tfbook.course import shards as course_shards
from tfbook.course import wire as course_wire

ROOT = Path(__file__).resolve().parents[1]
A = "97_grader_robust"
LATIN1 = os.fsdecode(b"caf\xe9_latin1")  # a folder name that is not UTF-8 (a learning-management export)
HIDDEN_MARK = 1234.5  # in a hidden case's input only: never anywhere the student can read

CELLS = [
    ("code", None, "import numpy as np\nfrom tfbook.checks import check_close"),
    ("markdown", None, "(sec-double)=\n## Doubling\n\n```{math}\n:label: eq-double\ny = 2 x\n```"),
    ("markdown", None, "## Exercise 97.1\n\nWrite `double(x)`: the array $2x$, leaving `x` as it was "
                       "(see {eq}`eq-double` in {ref}`sec-double`, and {cite:p}`vaswani2017attention`)."),
    ("code", ("ex97-1-double", False, 0), "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
                                          "    ### END SOLUTION\n"),
    ("code", ("ex97-1-double-tests", True, 2), """_x = np.arange(3.0)
check_close(double(_x), 2 * np.arange(3.0), "double(x)")
check_close(double(_x), 2 * np.arange(3.0), "double(x), called again on the same x")
### BEGIN HIDDEN TESTS
_y = np.array([1234.5, 0.5])
check_close(double(_y), 2 * np.array([1234.5, 0.5]), "hidden case A")
check_close(double(_y), 2 * np.array([1234.5, 0.5]), "hidden case B")
### END HIDDEN TESTS"""),
    ("markdown", None, "## Exercise 97.2\n\nWrite `third(x)`: x / 3, as precise as x."),
    ("code", ("ex97-2-third", False, 0), "def third(x):\n    ### BEGIN SOLUTION\n    return x / 3\n"
                                         "    ### END SOLUTION\n"),
    ("code", ("ex97-2-third-tests", True, 1), """check_close(third(np.ones((2, 4))), np.ones((2, 4)) / 3, "third(x)")
### BEGIN HIDDEN TESTS
check_close(third(np.full((2, 3), 2.0)), np.full((2, 3), 2.0) / 3, "hidden case A")
### END HIDDEN TESTS"""),
    ("markdown", None, "## Exercise 97.3\n\nSet `prediction` to one quarter."),
    ("code", ("ex97-3-prediction", False, 0), "### BEGIN SOLUTION\nprediction = 0.25\n### END SOLUTION\n"),
    ("code", ("ex97-3-prediction-tests", True, 1),
     'assert abs(prediction - 0.25) < 1e-12, "✘ prediction is not one quarter"'),
]


def master():
    from tfbook.course.demo import synthetic_master

    return synthetic_master(CELLS)  # the demo's builder, this class's cells


def _index(nb, gid):
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == gid)


def student(answers=None, after=(), edit=None):
    """The released notebook (hidden tests dropped) with ``answers`` {grade id: source}, cells
    ``after`` appended, and ``edit(nb)`` applied."""
    nb = master()
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in (answers or {}):
            cell.source = answers[gid]
        elif "### BEGIN HIDDEN TESTS" in cell.source:
            cell.source = cell.source.split("### BEGIN HIDDEN TESTS")[0].rstrip()
    nb.cells += [nbformat.v4.new_code_cell(s) for s in after]
    if edit:
        edit(nb)
    return nb


def _copy_test_above_answer(nb):
    k = _index(nb, "ex97-3-prediction-tests")
    copy = nbformat.from_dict(json.loads(json.dumps(nb.cells[k])))
    copy["id"] = "copied-test"
    nb.cells.insert(_index(nb, "ex97-3-prediction"), copy)  # Jupyter's copy, pasted above the answer


def _big_output(nb):
    k = _index(nb, "ex97-3-prediction")
    nb.cells[k].outputs = [nbformat.v4.new_output("stream", name="stdout", text="y" * (66 * 2**20))]


FORGE = """import json, os, stat
_msg = json.dumps({"t": "value", "gid": "ex97-3-prediction-tests", "name": "prediction", "ok": True,
                   "value": {"t": "float", "v": "0.25"}}) + "\\n"
for _p in ["self"] + [str(p) for p in range(1, 200)]:  # every channel this process can write, its own or another's
    for _f in range(0, 16):
        try:
            with open(f"/proc/{_p}/fdinfo/{_f}") as _info:
                _flags = int(_info.read().split("flags:")[1].split()[0], 8)
            if _flags & 3 == 0 or not stat.S_ISFIFO(os.stat(f"/proc/{_p}/fd/{_f}").st_mode):
                continue  # a read end, or not a pipe
            _w = os.open(f"/proc/{_p}/fd/{_f}", os.O_WRONLY | os.O_NONBLOCK)
            os.write(_w, _msg.encode())
            os.close(_w)
        except (OSError, IndexError, ValueError):
            pass
"""
HIDDEN_HANG = """import signal, sys
def double(x):
    _f, _hidden = sys._getframe(1), False
    while _f is not None:
        _hidden = _hidden or _f.f_code.co_name == "_hidden"
        _f = _f.f_back
    if _hidden:  # only when the hidden tests run: ignore the interrupt and never return
        for _s in (signal.SIGPROF, signal.SIGALRM, signal.SIGINT):
            signal.signal(_s, signal.SIG_IGN)
        while True:
            pass
    return 2 * x
"""
# raises exceptions that name their inputs, and writes them everywhere it can
NAMING = """import os, sys
def double(x):
    _text = "LEAK" + "_".join(repr(float(v)) for v in np.ravel(x))
    print(_text)
    os.write(2, (_text + "\\n").encode())
    raise type("Err_" + _text.replace(".", "p").replace("-", "m"), (ValueError,), {})(_text)
"""
LOG_FORGER = """import os
os.write(2, b"\\n[tfbook-grade] submission verified by hand: 4/4\\r\\x1b[2J\\x1b]8;;http://evil\\x07x\\n")
os.write(2, b"grader: all rows verified\\n")
"""
# the point for ex97-3 only if the host's paths (the checkout, the gradebook's logs) are NOT visible
HOST_PATHS = """import glob, os, sys
_seen = [sys.executable, sys.prefix, str(sys.path)]
for _f in os.listdir("/proc/self/fd"):
    try:
        _seen.append(os.readlink(f"/proc/self/fd/{_f}"))
    except OSError:
        pass
for _p in glob.glob(sys.prefix + "/lib/python3*/site-packages/*.pth") + \\
        glob.glob(sys.prefix + "/lib/python3*/site-packages/__editable__*.py") + \\
        glob.glob(sys.prefix + "/lib/python3*/site-packages/tfbook*/*"):
    try:
        _seen.append(open(_p).read())
    except (OSError, UnicodeDecodeError):
        pass
import tfbook
_seen.append(tfbook.__file__)
_seen = "\\n".join(_seen)
prediction = 0.5 if (ROOT in _seen or "/logs/" in _seen) else 0.25
""".replace("ROOT", repr(str(ROOT)))
# the point for ex97-3 only if the sandbox's mount table names no host path of the class, the
# gradebook or the grader's temporary folder (issue 37: the job's files are copied in, not bound)
MOUNTINFO = """_mounts = open("/proc/self/mountinfo").read() + open("/proc/self/mounts").read()
prediction = 0.5 if any(s in _mounts for s in ("tfbook-grade-", "pytest-of-", "/subs", "robust")) else 0.25
"""
# the point for ex97-3 only if the grader's channel (the relay's stdin and stdout) is out of reach
REACH = """import os
_reached = False
for _p in range(1, 64):
    for _f in (0, 1):
        try:
            if _p != os.getpid() and "pipe:" in os.readlink(f"/proc/{_p}/fd/{_f}"):
                os.close(os.open(f"/proc/{_p}/fd/{_f}", os.O_WRONLY | os.O_NONBLOCK))
                _reached = True
        except OSError:
            pass
prediction = 0.5 if _reached else 0.25
"""

# hangs, ignoring the interrupt, while the driver unpickles the hidden inputs (before any hidden test)
HANG_RECEIVE = """import pickle, signal
def _hang(*args, **kwargs):
    for _s in (signal.SIGPROF, signal.SIGALRM, signal.SIGINT):
        signal.signal(_s, signal.SIG_IGN)
    while True:
        pass
pickle.loads = _hang
"""

STUDENTS = {
    # name: (notebook, expected score of 4, status, a fragment of the reason)
    "ok": (student(), 4, "graded", ""),
    "unanswered": (student({"ex97-1-double": "def double(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"}),
                   2, "graded", "Exercise 97.1, ex97-1-double-tests: not answered"),
    LATIN1: (student(), 4, "graded", ""),
    "inplace": (student({"ex97-1-double": "def double(x):\n    x *= 2\n    return x\n"}), 2, "graded",
                "double changed its input in place"),
    "f16_list": (student({"ex97-2-third": "def third(x):\n    return [row.astype(np.float16) for row in x / 3]\n"}),
                 3, "graded", "third returned float16 where the exercise's answer is float64"),
    "copied_test": (student(edit=_copy_test_above_answer), 4, "graded",
                    "a copy of test cell ex97-3-prediction-tests"),
    "forged_value": (student({"ex97-3-prediction": "prediction = 0.5\n"}, after=[FORGE]), 3, "graded",
                     "ex97-3-prediction-tests"),
    "hidden_hang": (student({"ex97-1-double": HIDDEN_HANG}), 2, "timeout", "the hidden cases of ex97-1-double-tests"),
    "hang_receive": (student(after=[HANG_RECEIVE]), 1, "timeout", "receiving the hidden cases did not stop"),
    "naming": (student({"ex97-1-double": NAMING}), 2, "graded", "double raised an exception"),
    "big_output": (student(edit=_big_output), 4, "graded", ""),
    "log_forger": (student(after=[LOG_FORGER]), 4, "graded", ""),
    "reach_channel": (student({"ex97-3-prediction": REACH}), 4, "graded", ""),
    "host_paths": (student({"ex97-3-prediction": HOST_PATHS}), 4, "graded", ""),
    "mountinfo": (student({"ex97-3-prediction": MOUNTINFO}), 4, "graded", ""),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if course_sandbox.available():
        pytest.skip(course_sandbox.available())
    tmp = tmp_path_factory.mktemp("robust")
    masters, subs, out = tmp / "notebooks", tmp / "subs", tmp / "out"
    masters.mkdir()
    nbformat.write(master(), str(masters / f"{A}.ipynb"))
    for name, (nb, *_) in STUDENTS.items():
        folder = subs / name / A
        folder.mkdir(parents=True)
        nbformat.write(nb, str(folder / f"{A}.ipynb"))
    console = io.StringIO()
    with contextlib.redirect_stdout(console):
        rows = course_grade.grade(subs, out=out, timeout=1, total_timeout=20, verbose=True,
                                  notebooks_dir=masters, specs=tmp, jobs=2)
    return {"rows": {r.student: r for r in rows}, "out": out, "console": console.getvalue()}


def test_every_row_scores_its_honest_work(graded):
    rows = graded["rows"]
    assert set(rows) == set(STUDENTS)
    for name, (_, score, status, reason) in STUDENTS.items():
        r = rows[name]
        assert (r.score, r.max_score, r.status) == (score, 4, status), (name, r.reason)
        assert reason in r.reason, (name, r.reason)
    assert rows["ok"].reason == ""
    assert "not deterministic" not in rows["inplace"].reason


def test_any_bytes_in_a_name_are_graded_and_reported(graded):
    """A Latin-1 folder name: graded, shown safely, kept exactly (percent-encoded bytes) in the CSV."""
    with open(graded["out"] / "grades.csv", encoding="utf-8", newline="") as f:
        got = {r["student_id"]: r for r in csv.DictReader(f)}
    assert got["caf%E9_latin1"]["student"] == "caf\\xe9_latin1"  # the display form
    assert float(got["caf%E9_latin1"]["score"]) == 4
    assert os.fsencode(LATIN1) == course_report.name_bytes("caf%E9_latin1")  # reversible
    assert len(got) == len(STUDENTS)
    page = graded["out"] / "feedback" / LATIN1 / A / f"{A}.html"
    assert "caf\\xe9_latin1" in page.read_text(encoding="utf-8")
    rows = json.loads((graded["out"] / course_report.ROWS_FILE).read_text(encoding="utf-8"))
    assert LATIN1 in {r["student"] for r in rows}  # rows.json keeps the name exactly (for merge)


def test_one_rows_failure_in_reporting_costs_no_other_row(tmp_path, monkeypatch):
    rows = [course_rows.Row(s, A, score=1.0, max_score=4.0, exercises=[{"gid": "g", "points": 4,
            "score": 1.0, "passed": False, "diagnosis": "x", "checks_out": "", "visible_out": ""}])
            for s in ("ann", "bob", "cyd")]
    real = course_report.feedback_page

    def fragile(row, plan, src, **kw):
        if row.student == "bob":
            raise RuntimeError("a page that cannot be written")
        return real(row, plan, src, **kw)

    monkeypatch.setattr(course_report, "feedback_page", fragile)
    plan = course_judge.plan(master(), A)
    for r in rows:
        r.exercises[0]["gid"] = plan.tests[0].gid
    course_report.write_feedback(rows, {A: master()}, {A: plan}, tmp_path / "feedback")
    course_report.write_grades(rows, tmp_path)
    assert (tmp_path / "feedback" / "ann" / A / f"{A}.html").is_file()
    assert (tmp_path / "feedback" / "cyd" / A / f"{A}.html").is_file()
    assert "feedback page could not be written" in rows[1].reason
    with open(tmp_path / "grades.csv", encoding="utf-8") as f:
        assert [r["student"] for r in csv.DictReader(f)] == ["ann", "bob", "cyd"]
    # a row whose score is not a number still leaves every other row in grades.csv
    rows[2].score = "not a number"
    course_report.write_grades(rows, tmp_path)
    with open(tmp_path / "grades.csv", encoding="utf-8") as f:
        got = {r["student"]: r for r in csv.DictReader(f)}
    assert float(got["ann"]["score"]) == 1 and got["cyd"]["status"] == "error"


def test_hidden_inputs_never_come_back(graded):
    out = graded["out"]
    texts = [(out / "grades.csv").read_text(encoding="utf-8"), graded["console"],
             *(p.read_text(encoding="utf-8") for p in (out / "feedback").rglob("*.html"))]
    for text in texts:
        assert "1234.5" not in text and "LEAK1234" not in text
    page = (out / "feedback" / "naming" / A / f"{A}.html").read_text(encoding="utf-8")
    assert "LEAK0.0_1.0_2.0" in page  # the visible inputs' text is there: the check can fail


def test_the_instructors_log_quotes_the_student(graded):
    logs = "\n".join(p.read_text(encoding="utf-8", errors="replace")
                     for p in (graded["out"] / "logs").glob("log_forger*"))
    assert "submission verified by hand" in logs  # quoted, so present...
    for line in logs.splitlines():
        if "verified by hand" in line or "all rows verified" in line:
            assert line.startswith(course_attempt.STUDENT_PREFIX), line  # ... but attributed
    assert "\x1b" not in logs and "\x07" not in logs


def test_no_host_paths_in_the_sandbox(graded):
    """The student's code sees neither the checkout's path (the venv and the package are mounted
    at neutral paths, the editable install's path files blanked) nor the instructor's log (its
    stderr is a pipe): the probe's point (row host_paths) is scored only if it saw neither."""
    assert graded["rows"]["host_paths"].score == 4, graded["rows"]["host_paths"].reason


def test_the_mount_table_names_no_host_path_of_the_class(graded):
    """A submission reading /proc/self/mountinfo (and /proc/self/mounts) finds no path of the
    class folder, the gradebook or the grader's temporary folder (row mountinfo scores its point
    only then): bubblewrap copies the job's files in (``--ro-bind-data``) instead of binding
    them. The venv's and the package's bind sources are still named there (said in sandbox.py)."""
    assert graded["rows"]["mountinfo"].score == 4, graded["rows"]["mountinfo"].reason


def test_the_job_is_copied_into_the_sandbox_not_bound(tmp_path):
    why = course_sandbox.available()
    if why:
        pytest.skip(f"bubblewrap is not usable here: {why}")
    secret = tmp_path / "class-folder-XYZ"
    secret.mkdir()
    (secret / "job.json").write_text('{"job": 1}', encoding="utf-8")
    fds: list[int] = []
    cmd = course_sandbox.bwrap_command({"job.json": secret / "job.json"},
                                       [course_sandbox.python_inside(), "-c",
                                        "print(open('/grading/job.json').read()); "
                                        "print(open('/proc/self/mountinfo').read())"], fds=fds)
    assert str(secret) not in cmd and len(fds) == 1
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, pass_fds=fds, timeout=60)
    finally:
        for fd in fds:
            os.close(fd)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith('{"job": 1}')  # the job is there, read-only ...
    assert "/grading/job.json" in done.stdout and "class-folder-XYZ" not in done.stdout  # ... from no host path


def test_the_feedback_page_renders_the_books_roles(graded):
    """Issue 38: the page shows the exercise's name and its text with the book's roles rendered."""
    page = (graded["out"] / "feedback" / "ok" / A / f"{A}.html").read_text(encoding="utf-8")
    task = page.split("<div class='task'>")[1].split("</div>")[0]
    assert "{eq}" not in task and "{ref}" not in task and "{cite" not in task
    assert "$y = 2 x$" in task and "Doubling" in task and "[vaswani2017attention]" in task
    assert "Exercise 97.1" in page
    with open(graded["out"] / "exercises.csv", encoding="utf-8") as f:
        names = {r["exercise"]: r["name"] for r in csv.DictReader(f)}
    assert names["ex97-2-third-tests"] == "Exercise 97.2"


# --------------------------------------------------------------------------- the wire


def test_decoding_costs_linear_time():
    """Integers that all hash alike: a set or dict of them costs quadratic time to build; the
    grader builds none (the judge does, bounded in size)."""
    m = 2**61 - 1  # hash(k * m) == 0 for every k
    items = [{"t": "int", "v": str(k * m)} for k in range(1, 20_001)]
    for enc in ({"t": "set", "v": items}, {"t": "dict", "v": [[i, {"t": "none"}] for i in items]}):
        t0 = time.process_time()
        try:
            course_wire.decode(enc)
        except course_wire.Undecodable:
            pass
        assert time.process_time() - t0 < 1.0
    small = course_wire.decode(course_wire.encode({1, 2, 3}))
    assert course_judge.to_native(small) == {1, 2, 3}  # the judge still sees a set
    assert course_judge.to_native(course_wire.decode(course_wire.encode({"a": (1, 2)}))) == {"a": (1, 2)}
    with pytest.raises(course_wire.Undecodable):  # nesting bounded
        course_wire.decode(_deep(100))


def _deep(n):
    d = {"t": "none"}
    for _ in range(n):
        d = {"t": "list", "v": [d]}
    return d


def test_the_graders_own_cpu_is_metered_and_limited(tmp_path, monkeypatch):
    """A message whose handling costs the grader CPU (here: a decoder made slow on purpose) stops
    that submission's run at the grader's own limit."""

    def slow(d, _depth=0):
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.4:
            pass
        return 0.25

    monkeypatch.setattr(course_attempt, "decode", slow)
    monkeypatch.setattr(course_attempt, "GRADER_CPU", 1.0)
    cells = [{"index": i, "kind": "test", "source": "x = 1", "gid": f"g{i}", "capture": [["x", "value"]]}
             for i in range(8)]
    a = course_attempt.run_attempt({"cells": cells, "timeout": 5, "visible_only": True}, tmp_path / "s", dict,
                                   timeout=5, budget=course_budget.Budget.of(60), use_bwrap=False,
                                   limits=course_sandbox.Limits(), nproc=None, log=tmp_path / "log")
    assert a.grader_cpu >= 1.0 and a.grader_cpu < 3.0
    assert a.error and "grader" in a.error and len(a.values) < 8


# --------------------------------------------------------------------------- shards


def _fake_grade_one(row, path, plan, judge, work, **kw):
    row.score = 1.0


def _class(root: Path, names):
    nb = student()
    for s in names:
        (root / s / A).mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(root / s / A / f"{A}.ipynb"))


@pytest.fixture
def shard_setup(tmp_path, monkeypatch):
    monkeypatch.setattr(course_grade, "grade_one", _fake_grade_one)
    masters = tmp_path / "notebooks"
    masters.mkdir()
    nbformat.write(master(), str(masters / f"{A}.ipynb"))
    subs = tmp_path / "subs"
    _class(subs, ["s1", "s2", "s3", "s4"])
    kw = dict(verbose=False, use_sandbox=False, jobs=1, notebooks_dir=masters, specs=tmp_path)
    return tmp_path, subs, kw


def test_a_late_submission_never_falls_between_shards(shard_setup):
    tmp, subs, kw = shard_setup
    plan = course_shards.make_plan(subs, kw["notebooks_dir"], 2, tmp / "plan.json")
    assert plan["shards"] == 2 and len(plan["work"]) == 4 and plan["digest"]
    course_grade.grade(subs, out=tmp / "p1", shard="1/2", plan=tmp / "plan.json", **kw)
    _class(subs, ["s0"])  # arrives between the two shards' runs (sorts first: shifts a positional split)
    course_grade.grade(subs, out=tmp / "p2", shard="2/2", plan=tmp / "plan.json", **kw)
    for k in (1, 2):
        part = json.loads((tmp / f"p{k}" / course_shards.SHARD_FILE).read_text())
        assert (part["k"], part["n"], part["digest"]) == (k, 2, plan["digest"])
    rows = course_shards.merge([tmp / "p1", tmp / "p2"], tmp / "m", verbose=False)
    assert sorted(r["student"] for r in rows) == ["s1", "s2", "s3", "s4"]  # everyone, once
    assert f"s0/{A}" in json.loads((tmp / "p2" / course_shards.SHARD_FILE).read_text())["unplanned"]


def test_merge_refuses_and_reports(shard_setup, capsys):
    tmp, subs, kw = shard_setup
    course_shards.make_plan(subs, kw["notebooks_dir"], 2, tmp / "plan.json")
    course_grade.grade(subs, out=tmp / "p1", shard="1/2", plan=tmp / "plan.json", **kw)
    course_grade.grade(subs, out=tmp / "p2", shard="2/2", plan=tmp / "plan.json", **kw)
    with pytest.raises(course_shards.MergeError, match="missing"):  # only one part: students missing
        course_shards.merge([tmp / "p1"], tmp / "m1", verbose=False)
    with pytest.raises(course_shards.MergeError, match="twice|duplicated"):
        course_shards.merge([tmp / "p1", tmp / "p1", tmp / "p2"], tmp / "m2", verbose=False)
    _class(subs, ["s5"])
    course_shards.make_plan(subs, kw["notebooks_dir"], 2, tmp / "plan2.json")
    course_grade.grade(subs, out=tmp / "q2", shard="2/2", plan=tmp / "plan2.json", **kw)
    with pytest.raises(course_shards.MergeError, match="another shard plan"):
        course_shards.merge([tmp / "p1", tmp / "q2"], tmp / "m3", verbose=False)
    # without a plan file each part records the class it saw: parts that saw different classes are refused
    course_grade.grade(subs, out=tmp / "r1", shard="1/2", **kw)
    (subs / "s5" / A / f"{A}.ipynb").unlink()
    (subs / "s5" / A).rmdir()
    (subs / "s5").rmdir()
    course_grade.grade(subs, out=tmp / "r2", shard="2/2", **kw)
    with pytest.raises(course_shards.MergeError, match="another shard plan"):
        course_shards.merge([tmp / "r1", tmp / "r2"], tmp / "m4", verbose=False)
    # the command line: non-zero, and the missing students named
    from tfbook.course import __main__ as cli

    capsys.readouterr()
    assert cli.main(["merge", str(tmp / "p1"), "--out", str(tmp / "m5")]) != 0
    assert "missing" in capsys.readouterr().err
    assert cli.main(["merge", str(tmp / "p1"), str(tmp / "p2"), "--out", str(tmp / "m6")]) == 0


# --------------------------------------------------------------------------- values and test cells


def test_precision_is_read_through_any_container():
    sk = "float64"
    f16 = np.ones(3, dtype=np.float16)
    assert course_judge.lower_precision([f16, f16], sk) == ("float16", "float64")
    assert course_judge.lower_precision(([f16],), sk) == ("float16", "float64")
    assert course_judge.lower_precision([[np.float16(1)], [np.float16(2)]], sk) == ("float16", "float64")
    assert course_judge.lower_precision([np.ones(3), np.ones(3)], sk) is None  # the check can pass
    assert course_judge.lower_precision([[1.0, 2.0]], sk) is None  # Python floats are float64
    assert course_judge.lower_precision(course_wire.Tensor(np.ones(2, np.float32), "float32"), sk) == \
        ("float32", "float64")


def test_a_copied_test_cell_is_ignored_where_it_is_not_the_masters():
    nb = student(edit=_copy_test_above_answer)
    plan = course_judge.plan(master(), A)
    cells, notes, placed = course_job.build_job(nb, plan)
    tests = [c for c in cells if c["kind"] == "test" and c["gid"] == "ex97-3-prediction-tests"]
    assert len(tests) == 1
    answer = _index(nb, "ex97-3-prediction")
    assert placed["ex97-3-prediction-tests"] > answer  # the one after the answer
    assert any("copy" in n and "ignored" in n for n in notes)
    assert not any(c["index"] == answer - 1 for c in cells)  # the copy does not run at all


def test_an_in_place_answer_is_told_in_words():
    judge = course_judge.Judge.__new__(course_judge.Judge)
    log = [[b"", course_wire.digest((np.arange(3.0),), {}), "v", "float64"],
           [b"", course_wire.digest((np.arange(3.0),), {}), "v", "float64"]]
    x = np.arange(3.0)
    r = course_judge._Replayer("double", log, {}, visible=[
        (log[0][1], (True, 2 * np.arange(3.0), {"changes": [(["a", 0], 2 * np.arange(3.0))]}))])
    r(x)
    with pytest.raises(course_judge.StudentFailure, match="changed its input in place"):
        r(x)
    del judge


KEYS = """import ctypes, platform
_libc = ctypes.CDLL(None, use_errno=True)
_ADD, _KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
_libc.syscall.restype = ctypes.c_long
def _search(ring, name):
    return _libc.syscall(_KEYCTL, 10, ctypes.c_long(ring), b"user", name, ctypes.c_long(0))  # KEYCTL_SEARCH
"""


def test_nothing_persists_from_one_sandbox_to_the_next(tmp_path):
    """A key the student's code leaves in its user's or session's keyring (the kernel's, which no
    file system isolation touches) is gone when the next run (a retry, or a classmate in the same
    slot) starts: it could carry hidden inputs from a hidden phase into a visible one."""
    if course_sandbox.available() or os.geteuid() != 0:
        pytest.skip("needs the sandbox as root (one user per slot)")
    slots = course_sandbox.Slots(1, course_sandbox.Limits())
    slot = slots.acquire()

    def run(source):
        cells = [{"index": 0, "kind": "code", "source": KEYS + source}]
        return course_attempt.run_attempt({"cells": cells, "timeout": 5, "visible_only": True}, tmp_path / "s",
                                          dict, timeout=5, budget=course_budget.Budget.of(60), use_bwrap=True,
                                          limits=course_sandbox.Limits(), nproc=None, log=tmp_path / "log", slot=slot)
    try:
        put = run("for _r in (-4, -3, -5):\n"
                  "    print(_libc.syscall(_ADD, b'user', b'tfbook-leak', b'1234.5', 6, ctypes.c_long(_r)))")
        assert put.records[0]["status"] == "ok", put.records
        made = [int(x) for x in put.records[0]["out"].split()]
        assert any(k > 0 for k in made), made  # the kernel took the key (the check can fail)
        got = run("print([_search(r, b'tfbook-leak') for r in (-4, -3, -5)])")
        assert got.records[0]["status"] == "ok", got.records
        assert all(int(x) < 0 for x in got.records[0]["out"].strip(" []\n").split(",")), got.records[0]["out"]
    finally:
        slots.release(slot)
        slots.remove()
