"""The chapters that time code pass under nbval while two busy processes compete for the cores
(issue 32, part 5).

A reader's laptop is rarely idle. A check that depends on a time must either assert what no
machine's speed or load can change (counts, FLOPs, bytes, shapes) and show the time as a
measurement in a cell whose output nbval does not compare, or measure CPU time, the minimum
over repeats, with a band that holds under load. This test runs each chapter that times code
under nbval (the outputs compared as in ``make test``) while two pure-Python spin loops run,
each in its own session (``os.setsid``: with the kernel's autogroup scheduling, processes of
one session share one group's CPU share, so spinners started in the test's own session would
hardly compete with it), and asserts that every cell passes.

``TIMED`` lists the chapters that time code and are run here; ``NOT_RUN`` the chapters that
time code but are left out, with the reason. ``test_every_timing_chapter_is_listed`` finds
the chapters that call a timer and fails on one in neither list.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"

# chapter prefix -> what it times (each was a check on a time; each now asserts what load cannot change)
TIMED = {
    "01": "c015h/c015i: 500 byte-BPE merges; the CPU time is shown, the check asserts the merges and piece counts",
    "11": "c045b: the KV cache's speed-up; asserts FLOP counts, shows the times",
    "16": "c026-c041: CPU times of the layer's parts; asserts FLOP and byte counts, shows the times",
    "18": "c012c/c070b: the workers' measured seconds; asserts the training results, shows the times",
}
# chapter prefix -> why it times code but is not run here
NOT_RUN = {
    "14": "c035 times 10 training steps per model; the output is not compared (NBVAL_IGNORE_OUTPUT) and no "
          "check reads the time (make test's nbval run covers the chapter)",
    "17": "c015 times blocked and tiled attention; it asserts their outputs, not the times",
    "20": "c030b times speculative decoding (sv.time_speculative); output not compared, no check reads a time",
    "23": "c027/c028 time a recurrent and a cached step; outputs not compared, no check reads a time",
}
TIMER = re.compile(r"\b(perf_counter|process_time|thread_time|monotonic|time\.time|timeit|cpu_seconds|"
                   r"median_seconds|best_time|tokens_per_second|time_speculative)\s*\(|from tfbook\.measure import")
SPIN = "while True:\n    pass\n"


def chapter(prefix: str) -> Path:
    (path,) = sorted(NOTEBOOKS.glob(f"{prefix}_*.ipynb"))
    return path


def chapters_that_time_code() -> set[str]:
    found = set()
    for path in sorted(NOTEBOOKS.glob("[0-9A-Z]*_*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        if any(c.cell_type == "code" and TIMER.search(c.source) for c in nb.cells):
            found.add(path.name[:2])
    return found


def test_every_timing_chapter_is_listed():
    missing = chapters_that_time_code() - set(TIMED) - set(NOT_RUN)
    assert not missing, f"chapters that time code, neither run under load here nor excused: {sorted(missing)}"


def spinners(n: int = 2) -> list[subprocess.Popen]:
    """``n`` pure-Python busy loops, each in its own session (so autogroup does not fold them
    into this test's share of the CPU)."""
    return [subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # its own session and group: only what it started
        except ProcessLookupError:
            pass
        p.wait()


def test_spinners_run_in_their_own_sessions():
    procs = spinners(2)
    try:
        time.sleep(0.3)
        assert all(p.poll() is None for p in procs)
        assert all(os.getsid(p.pid) == p.pid != os.getsid(0) for p in procs)
    finally:
        stop(procs)


@pytest.mark.parametrize("prefix", sorted(TIMED))
def test_timing_chapter_passes_under_load(prefix):
    path = chapter(prefix)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
           "--nbval-sanitize-with", str(ROOT / "nbval_sanitize.cfg"), "--nbval-cell-timeout", "600", str(path)]
    procs = spinners(2)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    finally:
        stop(procs)
    assert proc.returncode == 0, f"{path.name} fails under load:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
