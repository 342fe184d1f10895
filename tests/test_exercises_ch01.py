"""The implement-it exercises of chapter 1 teach through their visible tests.

The same contract as tests/test_exercises_ch02_05.py (whose helpers this file reuses): for
every implement-it exercise, each likely mistake that its visible test names is written here
as a deliberately wrong answer, and the test cell's *visible* part (what a student receives:
:func:`tfbook.course_judge.released_test_source`) must fail on it with that mistake's words,
printed on a ``✘`` line; the master's solution must pass the whole cell, hidden part
included; every implement-it exercise names at least two mistakes; every exercise binds its
own answer names, and no ordinary cell of the chapter binds one.

The test cells run in a namespace holding only the chapter's imports, so this file is quick;
the prediction exercises, whose verification cells use the chapter's state, run with the
chapter under nbval.
"""

from __future__ import annotations

import re

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from test_exercises_ch02_05 import _code, _master, _plan, _run
from tfbook import course_judge

CHAPTER = "01_tokens_and_embeddings"


def _patches(keep: str, order: str = "0, 2, 3, 1, 4, 5") -> str:
    """A sliding-window answer to exercise 1.1 with the window selection and the axis order given."""
    return _code(f"""
        def overlapping_patches(images, p, stride):
            B, C, H, W = images.shape
            x = np.lib.stride_tricks.sliding_window_view(images, (p, p), axis=(2, 3)){keep}
            n_rows, n_cols = x.shape[2], x.shape[3]
            return x.transpose({order}).reshape(B, n_rows * n_cols, C * p * p)
    """)


# {test grade_id: {mistake: (wrong answer, words its visible failure must contain)}}
MISTAKES: dict[str, dict[str, tuple[str, str]]] = {
    "ex1-1-overlapping-patches-tests": {
        "stride ignored (a patch every p pixels)": (_patches("[:, :, ::p, ::p]"), "the stride was ignored"),
        "every window kept (stride 1)": (_patches(""), "a patch starts at every pixel"),
        "starts stop before H - p": (_code("""
            def overlapping_patches(images, p, stride):
                B, C, H, W = images.shape
                rows = [np.stack([images[:, :, i:i + p, j:j + p].reshape(B, -1)
                                  for j in range(0, W - p, stride)], axis=1)
                        for i in range(0, H - p, stride)]
                return np.concatenate(rows, axis=1)
        """), "the last patch of a column is missing"),
        "flattened channels last, (p, p, C)": (_patches("[:, :, ::stride, ::stride]", "0, 2, 3, 4, 5, 1"),
                                               "flattened in (p, p, C) order"),
        "numbered column by column": (_patches("[:, :, ::stride, ::stride]", "0, 3, 2, 1, 4, 5"),
                                      "numbered column by column"),
        "channel axis not moved before the reshape": (_patches("[:, :, ::stride, ::stride]", "0, 1, 2, 3, 4, 5"),
                                                      "with the channel axis still in front"),
    },
    "ex1-2-receptive-field-tests": {
        "strides ignored": (_code("""
            def receptive_field(kernel_sizes, strides=None):
                return 1 + sum(s - 1 for s in kernel_sizes)
        """), "the strides were ignored"),
        "layer l's own stride counted": (_code("""
            def receptive_field(kernel_sizes, strides=None):
                strides = [1] * len(kernel_sizes) if strides is None else strides
                r, jump = 1, 1
                for s, stride in zip(kernel_sizes, strides):
                    jump *= stride
                    r += (s - 1) * jump
                return r
        """), "layer l's own stride was counted"),
        "strides=None not handled": (_code("""
            def receptive_field(kernel_sizes, strides=None):
                r, jump = 1, 1
                for s, stride in zip(kernel_sizes, strides):
                    r += (s - 1) * jump
                    jump *= stride
                return r
        """), "strides=None must mean stride 1 in every layer"),
        "a NumPy integer returned": (_code("""
            def receptive_field(kernel_sizes, strides=None):
                s = np.asarray(kernel_sizes)
                strides = np.ones_like(s) if strides is None else np.asarray(strides)
                jumps = np.concatenate([[1], np.cumprod(strides)[:-1]]).astype(int)
                return 1 + np.sum((s - 1) * jumps)
        """), "not an int"),
    },
}

CASES = [(gid, m) for gid, ms in MISTAKES.items() for m in ms]


@pytest.mark.parametrize("gid,mistake", CASES, ids=[f"{g}:{m}" for g, m in CASES])
def test_each_named_mistake_fails_the_visible_test(gid, mistake):
    wrong, words = MISTAKES[gid][mistake]
    test = _plan(CHAPTER).test(gid)
    exc, printed = _run(CHAPTER, wrong, test.visible)
    assert isinstance(exc, AssertionError), (mistake, exc, printed)
    assert words in str(exc), (mistake, str(exc))
    assert any(line.startswith("✘") and words in line for line in printed.splitlines()), printed


@pytest.mark.parametrize("gid", sorted(MISTAKES))
def test_the_solution_passes_the_whole_test_cell(gid):
    plan = _plan(CHAPTER)
    test = plan.test(gid)
    exc, printed = _run(CHAPTER, plan.answers[test.answer], test.source)
    assert exc is None, (exc, printed)
    assert "✘" not in printed


def test_every_implement_it_exercise_names_two_mistakes():
    plan = _plan(CHAPTER)
    implement = [t.gid for t in plan.tests if any(mode == "call" for _, mode in t.names)]
    assert sorted(implement) == sorted(MISTAKES), implement
    for gid in implement:
        assert len(MISTAKES[gid]) >= 2, gid


def test_each_exercise_has_its_own_answer_names():
    plan = _plan(CHAPTER)
    bound = {gid: set(course_judge._bound_names(src)) for gid, src in plan.answers.items()}
    seen: dict[str, str] = {}
    for gid, names in bound.items():
        for n in names:
            assert n not in seen, f"{n} is bound by both {seen[n]} and {gid}"
            seen[n] = gid
    for test in plan.tests:
        used = {n for n, _ in test.names}
        assert used and used <= bound[test.answer], (test.gid, used, bound[test.answer])
    for cell in _master(CHAPTER).cells:
        if cell.cell_type == "code" and not cell.get("metadata", {}).get("nbgrader"):
            clash = set(course_judge._bound_names(TransformerManager().transform_cell(cell.source))) & set(seen)
            assert not clash, clash


def test_every_hidden_case_is_described():
    plan = _plan(CHAPTER)
    hints = course_judge.load_hints(CHAPTER)
    for test in plan.tests:
        letters = set(re.findall(r"hidden case ([A-Z])", test.source))
        assert letters and letters <= set(hints.get(test.gid, {})), (test.gid, letters, hints.get(test.gid))
