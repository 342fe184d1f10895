"""``python -m tfbook.course grade``: the batch. Every submission of the class in its own sandbox,
``--jobs`` at a time (default: the number of cores), judged outside it; then the feedback pages,
``grades.csv``, ``rows.json`` and the exercise table, which one student's failure never stops.

For each submission (student, assignment) the grader

1. reads the notebook (the original is only ever read; :mod:`tfbook.course.collect`) and lays
   out the job (:mod:`tfbook.course.job`): the student's code cells in order, each test cell
   replaced by the master's visible test;
2. runs :mod:`tfbook.course.driver` on it in a sandbox (:mod:`tfbook.course.sandbox`),
   supervising every cell's time from outside (:mod:`tfbook.course.attempt`): a cell that
   does not stop when it is interrupted, or that crashes the process, is skipped on a fresh
   run (:mod:`tfbook.course.submission`), so it costs only the points of what it breaks. Time
   is measured so that a loaded machine does not use it up (:mod:`tfbook.course.budget`): a
   cell's limit (``--timeout``) and a notebook's (``--total-timeout``) are CPU seconds, with a
   backstop of ``WALL_FACTOR`` times as many wall-clock seconds *less the time spent waiting
   for a CPU* for code that sleeps or blocks;
3. sends the sandbox the inputs of the hidden cases only after its visible phase ended,
   receives the student's outputs as plain data, and has the judge
   (:mod:`tfbook.course.judge`, driven by :mod:`tfbook.course.judging`) run the master's tests
   on them in another process that never runs student code; the row
   (:mod:`tfbook.course.rows`) gets the score, status and reason.

``--shard k/N`` grades one part of a class (:mod:`tfbook.course.shards`).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat

from tfbook.course import judge as judge_mod
from tfbook.course import release as release_mod
from tfbook.course import report
from tfbook.course import sandbox
from tfbook.course.collect import find_work
from tfbook.course.judging import JudgeProxy
from tfbook.course.rows import NO_ASSIGNMENT, Row
from tfbook.course.shards import PLAN_FORMAT, SHARD_FILE, parse_shard, plan_of, read_plan, select_shard
from tfbook.course.submission import grade_one, log_fault

ROOT = Path(__file__).resolve().parents[2]
UNSANDBOXED = "WARNING: graded WITHOUT a sandbox"


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
                            log_fault(logs, row, n)
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


__all__ = ["grade", "write_outputs", "UNSANDBOXED"]
