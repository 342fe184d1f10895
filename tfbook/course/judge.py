"""The grader's judge: runs a master notebook's tests against a student's *results*,
in the grader's own process, where no student code runs.

How an exercise is graded, without per-exercise code (record, then replay):

1. :func:`plan` reads the master notebook: every test cell, its visible part and its
   hidden part (between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``), and the
   names it takes from the answer cells (``softmax``, ``prediction``): a name an answer
   cell binds with ``def``/``class`` is a *function*, any other a *value*.
2. :meth:`Judge.prepare` runs the master notebook here (trusted code, solutions in).
   At each test cell it keeps a snapshot of the namespace, then runs the whole test cell
   with every function name wrapped by a recorder: the recorder pickles the inputs of
   every call (visible and hidden) and returns the solution's output. These inputs are
   the exercise's cases; they go, as pickles, to the sandbox, which calls the
   student's function on them and sends back plain data.
3. :meth:`Judge.evaluate` runs the same test cell again on the snapshot, with each
   function name replaced by a replayer that returns the student's recorded outputs
   in order (and checks that the inputs are those recorded), and each value name set to
   the student's value. The test cell's own checks decide, exactly as in the notebook;
   the student's code cannot touch them.

A failing *hidden* check is reported as the property that failed (wrong shape, NaN or
inf, wrong values, wrong dtype, the function raised or timed out), plus the chapter's
description of the case from ``course/specs/<assignment>.py`` when there is one
(``HIDDEN = {test grade_id: {case letter: "what the case probes"}}``); never an input,
a shape or an expected value.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib.util
import io
import pickle
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import numpy as np

from tfbook.course.wire import Undecodable, apply_changes, digest

HIDDEN_BEGIN, HIDDEN_END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"
SPECS = Path(__file__).resolve().parents[2] / "course" / "specs"


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


class GraderError(Exception):
    """The grader cannot judge this exercise (a bug or a limit of the grader, not the student's)."""


class StudentFailure(Exception):
    """The student's function failed on a case in the sandbox (raised, timed out, ...)."""


# --------------------------------------------------------------------------- the plan


def split_test(source: str) -> tuple[str, str, str]:
    """(before, hidden, after) parts of a test cell's source."""
    before, hidden, after, where = [], [], [], 0
    for line in source.splitlines():
        if HIDDEN_BEGIN in line:
            where = 1
        elif HIDDEN_END in line:
            where = 2
        else:
            (before, hidden, after)[where].append(line)
    return "\n".join(before), "\n".join(hidden), "\n".join(after)


def released_test_source(source: str) -> str:
    """A test cell as the student receives it (nbgrader drops the hidden region)."""
    before, _, after = split_test(source)
    return "\n".join(p for p in (before, after) if p)


def normalise(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.splitlines() if line.strip())


def _bound_names(source: str) -> dict[str, str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    out: dict[str, str] = {}

    def targets(node):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, (ast.Tuple, ast.List)):
            for e in node.elts:
                yield from targets(e)
        elif isinstance(node, ast.Starred):
            yield from targets(node.value)

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = "call"
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                for n in targets(t):
                    out[n] = "value"
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            for n in targets(node.target):
                out[n] = "value"
    return out


def _loaded_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set(re.findall(r"[A-Za-z_]\w*", source))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _last_section(markdown: str) -> str:
    """The markdown from its last heading on (the exercise's own text)."""
    lines = markdown.splitlines()
    heads = [i for i, line in enumerate(lines) if line.lstrip().startswith("#")]
    return "\n".join(lines[heads[-1]:] if heads else lines)


@dataclass
class TestCell:
    gid: str
    index: int  # cell index in the master
    points: float
    source: str
    names: list[tuple[str, str]]  # (name, "call" | "value")
    answer: str | None = None  # grade_id of the answer cell it belongs to
    task: str = ""  # the markdown of the exercise (public)

    @property
    def visible(self) -> str:
        return released_test_source(self.source)


@dataclass
class Plan:
    assignment: str
    tests: list[TestCell] = field(default_factory=list)
    answers: dict[str, str] = field(default_factory=dict)  # answer grade_id -> master source
    order: list[str] = field(default_factory=list)  # every grade_id, in the master's order
    sources: set = field(default_factory=set)  # the master's code cells (normalised, NBVAL lines dropped)

    @property
    def max_score(self) -> float:
        return float(sum(t.points for t in self.tests))

    def test(self, gid: str) -> TestCell:
        return next(t for t in self.tests if t.gid == gid)


def plan(master, assignment: str) -> Plan:
    """The exercises of a master notebook (see the module docstring)."""
    p = Plan(assignment)
    defined: dict[str, str] = {}
    last_answer, last_markdown, task = None, "", ""
    for i, cell in enumerate(master.cells):
        meta = _nbgrader(cell)
        if meta.get("grade_id"):
            p.order.append(meta["grade_id"])
        if cell.cell_type == "markdown":
            last_markdown = cell.source
            continue
        if cell.cell_type != "code":
            continue
        p.sources.add("\n".join(l.rstrip() for l in cell.source.splitlines()
                                if l.strip() and not re.match(r"^\s*#\s*NBVAL_[A-Z_]+\s*$", l)))
        if meta.get("solution") and not meta.get("grade"):
            last_answer = meta.get("grade_id")
            p.answers[last_answer] = cell.source
            defined.update(_bound_names(cell.source))
            task = _last_section(last_markdown)
        elif meta.get("grade"):
            loaded = _loaded_names(cell.source)
            names = sorted((n, m) for n, m in defined.items() if n in loaded)
            p.tests.append(TestCell(meta["grade_id"], i, float(meta.get("points", 0) or 0),
                                    cell.source, names, last_answer, task))
    return p


# --------------------------------------------------------------------------- record / replay


def _skeleton(x, depth=0):
    """The dtypes of a value's arrays and tensors, in its structure (the solution's outputs)."""
    if depth > 4:
        return None
    if isinstance(x, (np.ndarray, np.generic)) or (type(x).__module__ or "").startswith("torch") and hasattr(x, "dtype"):
        return str(x.dtype).replace("torch.", "")
    if isinstance(x, (list, tuple)):
        return [_skeleton(i, depth + 1) for i in x]
    return None


class _Recorder:
    def __init__(self, name, ref, log, part):
        self.name, self.ref, self.log, self.part = name, ref, log, part

    def __call__(self, *args, **kwargs):
        try:
            blob = pickle.dumps((args, kwargs))
        except Exception:  # noqa: BLE001  (e.g. a lambda the test passes in: pickled by value)
            try:
                import cloudpickle

                blob = cloudpickle.dumps((args, kwargs))
            except Exception as exc:  # noqa: BLE001
                raise GraderError(f"the inputs of {self.name} cannot be pickled "
                                  f"({type(exc).__name__}); this exercise needs a spec") from None
        entry = [blob, digest(args, kwargs), self.part[0], None]
        self.log.append(entry)
        out = self.ref(*args, **kwargs)
        entry[3] = _skeleton(out)
        return out


def to_native(x):
    """Decoded wire data with tensors turned back into torch tensors."""
    from tfbook.course.wire import DictOf, SetOf, Tensor

    if isinstance(x, Tensor):
        return x.to_torch()
    if isinstance(x, (SetOf, DictOf)):  # hashed here, in the judge (its CPU time is limited), never in the grader
        return x.build(to_native)
    if isinstance(x, tuple):
        return tuple(to_native(i) for i in x)
    if isinstance(x, list):
        return [to_native(i) for i in x]
    if isinstance(x, dict):
        return {k: to_native(v) for k, v in x.items()}
    return x


_PRECISION = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3, "complex64": 2, "complex128": 3}


def lower_precision(value, skeleton) -> tuple[str, str] | None:
    """(the student's dtype, the solution's) where the student's result has a floating array or
    tensor less precise than the solution's output in the same place, else None. A check's
    default tolerance follows the dtypes it compares (float16: 1e-2), so such a result would
    widen it by the student's choice: it fails instead, with this reason."""
    if isinstance(skeleton, list) and isinstance(value, (list, tuple)) and len(skeleton) == len(value):
        for v, k in zip(value, skeleton):
            found = lower_precision(v, k)
            if found:
                return found
        return None
    if not isinstance(skeleton, str) or skeleton not in _PRECISION:
        return None
    have = _dtype_as_checked(value)
    if have in _PRECISION and _PRECISION[have] < _PRECISION[skeleton]:
        return have, skeleton
    return None


def _dtype_as_checked(value, depth: int = 0) -> str:
    """The floating dtype a check sees in ``value``, whatever holds it: an array's or tensor's
    own; a list or tuple (nested) as ``np.asarray`` makes it (float16 rows in a list are a
    float16 array to the check), or, where that fails (ragged, tensors inside), its least
    precise item. '' where there is none."""
    from tfbook.course.wire import Tensor

    if depth > 8:
        return ""
    if isinstance(value, Tensor):
        return value.dtype
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        return str(dtype).replace("torch.", "")
    if isinstance(value, float):
        return "float64"
    if isinstance(value, (list, tuple)) and value:
        try:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                arr = np.asarray(value)
            if arr.dtype.kind in "fc":
                return str(arr.dtype)
        except (ValueError, TypeError, OverflowError):
            pass
        found = [d for d in (_dtype_as_checked(v, depth + 1) for v in value) if d in _PRECISION]
        return min(found, key=_PRECISION.get) if found else ""
    return ""


class _Replayer:
    """Stands for the student's function in the replay of a test cell: each call gets the
    student's result for the same inputs. A call the *visible* checks make is answered with
    what the student's function returned when the visible test cell ran in the sandbox (so
    visible answers are scored as they were shown); a hidden call with what it returned in
    the hidden phase. Changes the student's function made to its arguments in place are
    written into the replay's arguments."""

    def __init__(self, name, log, results, visible=None, failure=None, changed=None):
        self.name, self.log, self.results, self.k, self.failure = name, log, results, 0, failure
        self.changed = [] if changed is None else changed  # the names whose calls changed an input in place
        self.visible = {}
        for d, r in (visible or []):
            self.visible.setdefault(d, []).append(r)

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        k = self.k
        self.k += 1
        if k >= len(self.log):
            raise GraderError(f"{self.name} called more often than when the cases were recorded")
        blob, want, part, skeleton = self.log[k]
        if digest(args, kwargs) != want:
            if self.changed:  # an earlier call changed the array the test passes again: the student's doing
                raise StudentFailure(
                    f"{self.changed[0]} changed its input in place, so the test's next call got the changed "
                    "array instead of the one the test made: return a new array and leave the input as it was")
            raise GraderError(f"call {k + 1} of {self.name} got other inputs than recorded "
                              "(the test is not deterministic?)")
        if self.failure is not None:
            raise StudentFailure(_failure_text(self.name, self.failure))
        if part == "v":
            queue = self.visible.get(want)
            if not queue:
                raise StudentFailure(f"{self.name} did not answer this call of the visible checks "
                                     "when they ran in your notebook")
            r = queue.pop(0)
        else:
            r = self.results.get(k)
        if r is None:
            raise StudentFailure(f"{self.name} was not called on this case (the run ended early)")
        ok, value = r[0], r[1]
        if not ok:
            raise StudentFailure(_failure_text(self.name, value))
        extra = r[2] if len(r) > 2 and isinstance(r[2], dict) else {}
        if extra.get("changes"):
            self.changed.append(self.name)
            try:
                apply_changes(args, kwargs, extra["changes"])
            except Undecodable:
                raise StudentFailure(f"{self.name} changed the type or shape of an input in place") from None
        if extra.get("peak", 0) > 0:
            # the peak memory the student's call reached in the sandbox, allocated here once more, so
            # that a test cell measuring the call (tracemalloc) sees the student's memory, not ours
            # (np.empty: tracemalloc counts it, and its pages are never touched, so the judge's
            # memory does not grow by a student's claim)
            held = np.empty(int(extra["peak"]), dtype=np.uint8)
            del held
        lower = lower_precision(value, skeleton)
        if lower:
            raise StudentFailure(f"{self.name} returned {lower[0]} where the exercise's answer is "
                                 f"{lower[1]} (less precise than asked)")
        return to_native(copy.deepcopy(value))


# A test cell that measures memory around a call: the grader measures the same call in the sandbox.
MEMORY_MARKERS = ("tracemalloc", "peak_extra_bytes")


def memory_measuring_tests(plan) -> list:
    """The grade ids of the test cells that measure the memory of the student's calls."""
    return [t.gid for t in plan.tests if any(m in t.source for m in MEMORY_MARKERS)]


# What the grader says when a student's function failed in the sandbox. The sandbox sends one of
# these codes (anything else reads "failed"): never a class name or a message, which the student's
# code chooses and which could carry the hidden inputs out.
_FAILURES = {
    "timeout": "{name} ran out of time on this case",
    "missing": "{name} is not defined (its answer cell failed or was skipped)",
    "crashed": "{name} crashed the grading run on this case",
    "not a function": "{name} is not a function",
    "raised": "{name} raised an exception on this case",
    "uncomparable": ("{name} returned a value the grader cannot compare (numbers, strings, lists, "
                     "tuples, dicts, NumPy arrays and torch tensors only)"),
    "unreadable": "{name} could not be read after its test cell (reading it failed)",
    "failed": "{name} failed on this case",
}

# exception class names the grader may print: Python's own (a student's class may be named
# anything, and registering it in builtins does not put it in this list)
KNOWN_ERRORS = frozenset({
    "ArithmeticError", "AssertionError", "AttributeError", "BufferError", "EOFError", "Exception",
    "FloatingPointError", "ImportError", "IndexError", "KeyError", "KeyboardInterrupt", "LookupError",
    "MemoryError", "ModuleNotFoundError", "NameError", "NotImplementedError", "OSError",
    "OverflowError", "RecursionError", "RuntimeError", "StopIteration", "SyntaxError",
    "IndentationError", "TabError", "SystemExit", "TimeoutError", "TypeError", "UnboundLocalError",
    "UnicodeError", "UnicodeDecodeError", "UnicodeEncodeError", "ValueError", "ZeroDivisionError",
    "CheckFailed",
})


def error_name(name) -> str:
    """``name`` if it is one of :data:`KNOWN_ERRORS`, else "an exception"."""
    return name if isinstance(name, str) and name in KNOWN_ERRORS else "an exception"


def _failure_text(name: str, error: str) -> str:
    return _FAILURES.get(error, _FAILURES["failed"]).format(name=name)


# --------------------------------------------------------------------------- diagnosis

_PROPERTIES = [
    ("wrong shape", "wrong shape"),
    ("contains NaN", "NaN or inf in the result"),
    ("contains inf", "NaN or inf in the result"),
    ("is None", "returned None"),
    ("cannot be read as an array", "not an array"),
    ("is off by", "wrong values"),
    ("should return the pair", "wrong structure (not the expected pair)"),
    ("sum to", "rows do not sum to 1"),
    ("is uniform", "wrong values (uniform)"),
]


def classify(exc: BaseException) -> str:
    """The property a failed check is about, in words with no numbers in them."""
    if isinstance(exc, StudentFailure):
        return str(exc)
    msg = str(exc)
    for key, words in _PROPERTIES:
        if key in msg:
            return words
    if isinstance(exc, AssertionError):
        return "the property checked does not hold"
    if isinstance(exc, NameError):
        name = getattr(exc, "name", None)
        if isinstance(name, str) and re.fullmatch(r"[A-Za-z_]\w{0,40}", name):
            return f"{name} is not defined (its answer cell failed or was skipped)"
        return "a name the test needs is not defined"
    return f"the result could not be checked ({error_name(type(exc).__name__)}: wrong type or shape?)"


def _case(exc: BaseException) -> str | None:
    m = re.search(r"hidden case ([A-Za-z0-9]+)", str(exc))
    return m.group(1) if m else None


def load_hints(assignment: str, specs: Path = SPECS) -> dict:
    path = specs / f"{assignment}.py"
    if not path.is_file():
        return {}
    spec = importlib.util.spec_from_file_location(f"tfbook_course_spec_{assignment}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(getattr(module, "HIDDEN", {}))


# --------------------------------------------------------------------------- the judge


class Judge:
    def __init__(self, master_path: Path, specs: Path = SPECS):
        self.path = Path(master_path)
        self.master = nbformat.read(str(self.path), as_version=4)
        self.plan = plan(self.master, self.path.stem)
        self.hints = load_hints(self.path.stem, specs)
        self.snapshots: dict[str, dict] = {}
        self.logs: dict[str, dict[str, list]] = {}
        self.broken: dict[str, str] = {}

    def prepare(self) -> dict:
        """Run the master notebook here and record every test's calls."""
        import os

        os.environ.setdefault("MPLBACKEND", "Agg")
        start = time.perf_counter()
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        tests = {t.index: t for t in self.plan.tests}
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            for i, cell in enumerate(self.master.cells):
                if cell.cell_type != "code":
                    continue
                test = tests.get(i)
                if test is not None:
                    self._record(shell, test)
                shell.run_cell(cell.source, store_history=False)
                try:
                    import matplotlib.pyplot as plt

                    plt.close("all")
                except Exception:  # noqa: BLE001
                    pass
        # the sandbox's hidden phase answers the calls of the hidden part: {gid: {name: [(k, blob)]}}
        calls = {gid: {n: [(k, e[0]) for k, e in enumerate(log) if e[2] == "h"] for n, log in per.items()}
                 for gid, per in self.logs.items() if gid not in self.broken}
        return {"calls": calls, "broken": dict(self.broken), "seconds": time.perf_counter() - start}

    def _record(self, shell, test: TestCell) -> None:
        snapshot = dict(shell.user_ns)
        self.snapshots[test.gid] = snapshot
        ns = dict(snapshot)
        logs: dict[str, list] = {}
        part = ["v"]  # which part of the test cell is running: visible ("v") or hidden ("h")
        for name, mode in test.names:
            if mode == "call":
                if not callable(ns.get(name)):
                    self.broken[test.gid] = f"the master's {name} is not a function"
                    return
                logs[name] = []
                ns[name] = _Recorder(name, ns[name], logs[name], part)
        self.logs[test.gid] = logs
        try:
            for tag, src in zip("vhv", split_test(test.source)):  # as the replay runs it, part by part
                if src.strip():
                    part[0] = tag
                    exec(compile(src, f"<{test.gid}>", "exec"), ns)  # noqa: S102 (master code)
        except GraderError as exc:
            self.broken[test.gid] = str(exc)
        except BaseException as exc:  # noqa: BLE001
            self.broken[test.gid] = (f"the master's own solution fails its test "
                                     f"({type(exc).__name__}: {str(exc)[:200]})")

    def evaluate(self, values: dict, results: dict, visible: dict | None = None) -> dict:
        """Judge one submission.

        ``values``: {gid: {name: (ok, decoded value or error)}} for value names;
        ``results``: {gid: {name: {k: (ok, decoded value or error[, extra])}}} for function names
        (the hidden phase's answers to call k; ``extra``: {"changes": in-place changes, "peak": bytes});
        ``visible``: {gid: {name: [(digest of the inputs, (ok, value or error[, extra]))]}}: what the
        function returned to the visible checks when they ran in the sandbox.
        Returns {gid: {"passed", "part" ("visible"/"hidden"/"grader"), "diagnosis"}}.
        """
        out = {}
        for test in self.plan.tests:
            gid = test.gid
            if gid in self.broken:
                out[gid] = {"passed": False, "part": "grader", "diagnosis": self.broken[gid]}
                continue
            ns = dict(self.snapshots[gid])
            unusable = [(name, v[1]) for name, mode in test.names if mode == "value"
                        for v in [values.get(gid, {}).get(name)] if v is not None and not v[0]
                        and v[1] != "missing"]
            if unusable:  # a value the test needs could not be read: the test fails, in fixed words
                out[gid] = {"passed": False, "part": "visible", "out": "",
                            "diagnosis": "visible checks: " + _failure_text(*unusable[0])}
                continue
            changed: list = []
            for name, mode in test.names:
                if mode == "call":
                    got = results.get(gid, {}).get(name, {})
                    seen = (visible or {}).get(gid, {}).get(name, [])
                    fail = values.get(gid, {}).get(name)
                    ns[name] = _Replayer(name, self.logs[gid][name], got, seen,
                                         failure=fail[1] if fail is not None and not fail[0] else None,
                                         changed=changed)
                else:
                    v = values.get(gid, {}).get(name)
                    if v is None or not v[0]:
                        ns.pop(name, None)
                        if v is not None and v[1] not in ("missing",):
                            ns[name] = _Unusable(name, v[1])
                    else:
                        ns[name] = to_native(copy.deepcopy(v[1]))
            out[gid] = self._replay(test, ns)
        return out

    def _replay(self, test: TestCell, ns: dict) -> dict:
        before, hidden, after = split_test(test.source)
        sink = io.StringIO()  # what the visible checks print (shown); the hidden part's prints are dropped
        for part, src in (("visible", before), ("hidden", hidden), ("visible", after)):
            if not src.strip():
                continue
            out = sink if part == "visible" else io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), \
                        np.errstate(all="ignore"):
                    exec(compile(src, f"<{test.gid} {part}>", "exec"), ns)  # noqa: S102
            except GraderError as exc:
                return {"passed": False, "part": "grader", "diagnosis": str(exc), "out": _visible_out(sink)}
            except BaseException as exc:  # noqa: BLE001  (whatever the student's data did)
                words = classify(exc)
                if part == "hidden":
                    case = _case(exc)
                    hint = self.hints.get(test.gid, {}).get(case, "") if case else ""
                    label = f"hidden case {case}" if case else "a hidden case"
                    words = f"{label}: {words}" + (f" ({hint})" if hint else "")
                else:
                    words = f"visible checks: {_first_cross(sink.getvalue(), exc) or words}"
                return {"passed": False, "part": part, "diagnosis": words, "out": _visible_out(sink)}
        return {"passed": True, "part": None, "diagnosis": "", "out": _visible_out(sink)}


def _first_cross(text: str, exc: BaseException) -> str:
    """The first ✘ line the checks printed (or raised) in the replay: the checks' own words,
    computed here on the student's results, never a line the student's code printed."""
    for line in (text or "").splitlines() + str(exc).splitlines()[:1]:
        if line.startswith("✘"):
            return line[:240]
    return ""


def _visible_out(sink) -> str:
    """What the checks printed in the replay, up to the hidden part's first line (the hidden
    part's prints are not shown)."""
    return sink.getvalue()[-4000:]


class _Unusable:
    """A value the student's notebook had but the grader could not receive."""

    def __init__(self, name, why):
        self._why = f"{name} {why}"

    def __getattr__(self, item):
        raise StudentFailure(self._why)

    def __float__(self):
        raise StudentFailure(self._why)

    def __int__(self):
        raise StudentFailure(self._why)

    def __iter__(self):
        raise StudentFailure(self._why)

    def __array__(self, *a, **k):
        raise StudentFailure(self._why)


# --------------------------------------------------------------------------- served in a process


def _send(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


def _recv(stream):
    head = stream.read(8)
    if len(head) != 8:
        raise EOFError
    return pickle.loads(stream.read(int.from_bytes(head, "little")))  # the grader's own data


def serve(master_path: str, specs: str) -> None:
    """``python -m tfbook.course.judge MASTER SPECS``: a judge process of the grader.

    It talks pickles with the grader over its stdin/stdout (both trusted: no student
    bytes are ever unpickled here; the student's data arrive already decoded)."""
    import os
    import sys

    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray prints cannot corrupt the channel
    inp = sys.stdin.buffer
    try:
        judge = Judge(Path(master_path), Path(specs))
        _send(out, ("ready", judge.prepare()))
    except BaseException as exc:  # noqa: BLE001
        _send(out, ("failed", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            request = _recv(inp)
        except EOFError:
            return
        if request is None:
            return
        try:
            _send(out, ("ok", judge.evaluate(*request)))
        except BaseException as exc:  # noqa: BLE001
            _send(out, ("failed", f"{type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    import sys

    serve(*sys.argv[1:3])
