"""Instructor commands for the graded exercises (nbgrader 0.9, offline).

    python -m tfbook.course release [--out DIR] [NOTEBOOK ...]
    python -m tfbook.course grade SUBMISSIONS_DIR [--out DIR] [--timeout SECONDS]

``release`` turns each chapter notebook (the nbgrader "source" notebook; the
assignment name is the notebook stem) into a student notebook without solutions and
without hidden tests, in ``_build/release/<stem>/<stem>.ipynb``, and verifies that
nothing secret leaked.

``grade`` reads submissions laid out as ``SUBMISSIONS_DIR/<student>/<assignment>/
<assignment>.ipynb``, copies them into a temporary nbgrader course directory (the
originals are never written to), autogrades each student separately with a per-cell
timeout and an overall time limit, and writes ``_build/grades/grades.csv`` (one row
per student and assignment: student, assignment, score, max_score, status, reason)
and ``_build/grades/feedback/<student>/<assignment>/<assignment>.html``. A broken
submission (empty, corrupt, cells deleted, code that raises, loops or does not parse)
becomes a row with a status and a reason; it never stops the batch.

Statuses: ``graded`` (autograded; the reason lists the test cells that lost points),
``timeout`` (a cell ran past ``--timeout`` and was interrupted, the rest was graded;
or the whole run passed ``--total-timeout`` and scored 0), ``unreadable`` (not a
notebook: empty file, corrupt JSON), ``missing`` (no notebook in the folder),
``error`` (nbgrader refused the notebook, e.g. graded cells deleted) and
``unknown-assignment`` (no chapter notebook of that name).
"""

from __future__ import annotations

import argparse
import csv
import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
CONFIG = ROOT / "course" / "nbgrader_config.py"
SOLUTION_BEGIN, SOLUTION_END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"
HIDDEN_PLACEHOLDER = "# (hidden tests: not shown)"
CSV_FIELDS = ["student", "assignment", "score", "max_score", "status", "reason"]
_CHAPTER = re.compile(r"^(\d\d|[A-Z])_[a-z0-9_]+$")
_MIN_SECRET = 8  # shorter lines ("))", "else:") are too common to count as leaks


# --------------------------------------------------------------------------- notebook inspection


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _regions(source: str, begin: str, end: str) -> list[str]:
    """Lines strictly between ``begin`` and ``end`` marker lines."""
    out, inside = [], False
    for line in source.splitlines():
        if begin in line:
            inside = True
        elif end in line:
            inside = False
        elif inside:
            out.append(line)
    return out


def secret_lines(master) -> dict[str, list[str]]:
    """The solution lines and hidden-test lines of a master notebook (stripped)."""
    sol, hid = [], []
    for cell in master.cells:
        sol += _regions(cell.source, SOLUTION_BEGIN, SOLUTION_END)
        hid += _regions(cell.source, HIDDEN_BEGIN, HIDDEN_END)
    clean = lambda lines: [s for s in (l.strip() for l in lines) if len(s) >= _MIN_SECRET]  # noqa: E731
    return {"solution": clean(sol), "hidden": clean(hid)}


def _public_text(master) -> str:
    """The master notebook's sources with the secret regions removed."""
    parts = []
    for cell in master.cells:
        keep, inside = [], False
        for line in cell.source.splitlines():
            if SOLUTION_BEGIN in line or HIDDEN_BEGIN in line:
                inside = True
            elif SOLUTION_END in line or HIDDEN_END in line:
                inside = False
            elif not inside:
                keep.append(line)
        parts.append("\n".join(keep))
    return "\n".join(parts)


def find_leaks(master, text: str, kinds: tuple[str, ...] = ("solution", "hidden")) -> list[str]:
    """Secret lines of ``master`` that occur in ``text`` more often than in its public part.

    ``text`` is anything shown to a student: a released notebook's sources and outputs
    (``kinds`` both), or the text of a feedback page (``kinds=("hidden",)``: a feedback
    page shows the student's own answers, which may well equal the solution).
    """
    public = _public_text(master)
    leaks = []
    for kind, lines in secret_lines(master).items():
        if kind not in kinds:
            continue
        for line in dict.fromkeys(lines):
            if text.count(line) > public.count(line):
                leaks.append(f"{kind}: {line}")
    markers = {"solution": (SOLUTION_BEGIN, SOLUTION_END), "hidden": (HIDDEN_BEGIN, HIDDEN_END)}
    leaks += [f"marker: {m}" for k in kinds for m in markers[k] if m in text]
    return leaks


def notebook_text(nb) -> str:
    """Every source and every text output of a notebook, joined."""
    parts = []
    for cell in nb.cells:
        parts.append(cell.source)
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            parts.append(str(out.get("evalue", "")))
            parts.extend(out.get("traceback", []))
            for value in out.get("data", {}).values():
                if isinstance(value, str):
                    parts.append(value)
    return "\n".join(parts)


def html_text(page: str) -> str:
    """The visible text of an HTML page, roughly (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def max_score(master) -> float:
    return float(sum(_nbgrader(c).get("points", 0) for c in master.cells if _nbgrader(c).get("grade")))


def chapter_notebooks(directory: Path = NOTEBOOKS) -> list[Path]:
    """Chapter notebooks with at least one graded cell, in order."""
    found = []
    for path in sorted(directory.glob("*.ipynb")):
        if _CHAPTER.match(path.stem):
            nb = nbformat.read(str(path), as_version=4)
            if any(_nbgrader(c).get("grade") for c in nb.cells):
                found.append(path)
    return found


# --------------------------------------------------------------------------- feedback preprocessor


def _hide(source: str) -> tuple[str, list[str]]:
    keep, hidden, inside = [], [], False
    for line in source.splitlines():
        if HIDDEN_BEGIN in line:
            inside = True
            keep.append(line[: len(line) - len(line.lstrip())] + HIDDEN_PLACEHOLDER)
        elif HIDDEN_END in line:
            inside = False
        elif inside:
            hidden.append(line)
        else:
            keep.append(line)
    return "\n".join(keep), hidden


def _scrub(text: str, secrets: list[str]) -> str:
    for s in secrets:
        text = text.replace(s, "(hidden)")
    return text


def hide_hidden_tests(nb):
    """Remove hidden tests from an autograded notebook, in place (for feedback pages).

    Hidden-test regions are replaced by a one-line placeholder; in cells that had
    them, an error's traceback is cut to its last line (``ename: evalue``), because a
    traceback quotes the failing source line; any hidden-test text left in any output
    is replaced by ``(hidden)``.
    """
    secrets: list[str] = []
    touched = []
    for cell in nb.cells:
        if cell.cell_type != "code" or HIDDEN_BEGIN not in cell.source:
            continue
        cell.source, hidden = _hide(cell.source)
        secrets += [s for s in (h.strip() for h in hidden) if len(s) >= _MIN_SECRET]
        touched.append(cell)
    for cell in touched:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                out["traceback"] = [f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"]
    secrets.sort(key=len, reverse=True)  # replace longer lines first
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = _scrub("".join(out["text"]), secrets)
            if "evalue" in out:
                out["evalue"] = _scrub(str(out["evalue"]), secrets)
            if "traceback" in out:
                out["traceback"] = [_scrub(t, secrets) for t in out["traceback"]]
            for key, value in list(out.get("data", {}).items()):
                if isinstance(value, str) and not key.startswith("image/"):
                    out["data"][key] = _scrub(value, secrets)
    return nb


try:  # the preprocessor class is only needed inside nbgrader (see course/nbgrader_config.py)
    from nbgrader.preprocessors import NbGraderPreprocessor as _Base
except ImportError:  # pragma: no cover
    _Base = object


class HideHiddenTests(_Base):
    """nbgrader preprocessor: :func:`hide_hidden_tests` before a feedback page is rendered."""

    def preprocess(self, nb, resources):
        return hide_hidden_tests(nb), resources


# --------------------------------------------------------------------------- running nbgrader


def _venv_bin_on_path() -> None:
    """nbgrader starts ``alembic`` (its database migrations) from PATH; put this Python's
    bin folder first so ``.venv/bin/python -m tfbook.course`` works without an activated venv."""
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def _run_nbgrader(args: list[str], course: Path, timeout: float, log: Path | None = None):
    """Run ``nbgrader ARGS`` in ``course``; return (returncode or None on timeout, output)."""
    _venv_bin_on_path()
    cmd = [sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={course}"]
    proc = subprocess.Popen(cmd, cwd=course, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # own group: kill the kernel too
    try:
        output, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        code = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {' '.join(cmd)}\n{output}")
    return code, output


def _new_course(tmp: Path) -> Path:
    course = tmp / "course"
    (course / "source").mkdir(parents=True)
    shutil.copyfile(CONFIG, course / "nbgrader_config.py")
    return course


def _api(course: Path):
    """An in-process nbgrader API on ``course`` with the course's config (cached per course)."""
    api = _APIS.get(course)
    if api is None:
        _venv_bin_on_path()
        from nbgrader.apps import NbGraderAPI
        from nbgrader.coursedir import CourseDirectory
        from traitlets.config.loader import PyFileConfigLoader

        config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
        config.CourseDirectory.root = str(course)
        api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
        _APIS[course] = api
    return api


_APIS: dict[Path, object] = {}


def _generate(course: Path, master_path: Path) -> Path:
    """Put a master notebook in ``course`` and generate its student version (in process:
    generating does not execute anything, and it saves a Python start per chapter)."""
    stem = master_path.stem
    src = course / "source" / stem
    src.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(master_path, src / f"{stem}.ipynb")
    result = _api(course).generate_assignment(stem, force=True, create=True)
    released = course / "release" / stem / f"{stem}.ipynb"
    if not result.get("success") or not released.exists():
        raise RuntimeError(f"nbgrader generate_assignment {stem} failed:\n"
                           f"{result.get('error', '')}\n{result.get('log', '')}")
    return released


# --------------------------------------------------------------------------- release


def release(notebooks: list[Path] | None = None, out: Path = ROOT / "_build" / "release",
            verbose: bool = True) -> dict[str, Path]:
    """Build student notebooks; return {assignment: path}. Raises if anything secret leaked."""
    paths = [Path(p) for p in notebooks] if notebooks else chapter_notebooks()
    if not paths:
        raise ValueError("no chapter notebooks with graded cells found")
    written = {}
    with tempfile.TemporaryDirectory(prefix="tfbook-release-") as tmp:
        course = _new_course(Path(tmp))
        for path in paths:
            start = time.perf_counter()
            released = _generate(course, path)
            master = nbformat.read(str(path), as_version=4)
            student = nbformat.read(str(released), as_version=4)
            leaks = find_leaks(master, notebook_text(student))
            if leaks:
                raise RuntimeError(f"{path.name}: the student notebook leaks {leaks[:5]}")
            dest = Path(out) / path.stem / f"{path.stem}.ipynb"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(released, dest)
            written[path.stem] = dest
            if verbose:
                print(f"released {dest} ({time.perf_counter() - start:.1f} s; no solutions, "
                      "no hidden tests)")
        _APIS.pop(course, None)
    return written


# --------------------------------------------------------------------------- grade


@dataclass
class Row:
    student: str
    assignment: str
    score: float = 0.0
    max_score: float = 0.0
    status: str = "graded"
    reason: str = ""
    notebook: Path | None = field(default=None, repr=False)


def _find_submission(folder: Path, assignment: str) -> tuple[Path | None, str]:
    exact = folder / f"{assignment}.ipynb"
    if exact.is_file():
        return exact, ""
    others = sorted(p for p in folder.glob("*.ipynb") if p.is_file())
    if len(others) == 1:
        return others[0], f"notebook named {others[0].name}, graded as {assignment}.ipynb"
    return None, f"no {assignment}.ipynb in {folder.name}/"


def _readable(path: Path) -> str:
    """'' if ``path`` is a notebook nbgrader can read, else why not."""
    data = path.read_bytes()
    if not data.strip():
        return "empty file"
    try:
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
    except UnicodeDecodeError:
        return "not UTF-8 text"
    except Exception as exc:  # json.JSONDecodeError, nbformat validation, ...
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"not a notebook ({type(exc).__name__}: {first[:120]})"
    if not isinstance(nb.get("cells"), list):
        return "not a notebook (no cells)"
    return ""


def _cell_report(autograded: Path, master) -> tuple[list[str], list[str], bool]:
    """From an autograded notebook: (test cells that failed, answer cells that raised,
    whether a cell timed out), each failure as ``grade_id: ErrorName``."""
    nb = nbformat.read(str(autograded), as_version=4)
    lost, broken, timed_out = [], [], False
    for cell in nb.cells:
        meta = _nbgrader(cell)
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if any(o.get("ename") == "CellTimeoutError" for o in errors):
            timed_out = True
        if errors and (meta.get("grade") or meta.get("solution")):
            (lost if meta.get("grade") else broken).append(
                f"{meta.get('grade_id')}: {errors[-1].get('ename')}")
    return lost, broken, timed_out


def _deleted_cells(submitted: Path, master) -> list[str]:
    """grade_ids of the master's nbgrader cells that the submission no longer has."""
    nb = nbformat.read(str(submitted), as_version=4)
    have = {_nbgrader(c).get("grade_id") for c in nb.cells}
    return [_nbgrader(c)["grade_id"] for c in master.cells
            if _nbgrader(c).get("grade_id") and _nbgrader(c)["grade_id"] not in have]


def _gradebook_score(course: Path, assignment: str, student: str) -> float:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        return float(gb.find_submission(assignment, student).score)


def grade(submissions: Path, out: Path = ROOT / "_build" / "grades", timeout: int = 60,
          total_timeout: float = 900.0, notebooks_dir: Path = NOTEBOOKS,
          verbose: bool = True) -> list[Row]:
    """Grade every ``submissions/<student>/<assignment>/<assignment>.ipynb``; return the rows."""
    submissions, out = Path(submissions), Path(out)
    if not submissions.is_dir():
        raise ValueError(f"SUBMISSIONS_DIR {submissions} is not a folder")
    students = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    feedback_root = out / "feedback"
    if feedback_root.exists():
        shutil.rmtree(feedback_root)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tfbook-grade-") as tmp:
        course = _new_course(Path(tmp))
        masters: dict[str, object] = {}
        for student_dir in students:
            for folder in sorted(p for p in student_dir.iterdir() if p.is_dir()):
                a, s = folder.name, student_dir.name
                row = Row(s, a)
                rows.append(row)
                start = time.perf_counter()
                master_path = Path(notebooks_dir) / f"{a}.ipynb"
                if not master_path.is_file():
                    row.status, row.reason = "unknown-assignment", f"no notebooks/{a}.ipynb"
                    continue
                if a not in masters:
                    _generate(course, master_path)
                    masters[a] = nbformat.read(str(master_path), as_version=4)
                master = masters[a]
                row.max_score = max_score(master)
                path, note = _find_submission(folder, a)
                if path is None:
                    row.status, row.reason = "missing", note
                    continue
                problem = _readable(path)
                if problem:
                    row.status, row.reason = "unreadable", problem
                    continue
                dest = course / "submitted" / s / a / f"{a}.ipynb"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest)  # our copy: the original is never opened for writing
                _autograde(course, row, master, timeout, total_timeout, out / "logs", note)
                if verbose:
                    print(f"{s:>16} {a}: {row.score:g}/{row.max_score:g} {row.status}"
                          f"{' (' + row.reason + ')' if row.reason else ''} "
                          f"[{time.perf_counter() - start:.1f} s]")
        for a, master in masters.items():
            start = time.perf_counter()
            _feedback(course, a, [r for r in rows if r.assignment == a and r.notebook is not None],
                      master, feedback_root, out / "logs")
            if verbose:
                print(f"feedback pages for {a} [{time.perf_counter() - start:.1f} s]")
        _APIS.pop(course, None)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "grades.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_FIELDS)
        for r in rows:
            writer.writerow([r.student, r.assignment, f"{r.score:g}", f"{r.max_score:g}", r.status,
                             r.reason])
    return rows


def _autograde(course: Path, row: Row, master, timeout: int, total_timeout: float, logs: Path,
               note: str) -> None:
    a, s = row.assignment, row.student
    code, output = _run_nbgrader(
        ["autograde", a, f"--student={s}", "--force", f"--Execute.timeout={int(timeout)}"],
        course, timeout=total_timeout, log=logs / f"{s}__{a}.autograde.log")
    autograded = course / "autograded" / s / a / f"{a}.ipynb"
    if code is None:
        row.status = "timeout"
        row.reason = f"autograde ran past the overall limit of {total_timeout:g} s"
        return
    if code != 0 or not autograded.exists():
        row.status = "error"
        lines = [ln for ln in output.splitlines() if "[AutogradeApp | ERROR]" in ln or "Error" in ln]
        detail = lines[0].split("]", 1)[-1].strip() if lines else f"nbgrader exit code {code}"
        row.reason = f"nbgrader could not grade it ({detail[:200]}); see logs/{s}__{a}.autograde.log"
        return
    row.notebook = autograded
    row.score = _gradebook_score(course, a, s)
    lost, broken, timed_out = _cell_report(autograded, master)
    deleted = _deleted_cells(course / "submitted" / s / a / f"{a}.ipynb", master)
    parts = [note] if note else []
    if timed_out:
        row.status = "timeout"
        parts.append(f"a cell ran longer than {timeout} s and was interrupted")
    if deleted:
        parts.append("cells deleted: " + ", ".join(deleted))
    if broken:
        parts.append("answer cells raised " + ", ".join(broken))
    if lost:
        parts.append("lost points in " + ", ".join(lost))
    row.reason = "; ".join(parts)


def _feedback(course: Path, a: str, rows: list[Row], master, feedback_root: Path,
              logs: Path) -> None:
    """Feedback pages for every autograded row of assignment ``a`` (one nbgrader call)."""
    if not rows:
        return
    code, _ = _run_nbgrader(["generate_feedback", a, "--force"], course, timeout=600,
                            log=logs / f"{a}.feedback.log")
    for row in rows:
        s = row.student
        page = course / "feedback" / s / a / f"{a}.html"
        if not page.exists():  # retry alone, so one bad notebook cannot cost everyone feedback
            _run_nbgrader(["generate_feedback", a, f"--student={s}", "--force"], course,
                          timeout=300, log=logs / f"{s}__{a}.feedback.log")
        if not page.exists():
            row.reason = "; ".join(filter(None, [row.reason, "no feedback page (see logs)"]))
            continue
        leaks = find_leaks(master, html_text(page.read_text(encoding="utf-8")), kinds=("hidden",))
        if leaks:  # defence in depth: never hand out a page that shows hidden tests
            row.reason = "; ".join(filter(None, [row.reason, "feedback withheld (it showed test code)"]))
            continue
        dest = feedback_root / s / a / f"{a}.html"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(page, dest)


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfbook.course", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_rel = sub.add_parser("release", help="build student notebooks from the chapter notebooks")
    p_rel.add_argument("notebooks", nargs="*", type=Path,
                       help="chapter notebooks (default: every notebooks/*.ipynb with graded cells)")
    p_rel.add_argument("--out", type=Path, default=ROOT / "_build" / "release")
    p_gr = sub.add_parser("grade", help="autograde a folder of submissions")
    p_gr.add_argument("submissions", type=Path,
                      help="folder laid out as <student>/<assignment>/<assignment>.ipynb")
    p_gr.add_argument("--out", type=Path, default=ROOT / "_build" / "grades")
    p_gr.add_argument("--timeout", type=int, default=60, help="per-cell timeout in seconds (default 60)")
    p_gr.add_argument("--total-timeout", type=float, default=900.0,
                      help="limit for one student's whole notebook in seconds (default 900)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.command == "release":
        written = release(args.notebooks or None, out=args.out)
        print(f"released {len(written)} notebook(s) to {args.out} in {time.perf_counter() - start:.1f} s")
    else:
        rows = grade(args.submissions, out=args.out, timeout=args.timeout,
                     total_timeout=args.total_timeout)
        print(f"graded {len(rows)} submission(s) in {time.perf_counter() - start:.1f} s: "
              f"{args.out / 'grades.csv'}, feedback in {args.out / 'feedback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
