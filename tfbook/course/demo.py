"""A generated class of submissions that attacks and breaks the grader, for its tests and
for instructors who want to see what ``grade`` does with them.

    python -m tfbook.course.demo OUT_DIR      # writes OUT_DIR/submissions and prints the table

Every attack on the sandbox answers the first three exercises of chapter 0 correctly (6
points) and sets the last prediction to the right value *only if the attack worked*: so a
student scores 7 when the attack succeeded and 6 when it was stopped. The attacks on the
grading itself (leaking hidden inputs through names, phase detection, forged values and
peaks, symbolic links, in-place changes, float16 tolerances, faults while a value is read,
odd names) each score what the honest work deserves; a synthetic chapter
(``synthetic_master``) carries the exercises that check in-place changes, a dtype and a cache. ``EXPECTED`` is what the
sandboxed grader must give; ``UNSANDBOXED`` what the same attacks get without it.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import nbformat

from tfbook.course import release as course

ROOT = Path(__file__).resolve().parents[2]
CH0, CH4, CH7 = "00_setup_and_notation", "04_self_attention", "07_positional_information"

WIN = "prediction = 1 / 3 if ok else 0.9   # 7 points if the attack worked, 6 if not\n"

ATTACKS = {
    # read the master notebooks (solutions and hidden tests)
    "atk_masters": """import glob
ok = False
for _p in glob.glob({root!r} + "/notebooks/*.ipynb") + glob.glob("/tmp/tfbook-*/**/*.ipynb", recursive=True):
    try:
        ok = ok or "BEGIN HIDDEN TESTS" in open(_p, encoding="utf-8").read()
    except OSError:
        pass
""",
    # run a classmate's answer
    "atk_classmate_read": """import json
ok = False
try:
    _nb = json.load(open({victim!r}, encoding="utf-8"))
    _src = [''.join(c["source"]) for c in _nb["cells"]
            if c.get("metadata", {{}}).get("nbgrader", {{}}).get("grade_id") == "ex0-4-prediction"][0]
    _ns = {{}}
    exec(_src, _ns)
    ok = abs(_ns["prediction"] - 1 / 3) < 1e-9
except Exception:
    pass
""",
    # overwrite a classmate's original file
    "atk_classmate_write": """ok = False
try:
    with open({victim_write!r}, "w") as _f:
        _f.write("{{}}")
    ok = True
except OSError:
    pass
""",
    # write into the project checkout
    "atk_checkout": """import os
ok = False
try:
    if not os.path.isdir({root!r} + "/notebooks"):   # not the real checkout: nothing to gain
        raise OSError("no checkout here")
    os.makedirs({root!r} + "/_build", exist_ok=True)
    with open({root!r} + "/_build/tfbook-attack-{tag}.txt", "w") as _f:
        _f.write("pwned")
    ok = True
except OSError:
    pass
""",
    # rewrite the gradebook (grades.csv) and leave a file next to it
    "atk_gradebook": """import os
ok = False
try:
    if not os.path.isdir({out!r}):   # the grader made it: if it is not there, this is not the host
        raise OSError("no gradebook here")
    with open({out!r} + "/attack-{tag}.txt", "w") as _f:
        _f.write("pwned")
    with open({out!r} + "/grades.csv", "w") as _f:
        _f.write("student,assignment,score\\natk_gradebook,00_setup_and_notation,7\\n")
    ok = True
except OSError:
    pass
""",
    # a detached process that should outlive the grading
    "atk_detached": """import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(90)", "tfbook-detached-{tag}"],
                 start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
ok = True
""",
    # allocate 8 GiB (never touched, so an unlimited run does not really use the memory)
    "atk_memory": """import numpy as np
ok = False
try:
    _big = np.empty(2**30)   # 8 GiB of float64
    ok = True
    del _big
except MemoryError:
    pass
""",
    # reach a server on the grading machine
    "atk_network": """import socket
ok = False
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    ok = True
except OSError:
    pass
""",
}

# rebinding the check helpers and builtins: full marks with no work under a shared kernel
CHEAT_REBIND = """import builtins, tfbook.checks
_noop = lambda *a, **k: None
for _n in ("check_softmax", "check_close", "check_shape", "check_finite", "check_projection"):
    setattr(tfbook.checks, _n, _noop)
    globals()[_n] = _noop
builtins.abs = lambda x: 0
builtins.tuple = lambda g: (2, 4, 3, 5)
def softmax(x, axis=-1):
    return x
"""
# an input transformer that turns every later cell (the tests too) into `pass`
CHEAT_TRANSFORMER = """get_ipython().input_transformers_cleanup.append(lambda lines: ["pass\\n"])
def softmax(x, axis=-1):
    return x
"""
# patching the checks' failure function, every answer wrong
CHEAT_FAIL = """import tfbook.checks
tfbook.checks._fail = lambda message: None
def softmax(x, axis=-1):
    return x / x.sum()
"""
LOOP = "def softmax(x, axis=-1):\n    while True:\n        pass\n"
IGNORE_SIGNALS = """import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGALRM, signal.SIG_IGN)
signal.signal(signal.SIGPROF, signal.SIG_IGN)
while True:
    pass
"""
CRASH = "prediction = 1 / 3\nimport os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
LEAKY = """import base64
_seen = []
def softmax(x, axis=-1):
    x = np.asarray(x)
    print("LEAK:" + base64.b64encode(np.ascontiguousarray(x).tobytes()).decode())
    _seen.append(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)
"""
LEAKY_LATER = """for _x in _seen:
    print("LEAK:" + base64.b64encode(np.ascontiguousarray(_x).tobytes()).decode())
"""
# 30 MB printed; a 400 MiB file (over the 64 MiB file limit and the 256 MiB scratch); /tmp filled
FLOOD = """print("x" * 30_000_000)
for _path, _n in (("/grading/flood.bin", 100), ("flood.bin", 100)):
    try:
        with open(_path, "wb") as _f:
            for _ in range(_n):
                _f.write(b"\\0" * 2**22)
    except OSError:
        pass
for _i in range(10):
    try:
        with open(f"/tmp/tfbook-flood-{_i}", "wb") as _f:
            _f.write(b"\\0" * 2**25)
    except OSError:
        pass
"""
NO_MAX = """def packed_self_attention(X, W_Q, W_K, W_V, doc):
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    S = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
    doc, T = np.asarray(doc), X.shape[-2]
    S = np.where((doc[..., :, None] == doc[..., None, :]) & np.tril(np.ones((T, T), dtype=bool)), S, -np.inf)
    E = np.exp(S)                      # no max subtraction: overflows at large scores
    P = E / E.sum(axis=-1, keepdims=True)
    return P @ V, P
"""

# ----------------------------------------------------------------- attacks on the grading itself
# (issue 28): each scores what the honest work deserves; the test asserts each row
SOFTMAX = """def softmax(x, axis=-1):
    x = np.asarray(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)
"""
# garbage while the visible checks run, right answers once a later cell has run (the hidden phase)
PHASE = """_phase = {"hidden": False}
def softmax(x, axis=-1):
    if not _phase["hidden"]:
        return np.full(np.shape(x), 0.5)
    x = np.asarray(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)
"""
# the inputs, encoded in an exception's class name registered in builtins
RAISE_NAME = """import builtins
def softmax(x, axis=-1):
    _name = "LEAKX_" + "_".join(str(int(abs(v))) for v in np.ravel(x)[:3])
    _cls = type(_name, (Exception,), {})
    setattr(builtins, _name, _cls)
    raise _cls()
"""
# the inputs, encoded in the class name of a returned object that claims to be torch's
TYPE_NAME = """def softmax(x, axis=-1):
    _name = "LEAKX_" + "_".join(str(int(abs(v))) for v in np.ravel(x)[:3])
    return type(_name, (), {"__module__": "torch.leak"})()
"""
# what it prints: a MathJax javascript: link, terminal escapes (an OSC 8 link, clear screen)
PRINT_HTML = SOFTMAX.replace("    x = np.asarray(x)\n", "    x = np.asarray(x)\n"
                             "    print('✘ $\\\\href{javascript:alert(1)}{click}$ \\x1b]8;;http://evil.example\\x07"
                             "link\\x1b]8;;\\x07 \\x1b[2J')\n", 1)
# the book's own reference function as the answer
REFERENCE = "from tfbook.numpy import softmax\n"
# a value that raises SystemExit, or never stops, when the grader reads it after its test cell
EXIT_VALUE = """class _Shape(tuple):
    def __iter__(self):
        raise SystemExit(0)
prediction_0_2 = _Shape((2, 4, 3, 5))
"""
HANG_VALUE = """class _Shape(tuple):
    def __iter__(self):
        while True:
            try:
                pass
            except BaseException:
                pass
prediction_0_2 = _Shape((2, 4, 3, 5))
"""
# a forged value: 10^12 elements of zero bytes each, sent in place of prediction_0_2
# (the driver's own globals, found by the garbage collector: the student's code runs in its process)
DRIVER = """import gc, sys
_driver = next(d for d in gc.get_objects() if isinstance(d, dict) and "_encode_value" in d and "_call" in d)
"""
ZERO_ITEMSIZE = DRIVER + """import io, base64
prediction_0_2 = (2, 4, 3, 5)
_real_encode = _driver["_encode_value"]
def _forged(value):
    if not (type(value) is tuple and value == (2, 4, 3, 5)):
        return _real_encode(value)
    _buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(_buf, {"descr": "|S0", "fortran_order": False, "shape": (10**12,)})
    return {"ok": True, "value": {"t": "ndarray", "npy": base64.b64encode(_buf.getvalue()).decode()}}
_driver["_encode_value"] = _forged
"""
# a forged memory peak on every answer (2^39 bytes: more than the sandbox may hold)
FORGED_PEAK = DRIVER + """_real_call = _driver["_call"]
def _call(*args, **kwargs):
    msg = _real_call(*args, **kwargs)
    msg["peak"] = 2**39
    return msg
_driver["_call"] = _call
"""
# a fork bomb (bounded by the sandbox's own process budget, never a classmate's)
FORK_BOMB = """import os, time
_kids = 0
try:
    for _ in range(5000):
        _pid = os.fork()
        if _pid == 0:
            time.sleep(20)
            os._exit(0)
        _kids += 1
except OSError:
    pass
print("forked", _kids)
"""
LONG_NAME = "x" * 240
FORMULA_NAME = "=1+2"
# a synthetic chapter whose exercises check in-place changes, a dtype's tolerance and a cache
SYNTH = "99_grader_attacks"
SYNTH_CELLS = [
    ("code", None, "import numpy as np\nfrom tfbook.checks import check_close"),
    ("markdown", None, "## Exercise 99.1\n\nWrite `double(x)`: 2x, leaving `x` as it was."),
    ("code", ("ex99-1-double", False, 0), "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
     "    ### END SOLUTION\n"),
    ("code", ("ex99-1-double-tests", True, 1), """_x = np.arange(3.0)
_keep = _x.copy()
_out = double(_x)
assert np.array_equal(_x, _keep), "✘ the input was changed in place"
check_close(_out, 2 * _keep, "double(x)")
### BEGIN HIDDEN TESTS
_y = np.linspace(0.0, 1.0, 5)
_ykeep = _y.copy()
check_close(double(_y), 2 * _ykeep, "hidden case A")
assert np.array_equal(_y, _ykeep), "hidden case B"
### END HIDDEN TESTS"""),
    ("markdown", None, "## Exercise 99.2\n\nWrite `third(x)`: x / 3 in x's dtype."),
    ("code", ("ex99-2-third", False, 0), "def third(x):\n    ### BEGIN SOLUTION\n    return x / 3\n"
     "    ### END SOLUTION\n"),
    ("code", ("ex99-2-third-tests", True, 1), """check_close(third(np.ones(4)), np.ones(4) / 3, "third(x)")
### BEGIN HIDDEN TESTS
check_close(third(np.full(3, 2.0)), np.full(3, 2.0) / 3, "hidden case A")
### END HIDDEN TESTS"""),
    ("markdown", None, "## Exercise 99.3\n\nWrite `push(cache, x)`: the cache with x appended."),
    ("code", ("ex99-3-push", False, 0), "def push(cache, x):\n    ### BEGIN SOLUTION\n"
     "    return tuple(cache) + (x,)\n    ### END SOLUTION\n"),
    ("code", ("ex99-3-push-tests", True, 1), """_c = ()
for _v in (1.0, 2.0, 3.0):
    _c = push(_c, _v)
assert list(_c) == [1.0, 2.0, 3.0], "✘ the cache holds the values in order"
### BEGIN HIDDEN TESTS
_c = ()
for _v in (5.0, 6.0):
    _c = push(_c, _v)
assert list(_c) == [5.0, 6.0], "hidden case A"
### END HIDDEN TESTS"""),
]
SYNTH_ANSWERS = {
    "syn_correct": {},
    "syn_inplace": {"ex99-1-double": "def double(x):\n    x *= 2\n    return x\n"},
    "syn_float16": {"ex99-2-third": "def third(x):\n    return (x / 3).astype(np.float16)\n"},
    "syn_list_cache": {"ex99-3-push": "def push(cache, x):\n    return list(cache) + [x]\n"},
}


def synthetic_master(spec=None):
    """The master notebook of the synthetic chapter (nbgrader metadata, solutions, hidden tests);
    ``spec``: other ``(kind, (grade_id, graded, points) or None, source)`` rows (default SYNTH_CELLS)."""
    cells = []
    for kind, meta, src in (SYNTH_CELLS if spec is None else spec):
        cell = nbformat.v4.new_code_cell(src) if kind == "code" else nbformat.v4.new_markdown_cell(src)
        if meta:
            gid, graded, points = meta
            cell.metadata["nbgrader"] = {"grade_id": gid, "grade": graded, "solution": not graded,
                                         "locked": graded, "schema_version": 3,
                                         **({"points": points} if graded else {})}
        cells.append(cell)
    return nbformat.v4.new_notebook(cells=cells)


def _synthetic_student(master, answers: dict):
    nb = copy.deepcopy(master)
    for cell in nb.cells:
        gid = course._nbgrader(cell).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
        elif "### BEGIN HIDDEN TESTS" in cell.source:
            cell.source = cell.source.split("### BEGIN HIDDEN TESTS")[0].rstrip()
    return nb


FULL = "full marks"  # an expected score: the assignment's maximum (less a test cell's points: "full marks-<gid>")


def expected_score(score, master) -> float:
    """An EXPECTED score as a number, given the assignment's master notebook."""
    if not isinstance(score, str):
        return float(score)
    full = sum(float(course._nbgrader(c).get("points", 0) or 0) for c in master.cells if course._nbgrader(c).get("grade"))
    less = score.split("-", 1)[1] if "-" in score else None
    return full - (next(float(course._nbgrader(c)["points"]) for c in master.cells
                        if course._nbgrader(c).get("grade_id") == less) if less else 0.0)


# student: {assignment: (score, status, fragment of the reason)}
EXPECTED = {
    # chapters 4 and 7 change while the book is written: full marks, or full marks less one test cell
    "ada_correct": {CH0: (7, "graded", ""), CH4: (FULL, "graded", ""), CH7: (FULL, "graded", "")},
    "ben_wrong": {CH0: (2, "graded", "ex0-1-softmax-tests: visible checks"),
                  CH4: (f"{FULL}-ex4-1-self-attention-tests", "graded",
                        "hidden case D: NaN or inf in the result (overflow at large inputs")},
    "cat_raises": {CH0: (5, "graded", "ex0-3-scores-tests: visible checks: scores raised an exception on this case")},
    "dan_loops": {CH0: (4, "timeout", "ran longer than")},
    "eve_syntax": {CH0: (5, "graded", "ex0-3-scores: SyntaxError")},
    "fay_corrupt": {CH0: (0, "unreadable", "not a notebook")},
    "gus_deleted": {CH0: (5, "graded", "cells deleted: ex0-3-scores, ex0-3-scores-tests")},
    "hal_blank": {CH0: (0, "graded", "ex0-4-prediction-tests")},
    "ivy_empty": {CH0: (0, "unreadable", "empty file")},
    # rebinding `tuple` breaks the student's own process: it ends early, and scores 0
    "cheat_rebind": {CH0: (0, "crashed", "ex0-1-softmax-tests")},
    "cheat_transformer": {CH0: (0, "graded", "ex0-1-softmax-tests")},
    "cheat_failpatch": {CH0: (0, "graded", "ex0-1-softmax-tests")},
    "sig_ignore": {CH0: (7, "timeout", "did not stop")},
    "crash_last": {CH0: (6, "crashed", "crashed the notebook")},
    "dup_cells": {CH0: (7, "graded", "ex0-1-softmax-tests appears again in cell")},
    "tamper_test": {CH0: (4, "graded", "test cell ex0-1-softmax-tests was edited")},
    "del_test": {CH0: (7, "graded", "test cell ex0-3-scores-tests was deleted")},
    "leaky": {CH0: (7, "graded", "")},
    "flood": {CH0: (7, "graded", "")},
    **{name: {CH0: (6, "graded", "ex0-4-prediction-tests")} for name in ATTACKS},
    # the detached process is the attack; the test looks for it after grading
    "atk_detached": {CH0: (7, "graded", "")},
    # attacks on the grading (issue 28): each the honest amount
    "atk_phase": {CH0: (4, "graded", "ex0-1-softmax-tests: visible checks")},
    "atk_raise_name": {CH0: (4, "graded", "softmax raised an exception on this case")},
    "atk_type_name": {CH0: (4, "graded", "softmax returned a value the grader cannot compare")},
    "atk_print_html": {CH0: (7, "graded", "")},
    "atk_reference": {CH0: (4, "graded", "the answer uses a library's softmax")},
    "atk_zero_itemsize": {CH0: (6, "graded", "ex0-2-prediction-tests")},
    "atk_peak": {CH0: (2, "graded", "ex0-1-softmax-tests")},
    "atk_forkbomb": {CH0: (7, "graded", "")},
    "atk_symlink_nb": {CH0: (0, "refused", "is a symbolic link: not followed")},
    "atk_symlink_folder": {CH0: (0, "refused", "the assignment's folder is a symbolic link")},
    "atk_passwd": {CH0: (0, "refused", "is a symbolic link: not followed")},
    "atk_symlink_classmate": {"(none)": (0, "refused", "the student's folder is a symbolic link")},
    ".dot_student": {"(none)": (0, "skipped", "a hidden folder")},
    "flt_exit_value": {CH0: (6, "graded", "ex0-2-prediction-tests: visible checks: prediction_0_2 could not be read")},
    "flt_hang_value": {CH0: (6, "timeout", "ex0-2-prediction-tests: visible checks: prediction_0_2 ran out of time")},
    "flt_no_metadata": {CH0: (7, "graded", "the notebook has no nbgrader metadata")},
    LONG_NAME: {CH0: (7, "graded", "")},
    FORMULA_NAME: {CH0: (7, "graded", "")},
    **{name: {SYNTH: (score, "graded", why)} for name, (score, why) in {
        "syn_correct": (3, ""), "syn_inplace": (2, "ex99-1-double-tests: visible checks: ✘ the input was changed"),
        "syn_float16": (2, "third returned float16 where the exercise's answer is float64"),
        "syn_list_cache": (3, "")}.items()},
}
# the same attacks with no sandbox: each one works (7 points; the victim's file is overwritten)
UNSANDBOXED = {name: 7 for name in ATTACKS}


def solutions(master) -> dict[str, str]:
    return {course._nbgrader(c)["grade_id"]: c.source for c in master.cells
            if course._nbgrader(c).get("solution")}


def _answer(student, answers: dict[str, str]):
    nb = copy.deepcopy(student)
    for cell in nb.cells:
        gid = course._nbgrader(cell).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return nb


def _copy_cell(cell):
    """A copy of a cell as JupyterLab pastes it: the same source and metadata (nbgrader's grade id
    included), a cell id of its own (nbformat 4.5 ids are unique in a notebook)."""
    c = copy.deepcopy(cell)
    c["id"] = (str(cell.get("id") or "cell")[:58] + "-copy")
    return c


def _index(nb, gid):
    return next(i for i, c in enumerate(nb.cells) if course._nbgrader(c).get("grade_id") == gid)


def _write(subs: Path, student: str, assignment: str, nb) -> Path:
    path = subs / student / assignment / f"{assignment}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(nb, str):
        path.write_text(nb, encoding="utf-8")
    else:
        nbformat.write(nb, str(path))
    return path


def make_class(subs: Path, released: dict[str, Path], out: Path, tag: str, port: int,
               names: list[str] | None = None, victims: Path | None = None) -> dict:
    """Write the class into ``subs``; return {student: {assignment: expected}} for those written.

    ``names`` picks students; the attacks' victims (ada_correct, ben_wrong) are classmates
    in ``subs`` unless ``victims`` names another folder, where their notebooks are then
    written (not graded)."""
    masters = {a: nbformat.read(str(ROOT / "notebooks" / f"{a}.ipynb"), as_version=4)
               for a in (CH0, CH4, CH7)}
    students = {a: nbformat.read(str(released[a]), as_version=4) for a in (CH0, CH4, CH7) if a in released}
    right = {a: solutions(m) for a, m in masters.items()}
    r0 = right[CH0]
    home = Path(victims) if victims is not None else subs
    victim = home / "ada_correct" / CH0 / f"{CH0}.ipynb"
    victim_write = home / "ben_wrong" / CH0 / f"{CH0}.ipynb"
    ctx = {"root": str(ROOT), "victim": str(victim), "victim_write": str(victim_write), "out": str(out),
           "tag": tag, "port": port}
    s0 = students[CH0]
    nbs: dict[str, dict] = {}
    nbs["ada_correct"] = {CH0: _answer(s0, r0)}
    if CH4 in students:
        nbs["ada_correct"][CH4] = _answer(students[CH4], right[CH4])
    if CH7 in students:
        nbs["ada_correct"][CH7] = _answer(students[CH7], right[CH7])
    wrong_axis = r0["ex0-1-softmax"].replace("axis=axis, keepdims", "axis=0, keepdims")
    assert wrong_axis != r0["ex0-1-softmax"]
    nbs["ben_wrong"] = {CH0: _answer(s0, {**r0, "ex0-1-softmax": wrong_axis,
                                          "ex0-2-prediction": "prediction_0_2 = (2, 4, 5, 3)",
                                          "ex0-4-prediction": "prediction = 0.5"})}
    if CH4 in students:
        nbs["ben_wrong"][CH4] = _answer(students[CH4], {**right[CH4], "ex4-1-self-attention": NO_MAX})
    nbs["cat_raises"] = {CH0: _answer(s0, {**r0, "ex0-3-scores":
                                           "def scores(Q, K):\n    raise RuntimeError('not today')\n"})}
    nbs["dan_loops"] = {CH0: _answer(s0, {**r0, "ex0-1-softmax": LOOP})}
    nbs["eve_syntax"] = {CH0: _answer(s0, {**r0, "ex0-3-scores": "def scores(Q, K)\n    return Q\n"})}
    nbs["fay_corrupt"] = {CH0: (ROOT / "notebooks" / f"{CH0}.ipynb").read_text(encoding="utf-8")[:500]}
    deleted = _answer(s0, r0)
    deleted.cells = [c for c in deleted.cells
                     if course._nbgrader(c).get("grade_id") not in ("ex0-3-scores", "ex0-3-scores-tests")]
    nbs["gus_deleted"] = {CH0: deleted}
    nbs["hal_blank"] = {CH0: s0}
    nbs["ivy_empty"] = {CH0: ""}
    nbs["cheat_rebind"] = {CH0: _answer(s0, {"ex0-1-softmax": CHEAT_REBIND,
                                             "ex0-2-prediction": "prediction_0_2 = (0, 0, 0, 0)",
                                             "ex0-3-scores": "def scores(Q, K):\n    return np.zeros((9, 9, 9, 9))\n",
                                             "ex0-4-prediction": "prediction = 0.9"})}
    nbs["cheat_transformer"] = {CH0: _answer(s0, {"ex0-1-softmax": CHEAT_TRANSFORMER})}
    nbs["cheat_failpatch"] = {CH0: _answer(s0, {"ex0-1-softmax": CHEAT_FAIL,
                                                "ex0-2-prediction": "prediction_0_2 = (2, 4, 5, 3)",
                                                "ex0-3-scores": "def scores(Q, K):\n    return Q @ K.T\n",
                                                "ex0-4-prediction": "prediction = 0.9"})}
    sig = _answer(s0, r0)
    sig.cells.insert(_index(sig, "ex0-3-scores-tests") + 1, nbformat.v4.new_code_cell(IGNORE_SIGNALS))
    nbs["sig_ignore"] = {CH0: sig}
    nbs["crash_last"] = {CH0: _answer(s0, {**r0, "ex0-4-prediction": CRASH})}
    dup = _answer(s0, r0)
    k = _index(dup, "ex0-1-softmax-tests")
    dup.cells.insert(k + 1, _copy_cell(dup.cells[k]))
    k = _index(dup, "ex0-3-scores")
    dup.cells.insert(k + 1, _copy_cell(dup.cells[k]))
    nbs["dup_cells"] = {CH0: dup}
    tam = _answer(s0, {**r0, "ex0-1-softmax": wrong_axis})
    tam.cells[_index(tam, "ex0-1-softmax-tests")].source = 'print("✔ softmax: all good")'
    nbs["tamper_test"] = {CH0: tam}
    dt = _answer(s0, r0)
    dt.cells = [c for c in dt.cells if course._nbgrader(c).get("grade_id") != "ex0-3-scores-tests"]
    nbs["del_test"] = {CH0: dt}
    leak = _answer(s0, {**r0, "ex0-1-softmax": LEAKY})
    leak.cells.append(nbformat.v4.new_code_cell(LEAKY_LATER))
    nbs["leaky"] = {CH0: leak}
    flood = _answer(s0, r0)
    flood.cells.append(nbformat.v4.new_code_cell(FLOOD))
    nbs["flood"] = {CH0: flood}
    for name, code in ATTACKS.items():
        nbs[name] = {CH0: _answer(s0, {**r0, "ex0-4-prediction": code.format(**ctx) + WIN})}
    phase = _answer(s0, {**r0, "ex0-1-softmax": PHASE})
    phase.cells.append(nbformat.v4.new_code_cell('_phase["hidden"] = True'))
    nbs["atk_phase"] = {CH0: phase}
    nbs["atk_raise_name"] = {CH0: _answer(s0, {**r0, "ex0-1-softmax": RAISE_NAME})}
    nbs["atk_type_name"] = {CH0: _answer(s0, {**r0, "ex0-1-softmax": TYPE_NAME})}
    nbs["atk_print_html"] = {CH0: _answer(s0, {**r0, "ex0-1-softmax": PRINT_HTML})}
    nbs["atk_reference"] = {CH0: _answer(s0, {**r0, "ex0-1-softmax": REFERENCE})}
    nbs["atk_zero_itemsize"] = {CH0: _answer(s0, {**r0, "ex0-2-prediction": ZERO_ITEMSIZE})}
    peak = _answer(s0, r0)
    peak.cells.insert(0, nbformat.v4.new_code_cell(FORGED_PEAK))
    nbs["atk_peak"] = {CH0: peak}
    bomb = _answer(s0, r0)
    bomb.cells.append(nbformat.v4.new_code_cell(FORK_BOMB))
    nbs["atk_forkbomb"] = {CH0: bomb}
    nbs["flt_exit_value"] = {CH0: _answer(s0, {**r0, "ex0-2-prediction": EXIT_VALUE})}
    nbs["flt_hang_value"] = {CH0: _answer(s0, {**r0, "ex0-2-prediction": HANG_VALUE})}
    bare = _answer(s0, r0)
    for cell in bare.cells:
        cell.metadata.pop("nbgrader", None)
    bare.cells.append(nbformat.v4.new_code_cell("prediction_0_2 = 'scratch'  # a scratch cell at the end"))
    nbs["flt_no_metadata"] = {CH0: bare}
    nbs[LONG_NAME] = {CH0: _answer(s0, r0)}
    nbs[FORMULA_NAME] = {CH0: _answer(s0, r0)}
    nbs[".dot_student"] = {CH0: _answer(s0, r0)}
    synth = synthetic_master()
    for student, answers in SYNTH_ANSWERS.items():
        nbs[student] = {SYNTH: _synthetic_student(synth, answers)}
    if victims is not None:
        for student in ("ada_correct", "ben_wrong"):
            _write(home, student, CH0, nbs[student][CH0])
    expected = {}
    for student, per in nbs.items():
        if names is not None and student not in names:
            continue
        for a, nb in per.items():
            _write(subs, student, a, nb)
        expected[student] = dict(EXPECTED[student]) if student == ".dot_student" else \
            {a: EXPECTED[student][a] for a in per}
    links = {  # symbolic links: to the master notebook, to the notebooks folder, to /etc/passwd, to a classmate
        "atk_symlink_nb": (Path(CH0) / f"{CH0}.ipynb", ROOT / "notebooks" / f"{CH0}.ipynb"),
        "atk_symlink_folder": (Path(CH0), ROOT / "notebooks"),
        "atk_passwd": (Path(CH0) / f"{CH0}.ipynb", Path("/etc/passwd")),
        "atk_symlink_classmate": (None, subs / "ada_correct"),
    }
    for student, (rel, target) in links.items():
        if names is not None and student not in names:
            continue
        link = subs / student / rel if rel is not None else subs / student
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
        expected[student] = dict(EXPECTED[student])
    return expected


def main(argv: list[str]) -> int:
    import tempfile

    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    with tempfile.TemporaryDirectory() as tmp:
        released = course.release([ROOT / "notebooks" / f"{a}.ipynb" for a in (CH0, CH4, CH7)],
                                  out=Path(tmp), verbose=False)
        make_class(out / "submissions", released, out / "grades", "demo", 9)
    print(f"wrote {out / 'submissions'}; grade it with: python -m tfbook.course grade "
          f"{out / 'submissions'} --out {out / 'grades'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
