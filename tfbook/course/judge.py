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
import hashlib
import importlib.util
import io
import pickle
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import numpy as np

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


# --------------------------------------------------------------------------- digests


def _digest_into(h, x, depth=0) -> None:
    if depth > 20:
        h.update(b"deep")
        return
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        a = np.ascontiguousarray(x)
        h.update(f"nd{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    elif type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "dtype"):
        t = x.detach().cpu()
        h.update(f"t{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.float().numpy().tobytes() if "bfloat16" in str(t.dtype) else t.numpy().tobytes())
    elif hasattr(x, "state_dict") and callable(x.state_dict):
        h.update(type(x).__name__.encode())
        for k, v in x.state_dict().items():
            h.update(k.encode())
            _digest_into(h, v, depth + 1)
    elif isinstance(x, (list, tuple)):
        h.update(f"{type(x).__name__}{len(x)}".encode())
        for i in x:
            _digest_into(h, i, depth + 1)
    elif isinstance(x, dict):
        h.update(f"d{len(x)}".encode())
        for k in sorted(x, key=repr):
            h.update(repr(k).encode())
            _digest_into(h, x[k], depth + 1)
    elif isinstance(x, (int, float, complex, str, bool, type(None))):
        h.update(repr(x).encode())
    else:
        h.update(type(x).__name__.encode())


def digest(args, kwargs) -> str:
    h = hashlib.sha256()
    _digest_into(h, (args, kwargs))
    return h.hexdigest()


# --------------------------------------------------------------------------- record / replay


class _Recorder:
    def __init__(self, name, ref, log):
        self.name, self.ref, self.log = name, ref, log

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
        self.log.append((blob, digest(args, kwargs)))
        return self.ref(*args, **kwargs)


def to_native(x):
    """Decoded wire data with tensors turned back into torch tensors."""
    from tfbook.course.wire import Tensor

    if isinstance(x, Tensor):
        return x.to_torch()
    if isinstance(x, tuple):
        return tuple(to_native(i) for i in x)
    if isinstance(x, list):
        return [to_native(i) for i in x]
    if isinstance(x, dict):
        return {k: to_native(v) for k, v in x.items()}
    return x


class _Replayer:
    def __init__(self, name, log, results, hidden_from: int):
        self.name, self.log, self.results, self.k = name, log, results, 0

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        k = self.k
        self.k += 1
        if k >= len(self.log):
            raise GraderError(f"{self.name} called more often than when the cases were recorded")
        if digest(args, kwargs) != self.log[k][1]:
            raise GraderError(f"call {k + 1} of {self.name} got other inputs than recorded "
                              "(the test is not deterministic?)")
        r = self.results.get(k)
        if r is None:
            raise StudentFailure(f"{self.name} was not called on this case (the run ended early)")
        ok, value = r[0], r[1]
        if not ok:
            raise StudentFailure(_failure_text(self.name, value))
        if len(r) > 2 and r[2] > 0:
            # the peak memory the student's call reached in the sandbox, allocated here once more, so
            # that a test cell measuring the call (tracemalloc) sees the student's memory, not ours
            held = bytearray(r[2])
            del held
        return to_native(copy.deepcopy(value))


# A test cell that measures memory around a call: the grader measures the same call in the sandbox.
MEMORY_MARKERS = ("tracemalloc", "peak_extra_bytes")


def memory_measuring_tests(plan) -> list:
    """The grade ids of the test cells that measure the memory of the student's calls."""
    return [t.gid for t in plan.tests if any(m in t.source for m in MEMORY_MARKERS)]


def _failure_text(name: str, error: str) -> str:
    if error == "timeout":
        return f"{name} ran out of time on this case"
    if error == "missing":
        return f"{name} is not defined (its answer cell failed or was skipped)"
    if error == "crashed":
        return f"{name} crashed the grading run on this case"
    if error == "not a function":
        return f"{name} is not a function"
    if error.startswith("raised "):
        return f"{name} {error}"
    if error.startswith("cannot be compared"):
        return f"{name} returned a value the grader {error}"
    return f"{name} failed ({error[:60]})"


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
    return f"the result could not be checked ({type(exc).__name__}: wrong type or shape?)"


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
        calls = {gid: {n: [b for b, _ in log] for n, log in per.items()}
                 for gid, per in self.logs.items() if gid not in self.broken}
        return {"calls": calls, "broken": dict(self.broken), "seconds": time.perf_counter() - start}

    def _record(self, shell, test: TestCell) -> None:
        snapshot = dict(shell.user_ns)
        self.snapshots[test.gid] = snapshot
        ns = dict(snapshot)
        logs: dict[str, list] = {}
        for name, mode in test.names:
            if mode == "call":
                if not callable(ns.get(name)):
                    self.broken[test.gid] = f"the master's {name} is not a function"
                    return
                logs[name] = []
                ns[name] = _Recorder(name, ns[name], logs[name])
        self.logs[test.gid] = logs
        try:
            exec(compile(test.source, f"<{test.gid}>", "exec"), ns)  # noqa: S102 (master code)
        except GraderError as exc:
            self.broken[test.gid] = str(exc)
        except BaseException as exc:  # noqa: BLE001
            self.broken[test.gid] = (f"the master's own solution fails its test "
                                     f"({type(exc).__name__}: {str(exc)[:200]})")

    def evaluate(self, values: dict, results: dict) -> dict:
        """Judge one submission.

        ``values``: {gid: {name: (ok, decoded value or error)}} for value names;
        ``results``: {gid: {name: {k: (ok, decoded value or error)}}} for function names.
        Returns {gid: {"passed", "part" ("visible"/"hidden"/"grader"), "diagnosis"}}.
        """
        out = {}
        for test in self.plan.tests:
            gid = test.gid
            if gid in self.broken:
                out[gid] = {"passed": False, "part": "grader", "diagnosis": self.broken[gid]}
                continue
            ns = dict(self.snapshots[gid])
            for name, mode in test.names:
                if mode == "call":
                    got = results.get(gid, {}).get(name, {})
                    fail = values.get(gid, {}).get(name)
                    if fail is not None and not fail[0] and not got:
                        got = {k: (False, fail[1]) for k in range(len(self.logs[gid][name]))}
                    ns[name] = _Replayer(name, self.logs[gid][name], got, 0)
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
        sink = io.StringIO()
        for part, src in (("visible", before), ("hidden", hidden), ("visible", after)):
            if not src.strip():
                continue
            try:
                with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), \
                        np.errstate(all="ignore"):
                    exec(compile(src, f"<{test.gid} {part}>", "exec"), ns)  # noqa: S102
            except GraderError as exc:
                return {"passed": False, "part": "grader", "diagnosis": str(exc)}
            except BaseException as exc:  # noqa: BLE001  (whatever the student's data did)
                words = classify(exc)
                if part == "hidden":
                    case = _case(exc)
                    hint = self.hints.get(test.gid, {}).get(case, "") if case else ""
                    label = f"hidden case {case}" if case else "a hidden case"
                    words = f"{label}: {words}" + (f" ({hint})" if hint else "")
                else:
                    words = f"visible checks: {words}"
                return {"passed": False, "part": part, "diagnosis": words}
        return {"passed": True, "part": None, "diagnosis": ""}


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
