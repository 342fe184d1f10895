"""The grader's time limits are fair on a loaded machine (issue 28).

A cell's limit (``--timeout``) and a notebook's (``--total-timeout``) are CPU seconds; code
that sleeps or blocks uses none, so a backstop of ``WALL_FACTOR`` times as many seconds of
wall-clock time *not spent waiting for a CPU* stops it (:class:`tfbook.course.sandbox.Meter`).
Each test here takes a few seconds: limits of 1 s.

Mutations that fail these tests: the driver's CPU timer made a wall-clock one again
(``ITIMER_PROF`` -> ``ITIMER_REAL``, ``SIGPROF`` -> ``SIGALRM``) fails the loaded honest
notebook; the meter's run-queue delay dropped (``waited`` set to 0) fails it too, at the
backstop; a driver that ignores its wall clock fails the sleeper; a grader that no longer
reads the meter (``meter.sample()`` removed) lets the signal-ignoring loop run forever.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tfbook.course import attempt as course_attempt
from tfbook.course import budget as course_budget
from tfbook.course import sandbox as course_sandbox

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the meter reads Linux's /proc")

LIMIT = 1.0  # CPU seconds per cell in these tests
BUSY = "import time\n_t = time.process_time()\nwhile time.process_time() - _t < {s}:\n    pass\n"


def _attempt(sources, timeout=LIMIT, budget=None, sandboxed=False):
    cells = [{"index": i, "kind": "code", "source": s} for i, s in enumerate(sources)]
    budget = budget or course_budget.Budget.of(60)
    use_bwrap = sandboxed and not course_sandbox.available()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        a = course_attempt.run_attempt({"cells": cells, "timeout": timeout, "visible_only": True},
                                       Path(tmp) / "s", dict, timeout=timeout, budget=budget,
                                       use_bwrap=use_bwrap, limits=course_sandbox.Limits(),
                                       nproc=course_sandbox.nproc_limit(course_sandbox.Limits(), 1),
                                       log=Path(tmp) / "log")
        a.wall = time.monotonic() - start
    return a


def test_the_backstop_is_three_times_the_cpu_limit_here():
    assert course_sandbox.run_queue_delays_available()  # this kernel counts run-queue delays
    assert course_budget.wall_factor() == course_budget.WALL_FACTOR == 3.0


def test_a_loop_meets_the_cpu_limit_and_a_sleeper_the_wall_backstop():
    a = _attempt(["x = 1", "while True:\n    pass", "import time\ntime.sleep(60)", "print(x + 1)"])
    assert a.records[1]["status"] == a.records[2]["status"] == "timeout"
    assert a.limit == {1: "cpu", 2: "wall"}  # which limit stopped each
    assert a.records[3] == {"status": "ok", "ename": "an exception", "evalue": "", "out": "2\n"}
    assert a.culprit is None and not a.overall  # both stopped when interrupted: nothing skipped
    # the sleeper stopped after 3 s of its own time, not its 60 s; the loop after 1 s of CPU
    assert a.wall < 60 and 1.0 <= a.cpu < 10
    assert course_budget.ran_longer(LIMIT, "cpu") == "ran longer than 1 s of CPU time"
    assert course_budget.ran_longer(LIMIT, "wall").startswith("ran longer than 3 s of wall-clock time")


@pytest.mark.parametrize("kind", ["loop", "sleep"])
def test_code_that_ignores_the_interrupt_is_killed_by_the_grader(kind):
    """In the sandbox: the grader's meter reads the whole process tree (bwrap, its init, the
    driver) and kills it GRACE seconds past the limit."""
    source = ("import signal\nfor _s in (signal.SIGPROF, signal.SIGALRM, signal.SIGINT):\n"
              "    signal.signal(_s, signal.SIG_IGN)\n"
              + ("while True:\n    pass\n" if kind == "loop" else "import time\ntime.sleep(120)\n"))
    a = _attempt(["x = 1", source], sandboxed=True)
    assert a.culprit == ("cell", 1, "timeout")
    if kind == "loop":
        assert a.cpu >= LIMIT + course_budget.GRACE  # stopped by CPU time...
    else:
        assert a.cpu < LIMIT + course_budget.GRACE  # ... and this one by the backstop
        assert a.own >= 3 * LIMIT + course_budget.GRACE and a.wall < 100


def test_the_notebook_limit_counts_cpu_seconds():
    budget = course_budget.Budget(cpu=2.5, wall=60)
    a = _attempt([BUSY.format(s=0.7)] * 6, budget=budget)
    assert a.overall
    assert 1 <= len([r for r in a.records.values() if r["status"] == "ok"]) < 4  # 6 x 0.7 s: not all ran
    assert budget.cpu_used >= 2.5 and budget.wall_used < 60


def test_an_honest_notebook_on_a_loaded_machine_is_not_timed_out():
    """Eight busy processes share one core with the grading: the cell's 0.5 s of CPU takes
    seconds of wall-clock time, past its 1 s limit (a wall-clock limit would stop it),
    and it passes: the limit counts its CPU time, and the backstop leaves out the time it
    waited for the core."""
    core = sorted(os.sched_getaffinity(0))[0]
    keep = os.sched_getaffinity(0)
    # each hog in its own session: with the kernel's autogroup scheduling a session shares a core
    # with other sessions as one group, so eight hogs in the test's session took only half the
    # core from the driver (its own session): 0.5 s of CPU in 0.91 s of wall time on CI
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                             preexec_fn=lambda: os.sched_setaffinity(0, {core})) for _ in range(8)]
    try:
        os.sched_setaffinity(0, {core})  # the driver (a child) inherits it
        cell = ("import time\n_w = time.monotonic()\n" + BUSY.format(s=0.5)
                + "print(f'wall {time.monotonic() - _w:.2f}')")
        a = _attempt(["x = 1", cell, "print(x + 1)"])
    finally:
        os.sched_setaffinity(0, keep)
        for h in hogs:
            h.kill()
            h.wait()
    assert a.records[1]["status"] == "ok", a.records[1]
    wall = float(re.search(r"wall (\d+\.\d+)", a.records[1]["out"]).group(1))
    assert wall > LIMIT  # the load was real: a wall-clock limit of 1 s would have fired
    assert a.records[2]["out"] == "2\n" and a.culprit is None and not a.overall


def test_the_meter_counts_a_grandchilds_cpu_and_not_its_wait(tmp_path):
    """The meter's CPU includes processes below the one it watches, ended ones too (a reaped
    child's time is its parent's), and its backstop clock is wall time for a sleeper."""
    script = ("import subprocess, sys, time\n"
              f"subprocess.run([sys.executable, '-c', {BUSY.format(s=0.6)!r}])\n"
              "time.sleep(1.0)\n")
    p = subprocess.Popen([sys.executable, "-c", script])
    meter = course_sandbox.Meter(p.pid)
    while p.poll() is None:
        meter.sample()
        time.sleep(0.1)
    assert meter.cpu >= 0.6  # the grandchild's busy loop (in the parent's count once it ended)
    assert meter.own >= 1.0 + 0.3  # the 1 s sleep counts in full, and some of the CPU time


def test_without_run_queue_delays_the_backstop_is_plain_wall_time(monkeypatch):
    monkeypatch.setattr(course_sandbox, "run_queue_delays_available", lambda: False)
    assert course_budget.wall_factor() == course_budget.PLAIN_WALL_FACTOR
    meter = course_sandbox.Meter(os.getpid())
    assert not meter.fair
    time.sleep(0.3)
    assert meter.sample().own >= 0.3
    assert "not spent waiting" not in course_budget.limit_words(60)


def test_a_slots_control_group_counts_the_cpu_a_process_tree_hides():
    """A child whose parent ignores SIGCHLD is reaped by the kernel and its CPU time is lost to
    the process tree's count; the slot's cpuacct group (as root, with cgroups) still has it."""
    slots = course_sandbox.Slots(1, course_sandbox.Limits())
    slot = slots.acquire()
    try:
        if slot.cpu_seconds() is None:
            pytest.skip("no cpuacct control group here (not root, or no cgroups)")
        script = ("import os, signal, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
                  f"if os.fork() == 0:\n    exec({BUSY.format(s=0.8)!r})\n    os._exit(0)\n"
                  "try:\n    os.wait()  # returns when the child has ended (and been reaped)\n"
                  "except ChildProcessError:\n    pass\ntime.sleep(60)\n")
        p = subprocess.Popen([sys.executable, "-c", script], preexec_fn=slot.enter)
        group = course_sandbox.Meter(p.pid, slot)
        time.sleep(0.3)
        while len(course_sandbox.process_tree(p.pid)) > 1 and p.poll() is None:  # the child runs
            group.sample()
            time.sleep(0.1)
        left, _ = course_sandbox.Meter(p.pid)._tree_cpu_and_delays()  # what the tree holds now
        group.sample()
        p.kill()
        p.wait()
        assert left < 0.5  # the child's 0.8 s are gone from the tree's count...
        assert group.cpu >= 0.8  # ... and in the group's
    finally:
        slots.release(slot)
        slots.remove()
