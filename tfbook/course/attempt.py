"""One run of the driver on a job, in its sandbox, supervised from outside: every cell's clocks
kept (a cell past its limit is interrupted, then killed), the student's answers captured from
the sandbox's channel (bounded lines, decoded as plain data, accepted only where the driver's
protocol expects them), the hidden inputs sent after the visible phase, the kernel's measure of
memory windows, and the sandbox's stderr quoted into the instructor's log (:func:`run_attempt`,
:class:`Attempt`)."""

from __future__ import annotations

import json
import os
import pickle
import queue
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tfbook.course import judge as judge_mod
from tfbook.course import report
from tfbook.course import sandbox
from tfbook.course.budget import GRACE, SAMPLE, Budget, wall_factor
from tfbook.course.wire import Undecodable, decode

GRADER_CPU = 60.0  # CPU seconds the grader itself may spend on one submission's messages (all its runs)
MAX_LINE = 48 * 2**20
MAX_STREAM = 128 * 2**20


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


__all__ = ["run_attempt", "Attempt", "STUDENT_PREFIX", "GRADER_CPU"]
