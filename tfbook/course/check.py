"""``python -m tfbook.course check``: a student runs a notebook's visible tests on their own
machine (no sandbox: it is their code) and reads, for each exercise, its points from the visible
checks and the same messages the grader's feedback shows (:func:`check_notebook`)."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from tfbook.course import judge as judge_mod
from tfbook.course import sandbox
from tfbook.course.attempt import run_attempt
from tfbook.course.budget import Budget, ran_longer
from tfbook.course.job import read_submission
from tfbook.course.rows import first_cross, exercise_label

_NAME = re.compile(r"name '([A-Za-z_]\w{0,40})' is not defined")


def _check_diagnosis(rec: dict, answer: dict | None, timeout: float) -> str:
    """Why a test cell failed, in words: the checks' own ✘ line, else a fixed sentence (never a
    bare exception)."""
    cross = first_cross(rec.get("out", ""))
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
        if not ok and not first_cross(rec["out"]):
            print(f"    {_check_diagnosis(rec, ans, timeout)}", file=stream)
    note = f"; {unanswered} not answered yet" if unanswered else ""
    print(f"Total: {score:g}/{total:g} points from the visible checks{note}", file=stream)
    return failed


__all__ = ["check_notebook"]
