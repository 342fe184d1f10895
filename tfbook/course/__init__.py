"""Instructor and student commands for the graded exercises (offline).

    python -m tfbook.course release [--out DIR] [NOTEBOOK ...]
    python -m tfbook.course grade SUBMISSIONS_DIR [--out DIR] [--timeout S] [--jobs N] [--shard K/N]
    python -m tfbook.course plan SUBMISSIONS_DIR --shards N --out PLAN.json
    python -m tfbook.course merge PART_DIR ... [--out DIR]
    python -m tfbook.course check NOTEBOOK

``release`` turns each chapter notebook (the nbgrader "source" notebook; the
assignment name is the notebook stem) into a student notebook without solutions,
hidden tests or test markers, with nbgrader's ``generate_assignment``, in
``_build/release/<stem>/<stem>.ipynb``, and verifies that nothing secret leaked.

``grade`` reads submissions laid out as ``SUBMISSIONS_DIR/<student>/<assignment>/
<assignment>.ipynb`` (only ever reading them) and grades each in its own sandbox,
judging the results outside it (:mod:`tfbook.course.grade`, :mod:`tfbook.course.sandbox`,
:mod:`tfbook.course.judge`). It writes ``grades.csv`` (student, assignment, score,
max_score, status, reason), ``exercises.csv``/``exercises.png`` and
``feedback/<student>/<assignment>/<assignment>.html`` into ``_build/grades``. A broken
submission becomes a row with a status and a reason; it never stops the batch.

Statuses: ``graded``; ``timeout`` (a cell was interrupted, or skipped because it did
not stop; the rest was graded); ``crashed`` (a cell crashed the process; the notebook
was graded again without it); ``unreadable`` (not a notebook: empty file, corrupt
JSON); ``missing`` (no notebook in the folder); ``error`` (the grader could not judge
it; the reason says why); ``refused`` (a symbolic link, or a folder or notebook graded
already: never followed); ``skipped`` (a folder whose name starts with a dot);
``unknown-assignment`` (no chapter notebook of that name).

``plan`` fixes the class (every row's key, with its shard) and its digest once, so that every
``grade --shard k/N --plan PLAN.json`` grades its part of the same class (a submission that
arrives later is listed as not in the plan, never lost between shards). ``merge`` joins the
output folders of the shard runs into one: it refuses parts of different plans (each part
records its plan's digest and its k/N), and exits non-zero, naming them, when a row of the plan
is missing or given twice.

In ``grades.csv`` the ``student`` column shows the folder's name (bytes that are not UTF-8 as
``\\xNN``) and ``student_id`` keeps its exact bytes, percent-encoded (RFC 3986), so any folder
name is graded and reported; exercises are named as the book names them ("Exercise 0.1").

``check`` runs a notebook's visible tests on the student's machine and prints the same
messages the grader's feedback shows.

The package (the grader is a product of its own, beside the book's components, which never
import it; its modules import each other in one direction only):

- :mod:`tfbook.course.wire`: the plain-data format between a sandbox and the grader;
- :mod:`tfbook.course.sandbox`: bubblewrap and the limits a submission runs under;
- :mod:`tfbook.course.driver`: runs one submission inside its sandbox (wire);
- :mod:`tfbook.course.judge`: the master's tests replayed on a student's results (wire);
- :mod:`tfbook.course.release`: student notebooks, secret regions, leak checks;
- :mod:`tfbook.course.report`: feedback pages, the per-exercise table, the console (release);
- :mod:`tfbook.course.policies`: an instructor's rules (``course/policies.py``), e.g. forbidden
  reference functions;
- grading, one job per module: :mod:`tfbook.course.rows` (a submission's row and the words of
  its reason), :mod:`tfbook.course.job` (the cells a sandbox runs), :mod:`tfbook.course.budget`
  (time limits and their backstop), :mod:`tfbook.course.attempt` (one supervised sandbox run:
  the answers captured; sandbox, wire, report), :mod:`tfbook.course.judging` (the judge
  processes; judge), :mod:`tfbook.course.submission` (one submission graded: runs, judging, its
  row; policies), :mod:`tfbook.course.collect` (what is under SUBMISSIONS_DIR),
  :mod:`tfbook.course.shards` (shard plans and ``merge``), :mod:`tfbook.course.check` (a
  student's ``check``), :mod:`tfbook.course.grade` (the batch: every submission, then the
  outputs);
- :mod:`tfbook.course.demo`: a generated class that attacks the grader (release);
- ``python -m tfbook.course`` (``__main__``): the command line (release, grade, shards, check, sandbox).
"""

__all__ = ["wire", "sandbox", "driver", "judge", "release", "report", "policies", "rows", "job", "budget",
           "attempt", "judging", "submission", "collect", "shards", "check", "grade", "demo"]

# A student's `check` needs the `check` extra (pyproject.toml), an instructor's release, grade
# and merge the `course` extra (nbgrader and the rest); without them, say so instead of a bare
# ModuleNotFoundError from deep inside a submodule. find_spec only looks; nothing is imported.
import importlib.util as _util


def _missing(modules) -> list[str]:
    out = []
    for m in modules:
        try:
            if _util.find_spec(m) is None:
                out.append(m)
        except (ImportError, ValueError):
            out.append(m)
    return out


CHECK_MODULES = ("nbformat", "IPython")  # release.require_course_extra checks the instructor's

if _missing(CHECK_MODULES):
    raise ImportError(f"tfbook.course needs the [course] extra (instructors) or the [check] extra "
                      f"(students: python -m tfbook.course check), neither is installed "
                      f"(missing: {', '.join(_missing(CHECK_MODULES))}); install it with "
                      f"pip install \"tfbook[course]\", or pip install \"tfbook[book,check]\" to check "
                      f"exercises only (in a clone: make venv)")
