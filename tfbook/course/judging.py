"""The grader's side of the judge (:mod:`tfbook.course.judge`): one judge process per
assignment, started when its first submission starts, fed each submission's captured answers
under a CPU and wall-clock bound, restarted when a submission's data hangs or kills it
(:class:`JudgeProxy`)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

from tfbook.course import judge as judge_mod
from tfbook.course import sandbox
from tfbook.course.budget import SAMPLE, wall_factor

ROOT = Path(__file__).resolve().parents[2]  # the judge runs from the checkout (as the grader)
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


__all__ = ["JudgeProxy"]
