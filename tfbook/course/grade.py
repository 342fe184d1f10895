"""``python -m tfbook.course grade``: every submission in its own sandbox, judged outside it.

For each submission (student, assignment) the grader

1. reads the notebook (the original is only ever read) and lays out the job: the
   student's code cells in order, each test cell replaced by the master's visible test
   (an edited test cell is reported; a deleted one is put back after its answer; a
   duplicated one runs once and the copy is named in the reason);
2. runs :mod:`tfbook.course.driver` on it in a sandbox (:mod:`tfbook.course.sandbox`),
   supervising every cell's time from outside: a cell that does not stop when it is
   interrupted, or that crashes the process, is skipped on a fresh run, so it costs only
   the points of what it breaks. Time is measured so that a loaded machine does not use it
   up (:class:`~tfbook.course.sandbox.Meter`): a cell's limit (``--timeout``) and a
   notebook's (``--total-timeout``) are CPU seconds, with a backstop of ``WALL_FACTOR`` times
   as many wall-clock seconds *less the time spent waiting for a CPU* for code that sleeps or
   blocks;
3. sends the sandbox the inputs of the hidden cases only after its visible phase ended,
   receives the student's outputs as plain data, and has the judge
   (:mod:`tfbook.course.judge`) run the master's tests on them in another process that
   never runs student code.

Submissions are graded ``--jobs`` at a time (default: the number of cores).
"""

from __future__ import annotations

import concurrent.futures as cf
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
from tfbook.course import policies
from tfbook.course import release as release_mod
from tfbook.course import report
from tfbook.course import sandbox
from tfbook.course.wire import Undecodable, decode

ROOT = Path(__file__).resolve().parents[2]
CSV_FIELDS = report.CSV_FIELDS
GRACE = 3.0  # seconds (of CPU, or of the backstop) a cell gets after its interrupt before the sandbox is killed
# A limit of T CPU seconds also stops code after WALL_FACTOR * T seconds of wall-clock time not
# spent waiting for a CPU (code that sleeps, or blocks, uses no CPU). Honest code waits for
# nothing else, so it never meets the backstop first, at any load; a sleeper holds a job slot
# (not a core) for at most 3 T. Where the kernel does not count the run-queue delay (no
# /proc/<pid>/schedstat), the backstop is plain wall-clock time, PLAIN_WALL_FACTOR * T: fair up
# to a load of about that many times the cores, for code using all of its CPU limit.
WALL_FACTOR = 3.0
PLAIN_WALL_FACTOR = 10.0
SAMPLE = 0.25  # seconds between two readings of a sandbox's meter
MAX_ATTEMPTS = 3  # runs of one submission (each skips the cells that hung or crashed before)
GRADER_CPU = 60.0  # CPU seconds the grader itself may spend on one submission's messages (all its runs)
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


def read_submission(text: str):
    """A student's notebook from its text. Cells that share an id (a cell copied by a tool that
    kept its id) are given new ids by nbformat, silently: :func:`build_job` names a duplicated
    test or answer cell in the reason, and the console is no place for the student's data."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Non-unique cell id")
        return nbformat.reads(text, as_version=4)


def build_job(sub, plan) -> tuple[list[dict], list[str], dict[str, int]]:
    """(cells to run, notes for the reason, {test gid: submission cell index}).

    A test cell that appears more than once (Jupyter copies keep the grading metadata) runs
    where the master has it: the first occurrence after its answer cell (or the first one, where
    the answer cannot be found); every other occurrence is a copy, reported and never run."""
    tests = {t.gid: t for t in plan.tests}
    by_source = {judge_mod.normalise(t.visible): t.gid for t in plan.tests}
    kinds: dict[int, str | None] = {}  # code cell index -> the test gid it is, or None
    occurrences: dict[str, list[int]] = {}
    answer_at: dict[str, list[int]] = {}
    for idx, cell in enumerate(sub.cells):
        if cell.cell_type != "code":
            continue
        meta = judge_mod._nbgrader(cell)
        gid = meta.get("grade_id")
        if gid is None:  # no nbgrader metadata (a notebook saved by another tool): a test cell by its source
            gid = by_source.get(judge_mod.normalise(cell.source))
        if gid in tests:
            kinds[idx] = gid
            occurrences.setdefault(gid, []).append(idx)
        else:
            kinds[idx] = None
            if gid in plan.answers:
                answer_at.setdefault(gid, []).append(idx)
    chosen: dict[str, int] = {}
    for gid, where in occurrences.items():
        answer = answer_at.get(tests[gid].answer)
        after = [i for i in where if answer and i > answer[-1]]
        chosen[gid] = after[0] if after else where[0]
    cells, notes, placed = [], [], {}
    for idx, cell in enumerate(sub.cells):
        if idx not in kinds:
            continue
        gid = kinds[idx]
        if gid is not None:
            t = tests[gid]
            if chosen[gid] != idx:
                where = "above its answer" if idx < chosen[gid] else "below it"
                notes.append(f"{gid} appears again in cell {idx + 1} (a copy of test cell {gid}, "
                             f"{where}; the test runs in cell {chosen[gid] + 1}): the copy was ignored")
                continue
            placed[gid] = idx
            if judge_mod.normalise(cell.source) != judge_mod.normalise(t.visible):
                notes.append(f"test cell {gid} was edited: the original was run")
            cells.append({"index": idx, "kind": "test", "source": t.visible, "gid": gid,
                          "capture": [list(n) for n in t.names]})
        else:
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


def wall_factor() -> float:
    return WALL_FACTOR if sandbox.run_queue_delays_available() else PLAIN_WALL_FACTOR


@dataclass
class Budget:
    """One notebook's overall limits and what its runs have used of them: CPU seconds, and the
    wall-clock backstop (seconds not spent waiting for a CPU, nor for the judge)."""
    cpu: float
    wall: float
    cpu_used: float = 0.0
    wall_used: float = 0.0
    grader_used: float = 0.0  # the grader's own CPU seconds on this notebook's messages

    @classmethod
    def of(cls, total_timeout: float) -> "Budget":
        return cls(cpu=total_timeout, wall=wall_factor() * total_timeout)

    def spent(self, cpu: float = 0.0, wall: float = 0.0) -> bool:
        return self.cpu_used + cpu >= self.cpu or self.wall_used + wall >= self.wall


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
    cpu: float = 0.0  # CPU seconds the sandbox used
    own: float = 0.0  # its wall-clock seconds not spent waiting for a CPU (nor for the judge)
    limit: dict = field(default_factory=dict)  # cell index -> "cpu"|"wall": which limit interrupted it
    visible: dict = field(default_factory=dict)  # gid -> name -> [(digest, answer)]
    kernel_peaks: dict = field(default_factory=dict)  # measured gid -> bytes its hidden calls took (kernel)
    grader_cpu: float = 0.0  # CPU seconds the grader's own threads spent reading this run's messages


KERNEL_SLACK = 32 * 2**20  # bytes a measured test's window may grow by without the student's code


class _Window:
    """The kernel's measure (the slot's memory cgroup) of what a sandbox allocates from now on:
    opened by the grader when it sends the hidden inputs (before the sandbox has them, so no
    result can be computed outside it), read at the end of each measured test's hidden calls.
    The student's code cannot reset it (no cgroup file system in the sandbox). ``allowance``:
    what reading and unpickling the inputs may take."""

    def __init__(self, slot, allowance: int):
        self.slot, self.allowance, self.highest = slot, allowance, 0
        self._open()

    def _open(self) -> None:
        self.slot.reset_peak()
        self.base = self.slot.usage() or 0

    def close_and_reopen(self) -> int:
        peak = self.slot.peak() or 0
        self.highest = max(self.highest, peak)
        grown = max(0, peak - self.base - self.allowance)
        self._open()
        return grown


# the error codes a sandbox may send (judge._FAILURES says each in words); anything else is "failed"
_ERRORS = frozenset({"missing", "timeout", "not a function", "raised", "uncomparable", "unreadable"})
_DIGEST = re.compile(r"[0-9a-f]{64}")
MAX_VISIBLE_CALLS = 1000  # answers to the visible checks' calls kept per function


def _clean_error(e) -> str:
    return e if isinstance(e, str) and e in _ERRORS else "failed"


def _path_ok(path) -> bool:
    return (isinstance(path, list) and 2 <= len(path) <= 4 and path[0] in ("a", "k")
            and all(isinstance(x, (str, int)) and not isinstance(x, bool) and len(str(x)) <= 100
                    for x in path[1:]))


def _answer(msg: dict, peak_limit: int) -> tuple:
    """A function's answer as the sandbox reported it: (True, value, extra) or (False, code)."""
    if not msg.get("ok"):
        return (False, _clean_error(msg.get("error")))
    try:
        value = decode(msg.get("value"))
        extra = {}
        changes = msg.get("changes")
        if changes is not None:
            if not isinstance(changes, list) or len(changes) > 64:
                raise Undecodable("bad changes")
            extra["changes"] = []
            for item in changes:
                if not isinstance(item, list) or len(item) != 2 or not _path_ok(item[0]):
                    raise Undecodable("bad change")
                extra["changes"].append((item[0], decode(item[1])))
        peak = msg.get("peak")
        # a peak the sandbox could not have held is not believed (the judge allocates it once)
        if isinstance(peak, int) and not isinstance(peak, bool) and 0 <= peak <= peak_limit:
            extra["peak"] = peak
        elif peak is not None:
            return (False, "failed")
        return (True, value, extra)
    except (Undecodable, RecursionError, ValueError, OverflowError, TypeError):
        return (False, "uncomparable")


def _reader(stream, q: queue.Queue, cpu: list) -> None:
    """Lines of the sandbox's channel into ``q``; a line longer than MAX_LINE is dropped whole.
    ``cpu[0]``: this thread's CPU seconds (the grader's own, metered per submission)."""
    total, t0, skipping = 0, time.thread_time(), False
    try:
        while True:
            line = stream.readline(MAX_LINE)
            cpu[0] = time.thread_time() - t0
            if not line:
                break
            total += len(line)
            if total > MAX_STREAM:
                q.put(("overflow", None))
                break
            whole = line.endswith(b"\n")
            if not skipping and whole:
                q.put(("line", line))
            skipping = not whole  # the rest of an overlong line is dropped too
    except (OSError, ValueError):
        pass
    cpu[0] = time.thread_time() - t0
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


def run_attempt(job: dict, scratch: Path, calls_for, *, timeout: float, budget: Budget,
                use_bwrap: bool, limits: sandbox.Limits, nproc: int, log: Path,
                slot: "sandbox.Slot | None" = None) -> Attempt:
    """Run the driver once on ``job``; supervise it; return what it reported.

    Each cell, reading of a value and hidden test may use ``timeout`` CPU seconds and
    ``wall_factor() * timeout`` seconds of the backstop (the driver interrupts it; GRACE
    seconds more and the sandbox is killed); the whole run what is left of ``budget``, which
    is updated with what the run used."""
    a = Attempt()
    wall = wall_factor() * timeout
    job = {**job, "wall": wall}
    peak_limit = limits.memory_bytes or 2**40
    if scratch.exists():
        shutil.rmtree(scratch, ignore_errors=True)
    sandbox.prepare_scratch(scratch)
    inside = sandbox.INSIDE if use_bwrap else str(scratch)
    # in the sandbox, stderr is a pipe the grader reads (the last LOG_TAIL bytes are kept, quoted)
    job = {**job, "log": None if use_bwrap else f"{inside}/driver.log"}
    (scratch / "job.json").write_text(json.dumps(job), encoding="utf-8")
    argv = [sandbox.python_inside() if use_bwrap else sys.executable, "-m", "tfbook.course.driver",
            f"{inside}/job.json"]
    if use_bwrap:
        files = {"job.json": scratch / "job.json"}
        files.update({f".matplotlib/{f.name}": f for f in sandbox.sandbox_font_caches()})
        uid = slot.uid if slot is not None and slot.uid is not None else sandbox.SANDBOX_UID
        fds: list[int] = []  # the job's files, copied in by bubblewrap (no host path in the sandbox's mountinfo)
        cmd, env, cwd = sandbox.bwrap_command(files, argv, limits, uid=uid, fds=fds), None, None
    else:
        fds = []
        cmd, cwd = argv, str(scratch)
        env = {**os.environ, **sandbox.environment(str(scratch)),
               "PATH": os.environ.get("PATH", "")}
    log.parent.mkdir(parents=True, exist_ok=True)
    if slot is not None:
        slot.reset_peak()
    log.write_bytes(b"")
    # the sandbox's stderr comes to the grader through a pipe (never the log file itself: the
    # student's code could reopen that through /proc, rewrite it and read its host path)
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=cwd, env=env, preexec_fn=sandbox.preexec(limits, nproc, slot),
                                pass_fds=fds)
    finally:
        for fd in fds:
            os.close(fd)
    stderr_tail = _Tail()
    stderr_thread = threading.Thread(target=stderr_tail.read, args=(proc.stderr,), daemon=True)
    stderr_thread.start()
    meter = sandbox.Meter(proc.pid, slot)
    q: queue.Queue = queue.Queue()
    reader_cpu = [0.0]
    threading.Thread(target=_reader, args=(proc.stdout, q, reader_cpu), daemon=True).start()
    open_item, item_start, hidden_calls, window = None, None, {}, None
    capturing = {c["index"] for c in job["cells"] if c.get("capture")
                 and c["index"] not in job.get("skip_capture", [])}
    # what each message may be about, by where the run is (the protocol the driver follows): a
    # message out of place (forged by the student's code, which shares the driver's process) is dropped
    by_cell = {c["index"]: c for c in job["cells"]}
    values_of = {c["index"]: {n for n, m in c.get("capture", []) if m == "value"} for c in job["cells"]}
    calls_of = {c["index"]: {n for n, m in c.get("capture", []) if m == "call"} for c in job["cells"]}
    started: set = set()  # the cells, then the hidden tests, that began (each once)
    sent: set = set()  # the tests whose hidden inputs were sent
    own_cpu0, sampling = time.thread_time(), [0.0]

    def grader_cpu() -> float:  # reading and handling the messages (not the meter's own readings of /proc)
        return time.thread_time() - own_cpu0 - sampling[0] + reader_cpu[0]

    def opened():  # an item's clocks start: (CPU seconds, backstop seconds) of the sandbox now
        return (meter.cpu, meter.own)

    last = time.monotonic()
    try:
        while True:
            if time.monotonic() - last >= SAMPLE:
                t_sample = time.thread_time()
                meter.sample()
                sampling[0] += time.thread_time() - t_sample
                last = time.monotonic()
                own = meter.own - a.waited  # waiting for the judge is not the notebook's time
                if budget.spent(meter.cpu, own):
                    a.overall = True
                    if open_item is not None:
                        a.culprit = (*open_item, "timeout")
                    break
                if item_start is not None and (meter.cpu - item_start[0] > timeout + GRACE
                                               or meter.own - item_start[1] > wall + GRACE):
                    a.culprit = (*open_item, "timeout")
                    break
            if budget.grader_used + grader_cpu() > GRADER_CPU:
                a.error = (f"the notebook's messages cost the grader more than {GRADER_CPU:g} s of its own "
                           "CPU time: not graded (see the log)")
                break
            try:
                kind_msg, line = q.get(timeout=SAMPLE)
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
                if open_item is not None and open_item[0] == "capture" and t in ("start", "visible-done"):
                    open_item, item_start = None, None
                if t == "start" and isinstance(msg.get("cell"), int) and msg["cell"] in by_cell \
                        and msg["cell"] not in started and open_item is None:
                    started.add(msg["cell"])
                    open_item = ("cell", msg["cell"])
                    item_start = opened()
                elif t == "end" and open_item == ("cell", msg.get("cell")):
                    status = msg.get("status") if msg.get("status") in ("ok", "error", "timeout") else "error"
                    if status == "timeout":  # which limit: one of two fixed words, or neither
                        a.limit[msg["cell"]] = msg.get("evalue") if msg.get("evalue") in ("cpu", "wall") else ""
                    a.records[msg["cell"]] = {
                        "status": status,
                        "ename": judge_mod.error_name(msg.get("ename")),  # never the student's class name
                        "evalue": str(msg.get("evalue", ""))[:300],
                        "out": str(msg.get("out", ""))[-2000:],
                    }
                    open_item, item_start = None, None
                    if by_cell[msg["cell"]].get("capture"):  # reading its values runs the student's code too
                        open_item = ("capture", msg["cell"])
                        item_start = opened() if msg["cell"] in capturing else None
                elif t == "vresult":
                    gid, name, d = msg.get("gid"), msg.get("name"), msg.get("digest")
                    # only while the test cell of that gid runs, for a function it takes
                    here = open_item[1] if open_item is not None and open_item[0] == "cell" else None
                    if isinstance(gid, str) and isinstance(name, str) and isinstance(d, str) \
                            and _DIGEST.fullmatch(d) and here in by_cell and by_cell[here].get("gid") == gid \
                            and name in calls_of[here]:
                        seen = a.visible.setdefault(gid, {}).setdefault(name, [])
                        if len(seen) < MAX_VISIBLE_CALLS:
                            seen.append((d, _answer(msg, peak_limit)))
                elif t == "value":
                    gid, name = msg.get("gid"), msg.get("name")
                    # only while the values of that gid's test cell are read, for a name it takes, once
                    here = open_item[1] if open_item is not None and open_item[0] == "capture" else None
                    if isinstance(gid, str) and isinstance(name, str) and here in by_cell \
                            and by_cell[here].get("gid") == gid and name in values_of[here] | calls_of[here] \
                            and name not in a.values.get(gid, {}):
                        if msg.get("ok") and msg.get("callable"):
                            a.values.setdefault(gid, {})[name] = (True, None)
                        elif msg.get("ok"):
                            try:
                                a.values.setdefault(gid, {})[name] = (True, decode(msg.get("value")))
                            except (Undecodable, RecursionError, ValueError, OverflowError):
                                a.values.setdefault(gid, {})[name] = (False, "uncomparable")
                        else:
                            a.values.setdefault(gid, {})[name] = (False, _clean_error(msg.get("error")))
                elif t == "visible-done":
                    a.visible_done = True
                    open_item, item_start = None, None
                    t0 = time.monotonic()
                    hidden_calls = calls_for()
                    a.waited += time.monotonic() - t0
                    wanted = {g: c for g, c in hidden_calls.items() if g not in job.get("skip_hidden", [])}
                    # the tests that measure memory run first, each in a window the kernel measures
                    measured = [g for g in job.get("measure_memory", ()) if g in wanted]
                    wanted = {**{g: wanted[g] for g in measured}, **wanted}
                    sent = set(wanted)
                    data = pickle.dumps(wanted)
                    if measured and slot is not None and slot.usage() is not None:
                        window = _Window(slot, allowance=4 * len(data) + KERNEL_SLACK)
                    threading.Thread(target=_writer, args=(proc.stdin, data), daemon=True).start()
                    # receiving the inputs runs in the student's process too (a patched pickle.loads
                    # could hang there): timed like any item, until the first hidden test starts
                    meter.sample()  # its clocks start now, after the wait for the judge (not counted)
                    open_item, item_start = ("receive", None), opened()
                continue
            # hidden phase: only results count; nothing here reaches the feedback
            if t == "hstart" and msg.get("gid") in sent and msg["gid"] not in started \
                    and open_item in (None, ("receive", None)):
                started.add(msg["gid"])
                open_item = ("hidden", msg["gid"])
                item_start = opened()
            elif t == "hend" and open_item == ("hidden", msg.get("gid")):
                open_item, item_start = None, None
                if window is not None and msg["gid"] in job.get("measure_memory", ()):
                    a.kernel_peaks[msg["gid"]] = window.close_and_reopen()
            elif t == "result" and open_item == ("hidden", msg.get("gid")):
                gid, name, k = msg.get("gid"), msg.get("name"), msg.get("k")
                wanted_ks = {j for j, _ in hidden_calls.get(gid, {}).get(name, [])}
                if isinstance(k, int) and k in wanted_ks:
                    a.results.setdefault(gid, {}).setdefault(name, {})[k] = _answer(msg, peak_limit)
            elif t == "done" and open_item in (None, ("receive", None)):
                a.done = True
                break
    finally:
        meter.sample()
        _kill(proc)
        a.cpu, a.own = meter.cpu, max(0.0, meter.own - a.waited)
        a.grader_cpu = grader_cpu()
        budget.cpu_used += a.cpu
        budget.wall_used += a.own
        budget.grader_used += a.grader_cpu
        if slot is not None:
            slot.kill_all()
            # the kernel's measure of the whole sandbox: a claim above it is forged
            trusted = slot.peak() if window is None else max(window.highest, slot.peak() or 0)
            if trusted is not None:
                for per in a.results.values():
                    for answers in per.values():
                        for k, r in list(answers.items()):
                            if len(r) > 2 and r[2].get("peak", 0) > trusted:
                                answers[k] = (False, "failed")
        stderr_thread.join(timeout=5)
        try:
            proc.stderr.close()
        except (OSError, ValueError):
            pass
        if not use_bwrap:  # unsandboxed, the driver writes its stderr to a file in the run's folder
            stderr_tail.feed(_read_driver_log(scratch / "driver.log"))
        _quote_student(stderr_tail.data(), log)
    # a measured call's peak is at least what the kernel saw its test's hidden calls allocate (less
    # the inputs' unpickling): tracemalloc.reset_peak(), or memory PyTorch allocates, cannot hide it
    for gid, floor in a.kernel_peaks.items():
        for answers in a.results.get(gid, {}).values():
            for k, r in list(answers.items()):
                if r[0] and len(r) > 2:
                    answers[k] = (True, r[1], {**r[2], "peak": max(int(r[2].get("peak", 0)), floor)})
    if not a.done and a.culprit is None and not a.overall:
        tail = report.terminal(stderr_tail.data()[-400:].decode("utf-8", errors="replace"))
        if not a.records and not a.visible_done:
            a.error = f"the sandbox did not start ({tail.strip()[-200:] or 'no message'})"
        else:
            a.culprit = ("end", None, "crashed")
    return a


STUDENT_PREFIX = "  student| "  # every line of the student's output in an instructor's log starts so
LOG_TAIL = 64 * 1024  # bytes of the sandbox's stderr kept for the log (its last ones)


class _Tail:
    """The last LOG_TAIL bytes of a stream (read in a thread)."""

    def __init__(self):
        self.chunks, self.size, self.total = [], 0, 0

    def feed(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)
        self.total += len(chunk)
        while self.size - len(self.chunks[0]) >= LOG_TAIL:
            self.size -= len(self.chunks.pop(0))

    def read(self, stream) -> None:
        try:
            while True:
                chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
                if not chunk:
                    break
                self.feed(chunk)
        except (OSError, ValueError):
            pass

    def data(self) -> bytes:
        return b"".join(self.chunks)[-LOG_TAIL:]


def _quote_student(data: bytes, log: Path) -> None:
    """The instructor's log: the grader's own header line, then what the sandbox wrote to its
    stderr, every line quoted (STUDENT_PREFIX), control characters (terminal escapes, carriage
    returns, bidi overrides) replaced: no line of the student's can pass for the grader's."""
    text = data.decode("utf-8", "replace")
    lines = [STUDENT_PREFIX + report.terminal(line) for line in text.splitlines()]
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"--- the grader: the sandbox's stderr (its last {LOG_TAIL // 1024} KiB), each line quoted "
                f"with {STUDENT_PREFIX.strip()!r} ---\n")
        f.write("\n".join(lines) + ("\n" if lines else ""))


def _read_driver_log(src: Path, limit: int = LOG_TAIL) -> bytes:
    """The tail of the unsandboxed driver's stderr file. The file is the student's: opened without
    following a symlink, and only if it is a plain file."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return b""
        os.lseek(fd, max(st.st_size - limit, 0), os.SEEK_SET)
        return os.read(fd, limit)
    finally:
        os.close(fd)


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
    """A judge process for one assignment (started when its first submission starts)."""

    EVALUATE_TIMEOUT = 300.0  # seconds the judge may take on one submission's data, at most
    MIN_EVALUATE = 30.0  # ... and at least, whatever is left of the notebook's overall limit

    def __init__(self, master_path: Path, specs: Path):
        self.args = (str(master_path), str(specs))
        self.lock = threading.Lock()  # one evaluation at a time
        self.ready_lock = threading.Lock()  # the recorded cases: never behind an evaluation
        self.proc = None
        self._ready = None
        self.busy = 0.0  # seconds spent evaluating (all submissions)

    def start(self) -> None:
        """Start the judge (once): when the first submission of its assignment starts, so
        that no more judges than jobs run the master notebooks at the same time."""
        with self.ready_lock:
            if self.proc is None:
                self._start()

    def _start(self) -> None:
        env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1",
               "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tfbook.course.judge", *self.args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=str(ROOT),
                                     preexec_fn=_judge_limits)

    def ready(self) -> dict:
        self.start()
        with self.ready_lock:
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

    def evaluate(self, values, results, visible=None, timeout: float | None = None) -> dict:
        """Judge one submission's data. ``timeout`` bounds the judge's *CPU* time on it (a hang
        on a student's data burns CPU; a judge that merely waits for a core on a loaded machine
        does not), and ``wall_factor()`` times as much wall-clock time not spent waiting for a
        CPU (:class:`~tfbook.course.sandbox.Meter`) bounds a judge that blocks."""
        import select

        limit = self.EVALUATE_TIMEOUT if timeout is None else min(self.EVALUATE_TIMEOUT, timeout)
        with self.lock:  # one evaluation at a time, and never on a judge whose "ready" is unread
            r = self.ready()  # inside the lock: after a restart, the new judge's "ready" is read first
            if "failed" in r:
                raise RuntimeError(f"the master notebook could not be run: {r['failed']}")
            t0, meter = time.monotonic(), sandbox.Meter(self.proc.pid)
            try:
                judge_mod._send(self.proc.stdin, (values, results, visible or {}))
                while not select.select([self.proc.stdout], [], [], SAMPLE)[0]:
                    meter.sample()
                    if meter.cpu > limit or meter.own > limit * wall_factor():
                        raise TimeoutError(f"judging this submission took over {limit:g} s")
                    if self.proc.poll() is not None:
                        raise EOFError
                status, payload = judge_mod._recv(self.proc.stdout)
            except (TimeoutError, EOFError, OSError, pickle.UnpicklingError) as exc:
                # one submission's data hung or killed the judge: a fresh judge for the others
                # (it records the cases again: the same master, the same pickles)
                self.restart()
                raise RuntimeError(str(exc) or "the judge died on this submission's data") from None
            finally:
                self.busy += time.monotonic() - t0
        if status != "ok":
            raise RuntimeError(payload)
        return payload

    def restart(self) -> None:
        """Kill the judge and start a fresh one (callers hold ``self.lock``)."""
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        with self.ready_lock:
            self._start()
            self._ready = None

    def close(self) -> None:
        if self.proc is None:
            return
        if self._ready is not None and "seconds" in self._ready:
            self.seconds = self._ready["seconds"]
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
              logs: Path, note: str, slot: "sandbox.Slot | None" = None, data: bytes | None = None) -> None:
    start = time.monotonic()
    budget = Budget.of(total_timeout)
    judge.start()  # records the cases while the sandbox runs the visible phase
    sub = read_submission((data if data is not None else path.read_bytes()).decode("utf-8"))
    cells, notes, placed = build_job(sub, plan)
    by_index = {c["index"]: c for c in cells}
    have = {judge_mod._nbgrader(c).get("grade_id") for c in sub.cells} - {None}
    if have:
        deleted = [g for g in plan.order if g not in have and not (g in placed and placed[g] < 10_000)]
    else:  # saved without nbgrader's metadata: nothing to say which answer cell is which
        deleted = []
        notes.append("the notebook has no nbgrader metadata: its test cells were found by their source")
    job = {"cells": cells, "timeout": timeout, "skip": [], "skip_hidden": [], "skip_capture": [],
           "measure_memory": judge_mod.memory_measuring_tests(plan)}
    events, attempt, waited = [], None, 0.0
    for n in range(MAX_ATTEMPTS):
        row.attempts = n + 1
        attempt = run_attempt(job, work / "scratch", judge.calls, timeout=timeout, budget=budget,
                              use_bwrap=use_bwrap, limits=limits, nproc=nproc,
                              log=logs / _log_name(row, n + 1), slot=slot)
        waited += attempt.waited  # the wait for the judge is not the notebook's time
        if attempt.error:
            break
        c = attempt.culprit
        if c is None or attempt.overall:
            break
        where, key, what = c
        if where == "cell" and key in by_index:
            events.append(("cell", key, what))
            job["skip"].append(key)
        elif where == "capture" and key in by_index:  # reading a value hung or crashed: that value only
            events.append(("capture", key, what))
            job["skip_capture"].append(key)
        elif where == "hidden":
            events.append(("hidden", key, what))
            job["skip_hidden"].append(key)
        elif where == "receive":  # the hidden phase never began: its cases are lost, never gained
            events.append(("receive", None, what))
            break
        else:
            events.append(("end", None, what))
            break
        if n == MAX_ATTEMPTS - 1:
            break
    row.notebook = path
    if attempt is None or attempt.error:
        row.status, row.reason = "error", (attempt.error if attempt else "not run")
        return
    # what the judge gets: values, results, and the failures the supervisor saw
    values, results = dict(attempt.values), {g: dict(v) for g, v in attempt.results.items()}
    calls = judge.calls()
    for where, key, what in events:
        for gid in ([key] if where == "hidden" else [g for g in calls if g not in results] if where == "receive" else []):
            results[gid] = {name: {k: (False, "timeout" if what == "timeout" else "crashed")
                                   for k, _ in blobs}
                            for name, blobs in calls.get(gid, {}).items()}
    try:
        # the judge's work is this notebook's: bounded by what is left of its overall limit
        verdict = judge.evaluate(values, results, attempt.visible,
                                 timeout=max(JudgeProxy.MIN_EVALUATE, budget.cpu - budget.cpu_used))
    except Exception as exc:  # noqa: BLE001
        row.status, row.reason = "error", f"grader: {exc}"[:300]
        return
    finally:
        # the notebook's time: its sandbox runs and its judging (not the one-off wait for the
        # judge to record the cases, which every notebook of the chapter shares)
        row.seconds = time.monotonic() - start - waited
    for gid, policy in policies.violations(plan, sub, plan.sources, policies.load()).items():
        verdict.setdefault(gid, {"passed": False, "part": "grader", "diagnosis": "not judged"})["policy"] = policy
    row.cells = {i: attempt.records.get(i) for i in by_index}
    for where, key, what in events:
        if where == "cell":
            row.cells[key] = {"status": what, "ename": "", "evalue": "", "out": ""}
    # the reason, most important first
    parts = [note] if note else []
    timed_out = crashed = False
    for where, key, what in events:
        label = (_cell_label(by_index.get(key), sub, key, plan.order) if where == "cell" else
                 f"reading the values of test {by_index[key].get('gid')}" if where == "capture" else
                 "receiving the hidden cases" if where == "receive" else
                 f"the hidden cases of {key}")
        if what == "timeout":
            timed_out = True
            parts.append(f"{label} did not stop {GRACE:g} s after its time-out interrupt "
                         f"({limit_words(timeout)}): " + ("the hidden cases were not run" if where == "receive"
                                                          else "it was skipped on a fresh run"))
        else:
            crashed = True
            parts.append(f"{label} crashed the notebook: graded again without it" if where != "end"
                         else "the notebook's process ended early")
    for i, rec in attempt.records.items():
        if rec and rec["status"] == "timeout":
            timed_out = True
            parts.append(f"{_cell_label(by_index.get(i), sub, i, plan.order)} "
                         f"{ran_longer(timeout, attempt.limit.get(i, ''))} and was interrupted")
    if attempt.overall:
        timed_out = True
        parts.append(f"the notebook ran past the overall limit ({limit_words(total_timeout)}); "
                     "what ran before was graded")
    if deleted:
        parts.append("cells deleted: " + ", ".join(deleted))
    parts += notes
    broken, unanswered = [], set()
    for i, rec in attempt.records.items():
        cell = by_index.get(i)
        if cell and cell["kind"] == "code" and rec and rec["status"] == "error":
            gid = judge_mod._nbgrader(sub.cells[i]).get("grade_id") if i < len(sub.cells) else None
            if gid in plan.answers and rec["ename"] == "NotImplementedError":
                unanswered.add(gid)  # the released stub, never replaced
            elif gid in plan.answers:
                broken.append(f"{gid}: {rec['ename']}")
    for cell in sub.cells:  # the released stub left in place: a function that raises when called
        gid = judge_mod._nbgrader(cell).get("grade_id")
        if cell.cell_type == "code" and gid in plan.answers and "raise NotImplementedError" in cell.source:
            unanswered.add(gid)
    if broken:
        parts.append("answer cells raised " + ", ".join(broken))
    lost = []
    row.exercises = []
    for t in plan.tests:
        v = verdict.get(t.gid, {"passed": False, "part": "grader", "diagnosis": "not judged"})
        diagnosis = v["diagnosis"]  # the judge's words, from the checks it ran on the student's results
        if t.answer in unanswered and not v["passed"]:
            diagnosis = "not answered (its answer cell still has the `raise NotImplementedError()` it was given)"
        if v["part"] == "grader":
            row.status = "error"
        points = t.points if v["passed"] else 0.0
        policy = v.get("policy")
        if policy:  # an instructor's rule (course/policies.py): its points and its reason
            points = min(points, float(policy["points"]))
            parts.append(f"{test_label(t)}, {t.gid}: {policy['reason']}")
        row.exercises.append({"gid": t.gid, "label": test_label(t), "points": t.points, "score": points,
                              "passed": v["passed"] and not policy, "diagnosis": diagnosis, "part": v["part"],
                              "checks_out": v.get("out", ""),
                              "visible_out": (attempt.records.get(placed.get(t.gid)) or {}).get("out", "")})
        if not v["passed"]:
            lost.append(f"{test_label(t)}, {t.gid}: {diagnosis}")
    if lost:
        parts.append("lost points in " + "; ".join(lost))
    row.score = float(sum(e["score"] for e in row.exercises))
    if row.status != "error":
        row.status = "timeout" if timed_out else ("crashed" if crashed else "graded")
    row.reason = "; ".join(parts)


def test_label(t) -> str:
    """"Exercise 0.1": the exercise as the book names it (its heading, else its grade id's numbers)."""
    m = _EXERCISE.search(t.task or "")
    if m:
        return f"Exercise {m.group(1)}"
    m = re.match(r"ex([0-9A-Za-z]+)-(\d+)-", t.gid or "")
    return f"Exercise {m.group(1)}.{m.group(2)}" if m else t.gid


def limit_words(cpu: float) -> str:
    """A limit of ``cpu`` CPU seconds and its backstop, in words."""
    return (f"{cpu:g} s of CPU time, or {wall_factor() * cpu:g} s of wall-clock time"
            + (" not spent waiting for a CPU" if sandbox.run_queue_delays_available() else ""))


def ran_longer(cpu: float, which: str) -> str:
    """What a cell interrupted by the limit ``which`` ("cpu", "wall" or "": unknown) did."""
    if which == "cpu":
        return f"ran longer than {cpu:g} s of CPU time"
    if which == "wall":
        return (f"ran longer than {wall_factor() * cpu:g} s of wall-clock time (sleeping or "
                "waiting for something?)")
    return f"ran longer than its limit ({limit_words(cpu)})"


def _log_fault(logs: Path, row: Row, n: int) -> None:
    """The grader's own traceback (not the student's output) into the instructor's log."""
    import traceback

    try:
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / (_log_name(row, n)[:-4] + ".grader-fault.log"), "w", encoding="utf-8") as f:
            f.write(traceback.format_exc())
    except OSError:
        pass


def _log_name(row, n: int) -> str:
    """A log file name for any student name (long, odd, dotted): a readable prefix and a hash."""
    import hashlib

    key = f"{row.student}\0{row.assignment}".encode("utf-8", "surrogateescape")
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", row.student)[:40]
    return f"{safe}__{row.assignment[:40]}__{hashlib.sha256(key).hexdigest()[:10]}.run{n}.log"


def _first_cross(text: str) -> str:
    for line in (text or "").splitlines():
        if line.startswith("✘"):
            return line[:240]
    return ""


def _cell_label(cell: dict | None, sub, index, known=()) -> str:
    if isinstance(index, int) and index < len(sub.cells):
        gid = judge_mod._nbgrader(sub.cells[index]).get("grade_id")
        known = gid if isinstance(gid, str) and gid in known else None  # never a made-up id
        return f"cell {index + 1}" + (f" ({known})" if known else "")
    if cell and cell.get("gid"):
        return f"test {cell['gid']}"
    return "a cell"


# --------------------------------------------------------------------------- finding submissions
# Everything under SUBMISSIONS_DIR is the students': a symbolic link is never followed (it could
# point at the master notebooks, /etc/passwd or a classmate's folder), and is reported as such;
# the same folder reached twice (a bind mount, a hard-linked notebook) is graded once.


def _lstat(path: Path):
    try:
        return os.lstat(path)
    except OSError:
        return None


def _entries(folder: Path) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of a folder's entries, sorted, without following anything."""
    out = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        st = _lstat(folder / name)
        if st is not None:
            out.append((name, st))
    return out


def _find_submission(folder: Path, assignment: str) -> tuple[Path | None, str, str]:
    """(the notebook, a note for the reason, or the status and reason why there is none)."""
    entries = dict(_entries(folder))
    want = f"{assignment}.ipynb"
    if want in entries:
        st = entries[want]
        if stat.S_ISLNK(st.st_mode):
            return None, "refused", f"{want} is a symbolic link: not followed, not graded"
        if stat.S_ISREG(st.st_mode):
            return folder / want, "", ""
        return None, "missing", f"{want} is not a file"
    others = [n for n, st in entries.items() if n.endswith(".ipynb") and stat.S_ISREG(st.st_mode)]
    links = [n for n, st in entries.items() if n.endswith(".ipynb") and stat.S_ISLNK(st.st_mode)]
    if len(others) == 1 and not links:
        return folder / others[0], f"the notebook had another name; graded as {want}", ""
    if links and not others:
        return None, "refused", "the notebook is a symbolic link: not followed, not graded"
    return None, "missing", f"no {want} in the assignment's folder"


MAX_NOTEBOOK = 512 * 2**20  # bytes: a notebook file larger than this is not read (its outputs are dropped)


def _strip_outputs(data: bytes) -> bytes:
    """The notebook without its cells' outputs and attachments (what is graded is the code, which
    runs again in the sandbox): a notebook whose outputs are hundreds of megabytes is graded like
    any other, and only its code is kept in memory. Bytes that are not notebook JSON are returned
    as they are (:func:`_readable` says why they are not a notebook)."""
    try:
        nb = json.loads(data)
    except (ValueError, RecursionError):
        return data
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        return data
    for cell in cells:
        if isinstance(cell, dict):
            if "outputs" in cell:
                cell["outputs"] = []
            cell.pop("attachments", None)
    return json.dumps(nb, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _read_notebook(path: Path) -> tuple[bytes | None, str]:
    """The notebook's bytes without its outputs (opened without following a symbolic link, a
    plain file only), or why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None, "cannot be opened (a symbolic link, or not readable)"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a plain file"
        if st.st_size > MAX_NOTEBOOK:
            return None, f"larger than {MAX_NOTEBOOK // 2**20} MiB"
        chunks, size = [], 0
        while size <= MAX_NOTEBOOK:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
        del chunks
        return _strip_outputs(data), ""
    finally:
        os.close(fd)


def _readable(data: bytes) -> str:
    """'' if ``data`` is a notebook, else why not: fixed words, never the file's content (a
    parser's message quotes it)."""
    if not data.strip():
        return "empty file"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    try:
        nb = read_submission(text)
    except Exception:  # noqa: BLE001  (json.JSONDecodeError, nbformat validation, ...)
        return "not a notebook (not valid notebook JSON)"
    if not isinstance(nb.get("cells"), list):
        return "not a notebook (no cells)"
    return ""


def find_work(submissions: Path, notebooks_dir: Path) -> list[tuple[Row, Path | None, str, bytes | None]]:
    """Every (row, notebook, note, bytes) under ``submissions``, sorted by assignment then student;
    rows that cannot be graded come with their status and reason set and no notebook."""
    out = []
    seen: dict[tuple[int, int], str] = {}
    for s, st in _entries(submissions):
        if stat.S_ISLNK(st.st_mode):
            out.append((Row(s, NO_ASSIGNMENT, status="refused",
                            reason="the student's folder is a symbolic link: not followed, not graded"), None, "", None))
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue
        if s.startswith("."):
            out.append((Row(s, NO_ASSIGNMENT, status="skipped",
                            reason="a hidden folder (its name starts with a dot): not graded"), None, "", None))
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            out.append((Row(s, NO_ASSIGNMENT, status="refused",
                            reason="the same folder as another student's: graded once"), None, "", None))
            continue
        seen[key] = s
        for a, ast_ in _entries(submissions / s):
            if stat.S_ISLNK(ast_.st_mode):
                out.append((Row(s, a, status="refused",
                                reason="the assignment's folder is a symbolic link: not followed, not graded"),
                            None, "", None))
                continue
            if not stat.S_ISDIR(ast_.st_mode) or a.startswith("."):
                continue
            row = Row(s, a)
            folder = submissions / s / a
            if not _CHAPTER.fullmatch(a) or not (Path(notebooks_dir) / f"{a}.ipynb").is_file():
                row.status, row.reason = "unknown-assignment", "no chapter notebook of that name"
                out.append((row, None, "", None))
                continue
            path, note, why = _find_submission(folder, a)
            if path is None:
                row.status, row.reason = note, why
                out.append((row, None, "", None))
                continue
            fst = _lstat(path)
            fkey = (fst.st_dev, fst.st_ino) if fst else None
            if fkey in seen:
                row.status, row.reason = "refused", "the same notebook file as another student's: graded once"
                out.append((row, None, "", None))
                continue
            if fkey:
                seen[fkey] = s
            data, why = _read_notebook(path)
            problem = why or _readable(data)
            if problem:
                row.status, row.reason = "unreadable", problem
                data = None
            out.append((row, path if data is not None else None, note, data))
    out.sort(key=lambda item: (item[0].assignment, item[0].student))
    return out


_CHAPTER = re.compile(r"(\d\d|[A-Z])_[a-z0-9_]+")
NO_ASSIGNMENT = "(none)"  # a row about a student's whole folder


# --------------------------------------------------------------------------- the batch


def _progress(total: int, verbose: bool):
    if not verbose or total == 0:
        return None
    try:
        from tqdm import tqdm

        return tqdm(total=total, unit="notebook", file=sys.stderr, dynamic_ncols=True)
    except ImportError:  # pragma: no cover
        return None


def parse_shard(shard: str | None) -> tuple[int, int]:
    """``"k/N"`` (1 <= k <= N) as (k, N); None as (1, 1)."""
    if shard is None:
        return 1, 1
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(shard))
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard must be k/N with 1 <= k <= N, got {shard!r}")
    return int(m.group(1)), int(m.group(2))


def grade(submissions: Path, out: Path = ROOT / "_build" / "grades", timeout: float = 60,
          total_timeout: float = 900.0, notebooks_dir: Path = ROOT / "notebooks",
          verbose: bool = True, jobs: int | None = None, specs: Path = judge_mod.SPECS,
          use_sandbox: bool | None = None, limits: sandbox.Limits | None = None,
          shard: str | None = None, plan: Path | None = None) -> list[Row]:
    """Grade every ``submissions/<student>/<assignment>/<assignment>.ipynb``; return the rows.

    ``shard="k/N"`` grades the k-th of N disjoint parts of the class (``merge`` joins the
    parts' output folders into what one run writes)."""
    release_mod.require_course_extra("grade")
    submissions, out = Path(submissions), Path(out)
    if not submissions.is_dir():
        raise ValueError(f"SUBMISSIONS_DIR {submissions} is not a folder")
    if timeout <= 0 or total_timeout <= 0:
        raise ValueError("--timeout and --total-timeout must be positive")
    k_shard, n_shard = parse_shard(shard)
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
    found = find_work(submissions, notebooks_dir)
    manifest = read_plan(plan) if plan is not None else plan_of(found, n_shard)
    if manifest["shards"] != n_shard:
        raise ValueError(f"--shard {k_shard}/{n_shard} does not match the plan's {manifest['shards']} shards")
    work, unplanned = select_shard(found, manifest, k_shard)
    out.mkdir(parents=True, exist_ok=True)
    (out / SHARD_FILE).write_text(json.dumps({
        "format": PLAN_FORMAT, "digest": manifest["digest"], "k": k_shard, "n": n_shard,
        "plan": manifest, "unplanned": unplanned}, indent=0), encoding="ascii")
    if unplanned and verbose:
        print(f"{len(unplanned)} submission(s) not in the shard plan, not graded here (grade them in a new "
              f"run): {', '.join(unplanned[:10])}", file=sys.stderr)
    for sub in ("feedback", "logs"):
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    logs = out / "logs"
    rows: list[Row] = [w[0] for w in work]
    plans: dict[str, object] = {}
    masters: dict[str, object] = {}
    for row, *_ in work:
        a = row.assignment
        if a != NO_ASSIGNMENT and row.status != "unknown-assignment" and a not in plans \
                and (Path(notebooks_dir) / f"{a}.ipynb").is_file():
            masters[a] = nbformat.read(str(Path(notebooks_dir) / f"{a}.ipynb"), as_version=4)
            plans[a] = judge_mod.plan(masters[a], a)
        if a in plans:
            row.max_score = plans[a].max_score
    todo = [(row, path, note, data) for row, path, note, data in work if path is not None]
    left = {a: sum(1 for r, *_ in todo if r.assignment == a) for a in plans}
    judges: dict[str, JudgeProxy] = {}
    judged: dict[str, float] = {}
    state = threading.Lock()
    slots = sandbox.Slots(jobs, limits) if use_bwrap else None
    nproc = sandbox.nproc_limit(limits, jobs, per_uid=slots is not None and os.geteuid() == 0)
    bar = _progress(len(todo), verbose)
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="tfbook-grade-") as tmp:
            os.chmod(tmp, 0o711)

            def judge_for(a: str) -> JudgeProxy:
                with state:
                    if a not in judges:
                        judges[a] = JudgeProxy(Path(notebooks_dir) / f"{a}.ipynb", Path(specs))
                    return judges[a]

            def done_with(a: str) -> None:
                """A chapter's last submission is judged: its judge goes (memory bounded by the
                chapters in progress, not by the class)."""
                with state:
                    left[a] -= 1
                    j = judges.get(a) if left[a] == 0 else None
                if j is not None:
                    judged[a] = (j._ready or {}).get("seconds")
                    j.close()

            def work_one(k_item):
                k, (row, path, note, data) = k_item
                slot = slots.acquire() if slots is not None else None
                try:
                    for n in (1, 2):  # a grader fault (not the student's) gets one fresh try
                        try:
                            grade_one(row, path, plans[row.assignment], judge_for(row.assignment),
                                      Path(tmp) / f"job{k}", timeout=timeout, total_timeout=total_timeout,
                                      use_bwrap=use_bwrap, limits=limits, nproc=nproc, logs=logs, note=note,
                                      slot=slot, data=data)
                            break
                        except Exception as exc:  # noqa: BLE001  (one broken submission never stops the batch)
                            _log_fault(logs, row, n)
                            row.score, row.exercises, row.cells = 0.0, [], {}
                            row.status, row.reason = ("error", f"grader: {judge_mod.error_name(type(exc).__name__)}"
                                                      " (see the log)") if n == 2 else ("graded", "")
                            if slot is not None:
                                slot.kill_all()
                finally:
                    if slots is not None:
                        slots.release(slot)
                    shutil.rmtree(Path(tmp) / f"job{k}", ignore_errors=True)
                    done_with(row.assignment)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(report.terminal(f"{report.display_name(row.student)[:30]}/{row.assignment} "
                                                        f"{row.score:g}/{row.max_score:g}"))
                return row

            with cf.ThreadPoolExecutor(max_workers=jobs) as pool:
                list(pool.map(work_one, enumerate(todo)))
    finally:
        for j in judges.values():
            j.close()
        if slots is not None:
            slots.remove()
    if bar is not None:
        bar.close()
    if warning:
        for r in rows:
            r.reason = "; ".join(filter(None, [warning, r.reason]))
    rows.sort(key=lambda r: (str(r.student), str(r.assignment)))
    write_outputs(rows, masters, plans, out, time.perf_counter() - start if verbose else None,
                  warning, judged)
    return rows


def write_outputs(rows, masters, plans, out: Path, seconds: float | None, warning: str = "",
                  judged: dict | None = None) -> None:
    """Feedback pages, grades.csv and rows.json, the exercise table, the console summary: a
    fault in any of them (the grader's, logged in logs/grader-faults.log) costs no row its line
    in grades.csv, which is always written."""
    faults = out / "logs" / "grader-faults.log"
    try:
        report.write_feedback(rows, masters, plans, out / "feedback", log=faults)
    except Exception:  # noqa: BLE001
        report.grader_fault(faults, "feedback pages")
    report.write_grades(rows, out, log=faults)
    try:
        report.write_exercise_table(rows, out)
    except Exception:  # noqa: BLE001
        report.grader_fault(faults, "the exercise table")
    if seconds is not None:
        try:
            report.print_summary(rows, seconds, warning, judged)
        except Exception:  # noqa: BLE001
            report.grader_fault(faults, "the console summary")


class MergeError(ValueError):
    """``merge`` refused its parts, or the merged class is incomplete (missing or duplicated rows)."""


def merge(parts: list[Path], out: Path, verbose: bool = True) -> list[dict]:
    """Join the output folders of ``grade --shard k/N`` runs into one: grades.csv, exercises.csv
    and .png and the feedback pages, as one run over the whole class writes them.

    Every part records its shard plan (the class's manifest and its digest) and its k/N: parts
    of different plans are refused (nothing is written); otherwise the merged files are written
    and :class:`MergeError` names every student of the plan with no row (a shard not given, or
    lost) and every row given twice (a part given twice)."""
    release_mod.require_course_extra("merge")
    rows, count, shards = [], {}, {}
    out = Path(out)
    infos = []
    for part in parts:
        part = Path(part)
        path, info_path = part / report.ROWS_FILE, part / SHARD_FILE
        if not path.is_file() or not info_path.is_file():
            raise ValueError(f"{part} has no {report.ROWS_FILE} or {SHARD_FILE}: not the output of `grade`")
        info = json.loads(info_path.read_text(encoding="utf-8"))
        if not isinstance(info, dict) or info.get("format") != PLAN_FORMAT:
            raise ValueError(f"{part}: {SHARD_FILE} is not a shard record of this grader")
        infos.append((part, info))
    digests = {info["digest"] for _, info in infos}
    if len(digests) > 1:
        raise MergeError("these parts come from another shard plan each (" + ", ".join(
            f"{p}: shard {i['k']}/{i['n']} of plan {i['digest'][:12]}" for p, i in infos) +
            "): the class changed between the shards' runs; make one plan (`python -m tfbook.course plan`) "
            "and pass it to every shard with --plan")
    manifest = infos[0][1]["plan"]
    if plan_digest(manifest) != manifest.get("digest"):
        raise MergeError(f"{infos[0][0]}: its shard plan does not match its digest")
    problems = []
    for part, info in infos:
        if info["k"] in shards:
            problems.append(f"shard {info['k']}/{info['n']} given twice ({shards[info['k']]} and {part})")
        shards.setdefault(info["k"], part)
        for r in json.loads((part / report.ROWS_FILE).read_text(encoding="utf-8")):
            key = (report.name_id(r["student"]), report.name_id(r["assignment"]))
            count[key] = count.get(key, 0) + 1
            if count[key] == 1:
                rows.append(r)
    out.mkdir(parents=True, exist_ok=True)
    for part, _ in infos:
        if (part / "feedback").is_dir() and part.resolve() != out.resolve():
            shutil.copytree(part / "feedback", out / "feedback", dirs_exist_ok=True)
    rows.sort(key=lambda r: (r["student"], r["assignment"]))
    report.write_grades(rows, out)
    report.write_exercise_table(rows, out)
    planned = {(w[0], w[1]) for w in manifest["work"]}
    missing = sorted(planned - set(count))
    twice = sorted(k for k, c in count.items() if c > 1)
    extra = sorted(set(count) - planned)
    absent = sorted(set(range(1, manifest["shards"] + 1)) - set(shards))
    late = sorted({u for _, info in infos for u in info.get("unplanned", [])})

    def names(keys):
        return ", ".join(f"{report.display_name(os.fsdecode(report.name_bytes(s)))}/"
                         f"{os.fsdecode(report.name_bytes(a))}" for s, a in keys[:20]) + \
            (f" and {len(keys) - 20} more" if len(keys) > 20 else "")

    n_shards = manifest["shards"]
    if absent:
        problems.append(f"shard(s) {', '.join(f'{k}/{n_shards}' for k in absent)} not given")
    if missing:
        problems.append(f"{len(missing)} row(s) of the plan missing: {names(missing)}")
    if twice:
        problems.append(f"{len(twice)} row(s) duplicated (graded by two shards: the same part twice?): {names(twice)}")
    if extra:
        problems.append(f"{len(extra)} row(s) not in the plan: {names(extra)}")
    if verbose:
        print(f"merged {len(parts)} part(s): {len(rows)} rows in {out / 'grades.csv'}")
        if late:
            print(f"not in the shard plan (arrived after it was made; grade them in a new run): "
                  f"{', '.join(late[:20])}", file=sys.stderr)
    if problems:
        raise MergeError("; ".join(problems) + f" (the merged files in {out} are incomplete)")
    return rows


# --------------------------------------------------------------------------- shard plans

SHARD_FILE = "shard.json"  # in each part: the plan, its digest, k/N and the submissions not in the plan
PLAN_FORMAT = "tfbook-shard-plan/1"


def plan_digest(manifest: dict) -> str:
    import hashlib

    body = json.dumps({"shards": manifest["shards"], "work": manifest["work"]}, sort_keys=True)
    return hashlib.sha256(body.encode("ascii")).hexdigest()


def plan_of(found: list, n: int) -> dict:
    """The shard plan of a class: every row's key (student and assignment as percent-encoded
    bytes) with its shard, in contiguous parts of the sorted list (so a shard runs few judges)."""
    keys = [[report.name_id(row.student), report.name_id(row.assignment)] for row, *_ in found]
    work = [[*key, (i * n) // len(keys) + 1] for i, key in enumerate(keys)] if keys else []
    manifest = {"format": PLAN_FORMAT, "shards": n, "work": work}
    manifest["digest"] = plan_digest(manifest)
    return manifest


def make_plan(submissions: Path, notebooks_dir: Path, n: int, path: Path | None = None) -> dict:
    """``python -m tfbook.course plan``: fix the class and its split into ``n`` shards once,
    before the shards run (``grade --shard k/N --plan PLAN``); written to ``path``."""
    if n < 1:
        raise ValueError("--shards must be at least 1")
    manifest = plan_of(find_work(Path(submissions), Path(notebooks_dir)), n)
    if path is not None:
        Path(path).write_text(json.dumps(manifest, indent=0), encoding="ascii")
    return manifest


def read_plan(path: Path) -> dict:
    try:
        manifest = json.loads(Path(path).read_text(encoding="utf-8"))
        ok = manifest.get("format") == PLAN_FORMAT and plan_digest(manifest) == manifest.get("digest")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise ValueError(f"{path} is not a shard plan of this grader (or it was edited: its digest differs)")
    return manifest


def select_shard(found: list, manifest: dict, k: int) -> tuple[list, list[str]]:
    """(the work of shard ``k``: the plan's rows for it, a "missing" row for each that is no longer
    in the folder; the display names of submissions found that are not in the plan)."""
    mine = {(w[0], w[1]) for w in manifest["work"] if w[2] == k}
    planned = {(w[0], w[1]) for w in manifest["work"]}
    work, seen, unplanned = [], set(), []
    for item in found:
        key = (report.name_id(item[0].student), report.name_id(item[0].assignment))
        if key in mine:
            work.append(item)
            seen.add(key)
        elif key not in planned:
            unplanned.append(f"{report.display_name(item[0].student)}/{report.display_name(item[0].assignment)}")
    for s, a in sorted(mine - seen):
        row = Row(os.fsdecode(report.name_bytes(s)), os.fsdecode(report.name_bytes(a)), status="missing",
                  reason="in the shard plan, but no longer in the submissions folder")
        work.append((row, None, "", None))
    return work, unplanned


# --------------------------------------------------------------------------- check (students)


def exercise_label(nb, index: int, gid: str | None) -> str:
    """"Exercise 0.1" for the test cell at ``index``: from the last heading above it that names
    an exercise, else from its grade id (ex0-1-...), else "test cell N"."""
    for cell in reversed(nb.cells[:index]):
        if cell.cell_type == "markdown":
            heads = [l for l in cell.source.splitlines() if l.lstrip().startswith("#")]
            for line in reversed(heads):
                m = _EXERCISE.search(line)
                if m:
                    return f"Exercise {m.group(1)}"
    m = re.match(r"ex([0-9A-Za-z]+)-(\d+)-", gid or "")
    return f"Exercise {m.group(1)}.{m.group(2)}" if m else f"test cell {index + 1}"


_EXERCISE = re.compile(r"Exercise\s+([0-9A-Z]+\.\d+)")
_NAME = re.compile(r"name '([A-Za-z_]\w{0,40})' is not defined")


def _check_diagnosis(rec: dict, answer: dict | None, timeout: float) -> str:
    """Why a test cell failed, in words: the checks' own ✘ line, else a fixed sentence (never a
    bare exception)."""
    cross = _first_cross(rec.get("out", ""))
    if cross:
        return cross
    def which(r):
        return r.get("evalue") if r.get("evalue") in ("cpu", "wall") else ""

    if rec.get("status") == "timeout":
        return f"✘ the test {ran_longer(timeout, which(rec))} and was interrupted (a loop that never ends?)"
    if answer and answer.get("status") == "timeout":
        return f"✘ your answer cell {ran_longer(timeout, which(answer))} and was interrupted"
    if answer and answer.get("status") == "error":
        return (f"✘ your answer cell raised {judge_mod.error_name(answer.get('ename'))}: run it and "
                "read its error first")
    ename = rec.get("ename", "")
    if ename == "NameError":
        m = _NAME.search(rec.get("evalue", ""))
        what = f"`{m.group(1)}`" if m else "a name the test needs"
        return f"✘ {what} is not defined: run your answer cell (and the cells above it) first"
    if ename in ("AssertionError", "CheckFailed"):
        first = (rec.get("evalue") or "").strip().splitlines()[:1]
        return "✘ a visible check failed" + (f": {first[0][:200]}" if first else "")
    return (f"✘ the test could not use your answer (it raised {judge_mod.error_name(ename)}: "
            "a wrong type or shape?)")


def check_notebook(path: Path, timeout: float = 60, stream=None) -> int:
    """Run a notebook and its visible tests here (no sandbox: it is the student's own code);
    print, for each exercise, "not answered yet" or its points from the visible checks with
    their ✔/✘ lines, then a total; return the number of exercises not passed (unanswered
    ones included)."""
    path = Path(path)
    stream = stream or sys.stdout
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    nb = read_submission(path.read_bytes().decode("utf-8"))
    cells, failed = [], 0
    tests: dict[int, tuple[str, float, int | None]] = {}  # test cell -> (label, points, answer cell)
    answer_at = None
    for idx, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        meta = judge_mod._nbgrader(cell)
        kind = "test" if meta.get("grade") else "code"
        if meta.get("solution") and not meta.get("grade"):
            answer_at = idx
        if kind == "test":
            try:
                points = float(meta.get("points", 0) or 0)
            except (TypeError, ValueError):
                points = 0.0
            tests[idx] = (exercise_label(nb, idx, meta.get("grade_id")), points, answer_at)
            answer_at = None
        cells.append({"index": idx, "kind": kind, "source": judge_mod.released_test_source(cell.source)
                      if kind == "test" else cell.source, "gid": meta.get("grade_id")})
    if not tests:
        raise ValueError(f"{path.name} has no test cells (is it a chapter notebook?)")
    with tempfile.TemporaryDirectory(prefix="tfbook-check-") as tmp:
        scratch = Path(tmp) / "scratch"
        job = {"cells": cells, "timeout": timeout, "visible_only": True}
        a = run_attempt(job, scratch, dict, timeout=timeout, budget=Budget.of(3600),
                        use_bwrap=False, limits=sandbox.Limits(), nproc=sandbox.nproc_limit(sandbox.Limits(), 1),
                        log=Path(tmp) / "check.log")
    if a.error:
        raise RuntimeError(a.error)
    print(f"{path.name}: the visible checks, run here (the grader also runs hidden tests, so these "
          "points are the most you can score)", file=stream)
    score = total = 0.0
    unanswered = 0
    for idx, (label, points, answer) in tests.items():
        total += points
        rec = a.records.get(idx)
        ans = a.records.get(answer) if answer is not None else None
        if rec is None:
            failed += 1
            print(f"{label}: 0/{points:g} points: not reached (the notebook stopped before this test)",
                  file=stream)
            continue
        stub = (ans or {}).get("ename") == "NotImplementedError" or (
            rec["status"] == "error" and rec.get("ename") == "NotImplementedError")
        if stub:
            failed += 1
            unanswered += 1
            print(f"{label}: not answered yet (0/{points:g} points)", file=stream)
            continue
        ok = rec["status"] == "ok"
        failed += not ok
        score += points if ok else 0.0
        print(f"{label}: {points if ok else 0:g}/{points:g} points", file=stream)
        for line in rec["out"].splitlines():
            if line.startswith(("✔", "✘")):
                print(f"    {line}", file=stream)
        if not ok and not _first_cross(rec["out"]):
            print(f"    {_check_diagnosis(rec, ans, timeout)}", file=stream)
    note = f"; {unanswered} not answered yet" if unanswered else ""
    print(f"Total: {score:g}/{total:g} points from the visible checks{note}", file=stream)
    return failed


def median_seconds(rows: list[Row]) -> tuple[float, float]:
    ts = [r.seconds for r in rows if r.seconds]
    return (statistics.median(ts), max(ts)) if ts else (0.0, 0.0)


__all__ = ["grade", "merge", "Row", "CSV_FIELDS", "check_notebook", "exercise_label", "build_job", "find_work"]
