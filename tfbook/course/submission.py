"""One submission graded (:func:`grade_one`): its sandbox runs (a cell that hangs or crashes is
skipped on a fresh run, up to ``MAX_ATTEMPTS`` runs), its judging, and its row's score, status
and reason, the instructor's rules (``course/policies.py``) applied."""

from __future__ import annotations

import re
import time
from pathlib import Path

from tfbook.course import judge as judge_mod
from tfbook.course import policies
from tfbook.course import sandbox
from tfbook.course.attempt import run_attempt
from tfbook.course.budget import Budget, GRACE, limit_words, ran_longer
from tfbook.course.job import build_job, read_submission
from tfbook.course.judging import JudgeProxy
from tfbook.course.rows import Row, cell_label, test_label

MAX_ATTEMPTS = 3  # runs of one submission (each skips the cells that hung or crashed before)


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
        label = (cell_label(by_index.get(key), sub, key, plan.order) if where == "cell" else
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
            parts.append(f"{cell_label(by_index.get(i), sub, i, plan.order)} "
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


def log_fault(logs: Path, row: Row, n: int) -> None:
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


__all__ = ["grade_one", "MAX_ATTEMPTS", "log_fault"]
