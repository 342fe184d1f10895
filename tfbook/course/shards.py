"""A class graded in parts: the shard plan fixed once (``python -m tfbook.course plan``: every
row's key with its shard, and a digest), the part a ``grade --shard k/N`` run grades, and
``merge``, which joins the parts' output folders and refuses parts of other plans, missing rows
and duplicated ones."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from tfbook.course import release as release_mod
from tfbook.course import report
from tfbook.course.collect import find_work
from tfbook.course.rows import Row


def parse_shard(shard: str | None) -> tuple[int, int]:
    """``"k/N"`` (1 <= k <= N) as (k, N); None as (1, 1)."""
    if shard is None:
        return 1, 1
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(shard))
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard must be k/N with 1 <= k <= N, got {shard!r}")
    return int(m.group(1)), int(m.group(2))


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


__all__ = ["parse_shard", "make_plan", "read_plan", "plan_of", "plan_digest", "select_shard", "merge", "MergeError", "SHARD_FILE", "PLAN_FORMAT"]
