"""The shared harness of the exercise tests (tests/test_exercises_*.py, tests/test_modern_exercises.py,
tests/test_training_exercises.py); not collected itself (its name does not start with ``test_``).

Every implement-it exercise teaches through its visible tests: each likely mistake that a
visible test names is written in a test file as a deliberately wrong answer, and the test
cell's *visible* part (what a student receives: :func:`tfbook.course.judge.released_test_source`)
must fail on it with an ``AssertionError`` carrying that mistake's words, printed on the first
``✘`` line; the master's own solution must pass the whole cell, hidden part included; every
implement-it exercise names at least two mistakes; every exercise binds its own answer names,
and no ordinary cell of the chapter binds one; every hidden case of a test cell is described in
the chapter's hints (course/specs); every exercise heading carries the chapter's number.

A test file holds only its chapters' data, a table ``{chapter: {test grade_id: mistakes}}``
where ``mistakes`` is ``{mistake: (wrong answer source, words)}`` or a list of
``(mistake, wrong answer source, words)``, and gets the generic tests with one line::

    globals().update(exercise_tests(MISTAKES))

Two ways to run a test cell:

* ``"imports"`` (the default): in a namespace holding only the chapter's imports and the
  chapter's top-level functions that some test cell names (``elu1`` in chapter 17), copied
  from its ordinary cells; no other cell runs, so this is quick;
* ``"judge"``: in the namespace that the master notebook had just before that test cell, kept
  by the grader's judge (:class:`tfbook.course.judge.Judge`, which runs each master notebook
  once, in this process), for test cells that use the chapter's state.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import os
import re
import textwrap
from pathlib import Path

import nbformat
import numpy as np
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from tfbook.course import judge as course_judge

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def code(source: str) -> str:
    """A wrong answer's source, written indented in a test file, as a cell would hold it."""
    return textwrap.dedent(source).strip() + "\n"


def variant(template: str, defaults: dict[str, str], **change: str) -> str:
    """A wrong answer: ``template`` with each upper-case placeholder of ``defaults`` replaced by
    its value there, or in ``change`` (where the mistake is)."""
    src = template
    for key, value in {**defaults, **change}.items():
        src = src.replace(key, value)
    return code(src)


@functools.lru_cache(maxsize=None)
def master(chapter: str):
    return nbformat.read(str(NOTEBOOKS / f"{chapter}.ipynb"), as_version=4)


@functools.lru_cache(maxsize=None)
def plan(chapter: str) -> course_judge.Plan:
    return course_judge.plan(master(chapter), chapter)


def grade_cells(chapter: str) -> dict[str, str]:
    """The source of every graded cell of the chapter, by grade id."""
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in master(chapter).cells
            if c.cell_type == "code" and "grade_id" in c.get("metadata", {}).get("nbgrader", {})}


def ordinary_trees(chapter: str):
    """The syntax tree of every ordinary (not graded) code cell of the chapter, magics transformed."""
    transform = TransformerManager().transform_cell
    for cell in master(chapter).cells:
        if cell.cell_type == "code" and not cell.get("metadata", {}).get("nbgrader"):
            yield ast.parse(transform(cell.source))


@functools.lru_cache(maxsize=None)
def prelude(chapter: str) -> str:
    """The chapter's imports, then its top-level functions that some test cell names."""
    wanted = set()
    for test in plan(chapter).tests:
        wanted |= {n.id for n in ast.walk(ast.parse(test.source)) if isinstance(n, ast.Name)}
    imports, defs = [], []
    for tree in ordinary_trees(chapter):
        imports += [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        defs += [ast.unparse(n) for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    return "\n".join(dict.fromkeys(imports)) + "\n\n" + "\n\n".join(defs)


_JUDGES: dict[str, course_judge.Judge] = {}


def judge(chapter: str) -> course_judge.Judge:
    """The master notebook run once by the grader's judge (snapshots before each test cell)."""
    if chapter not in _JUDGES:
        from IPython.core.interactiveshell import InteractiveShell

        InteractiveShell.instance().reset(new_session=False)   # no names left from another notebook
        import torch

        torch.set_grad_enabled(True)   # process-wide state that a notebook before may have switched off
        torch.set_default_dtype(torch.float32)
        j = course_judge.Judge(NOTEBOOKS / f"{chapter}.ipynb")
        cwd = os.getcwd()
        os.chdir(NOTEBOOKS)   # the notebooks run from their folder
        try:
            j.prepare()
        finally:
            os.chdir(cwd)
        assert j.broken == {}, j.broken
        _JUDGES[chapter] = j
    return _JUDGES[chapter]


def run(chapter: str, answer: str, test_source: str, *, via: str = "imports",
        gid: str | None = None) -> tuple[BaseException | None, str]:
    """Run an answer, then a test cell's source; (the exception raised or None, what was printed).

    ``via="imports"``: in a namespace with the chapter's :func:`prelude`; ``via="judge"``: in the
    namespace the master notebook had before test cell ``gid``."""
    if via == "judge":
        import torch

        j = judge(chapter)
        torch.set_grad_enabled(True)   # whatever the notebook prepared last left behind (8.2 needs autograd)
        ns = dict(j.snapshots[gid])
    else:
        ns = {"__name__": "__exercise__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), np.errstate(all="ignore"):
        if via != "judge":
            exec(compile(prelude(chapter), f"<{chapter} prelude>", "exec"), ns)  # noqa: S102
        exec(compile(answer, "<answer>", "exec"), ns)  # noqa: S102
        try:
            exec(compile(test_source, "<test cell>", "exec"), ns)  # noqa: S102
        except Exception as exc:  # noqa: BLE001
            return exc, out.getvalue()
    return None, out.getvalue()


# --------------------------------------------------------------------------------------------
# The generic checks, one function each
# --------------------------------------------------------------------------------------------


def check_mistake_fails_visible_test(chapter: str, gid: str, mistake: str, wrong: str, words: str,
                                     *, via: str = "imports") -> None:
    """The visible part of test cell ``gid`` fails on ``wrong`` with ``words``, on its first ✘ line."""
    exc, printed = run(chapter, wrong, plan(chapter).test(gid).visible, via=via, gid=gid)
    assert isinstance(exc, AssertionError), f"{mistake}: the visible test raised {exc!r}\n{printed}"
    assert words in str(exc), (mistake, str(exc))
    first = next((line for line in printed.splitlines() if line.startswith("✘")), "")
    assert words in first, f"{mistake}: expected a first ✘ line naming {words!r}, got:\n{printed}"


def check_solution_passes_whole_cell(chapter: str, gid: str, *, via: str = "imports") -> None:
    """The master's solution passes test cell ``gid``, hidden part included, printing no ✘."""
    test = plan(chapter).test(gid)
    exc, printed = run(chapter, plan(chapter).answers[test.answer], test.source, via=via, gid=gid)
    assert exc is None, (exc, printed)
    assert "✘" not in printed, printed


def implement_it_tests(chapter: str) -> list[str]:
    """The grade ids of the test cells that call an answer (the implement-it exercises)."""
    return [t.gid for t in plan(chapter).tests if any(mode == "call" for _, mode in t.names)]


def check_implement_it_exercises_name_two_mistakes(chapter: str, mistakes: dict) -> None:
    """Every implement-it exercise of the chapter has >= 2 named mistakes in ``mistakes[gid]``."""
    implement = implement_it_tests(chapter)
    assert implement, chapter
    for gid in implement:
        assert len(mistakes.get(gid, {})) >= 2, gid


def check_own_answer_names(chapter: str) -> None:
    """Each exercise binds its own answer names, its tests use only those, and no ordinary cell
    of the chapter binds one (a stale value could be graded)."""
    p = plan(chapter)
    bound = {gid: set(course_judge._bound_names(src)) for gid, src in p.answers.items()}
    seen: dict[str, str] = {}
    for gid, names in bound.items():
        for n in names:
            assert n not in seen, f"{n} is bound by both {seen[n]} and {gid}"
            seen[n] = gid
    for test in p.tests:
        used = {n for n, _ in test.names}
        assert used and used <= bound[test.answer], (test.gid, used, bound[test.answer])
    for tree in ordinary_trees(chapter):
        clash = set(course_judge._bound_names(ast.unparse(tree))) & set(seen)
        assert not clash, (chapter, clash)


def check_hidden_cases_described(chapter: str) -> None:
    """Every test cell has hidden cases (``hidden case A``...), each described in the chapter's
    hints (course/specs); a case numbered at run time (``hidden case A{i}``) by every hint that
    starts with its letters."""
    hints = course_judge.load_hints(chapter)
    for test in plan(chapter).tests:
        described = set(hints.get(test.gid, {}))
        cases = re.findall(r"hidden case ([A-Za-z0-9]+)(\{?)", test.source)   # ids as course_judge._case reads them
        assert cases, (test.gid, "no hidden case")
        for case, runtime in cases:
            ok = (any(d.startswith(case) and d != case for d in described) if runtime else case in described)
            assert ok, (test.gid, case + ("{...}" if runtime else ""), sorted(described))


def check_exercise_headings(chapter: str) -> None:
    """Every ``### Exercise`` heading of the chapter carries the chapter's number."""
    prefix = chapter.split("_")[0]
    number = str(int(prefix)) if prefix.isdigit() else prefix
    headings = [line for cell in master(chapter).cells if cell.cell_type == "markdown"
                for line in cell.source.splitlines() if line.startswith("### Exercise ")]
    assert headings and all(h.startswith(f"### Exercise {number}.") for h in headings), headings


# --------------------------------------------------------------------------------------------
# The factory: the generic tests of a test file, parametrized over its table
# --------------------------------------------------------------------------------------------


def _normalise(mistakes: dict) -> dict[str, dict[str, dict[str, tuple[str, str]]]]:
    """``{chapter: {gid: {mistake: (source, words)}}}``, from either form of the table."""
    out: dict = {}
    for chapter, per in mistakes.items():
        out[chapter] = {}
        for gid, ms in per.items():
            pairs = ms.items() if isinstance(ms, dict) else ((m, (src, words)) for m, src, words in ms)
            out[chapter][gid] = {m: (code(src), words) for m, (src, words) in pairs}
    return out


def exercise_tests(mistakes: dict, chapters=None, *, via: str = "imports",
                   checks=("names", "two-mistakes", "hidden", "headings")) -> dict:
    """The generic tests for the chapters of ``mistakes`` (and of ``chapters``, if given), as a
    dict ``{test name: test function}`` for a test file's ``globals()``.

    Always: each named mistake fails the visible test; the solution passes the whole test cell.
    ``checks`` adds, per chapter: ``"names"`` (each exercise has its own answer names),
    ``"two-mistakes"`` (every implement-it exercise names >= 2 mistakes), ``"hidden"`` (every
    hidden case is described), ``"headings"`` (exercise headings carry the chapter number)."""
    table = _normalise(mistakes)
    chapters = tuple(chapters or table)
    cases = [(c, gid, m) for c, per in table.items() for gid, ms in per.items() for m in ms]
    tests = {}

    @pytest.mark.parametrize("chapter,gid,mistake", cases, ids=[f"{g}:{m}" for _, g, m in cases])
    def test_each_named_mistake_fails_the_visible_test(chapter, gid, mistake):
        wrong, words = table[chapter][gid][mistake]
        check_mistake_fails_visible_test(chapter, gid, mistake, wrong, words, via=via)

    @pytest.mark.parametrize("chapter,gid", sorted({(c, g) for c, g, _ in cases}))
    def test_the_solution_passes_the_whole_test_cell(chapter, gid):
        check_solution_passes_whole_cell(chapter, gid, via=via)

    if cases:   # (a file whose wrong answers are functions, not sources, writes these two itself)
        tests[test_each_named_mistake_fails_the_visible_test.__name__] = test_each_named_mistake_fails_the_visible_test
        tests[test_the_solution_passes_the_whole_test_cell.__name__] = test_the_solution_passes_the_whole_test_cell

    per_chapter = {
        "names": ("test_each_exercise_has_its_own_answer_names", check_own_answer_names),
        "two-mistakes": ("test_every_implement_it_exercise_names_two_mistakes",
                         lambda chapter: check_implement_it_exercises_name_two_mistakes(
                             chapter, table.get(chapter, {}))),
        "hidden": ("test_every_hidden_case_is_described", check_hidden_cases_described),
        "headings": ("test_exercise_headings_carry_the_chapter_number", check_exercise_headings),
    }
    for key in checks:
        name, check = per_chapter[key]

        def test(chapter, _check=check):
            _check(chapter)

        test.__name__ = test.__qualname__ = name
        tests[name] = pytest.mark.parametrize("chapter", chapters)(test)
    return tests
