"""Runs ONE submission inside its sandbox; started by :mod:`tfbook.course.attempt` (never by hand).

    python -m tfbook.course.driver JOB.json

The job file lists the notebook's code cells in order. Ordinary and answer cells are the
student's; at each test cell the driver runs the *visible* part of the master's test
(for the student's feedback) and then records what the test needs from the student's
code: a plain value (``prediction``), or a function, which is kept for later.

Phase 1 (visible): every cell runs in one IPython shell, in this process; each cell has
``timeout`` seconds of CPU time (a SIGPROF interrupts it) and, for code that sleeps or blocks,
``wall`` seconds of wall-clock time less the time it waited for a CPU (a SIGALRM every few
seconds counts it; the interrupt comes when it is spent), so that a loaded grading machine
does not shorten either. What each cell printed is reported.
Phase 2 (hidden): after reporting ``visible-done`` the driver reads, from its standard
input, the inputs of every call the grader wants (pickles made by the grader), calls the
student's functions on them with the output discarded, and reports each result as plain
data (:mod:`tfbook.course.wire`). The grader sends those inputs only once it has received
``visible-done``, and ignores anything after it for feedback: nothing the student's code
learns in phase 2 can reach the feedback page.

Nothing here is trusted by the grader: the student's code runs in this very process and
can change anything in it. The grader judges the reported data in its own process,
against the master notebook's solution, and supervises the time limits from outside.

Messages go, one JSON object a line, to the file descriptor that was standard output
when the driver started; fd 1 and fd 2 are redirected so C-level prints cannot corrupt it.

That channel is out of the student's reach: the driver forks at once, before any student code
exists, into a *relay* (the parent), which alone holds the grader's channel (its stdin and
stdout) and makes itself non-dumpable (no process of the sandbox user can read its file
descriptors through /proc, or trace it), and the *runner* (the child), which runs the
notebook and sends its messages to the relay through a pipe of its own. The relay forwards
each message re-encoded, bounded in size (``MAX_LINE``) and nesting, and drops anything that
is not one JSON object naming a known kind: the grader reads only what the relay wrote. The
relay's parsing costs the sandbox's CPU time, which the grader limits.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import struct
import sys
import time
import tracemalloc

EXCERPT = 4000


class _State:
    fired = ""  # "" (no), "cpu" or "wall": which limit interrupted the code
    proto = None
    stdin = None  # kept from the start: a student's cell may rebind sys.stdin
    wall_left = 0.0  # the wall-clock backstop left (seconds not spent waiting for a CPU)
    mark = (0.0, {})  # (time, each thread's run-queue delay) when it was last counted


WALL_STEP = 5.0  # seconds between two counts of the wall-clock backstop


def _send(msg: dict) -> None:
    try:
        _State.proto.write(json.dumps(msg) + "\n")
        _State.proto.flush()
    except Exception:  # noqa: BLE001  (the channel is gone: nothing left to do)
        os._exit(3)


def _delays() -> dict:
    """Each thread of this process: nanoseconds it has waited for a CPU (the kernel's count)."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                out[tid] = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return out


def _on_cpu(signum, frame):
    _State.fired = "cpu"
    raise KeyboardInterrupt("CPU time limit")


def _on_alarm(signum, frame):
    now, delays = time.monotonic(), _delays()
    t0, before = _State.mark
    waited = max((d - before.get(t, 0) for t, d in delays.items()), default=0) / 1e9
    _State.wall_left -= (now - t0) - min(max(waited, 0.0), now - t0)
    _State.mark = (now, delays)
    if _State.wall_left <= 0:
        _State.fired = "wall"
        raise KeyboardInterrupt("time limit")
    signal.setitimer(signal.ITIMER_REAL, min(_State.wall_left, WALL_STEP))


def _arm(limits) -> None:
    """Interrupt the code after ``limits[0]`` CPU seconds (this process's threads) or
    ``limits[1]`` seconds of wall-clock time not spent waiting for a CPU."""
    cpu, wall = limits
    _State.fired = ""
    signal.signal(signal.SIGPROF, _on_cpu)
    signal.signal(signal.SIGALRM, _on_alarm)
    _State.wall_left, _State.mark = float(wall), (time.monotonic(), _delays())
    signal.setitimer(signal.ITIMER_PROF, max(float(cpu), 0.001))
    signal.setitimer(signal.ITIMER_REAL, max(min(float(wall), WALL_STEP), 0.001))


def _disarm() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.setitimer(signal.ITIMER_PROF, 0)


def _limits(job: dict) -> tuple:
    """(CPU seconds, wall-clock backstop seconds) of one cell (a job without "wall": 10 times)."""
    return job["timeout"], job.get("wall", 10 * job["timeout"])


def _run(shell, source: str, limits) -> dict:
    from IPython.utils.capture import capture_output

    status, ename, evalue = "ok", "", ""
    with capture_output(display=True) as cap:
        _arm(limits)
        try:
            result = shell.run_cell(source, store_history=False, silent=False)
        except KeyboardInterrupt:  # the alarm fired outside the cell's own code
            result = None
        finally:
            _disarm()
    err = None if result is None else (result.error_before_exec or result.error_in_exec)
    if _State.fired:
        status, ename = "timeout", "TimeoutError"
        evalue = _State.fired  # "cpu" or "wall" (the grader reads only these two words)
    elif result is None or err is not None:
        status = "error"
        ename = type(err).__name__ if err is not None else "KeyboardInterrupt"
        evalue = str(err)[:500] if err is not None else ""
    text = cap.stdout + cap.stderr
    for out in cap.outputs:
        plain = out.data.get("text/plain") if hasattr(out, "data") else None
        if plain and not any(k.startswith("image/") for k in out.data):
            text += str(plain) + "\n"
    try:
        import matplotlib.pyplot as plt

        plt.close("all")
    except Exception:  # noqa: BLE001
        pass
    return {"status": status, "ename": ename, "evalue": evalue, "out": text[-EXCERPT:]}


def _encode_value(value):
    """``value`` as wire data, or a fixed error code (never a message or a class name: the
    student's code chooses those)."""
    from tfbook.course.wire import Unencodable, encode

    try:
        return {"ok": True, "value": encode(value)}
    except Unencodable:
        return {"ok": False, "error": "uncomparable"}
    except KeyboardInterrupt:
        return {"ok": False, "error": "timeout" if _State.fired else "unreadable"}
    except BaseException:  # noqa: BLE001  (SystemExit from a __len__ or __iter__ too)
        return {"ok": False, "error": "unreadable"}


def _call(fn, args, kwargs, keep: dict | None = None, measure: bool = False) -> dict:
    """Call a student's function; its result as wire data plus the changes it made to its
    array arguments in place ("changes"), or a fixed error code. ``keep`` receives the
    result ("out") or the exception ("exc"). ``measure``: the test cell measures this call's
    memory, so it is measured here ("peak", tracemalloc) and the judge replays that peak."""
    from tfbook.course import wire

    keep = {} if keep is None else keep
    try:
        leaves = wire.array_leaves(args, kwargs)
        before = wire.snapshot(leaves)
    except Exception:  # noqa: BLE001  (the grader's inputs: cannot fail, but never stop the run)
        leaves, before = [], []
    peak = None
    try:
        if measure:
            tracemalloc.start()
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
        out = keep["out"] = fn(*args, **kwargs)
        if measure:
            peak = max(0, tracemalloc.get_traced_memory()[1] - base)
    except KeyboardInterrupt as exc:
        keep["exc"] = exc
        return {"ok": False, "error": "timeout" if _State.fired else "raised"}
    except BaseException as exc:  # noqa: BLE001  (SystemExit too)
        keep["exc"] = exc
        return {"ok": False, "error": "raised"}
    finally:
        if measure:
            tracemalloc.stop()
    msg = _encode_value(out)
    if peak is not None and msg["ok"]:
        msg["peak"] = peak
    if msg["ok"]:
        try:
            changes = wire.changed_leaves(leaves, before)
        except BaseException:  # noqa: BLE001
            return {"ok": False, "error": "unreadable"}
        if changes:
            msg["changes"] = changes
    return msg


class _Seen:
    """Stands for a student's function while its visible test cell runs: each call's inputs
    (as a digest), result and in-place changes are reported, so that the grader scores the
    visible checks on what the function returned to them."""

    def __init__(self, fn, gid, name, measure=False):
        self.fn, self.gid, self.name, self.n, self.measure = fn, gid, name, 0, measure
        for attr in ("__name__", "__qualname__", "__doc__", "__module__", "__wrapped__"):
            try:
                setattr(self, attr, getattr(fn, attr))
            except AttributeError:
                pass

    def __call__(self, *args, **kwargs):
        from tfbook.course import wire

        self.n += 1
        if self.n > 1000:  # a test cell makes a few calls; a loop of the student's own is not reported
            return self.fn(*args, **kwargs)
        try:
            d = wire.digest(args, kwargs)
        except Exception:  # noqa: BLE001
            return self.fn(*args, **kwargs)
        keep: dict = {}
        msg = _call(self.fn, args, kwargs, keep, self.measure)
        _send({"t": "vresult", "gid": self.gid, "name": self.name, "digest": d, **msg})
        if "exc" in keep:  # the test cell sees what the function raised
            raise keep["exc"]
        return keep["out"]


def _hidden(job: dict, functions: dict, slow: set) -> None:
    raw = _State.stdin.read(8)
    if len(raw) != 8:
        _send({"t": "log", "msg": "no hidden inputs"})
        return
    (size,) = struct.unpack("<Q", raw)
    calls = pickle.loads(_State.stdin.read(size))  # made by the grader (cloudpickle for lambdas)
    sink = io.StringIO()
    skip = set(job.get("skip_hidden", []))
    for gid, per_name in calls.items():
        if gid in skip:
            continue
        _send({"t": "hstart", "gid": gid})
        _arm(_limits(job))
        timed_out = gid in slow  # its visible checks already ran out of time: do not wait again
        try:
            for name, blobs in per_name.items():
                fn = functions.get((gid, name))
                for k, blob in blobs:
                    if timed_out:
                        msg = {"ok": False, "error": "timeout"}
                    elif fn is None:
                        msg = {"ok": False, "error": "missing"}
                    else:
                        args, kwargs = pickle.loads(blob)
                        old = sys.stdout, sys.stderr
                        sys.stdout = sys.stderr = sink
                        try:
                            msg = _call(fn, args, kwargs, measure=gid in job.get("measure_memory", ()))
                            timed_out = msg.get("error") == "timeout"
                        finally:
                            sys.stdout, sys.stderr = old
                            sink.seek(0)
                            sink.truncate()
                    _send({"t": "result", "gid": gid, "name": name, "k": k, **msg})
        except KeyboardInterrupt:
            pass
        finally:
            _disarm()
        _send({"t": "hend", "gid": gid})


MAX_LINE = 48 * 2**20  # bytes of one message (the grader reads no longer line)
KINDS = frozenset({"ready", "start", "end", "vresult", "value", "visible-done", "hstart", "hend", "result",
                   "done", "log"})


def _non_dumpable() -> None:
    """No other process of this user may read this one's memory or file descriptors (/proc) or trace it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass


def _relay(up: int, down: int, child: int) -> None:
    """The parent: holds the grader's channel (fds 0 and 1); copies the grader's bytes (the hidden
    inputs) to the runner, and the runner's messages, checked and re-encoded, to the grader."""
    import threading

    out = os.fdopen(1, "wb", closefd=False)

    def downstream():
        try:
            while True:
                chunk = os.read(0, 1 << 20)
                if not chunk:
                    break
                _write_all(down, chunk)
        except OSError:
            pass
        try:
            os.close(down)
        except OSError:
            pass

    threading.Thread(target=downstream, daemon=True).start()
    source = os.fdopen(up, "rb")
    skipping = False
    while True:
        try:
            line = source.readline(MAX_LINE)
        except (OSError, ValueError):
            break
        if not line:
            break
        whole = line.endswith(b"\n")
        if skipping or not whole:  # longer than MAX_LINE: dropped, with the rest of it
            skipping = not whole
            continue
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(msg, dict) or msg.get("t") not in KINDS:
            continue
        try:
            out.write(json.dumps(msg, ensure_ascii=True).encode("ascii") + b"\n")
            out.flush()
        except (OSError, ValueError, RecursionError):
            break
    try:
        os.waitpid(child, 0)
    except OSError:
        pass
    os._exit(0)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _split() -> tuple[int, int]:
    """Fork into the relay (which never returns from here) and the runner; the runner gets its
    ends of the two pipes (messages up, the grader's bytes down), and no grader's channel."""
    up_r, up_w = os.pipe()
    down_r, down_w = os.pipe()
    _non_dumpable()  # before the fork: the relay is never dumpable, not for an instant
    pid = os.fork()
    if pid:
        os.close(up_w)
        os.close(down_r)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 2)
        _relay(up_r, down_w, pid)
    os.close(up_r)
    os.close(down_w)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # the grader's channel: gone from the runner
    os.dup2(devnull, 1)
    os.close(devnull)
    return up_w, down_r


def _fresh_keyrings() -> None:
    """The kernel's keyrings outlive a sandbox: a key left in the sandbox user's keyring, or in the
    session keyring every sandbox inherits from the grader, would reach the next run in this slot
    (a retry after the hidden phase, or a classmate). Before any student code: a new, empty
    session keyring of our own, and the user's keyrings emptied."""
    import ctypes
    import platform

    calls = {"x86_64": 250, "aarch64": 219, "armv7l": 311, "ppc64le": 289, "s390x": 280}
    nr = calls.get(platform.machine())
    if nr is None:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.syscall(nr, 1, None)  # KEYCTL_JOIN_SESSION_KEYRING, anonymous: the grader's is no longer ours
        for ring in (-4, -5):  # KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING
            libc.syscall(nr, 7, ctypes.c_long(ring))  # KEYCTL_CLEAR
    except (OSError, AttributeError):
        pass


def _drop_privileges() -> None:
    """As root inside bwrap: become the sandbox user before anything else runs."""
    uid = os.environ.pop("TFBOOK_SANDBOX_UID", "")
    if uid and os.getuid() == 0:
        os.setgroups([])
        os.setgid(int(uid))
        os.setuid(int(uid))
        if os.getuid() == 0 or os.geteuid() == 0:
            raise SystemExit("could not drop privileges")


def main(argv: list[str]) -> int:
    _drop_privileges()
    _fresh_keyrings()
    job = json.loads(open(argv[0], encoding="utf-8").read())
    up, down = _split()
    _State.proto = os.fdopen(up, "w", encoding="utf-8")
    _State.stdin = os.fdopen(down, "rb")
    devnull = os.open(os.devnull, os.O_WRONLY)
    log = job.get("log")
    if log:  # unsandboxed: a file in the run's folder; in the sandbox fd 2 is the grader's log
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 2)
    sys.stdout = io.TextIOWrapper(os.fdopen(os.dup(1), "wb"), encoding="utf-8")
    os.environ.setdefault("MPLBACKEND", "Agg")
    start = time.perf_counter()
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.colors = "NoColor"
    _send({"t": "ready", "s": round(time.perf_counter() - start, 3)})
    skip = set(job.get("skip", []))
    functions: dict = {}
    slow: set = set()
    for cell in job["cells"]:
        i = cell["index"]
        if i in skip:
            continue
        _send({"t": "start", "cell": i})
        seen = {}
        for name, mode in cell.get("capture", []):  # the visible checks' calls are reported
            fn = shell.user_ns.get(name, _MISSING)
            if mode == "call" and fn is not _MISSING and callable(fn) and not job.get("visible_only"):
                seen[name] = (fn, _Seen(fn, cell["gid"], name, cell["gid"] in job.get("measure_memory", ())))
                shell.user_ns[name] = seen[name][1]
        rec = _run(shell, cell["source"], _limits(job)) if cell["source"].strip() else \
            {"status": "ok", "ename": "", "evalue": "", "out": ""}
        for name, (fn, wrapper) in seen.items():
            if shell.user_ns.get(name, _MISSING) is wrapper:
                shell.user_ns[name] = fn
        _send({"t": "end", "cell": i, **rec})
        if cell.get("gid") and rec["status"] == "timeout":
            slow.add(cell["gid"])
        for name, mode in cell.get("capture", []):
            gid = cell["gid"]
            if i in job.get("skip_capture", ()):  # reading it did not stop on an earlier run
                _send({"t": "value", "gid": gid, "name": name, "ok": False, "error": "timeout"})
                continue
            _arm(_limits(job))  # reading a value runs the student's code too (__len__, __iter__)
            try:
                _capture(shell, gid, name, mode, functions)
            except BaseException:  # noqa: BLE001  (SystemExit, a time-out: this value only)
                _send({"t": "value", "gid": gid, "name": name, "ok": False,
                       "error": "timeout" if _State.fired else "unreadable"})
            finally:
                _disarm()
    _send({"t": "visible-done"})
    if not job.get("visible_only"):
        _hidden(job, functions, slow)
    _send({"t": "done"})
    _State.proto.close()
    os._exit(0)  # no atexit handlers of the student's


def _capture(shell, gid, name, mode, functions) -> None:
    value = shell.user_ns.get(name, _MISSING)
    if value is _MISSING:
        _send({"t": "value", "gid": gid, "name": name, "ok": False, "error": "missing"})
    elif mode == "call":
        if callable(value):
            functions[(gid, name)] = value
            _send({"t": "value", "gid": gid, "name": name, "ok": True, "callable": True})
        else:
            _send({"t": "value", "gid": gid, "name": name, "ok": False, "error": "not a function"})
    else:
        _send({"t": "value", "gid": gid, "name": name, **_encode_value(value)})


_MISSING = object()

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
