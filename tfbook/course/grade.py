"""``python -m tfbook.course grade``: every submission in its own sandbox, judged outside it.

For each submission (student, assignment) the grader

1. reads the notebook (the original is only ever read) and lays out the job: the
   student's code cells in order, each test cell replaced by the master's visible test
   (an edited test cell is reported; a deleted one is put back after its answer; a
   duplicated one runs once and the copy is named in the reason);
2. runs :mod:`tfbook.course.driver` on it in a sandbox (:mod:`tfbook.course.sandbox`),
   supervising every cell's time from outside: a cell that does not stop when it is
   interrupted, or that crashes the process, is skipped on a fresh run, so it costs only
   the points of what it breaks;
3. sends the sandbox the inputs of the hidden cases only after its visible phase ended,
   receives the student's outputs as plain data, and has the judge
   (:mod:`tfbook.course.judge`) run the master's tests on them in another process that
   never runs student code.

Submissions are graded ``--jobs`` at a time (default: the number of cores).
"""

from __future__ import annotations

import concurrent.futures as cf
import csv
import json
import os
import pickle
import queue
import re
import shutil
import signal
import stat
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from tfbook.course import judge as judge_mod
from tfbook.course import report
from tfbook.course import sandbox
from tfbook.course.wire import Undecodable, decode

ROOT = Path(__file__).resolve().parents[2]
CSV_FIELDS = ["student", "assignment", "score", "max_score", "status", "reason"]
GRACE = 3.0  # seconds a cell gets after its time-out interrupt before the sandbox is killed
MAX_ATTEMPTS = 3  # runs of one submission (each skips the cells that hung or crashed before)
MAX_LINE = 48 * 2**20
MAX_STREAM = 128 * 2**20
UNSANDBOXED = "WARNING: graded WITHOUT a sandbox"


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


# --------------------------------------------------------------------------- the job


def build_job(sub, plan) -> tuple[list[dict], list[str], dict[str, int]]:
    """(cells to run, notes for the reason, {test gid: submission cell index})."""
    tests = {t.gid: t for t in plan.tests}
    cells, notes, placed = [], [], {}
    answer_at: dict[str, list[int]] = {}
    for idx, cell in enumerate(sub.cells):
        if cell.cell_type != "code":
            continue
        meta = judge_mod._nbgrader(cell)
        gid = meta.get("grade_id")
        if gid in tests:
            t = tests[gid]
            if gid in placed:
                notes.append(f"{gid} appears again in cell {idx + 1} (a copy of cell "
                             f"{placed[gid] + 1}): the copy was ignored")
                continue
            placed[gid] = idx
            if judge_mod.normalise(cell.source) != judge_mod.normalise(t.visible):
                notes.append(f"test cell {gid} was edited: the original was run")
            cells.append({"index": idx, "kind": "test", "source": t.visible, "gid": gid,
                          "capture": [list(n) for n in t.names]})
        else:
            if gid in plan.answers:
                answer_at.setdefault(gid, []).append(idx)
            cells.append({"index": idx, "kind": "code", "source": cell.source})
    for gid, where in answer_at.items():
        if len(where) > 1:
            notes.append(f"answer cell {gid} appears {len(where)} times (cells "
                         f"{', '.join(str(i + 1) for i in where)}): all ran, in order")
    extra = 10_000
    for t in plan.tests:
        if t.gid in placed:
            continue
        after = answer_at.get(t.answer)
        pos = len(cells)
        if after:
            pos = next(k for k, c in enumerate(cells) if c["index"] == after[-1]) + 1
            notes.append(f"test cell {t.gid} was deleted: the original was run after its answer")
        cells.insert(pos, {"index": extra, "kind": "test", "source": t.visible, "gid": t.gid,
                           "capture": [list(n) for n in t.names]})
        placed[t.gid] = extra
        extra += 1
    return cells, notes, placed


# --------------------------------------------------------------------------- one sandbox run


@dataclass
class Attempt:
    records: dict = field(default_factory=dict)  # cell index -> end record
    values: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    visible_done: bool = False
    done: bool = False
    culprit: tuple | None = None  # ("cell", index, "timeout"|"crashed") / ("hidden", gid, ...)
    overall: bool = False
    error: str = ""
    waited: float = 0.0  # seconds spent waiting for the judge to record the cases


_ERROR_OK = re.compile(r"(missing|timeout|not a function|raised [A-Za-z_ ]{1,40}|"
                       r"cannot be compared[A-Za-z0-9 _:(),.\-]{0,80})")


def _clean_error(e) -> str:
    return e if isinstance(e, str) and _ERROR_OK.fullmatch(e) else "failed"


def _reader(stream, q: queue.Queue) -> None:
    total = 0
    try:
        while True:
            line = stream.readline(MAX_LINE)
            if not line:
                break
            total += len(line)
            if total > MAX_STREAM:
                q.put(("overflow", None))
                break
            q.put(("line", line))
    except (OSError, ValueError):
        pass
    q.put(("eof", None))


def _writer(stream, data: bytes) -> None:
    try:
        stream.write(struct.pack("<Q", len(data)) + data)
        stream.flush()
    except (OSError, ValueError):
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


def run_attempt(job: dict, scratch: Path, calls_for, *, timeout: float, deadline: float,
                use_bwrap: bool, limits: sandbox.Limits, nproc: int, log: Path) -> Attempt:
    """Run the driver once on ``job``; supervise it; return what it reported."""
    a = Attempt()
    if scratch.exists():
        shutil.rmtree(scratch, ignore_errors=True)
    sandbox.prepare_scratch(scratch)
    inside = sandbox.INSIDE if use_bwrap else str(scratch)
    # in the sandbox, stderr stays the grader's log file (bounded by RLIMIT_FSIZE)
    job = {**job, "log": None if use_bwrap else f"{inside}/driver.log"}
    (scratch / "job.json").write_text(json.dumps(job), encoding="utf-8")
    argv = [sys.executable, "-m", "tfbook.course.driver", f"{inside}/job.json"]
    if use_bwrap:
        files = {"job.json": scratch / "job.json"}
        files.update({f".matplotlib/{f.name}": f for f in sandbox.font_caches()})
        cmd, env, cwd = sandbox.bwrap_command(files, argv, limits), None, None
    else:
        cmd, cwd = argv, str(scratch)
        env = {**os.environ, **sandbox.environment(str(scratch)),
               "PATH": os.environ.get("PATH", "")}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                cwd=cwd, env=env, preexec_fn=sandbox.preexec(limits, nproc))
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
    open_item, item_deadline, hidden_calls = None, None, {}
    try:
        while True:
            now = time.monotonic()
            limit = deadline if item_deadline is None else min(deadline, item_deadline)
            if now >= limit:
                if now >= deadline:
                    a.overall = True
                kind = "timeout"
                if open_item is not None:
                    a.culprit = (*open_item, kind)
                break
            try:
                kind_msg, line = q.get(timeout=min(limit - now, 1.0))
            except queue.Empty:
                continue
            if kind_msg != "line":
                if open_item is not None:
                    a.culprit = (*open_item, "crashed")
                break
            try:
                msg = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(msg, dict):
                continue
            t = msg.get("t")
            if not a.visible_done:
                if t == "start" and isinstance(msg.get("cell"), int):
                    open_item = ("cell", msg["cell"])
                    item_deadline = time.monotonic() + timeout + GRACE
                elif t == "end" and open_item == ("cell", msg.get("cell")):
                    status = msg.get("status") if msg.get("status") in ("ok", "error", "timeout") else "error"
                    a.records[msg["cell"]] = {
                        "status": status,
                        "ename": str(msg.get("ename", ""))[:60],
                        "evalue": str(msg.get("evalue", ""))[:300],
                        "out": str(msg.get("out", ""))[-2000:],
                    }
                    open_item, item_deadline = None, None
                elif t == "value":
                    gid, name = msg.get("gid"), msg.get("name")
                    if isinstance(gid, str) and isinstance(name, str):
                        if msg.get("ok") and msg.get("callable"):
                            a.values.setdefault(gid, {})[name] = (True, None)
                        elif msg.get("ok"):
                            try:
                                a.values.setdefault(gid, {})[name] = (True, decode(msg.get("value")))
                            except (Undecodable, RecursionError, ValueError, OverflowError):
                                a.values.setdefault(gid, {})[name] = (False, "cannot be compared")
                        else:
                            a.values.setdefault(gid, {})[name] = (False, _clean_error(msg.get("error")))
                elif t == "visible-done":
                    a.visible_done = True
                    open_item, item_deadline = None, None
                    t0 = time.monotonic()
                    hidden_calls = calls_for()
                    a.waited += time.monotonic() - t0
                    wanted = {g: c for g, c in hidden_calls.items() if g not in job.get("skip_hidden", [])}
                    data = pickle.dumps(wanted)
                    threading.Thread(target=_writer, args=(proc.stdin, data), daemon=True).start()
                continue
            # hidden phase: only results count; nothing here reaches the feedback
            if t == "hstart" and isinstance(msg.get("gid"), str):
                open_item = ("hidden", msg["gid"])
                item_deadline = time.monotonic() + timeout + GRACE
            elif t == "hend" and open_item == ("hidden", msg.get("gid")):
                open_item, item_deadline = None, None
            elif t == "result" and open_item == ("hidden", msg.get("gid")):
                gid, name, k = msg.get("gid"), msg.get("name"), msg.get("k")
                n = len(hidden_calls.get(gid, {}).get(name, []))
                if isinstance(k, int) and 0 <= k < n:
                    slot = a.results.setdefault(gid, {}).setdefault(name, {})
                    if msg.get("ok"):
                        try:
                            slot[k] = (True, decode(msg.get("value")))
                            peak = msg.get("peak")
                            if isinstance(peak, int) and 0 <= peak < 2**40:  # measured in the sandbox
                                slot[k] += (peak,)
                        except (Undecodable, RecursionError, ValueError, OverflowError):
                            slot[k] = (False, "cannot be compared")
                    else:
                        slot[k] = (False, _clean_error(msg.get("error")))
            elif t == "done":
                a.done = True
                break
    finally:
        _kill(proc)
        _append_driver_log(scratch / "driver.log", log)
    if not a.done and a.culprit is None and not a.overall:
        tail = log.read_bytes()[-400:].decode("utf-8", errors="replace") if log.exists() else ""
        if not a.records and not a.visible_done:
            a.error = f"the sandbox did not start ({tail.strip()[-200:] or 'no message'})"
        else:
            a.culprit = ("end", None, "crashed")
    return a


def _append_driver_log(src: Path, log: Path, limit: int = 64 * 1024) -> None:
    """The tail of what the sandbox wrote to its stderr, for the instructor's log. The file
    is the student's: opened without following a symlink, and only if it is a plain file."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return
        os.lseek(fd, max(st.st_size - limit, 0), os.SEEK_SET)
        data = os.read(fd, limit)
    finally:
        os.close(fd)
    with open(log, "ab") as f:
        f.write(b"\n--- the sandbox's stderr (its last 64 KiB) ---\n" + data)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # bwrap and, unsandboxed, its process group
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    for s in (proc.stdin, proc.stdout):
        try:
            s.close()
        except (OSError, ValueError):
            pass


# --------------------------------------------------------------------------- judges


JUDGE_MEMORY = 8 * 2**30  # the judge runs trusted code on student data: bounded anyway


def _judge_limits() -> None:
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_DATA, (JUDGE_MEMORY, JUDGE_MEMORY))
    except (ValueError, OSError):
        pass


class JudgeProxy:
    """A judge process for one assignment (started at once, prepared in the background)."""

    EVALUATE_TIMEOUT = 300.0  # seconds the judge may take on one submission's data

    def __init__(self, master_path: Path, specs: Path):
        self.args = (str(master_path), str(specs))
        self.lock = threading.Lock()
        self.proc = None
        self._ready = None

    def start(self) -> None:
        """Start the judge (once): when the first submission of its assignment starts, so
        that no more judges than jobs run the master notebooks at the same time."""
        with self.lock:
            if self.proc is None:
                self._start()

    def _start(self) -> None:
        env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1",
               "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tfbook.course.judge", *self.args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=str(ROOT),
                                     preexec_fn=_judge_limits)
        self._ready = None

    def ready(self) -> dict:
        self.start()
        with self.lock:
            if self._ready is None:
                try:
                    status, payload = judge_mod._recv(self.proc.stdout)
                except (EOFError, pickle.UnpicklingError, OSError):
                    status, payload = "failed", "the judge process died"
                self._ready = {"failed": payload} if status != "ready" else payload
            return self._ready

    def calls(self) -> dict:
        r = self.ready()
        return r.get("calls", {}) if "failed" not in r else {}

    def evaluate(self, values, results) -> dict:
        r = self.ready()
        if "failed" in r:
            raise RuntimeError(f"the master notebook could not be run: {r['failed']}")
        import select

        with self.lock:
            try:
                judge_mod._send(self.proc.stdin, (values, results))
                if not select.select([self.proc.stdout], [], [], self.EVALUATE_TIMEOUT)[0]:
                    raise TimeoutError(f"judging this submission took over {self.EVALUATE_TIMEOUT:g} s")
                status, payload = judge_mod._recv(self.proc.stdout)
            except (TimeoutError, EOFError, OSError, pickle.UnpicklingError) as exc:
                # one submission's data hung or killed the judge: a fresh judge for the others
                self.proc.kill()
                self.proc.wait()
                self._start()
                raise RuntimeError(str(exc) or "the judge died on this submission's data") from None
        if status != "ok":
            raise RuntimeError(payload)
        return payload

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            with self.lock:
                judge_mod._send(self.proc.stdin, None)
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --------------------------------------------------------------------------- one submission


def grade_one(row: Row, path: Path, plan, judge: JudgeProxy, work: Path, *, timeout: float,
              total_timeout: float, use_bwrap: bool, limits: sandbox.Limits, nproc: int,
              logs: Path, note: str) -> None:
    start = time.monotonic()
    deadline = start + total_timeout
    judge.start()  # records the cases while the sandbox runs the visible phase
    sub = nbformat.reads(path.read_bytes().decode("utf-8"), as_version=4)
    cells, notes, placed = build_job(sub, plan)
    by_index = {c["index"]: c for c in cells}
    have = {judge_mod._nbgrader(c).get("grade_id") for c in sub.cells}
    deleted = [g for g in plan.order if g not in have]
    job = {"cells": cells, "timeout": timeout, "skip": [], "skip_hidden": [],
           "measure_memory": judge_mod.memory_measuring_tests(plan)}
    events, attempt, waited = [], None, 0.0
    for n in range(MAX_ATTEMPTS):
        row.attempts = n + 1
        attempt = run_attempt(job, work / "scratch", judge.calls, timeout=timeout, deadline=deadline,
                              use_bwrap=use_bwrap, limits=limits, nproc=nproc,
                              log=logs / f"{row.student}__{row.assignment}.run{n + 1}.log")
        waited += attempt.waited
        if attempt.error:
            break
        c = attempt.culprit
        if c is None or attempt.overall:
            break
        where, key, what = c
        if where == "cell" and key in by_index:
            events.append(("cell", key, what))
            job["skip"].append(key)
        elif where == "hidden":
            events.append(("hidden", key, what))
            job["skip_hidden"].append(key)
        else:
            events.append(("end", None, what))
            break
        if n == MAX_ATTEMPTS - 1:
            break
    # the notebook's own time: not the wait for the judge's one-off recording of the cases
    row.seconds = time.monotonic() - start - waited
    row.notebook = path
    if attempt is None or attempt.error:
        row.status, row.reason = "error", (attempt.error if attempt else "not run")
        return
    # what the judge gets: values, results, and the failures the supervisor saw
    values, results = dict(attempt.values), {g: dict(v) for g, v in attempt.results.items()}
    calls = judge.calls()
    for where, key, what in events:
        if where == "hidden":
            results[key] = {name: {k: (False, "timeout" if what == "timeout" else "crashed")
                                   for k in range(len(blobs))}
                            for name, blobs in calls.get(key, {}).items()}
    try:
        verdict = judge.evaluate(values, results)
    except Exception as exc:  # noqa: BLE001
        row.status, row.reason = "error", f"grader: {exc}"[:300]
        return
    row.cells = {i: attempt.records.get(i) for i in by_index}
    for where, key, what in events:
        if where == "cell":
            row.cells[key] = {"status": what, "ename": "", "evalue": "", "out": ""}
    # the reason, most important first
    parts = [note] if note else []
    timed_out = crashed = False
    for where, key, what in events:
        label = _cell_label(by_index.get(key), sub, key) if where == "cell" else f"the hidden cases of {key}"
        if what == "timeout":
            timed_out = True
            parts.append(f"{label} did not stop {GRACE:g} s after its {timeout:g} s time-out "
                         "interrupt: it was skipped on a fresh run")
        else:
            crashed = True
            parts.append(f"{label} crashed the notebook: graded again without it" if where != "end"
                         else "the notebook's process ended early")
    for i, rec in attempt.records.items():
        if rec and rec["status"] == "timeout":
            timed_out = True
            parts.append(f"{_cell_label(by_index.get(i), sub, i)} ran longer than {timeout:g} s "
                         "and was interrupted")
    if attempt.overall:
        timed_out = True
        parts.append(f"the notebook ran past the overall limit of {total_timeout:g} s; "
                     "what ran before was graded")
    if deleted:
        parts.append("cells deleted: " + ", ".join(deleted))
    parts += notes
    broken = []
    for i, rec in attempt.records.items():
        cell = by_index.get(i)
        if cell and cell["kind"] == "code" and rec and rec["status"] == "error":
            gid = judge_mod._nbgrader(sub.cells[i]).get("grade_id") if i < len(sub.cells) else None
            if gid in plan.answers:
                broken.append(f"{gid}: {rec['ename']}")
    if broken:
        parts.append("answer cells raised " + ", ".join(broken))
    lost = []
    row.exercises = []
    for t in plan.tests:
        v = verdict.get(t.gid, {"passed": False, "part": "grader", "diagnosis": "not judged"})
        diagnosis = v["diagnosis"]
        if v["part"] == "visible":
            rec = attempt.records.get(placed.get(t.gid))
            line = _first_cross(rec["out"]) if rec else ""
            if line:
                diagnosis = "visible checks: " + line
        if v["part"] == "grader":
            row.status = "error"
        row.exercises.append({"gid": t.gid, "points": t.points, "score": t.points if v["passed"] else 0.0,
                              "passed": v["passed"], "diagnosis": diagnosis, "part": v["part"],
                              "visible_out": (attempt.records.get(placed.get(t.gid)) or {}).get("out", "")})
        if not v["passed"]:
            lost.append(f"{t.gid}: {diagnosis}")
    if lost:
        parts.append("lost points in " + "; ".join(lost))
    row.score = float(sum(e["score"] for e in row.exercises))
    if row.status != "error":
        row.status = "timeout" if timed_out else ("crashed" if crashed else "graded")
    row.reason = "; ".join(parts)


def _first_cross(text: str) -> str:
    for line in (text or "").splitlines():
        if line.startswith("✘"):
            return line[:240]
    return ""


def _cell_label(cell: dict | None, sub, index) -> str:
    if isinstance(index, int) and index < len(sub.cells):
        gid = judge_mod._nbgrader(sub.cells[index]).get("grade_id")
        return f"cell {index + 1}" + (f" ({gid})" if gid else "")
    if cell and cell.get("gid"):
        return f"test {cell['gid']}"
    return "a cell"


# --------------------------------------------------------------------------- finding submissions


def _find_submission(folder: Path, assignment: str) -> tuple[Path | None, str]:
    exact = folder / f"{assignment}.ipynb"
    if exact.is_file():
        return exact, ""
    others = sorted(p for p in folder.glob("*.ipynb") if p.is_file())
    if len(others) == 1:
        return others[0], f"notebook named {others[0].name}, graded as {assignment}.ipynb"
    return None, f"no {assignment}.ipynb in {folder.name}/"


def _readable(path: Path) -> str:
    """'' if ``path`` is a notebook nbgrader can read, else why not."""
    data = path.read_bytes()
    if not data.strip():
        return "empty file"
    try:
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
    except UnicodeDecodeError:
        return "not UTF-8 text"
    except Exception as exc:  # json.JSONDecodeError, nbformat validation, ...
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"not a notebook ({type(exc).__name__}: {first[:120]})"
    if not isinstance(nb.get("cells"), list):
        return "not a notebook (no cells)"
    return ""


# --------------------------------------------------------------------------- the batch


def _progress(total: int, verbose: bool):
    if not verbose or total == 0:
        return None
    try:
        from tqdm import tqdm

        return tqdm(total=total, unit="notebook", file=sys.stderr, dynamic_ncols=True)
    except ImportError:  # pragma: no cover
        return None


def grade(submissions: Path, out: Path = ROOT / "_build" / "grades", timeout: float = 60,
          total_timeout: float = 900.0, notebooks_dir: Path = ROOT / "notebooks",
          verbose: bool = True, jobs: int | None = None, specs: Path = judge_mod.SPECS,
          use_sandbox: bool | None = None, limits: sandbox.Limits | None = None) -> list[Row]:
    """Grade every ``submissions/<student>/<assignment>/<assignment>.ipynb``; return the rows."""
    submissions, out = Path(submissions), Path(out)
    if not submissions.is_dir():
        raise ValueError(f"SUBMISSIONS_DIR {submissions} is not a folder")
    if timeout <= 0 or total_timeout <= 0:
        raise ValueError("--timeout and --total-timeout must be positive")
    jobs = jobs or os.cpu_count() or 1
    if jobs < 1:
        raise ValueError("--jobs must be at least 1")
    limits = limits or sandbox.Limits(cpu_seconds=int(total_timeout) + 30)
    why = sandbox.available()
    use_bwrap = (not why) if use_sandbox is None else use_sandbox
    if use_bwrap and why:
        raise RuntimeError(f"sandbox requested but unavailable: {why}")
    warning = "" if use_bwrap else f"{UNSANDBOXED} ({why or 'disabled'}): student code ran with the grader's rights"
    if warning and verbose:
        bar = "!" * 78
        print(f"{bar}\n{warning}\n{bar}", file=sys.stderr)
    students = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("feedback", "logs"):
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    logs = out / "logs"
    rows: list[Row] = []
    todo = []
    judges: dict[str, JudgeProxy] = {}
    plans: dict[str, object] = {}
    masters: dict[str, object] = {}
    for student_dir in students:
        for folder in sorted(p for p in student_dir.iterdir() if p.is_dir()):
            a, s = folder.name, student_dir.name
            row = Row(s, a)
            rows.append(row)
            master_path = Path(notebooks_dir) / f"{a}.ipynb"
            if not master_path.is_file():
                row.status, row.reason = "unknown-assignment", f"no notebooks/{a}.ipynb"
                continue
            if a not in plans:
                masters[a] = nbformat.read(str(master_path), as_version=4)
                plans[a] = judge_mod.plan(masters[a], a)
            row.max_score = plans[a].max_score
            path, note = _find_submission(folder, a)
            if path is None:
                row.status, row.reason = "missing", note
                continue
            problem = _readable(path)
            if problem:
                row.status, row.reason = "unreadable", problem
                continue
            if a not in judges:
                judges[a] = JudgeProxy(master_path, Path(specs))
            todo.append((row, path, note))
    nproc = sandbox.nproc_limit(limits, jobs)
    bar = _progress(len(todo), verbose)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tfbook-grade-") as tmp:
        os.chmod(tmp, 0o711)

        def work(k_item):
            k, (row, path, note) = k_item
            try:
                grade_one(row, path, plans[row.assignment], judges[row.assignment],
                          Path(tmp) / f"job{k}", timeout=timeout, total_timeout=total_timeout,
                          use_bwrap=use_bwrap, limits=limits, nproc=nproc, logs=logs, note=note)
            except Exception as exc:  # noqa: BLE001  (one broken submission never stops the batch)
                row.status, row.reason = "error", f"grader: {type(exc).__name__}: {str(exc)[:200]}"
            finally:
                shutil.rmtree(Path(tmp) / f"job{k}", ignore_errors=True)
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"{row.student}/{row.assignment} {row.score:g}/{row.max_score:g}")
            return row

        with cf.ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(work, enumerate(todo)))
        judged = {a: j.ready().get("seconds") for a, j in judges.items() if j.proc is not None}
        for j in judges.values():
            j.close()
    if bar is not None:
        bar.close()
    if warning:
        for r in rows:
            r.reason = "; ".join(filter(None, [warning, r.reason]))
    report.write_feedback(rows, masters, plans, out / "feedback")
    with open(out / "grades.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_FIELDS)
        for r in rows:
            writer.writerow([r.student, r.assignment, f"{r.score:g}", f"{r.max_score:g}", r.status,
                             r.reason])
    report.write_exercise_table(rows, plans, out)
    if verbose:
        report.print_summary(rows, time.perf_counter() - start, warning, judged)
    return rows


# --------------------------------------------------------------------------- check (students)


def check_notebook(path: Path, timeout: float = 60, stream=None) -> int:
    """Run a notebook and its visible tests here (no sandbox: it is the student's own code);
    print each test cell's messages; return the number of test cells that failed."""
    path = Path(path)
    stream = stream or sys.stdout
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    nb = nbformat.reads(path.read_bytes().decode("utf-8"), as_version=4)
    cells, failed = [], 0
    tests = {}
    for idx, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        meta = judge_mod._nbgrader(cell)
        kind = "test" if meta.get("grade") else "code"
        if kind == "test":
            tests[idx] = meta.get("grade_id", f"cell {idx + 1}")
        cells.append({"index": idx, "kind": kind, "source": judge_mod.released_test_source(cell.source)
                      if kind == "test" else cell.source, "gid": meta.get("grade_id")})
    if not tests:
        raise ValueError(f"{path.name} has no test cells (is it a chapter notebook?)")
    with tempfile.TemporaryDirectory(prefix="tfbook-check-") as tmp:
        scratch = Path(tmp) / "scratch"
        job = {"cells": cells, "timeout": timeout, "visible_only": True}
        a = run_attempt(job, scratch, dict, timeout=timeout, deadline=time.monotonic() + 3600,
                        use_bwrap=False, limits=sandbox.Limits(), nproc=sandbox.nproc_limit(sandbox.Limits(), 1),
                        log=Path(tmp) / "check.log")
    if a.error:
        raise RuntimeError(a.error)
    for idx, gid in tests.items():
        rec = a.records.get(idx)
        if rec is None:
            failed += 1
            print(f"{gid}: not reached", file=stream)
            continue
        ok = rec["status"] == "ok"
        failed += not ok
        print(f"{gid}: {'passed' if ok else 'FAILED'}", file=stream)
        for line in rec["out"].splitlines():
            if line.startswith(("✔", "✘")):
                print(f"    {line}", file=stream)
        if not ok and not _first_cross(rec["out"]):
            print(f"    {rec['ename']}: {rec['evalue'][:200]}", file=stream)
    return failed


def median_seconds(rows: list[Row]) -> tuple[float, float]:
    ts = [r.seconds for r in rows if r.seconds]
    return (statistics.median(ts), max(ts)) if ts else (0.0, 0.0)


__all__ = ["grade", "Row", "CSV_FIELDS", "check_notebook", "build_job"]
