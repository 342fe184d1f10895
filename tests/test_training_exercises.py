"""Chapter 10's graded exercises: every mistake a visible test names makes that visible test fail.

The visible part of each test cell (everything before ``### BEGIN HIDDEN TESTS``) is run
against the reference solution (it must pass) and against one deliberately wrong answer per
named mistake (it must raise). The wrong answers are written here, one function per mistake.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tfbook.numpy as tnp
from exercise_harness import (NOTEBOOKS, check_implement_it_exercises_name_two_mistakes,
                              check_solution_passes_whole_cell, exercise_tests, grade_cells, plan)
from tfbook.checks import check_close, check_finite, check_shape

CHAPTER = "10_training_from_scratch"

pytestmark = pytest.mark.skipif(not (NOTEBOOKS / f"{CHAPTER}.ipynb").exists(), reason="chapter 10 not written yet")


def _cells():
    return grade_cells(CHAPTER)


def _visible(grade_id: str) -> str:
    return plan(CHAPTER).test(grade_id).visible


def _namespace(**extra):
    return dict(np=np, torch=torch, F=F, nn=nn, tnp=tnp, check_close=check_close, check_shape=check_shape,
                check_finite=check_finite, **extra)


# each exercise has its own answer names; every hidden case is described; exercise headings say 10.k
globals().update(exercise_tests({}, [CHAPTER], checks=("names", "hidden", "headings")))


# ---------------------------------------------------------------------------------------------
# 10.1: the gradient with label smoothing
# ---------------------------------------------------------------------------------------------


def _softmax_ok(logits):
    z = logits - logits.max(-1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(-1, keepdims=True)


def _onehot(targets, counted, V):
    return np.where(counted, targets, 0)[..., None] == np.arange(V)


def _q(targets, counted, V, epsilon):
    return (1 - epsilon) * _onehot(targets, counted, V) + epsilon / V


def ls_over_v_minus_1(logits, targets, epsilon, ignore_index=-100):
    c = targets != ignore_index
    V = logits.shape[-1]
    oh = _onehot(targets, c, V)
    q = (1 - epsilon) * oh + epsilon / (V - 1) * (1 - oh)
    return (_softmax_ok(logits) - q) * c[..., None] / c.sum()


def ls_not_smoothed(logits, targets, epsilon, ignore_index=-100):
    c = targets != ignore_index
    return (_softmax_ok(logits) - _onehot(targets, c, logits.shape[-1])) * c[..., None] / c.sum()


def ls_divide_by_all(logits, targets, epsilon, ignore_index=-100):
    c = targets != ignore_index
    return (_softmax_ok(logits) - _q(targets, c, logits.shape[-1], epsilon)) * c[..., None] / targets.size


def ls_ignored_rows_not_zeroed(logits, targets, epsilon, ignore_index=-100):
    c = targets != ignore_index
    return (_softmax_ok(logits) - _q(targets, c, logits.shape[-1], epsilon)) / c.sum()


def ls_ignored_rows_eye(logits, targets, epsilon, ignore_index=-100):
    """The raw targets one-hot by np.eye(V)[t]: the visible test's ignore_index -1 picks class V - 1."""
    c = targets != ignore_index
    V = logits.shape[-1]
    q = (1 - epsilon) * np.eye(V)[targets] + epsilon / V
    return (_softmax_ok(logits) - q) / c.sum()


def ls_ignored_rows_no_class(logits, targets, epsilon, ignore_index=-100):
    """The raw targets compared with arange(V): an ignored position's one-hot row is all zeros."""
    c = targets != ignore_index
    V = logits.shape[-1]
    q = (1 - epsilon) * (targets[..., None] == np.arange(V)) + epsilon / V
    return (_softmax_ok(logits) - q) / c.sum()


def ls_no_max_shift(logits, targets, epsilon, ignore_index=-100):
    c = targets != ignore_index
    with np.errstate(all="ignore"):
        P = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return (P - _q(targets, c, logits.shape[-1], epsilon)) * c[..., None] / c.sum()


def ls_max_wrong_axis(logits, targets, epsilon, ignore_index=-100):
    c = targets != ignore_index
    with np.errstate(all="ignore"):
        z = logits - logits.max(axis=0, keepdims=True)
        P = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    return (P - _q(targets, c, logits.shape[-1], epsilon)) * c[..., None] / c.sum()


# (the wrong answer, a phrase of the assertion message that names it, which visible check fails)
CE_MISTAKES = [
    (ls_over_v_minus_1, "over the V - 1 wrong classes only", "padding"),
    (ls_not_smoothed, "leaving the target one-hot", "padding"),
    (ls_divide_by_all, "dividing by all B*T positions", "padding"),
    (ls_ignored_rows_not_zeroed, "leaving nonzero rows at ignored positions", "padding"),
    (ls_ignored_rows_eye, "leaving nonzero rows at ignored positions", "padding"),
    (ls_ignored_rows_no_class, "leaving nonzero rows at ignored positions", "padding"),
    (ls_no_max_shift, "without subtracting the maximum logit", "large"),
    (ls_max_wrong_axis, "subtracting the maximum over the wrong axis", "large"),
]


def _split_ce_visible():
    """The two visible checks of 10.1: (padding part, padding + large-logit part)."""
    src = _visible("ex10-1-smoothed-gradient-tests")
    cut = src.index("_big = ")
    return src[:cut], src


def _large_only(full):
    """The large-logit check of 10.1 alone (the random generator advanced as in the full cell)."""
    head, tail = full.split("_big = ", 1)
    setup = head.split("_grad = ")[0]  # the generator and the draws before the first call
    return setup + "_big = " + tail


def test_ex10_1_solution_passes_visible_and_hidden():
    check_solution_passes_whole_cell(CHAPTER, "ex10-1-smoothed-gradient-tests")


@pytest.mark.parametrize("wrong,phrase,which", CE_MISTAKES, ids=[m[0].__name__ for m in CE_MISTAKES])
def test_ex10_1_each_named_mistake_fails_its_visible_check(wrong, phrase, which):
    padding, full = _split_ce_visible()
    named = re.escape(phrase)  # the failure message names this very mistake
    if which == "padding":
        with pytest.raises(AssertionError, match=named) as raised:
            exec(padding, _namespace(smoothed_ce_gradient=wrong))
        others = [m[1] for m in CE_MISTAKES if m[2] == "padding" and m[1] != phrase]
        assert not any(o in str(raised.value) for o in others), str(raised.value)   # it names this one mistake only
    else:  # correct on ordinary logits, wrong only at 1e4: passes the first check, fails the second
        if wrong is not ls_max_wrong_axis:  # (the wrong axis is wrong at any scale)
            exec(padding, _namespace(smoothed_ce_gradient=wrong))
            with pytest.raises(AssertionError, match=named):
                exec(full, _namespace(smoothed_ce_gradient=wrong))
        else:
            with pytest.raises(AssertionError, match=named):
                exec(_large_only(full), _namespace(smoothed_ce_gradient=wrong))


# ---------------------------------------------------------------------------------------------
# 10.2: one AdamW step
# ---------------------------------------------------------------------------------------------


def adamw_no_bias_correction(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    p = p * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return p - lr * m / (np.sqrt(v) + eps), m, v


def adamw_l2(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    g = g + weight_decay * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return p - lr * (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps), m, v


def adamw_decay_without_lr(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    p = p * (1 - weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return p - lr * (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps), m, v


def adamw_in_place(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    p *= 1 - lr * weight_decay
    m *= beta1
    m += (1 - beta1) * g
    v *= beta2
    v += (1 - beta2) * g * g
    p -= lr * (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps)
    return p, m, v


def adamw_eps_inside_sqrt(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    p = p * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return p - lr * (m / (1 - beta1 ** t)) / np.sqrt(v / (1 - beta2 ** t) + eps), m, v


def adamw_decay_after_step(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - lr * (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps)
    return p * (1 - lr * weight_decay), m, v


def adamw_bias_correction_t_minus_1(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    p = p * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return p - lr * (m / (1 - beta1 ** (t - 1))) / (np.sqrt(v / (1 - beta2 ** (t - 1))) + eps), m, v


ADAMW_MISTAKES = [
    (adamw_no_bias_correction, "no bias correction"),
    (adamw_l2, "weight decay added to the gradient"),
    (adamw_decay_without_lr, "decay not multiplied by lr"),
    (adamw_in_place, "the inputs were modified in place"),
    (adamw_eps_inside_sqrt, "eps inside the square root"),
    (adamw_decay_after_step, "weight decay applied after the Adam step"),
    (adamw_bias_correction_t_minus_1, "bias correction with t - 1 instead of t"),
]


def test_ex10_2_solution_passes_visible_and_hidden():
    check_solution_passes_whole_cell(CHAPTER, "ex10-2-adamw-update-tests")


def test_every_implement_it_exercise_names_two_mistakes():
    check_implement_it_exercises_name_two_mistakes(CHAPTER, {"ex10-1-smoothed-gradient-tests": CE_MISTAKES,
                                                             "ex10-2-adamw-update-tests": ADAMW_MISTAKES})


@pytest.mark.parametrize("wrong,phrase", ADAMW_MISTAKES, ids=[m[0].__name__ for m in ADAMW_MISTAKES])
def test_ex10_2_each_named_mistake_fails_the_visible_test(wrong, phrase):
    src = _visible("ex10-2-adamw-update-tests")
    with pytest.raises(AssertionError, match=re.escape(phrase)):
        exec(src, _namespace(adamw_update=wrong))


# ---------------------------------------------------------------------------------------------
# 10.3: predict Adam's first step
# ---------------------------------------------------------------------------------------------


def _first_step():
    theta = nn.Parameter(torch.zeros(3, dtype=torch.float64))
    theta.grad = torch.tensor([1e-9, 1.0, 100.0], dtype=torch.float64)
    torch.optim.AdamW([theta], lr=0.01, weight_decay=0.0).step()
    return theta.detach().abs().numpy()


@pytest.mark.parametrize("prediction,phrase", [
    ((0.01 / 11, 0.01, 0.01), None),
    ((0.01, 0.01, 0.01), "Did you drop ε?"),           # eps dropped: sqrt(v_hat) = 1e-9 < eps = 1e-8
    ((1e-11, 0.01, 1.0), "as in SGD"),                 # SGD thinking: the step proportional to the gradient
    ((0.1 / 11, 0.1, 0.1), "as in SGD"),               # forgetting that m_hat is divided back by 1 - beta1
    ((0.01 / 10, 0.01, 0.01), "as in SGD"),            # eps alone in the denominator: off by 10%
])
def test_ex10_3_prediction_test(prediction, phrase):
    src = _cells()["ex10-3-prediction-tests"]
    ns = _namespace(prediction=prediction, first_step=_first_step())
    if phrase is None:
        exec(src, ns)
    else:
        with pytest.raises(AssertionError, match=re.escape(phrase)):
            exec(src.split("### BEGIN HIDDEN TESTS")[0], ns)


def test_ex10_3_true_changes_are_the_closed_form():
    """The verification cell's numbers are lr |g| / (|g| + eps): 0.01 / 11 for the tiny gradient."""
    np.testing.assert_allclose(_first_step(), [0.01 / 11, 0.01 / (1 + 1e-8), 0.01 / (1 + 1e-10)], rtol=1e-12)


def _ns_singular_values():
    """The verification cell of exercise 10.4: one position's gradient x (dy)^T, 1 and 5 quintic steps."""
    import tfbook.numpy.optim as nopt

    g = np.random.default_rng(6)
    rank_one = np.outer(g.normal(size=16), g.normal(size=24))
    return tuple(np.linalg.svd(nopt.newton_schulz(rank_one, steps=k), compute_uv=False)[0] for k in (1, 5))


@pytest.mark.parametrize("prediction_ns,phrase", [
    ((0.701, 0.696436), None),
    ((1.0, 1.0), "is 1 a fixed point"),                # taking the normalised singular value as a fixed point
    ((0.701, 0.701 ** 5), "not p(1) to the fifth power"),   # powering instead of iterating
    ((0.701, 0.701), "five times in a row"),           # assuming one step already converged
])
def test_ex10_4_prediction_test(prediction_ns, phrase):
    src = _cells()["ex10-4-prediction-tests"]
    ns = _namespace(prediction_ns=prediction_ns, ns_sv=_ns_singular_values())
    if phrase is None:
        exec(src, ns)
    else:
        with pytest.raises(AssertionError, match=re.escape(phrase)):
            exec(src.split("### BEGIN HIDDEN TESTS")[0], ns)


def test_ex10_4_true_values_are_the_scalar_map():
    """A rank-one matrix over its Frobenius norm has singular value 1, so NS gives p(1) and p^5(1)."""
    s = [1.0]
    for _ in range(5):
        s.append(3.4445 * s[-1] - 4.7750 * s[-1] ** 3 + 2.0315 * s[-1] ** 5)
    np.testing.assert_allclose(_ns_singular_values(), (s[1], s[5]), rtol=1e-12)
