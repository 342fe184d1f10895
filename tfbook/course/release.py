"""``python -m tfbook.course release``: student notebooks from the chapter notebooks, and
what the rest of the grader needs to know about notebooks (secret regions, leaks, scores).

``release`` turns each chapter notebook (the nbgrader "source" notebook; the
assignment name is the notebook stem) into a student notebook without solutions,
hidden tests or test markers, with nbgrader's ``generate_assignment``, in
``_build/release/<stem>/<stem>.ipynb``, and verifies that nothing secret leaked.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
CONFIG = ROOT / "course" / "nbgrader_config.py"
SOLUTION_BEGIN, SOLUTION_END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"
HIDDEN_PLACEHOLDER = "# (hidden tests: not shown)"
CSV_FIELDS = ["student", "assignment", "score", "max_score", "status", "reason", "student_id"]
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

_TEST_MARKER = re.compile(r"^\s*#\s*NBVAL_[A-Z_]+\s*$")


def strip_test_markers(nb):
    """Remove the test suite's ``# NBVAL_...`` comment lines and the Colab install snippet
    (it names the repository, which holds the solutions) from every code cell, and the "Open in
    Colab" link cell (it opens the repository's notebook, solutions included) (in place)."""
    from tfbook._colab import strip_badge, strip_snippet

    strip_badge(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = strip_snippet(cell.source)
        if cell.cell_type == "code" and "NBVAL_" in cell.source:
            cell.source = "\n".join(l for l in cell.source.splitlines() if not _TEST_MARKER.match(l))
    return nb



HOWTO_ID, INSTALL_ID = "tfbook-how-to-check", "tfbook-colab-install"  # fixed ids: releases are reproducible
_SNIPPET_PIP = re.compile(r'%pip install[^"]*"tfbook(\[[^\]]*\])?\s*@\s*(git\+\S+?)"')


COURSE_MODULES = ("nbformat", "IPython", "nbclient", "nbconvert", "nbgrader")


def require_course_extra(what: str) -> None:
    """Raise ImportError naming the [course] extra if ``what`` (release, grade, merge) lacks it
    (a student's ``check`` needs only the [check] extra)."""
    import importlib.util

    missing = []
    for m in COURSE_MODULES:
        try:
            if importlib.util.find_spec(m) is None:
                missing.append(m)
        except (ImportError, ValueError):
            missing.append(m)
    if missing:
        raise ImportError(f"{what} needs the [course] extra (instructors), which is not installed "
                          f"(missing: {', '.join(missing)}); install it with "
                          f"pip install \"tfbook[course]\" (or, in a clone, make venv)")


def default_install(master) -> str | None:
    """The pip requirement a student installs on Colab: the package with the extras the chapter
    and ``check`` need (``book`` and ``check``: not nbgrader, which only instructors use), from where the chapter's own Colab cell installs it (the package is
    built from its sources; the notebooks, and so the solutions, are not in it). None if the
    chapter has no Colab cell."""
    for cell in master.cells[:3]:
        m = _SNIPPET_PIP.search(cell.source) if cell.cell_type == "code" else None
        if m:
            return f"tfbook[book,check] @ {m.group(2)}"
    return None


def add_student_cells(nb, stem: str, install: str | None):
    """Put, after the title, a note on how to check the exercises and (when ``install`` is
    given) a Colab cell that installs the package (in place)."""
    name = f"{stem}.ipynb"
    text = (
        "**Graded exercises: how to check your work.** Write each answer in the cell marked "
        "`# YOUR CODE HERE` (delete the `raise NotImplementedError()` line) and run the test cell "
        "below it: it prints a `✔` or a `✘` line naming the likely mistake. For all the exercises "
        "at once, with points and a total, run in a terminal, in this notebook's folder:\n\n"
        f"```\npython -m tfbook.course check {name}\n```\n\n"
        "(in a notebook cell: `!python -m tfbook.course check " + name + "`; on Colab, save the "
        "notebook to Drive first and give its path under `/content/drive/`). The check runs only "
        "the visible tests: the grader also runs hidden tests, so the total it prints is the most "
        "you can score. Do not rename or delete the test cells; they are restored when graded.")
    cells = [nbformat.v4.new_markdown_cell(text)]
    cells[0]["id"] = HOWTO_ID
    if install:
        code = ("# On Colab only: install the tfbook package (does nothing elsewhere)\n"
                "import sys\n"
                'if "google.colab" in sys.modules:\n'
                f'    %pip install --quiet "{install}"\n')
        cells.append(nbformat.v4.new_code_cell(code))
        cells[1]["id"] = INSTALL_ID
    at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
    nb.cells[at:at] = cells
    return nb


def release(notebooks: list[Path] | None = None, out: Path = ROOT / "_build" / "release",
            verbose: bool = True, install: str | None = None) -> dict[str, Path]:
    """Build student notebooks; return {assignment: path}. Raises if anything secret leaked.

    ``install``: the pip requirement the notebooks' Colab cell installs (default: the package
    from where each chapter's own Colab cell gets it, with the ``book`` and ``check`` extras;
    an instructor whose repository must stay private gives a wheel's URL here)."""
    require_course_extra("release")
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
            student = strip_test_markers(nbformat.read(str(released), as_version=4))
            add_student_cells(student, path.stem, install or default_install(master))
            leaks = find_leaks(master, notebook_text(student))
            if leaks:
                raise RuntimeError(f"{path.name}: the student notebook leaks {leaks[:5]}")
            dest = Path(out) / path.stem / f"{path.stem}.ipynb"
            dest.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(student, str(dest))
            written[path.stem] = dest
            if verbose:
                print(f"released {dest} ({time.perf_counter() - start:.1f} s; no solutions, "
                      "no hidden tests)")
        _APIS.pop(course, None)
    return written
