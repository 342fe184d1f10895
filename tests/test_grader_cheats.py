"""The cheats of the generated class against the grading they beat (student code and tests in
one interpreter, as nbgrader's autograde runs them) and against tfbook's grader: each cheat
wins points the first way and none the second. Also: the judge's diagnoses of hidden cases
name a property, never an input or an expected value."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from grader_release import released_chapters

from tfbook.course import (
    demo as course_demo,
    attempt as course_attempt,
    budget as course_budget,
    judge as course_judge,
    judging as course_judging,
    release as course_release,
    sandbox as course_sandbox,
)

ROOT = Path(__file__).resolve().parents[1]
CH0 = course_demo.CH0
MASTER = ROOT / "notebooks" / f"{CH0}.ipynb"
CHEATS = ("cheat_rebind", "cheat_transformer", "cheat_failpatch")

pytestmark = pytest.mark.skipif(not MASTER.exists(), reason="chapter 0 not written yet")


def _shared_kernel_points(nb, master) -> float:
    """Points under the old model: the student's cells and the full master tests (hidden
    part included) run in one interpreter; a test cell that raises nothing scores."""
    full = {course_release._nbgrader(c).get("grade_id"): c for c in master.cells if course_release._nbgrader(c).get("grade")}
    cells = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        gid = course_release._nbgrader(cell).get("grade_id")
        src = full[gid].source if gid in full else cell.source
        cells.append({"index": i, "kind": "code", "source": src})
    with tempfile.TemporaryDirectory() as tmp:
        a = course_attempt.run_attempt({"cells": cells, "timeout": 30, "visible_only": True},
                                       Path(tmp) / "s", dict, timeout=30,
                                       budget=course_budget.Budget.of(300), use_bwrap=False,
                                       limits=course_sandbox.Limits(), nproc=course_sandbox.nproc_limit(
                                         course_sandbox.Limits(), 1), log=Path(tmp) / "log")
    points = 0.0
    for i, cell in enumerate(nb.cells):
        gid = course_release._nbgrader(cell).get("grade_id")
        if gid in full and a.records.get(i, {}).get("status") == "ok":
            points += float(course_release._nbgrader(full[gid]).get("points", 0))
    return points


@pytest.fixture(scope="module")
def cheats(tmp_path_factory):
    rel = {CH0: released_chapters()[CH0]}  # chapter 0 only: make_class writes every chapter it is given
    subs = tmp_path_factory.mktemp("subs")
    out = tmp_path_factory.mktemp("out")
    course_demo.make_class(subs, rel, out, "cheats", 9, names=list(CHEATS))
    master = nbformat.read(str(MASTER), as_version=4)
    return {s: _shared_kernel_points(nbformat.read(str(subs / s / CH0 / f"{CH0}.ipynb"), as_version=4), master)
            for s in CHEATS}


def test_cheats_beat_a_shared_kernel(cheats):
    # tests/test_exercises_pipeline.py grades the same notebooks: 0 points each
    assert course_demo.EXPECTED["cheat_rebind"][CH0][0] == 0
    # every answer wrong, yet 4 of 7 points: the checks that call tfbook.checks or builtins are
    # disarmed (the visible tests that raise AssertionError themselves still catch two exercises)
    assert cheats["cheat_rebind"] >= 4
    assert cheats["cheat_transformer"] == 7  # every later cell became `pass`
    assert cheats["cheat_failpatch"] >= 3  # the visible checks stopped failing, all answers wrong


def test_hidden_diagnosis_names_a_property_only():
    judge = course_judge.Judge(MASTER)
    judge.prepare()
    gid = "ex0-1-softmax-tests"
    calls = judge.logs[gid]["softmax"]
    import pickle

    import numpy as np

    from tfbook import numpy as tnp

    def naive(x, axis=-1):  # right on every matrix, but a 1-D input comes back reversed: hidden case C fails
        x = np.asarray(x)
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        p = e / e.sum(axis=axis, keepdims=True)
        return p[::-1] if x.ndim == 1 else p

    def answers(fn):
        """The results of ``fn`` as the sandbox reports them: hidden calls by their index,
        the visible checks' calls by the digest of their inputs."""
        results, visible = {}, []
        for k, (blob, d, part, _) in enumerate(calls):
            args, kwargs = pickle.loads(blob)
            with np.errstate(all="ignore"):
                r = (True, fn(*args, **kwargs))
            if part == "h":
                results[k] = r
            else:
                visible.append((d, r))
        return {gid: {"softmax": results}}, {gid: {"softmax": visible}}

    verdict = judge.evaluate({}, *answers(naive))[gid]
    assert not verdict["passed"] and verdict["part"] == "hidden"
    assert verdict["diagnosis"] == "hidden case C: wrong values (a 1-D input (a single vector of logits))"
    for leak in ("1e4", "10000", "expected", "got", "(2, 3)", "index"):
        assert leak not in verdict["diagnosis"], leak
    # the right answer passes, so the check can fail either way
    assert judge.evaluate({}, *answers(tnp.softmax))[gid]["passed"]


def test_a_dead_judge_costs_one_row_not_the_batch():
    """A judge that one submission's data kills costs that row only: a fresh judge serves the
    next. Two jobs share a chapter's judge: when one job's evaluation restarts it, the other
    job, already waiting to evaluate, must read the new judge's "ready" message before its own
    answer (issue 28: it once took "ready" for its verdict, a grader error on an honest row).
    A judge that is slow only because the machine is busy (no CPU burnt) is not killed."""
    import threading

    judge = course_judging.JudgeProxy(MASTER, course_judge.SPECS)
    values = {"ex0-4-prediction-tests": {"prediction": (True, 1 / 3)}}
    got = {}
    try:
        assert "failed" not in judge.ready()
        judge.lock.acquire()  # job A is evaluating
        waiting = threading.Thread(target=lambda: got.update(v=judge.evaluate(values, {}, timeout=60)))
        waiting.start()  # job B waits for the judge
        time.sleep(0.5)
        judge.restart()  # job A's data killed it: a fresh judge, still recording its cases
        judge.lock.release()
        waiting.join(120)
        assert got["v"]["ex0-4-prediction-tests"]["passed"]
        judge.proc.kill()  # as if one submission's data had crashed it
        judge.proc.wait()
        with pytest.raises(RuntimeError):
            judge.evaluate(values, {})
        assert judge.evaluate(values, {})["ex0-4-prediction-tests"]["passed"]  # a fresh judge
        # a judge stopped (SIGSTOP: no CPU used) for 3 s with a 1 s limit is waited for
        import signal

        os_kill = __import__("os").kill
        os_kill(judge.proc.pid, signal.SIGSTOP)
        threading.Timer(3.0, lambda: os_kill(judge.proc.pid, signal.SIGCONT)).start()
        assert judge.evaluate(values, {}, timeout=1)["ex0-4-prediction-tests"]["passed"]
    finally:
        judge.close()
