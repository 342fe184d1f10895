"""The implement-it exercises of chapters 2 to 5 teach through their visible tests.

For every implement-it exercise, each likely mistake that its visible test names is written
here as a deliberately wrong answer, and the test cell's *visible* part (what a student
receives: :func:`tfbook.course_judge.released_test_source`) must fail on it with that
mistake's words, printed as a ``✘`` line; the master's own solution must pass the whole
cell, hidden part included. Also: every exercise binds its own answer names, so no test
cell can grade a value left over from another exercise.

The test cells run in a namespace holding only the chapter's imports (no other cell of
the chapter runs), so this file is quick; the grader itself is exercised by
tests/test_exercises_pipeline.py and tests/test_grader_chapters.py.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import textwrap
from pathlib import Path

import nbformat
import numpy as np
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from tfbook import course_judge

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ("02_attention_as_averaging", "03_why_scale", "04_self_attention", "05_multi_head_attention")


def _code(source: str) -> str:
    return textwrap.dedent(source).strip() + "\n"


# {chapter: {test grade_id: {mistake: (wrong answer, words its visible failure must contain)}}}
MISTAKES: dict[str, dict[str, dict[str, tuple[str, str]]]] = {
    "02_attention_as_averaging": {
        "ex2-1-masked-weights-tests": {
            "mask applied after the softmax": (_code("""
                def masked_weights(S, mask):
                    return tnp.softmax(S) * mask
            """), "the mask was applied after the softmax"),
            "no max subtracted": (_code("""
                def masked_weights(S, mask):
                    E = np.exp(S) * mask
                    return E / E.sum(axis=-1, keepdims=True)
            """), "exp(1000) overflows"),
            "-inf minus -inf on a fully blocked row": (_code("""
                def masked_weights(S, mask):
                    S = np.where(mask, S, -np.inf)
                    E = np.exp(S - S.max(axis=-1, keepdims=True))
                    return E / E.sum(axis=-1, keepdims=True)
            """), "a fully blocked row gives NaN"),
            "a large finite number instead of -inf": (_code("""
                def masked_weights(S, mask):
                    return tnp.softmax(np.where(mask, S, -1e9))
            """), "a fully blocked row comes out uniform"),
        },
        "ex2-3-additive-tests": {
            "tanh of each term": (_code("""
                def additive_scores(Q, K, W_q, W_k, a):
                    return (np.tanh(Q @ W_q) @ a)[..., :, None] + (np.tanh(K @ W_k) @ a)[..., None, :]
            """), "tanh was applied to q W_q and k W_k separately"),
            "no tanh": (_code("""
                def additive_scores(Q, K, W_q, W_k, a):
                    return ((Q @ W_q)[..., :, None, :] + (K @ W_k)[..., None, :, :]) @ a
            """), "the tanh is missing"),
            "axes swapped": (_code("""
                def additive_scores(Q, K, W_q, W_k, a):
                    return np.tanh((Q @ W_q)[..., None, :, :] + (K @ W_k)[..., :, None, :]) @ a
            """), "the broadcast axes are swapped"),
            "axes fixed for 2-D inputs": (_code("""
                def additive_scores(Q, K, W_q, W_k, a):
                    return np.tanh((Q @ W_q)[:, None, :] + (K @ W_k)[None, :, :]) @ a
            """), "let batch axes through"),
        },
    },
    "03_why_scale": {
        "ex3-1-jacobian-tests": {
            "diagonal only": (_code("""
                def softmax_jacobian(P):
                    return P[..., :, None] * np.eye(P.shape[-1])
            """), "the off-diagonal entries are 0"),
            "elementwise derivative p (1 - p)": (_code("""
                def softmax_jacobian(P):
                    return (P * (1 - P))[..., :, None] * np.eye(P.shape[-1])
            """), "the off-diagonal entries are 0"),
            "sign flipped": (_code("""
                def softmax_jacobian(P):
                    return P[..., :, None] * P[..., None, :] - P[..., :, None] * np.eye(P.shape[-1])
            """), "the sign is flipped"),
            "np.diag and np.outer on a batch": (_code("""
                def softmax_jacobian(P):
                    return np.diag(P) - np.outer(P, P)
            """), "np.diag and np.outer take one vector"),
        },
        "ex3-3-entropy-gradient-tests": {
            "dH/dp instead of dH/ds": (_code("""
                def entropy_gradient(S):
                    return -(np.log(tnp.softmax(S)) + 1)
            """), "this is dH/dp"),
            "diagonal of the Jacobian only": (_code("""
                def entropy_gradient(S):
                    p = tnp.softmax(S)
                    return -p * (np.log(p) + 1)
            """), "only the diagonal of the Jacobian was used"),
            "sign flipped": (_code("""
                def entropy_gradient(S):
                    p = tnp.softmax(S)
                    H = -np.sum(p * np.log(p), axis=-1, keepdims=True)
                    return p * (np.log(p) + H)
            """), "the sign is flipped"),
            "log of an underflowed weight": (_code("""
                def entropy_gradient(S):
                    p = tnp.softmax(S)
                    H = -np.sum(p * np.log(p), axis=-1, keepdims=True)
                    return -p * (np.log(p) + H)
            """), "NaN or inf for a saturated row"),
        },
    },
    "04_self_attention": {
        "ex4-1-self-attention-tests": {
            "scores not scaled": (_code("""
                def self_attention(X, W_Q, W_K, W_V, mask=None):
                    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
                    S = Q @ np.swapaxes(K, -1, -2)
                    if mask is not None:
                        S = np.where(mask, S, -np.inf)
                    E = np.exp(S - S.max(axis=-1, keepdims=True))
                    P = E / E.sum(axis=-1, keepdims=True)
                    return P @ V, P
            """), "without the 1/sqrt(D_K) factor"),
            "weights transposed": (_code("""
                def self_attention(X, W_Q, W_K, W_V, mask=None):
                    Q, K, V = X @ W_Q.T, X @ W_K.T, X @ W_V.T
                    S = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
                    if mask is not None:
                        S = np.where(mask, S, -np.inf)
                    E = np.exp(S - S.max(axis=-1, keepdims=True))
                    P = E / E.sum(axis=-1, keepdims=True)
                    return P @ V, P
            """), "the weights are transposed"),
            "mask after the softmax": (_code("""
                def self_attention(X, W_Q, W_K, W_V, mask=None):
                    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
                    S = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
                    E = np.exp(S - S.max(axis=-1, keepdims=True))
                    P = E / E.sum(axis=-1, keepdims=True)
                    if mask is not None:
                        P = P * mask
                    return P @ V, P
            """), "the mask was applied after the softmax"),
            "float64 scale promotes float32": (_code("""
                def self_attention(X, W_Q, W_K, W_V, mask=None):
                    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
                    S = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
                    if mask is not None:
                        S = np.where(mask, S, -np.inf)
                    E = np.exp(S - S.max(axis=-1, keepdims=True))
                    P = E / E.sum(axis=-1, keepdims=True)
                    return P @ V, P
            """), "promotes the result"),
        },
        "ex4-3-book-weights-tests": {
            "no transpose": (_code("""
                def book_weights(lin_q, lin_k, lin_v):
                    return tuple(lin.weight.detach().clone() for lin in (lin_q, lin_k, lin_v))
            """), "W_Q has nn.Linear's layout"),
            "reshape for transpose": (_code("""
                def book_weights(lin_q, lin_k, lin_v):
                    return tuple(lin.weight.detach().reshape(lin.in_features, lin.out_features)
                                 for lin in (lin_q, lin_k, lin_v))
            """), "a reshape keeps the memory order"),
            "W_Q and W_K swapped": (_code("""
                def book_weights(lin_q, lin_k, lin_v):
                    return tuple(lin.weight.detach().T for lin in (lin_k, lin_q, lin_v))
            """), "W_Q and W_K are swapped"),
        },
    },
    "05_multi_head_attention": {
        "ex5-1-multi-head-loop-tests": {
            "heads stacked first": (_code("""
                def multi_head_loop(X, params, num_heads):
                    D_h = X.shape[-1] // num_heads
                    b = lambda name: 0.0 if params.get(name) is None else params[name]
                    Zs, Ps = [], []
                    for h in range(num_heads):
                        c = slice(h * D_h, (h + 1) * D_h)
                        Q, K, V = (X @ params[f"W_{k}"][:, c] + (0.0 if params.get(f"b_{k}") is None
                                   else params[f"b_{k}"][c]) for k in "QKV")
                        Z_h, P_h = tnp.scaled_dot_product_attention(Q, K, V)
                        Zs.append(Z_h)
                        Ps.append(P_h)
                    return np.concatenate(Zs, axis=-1) @ params["W_O"] + b("b_O"), np.stack(Ps)
            """), "P has the heads first"),
            "scaled by sqrt(D)": (_code("""
                def multi_head_loop(X, params, num_heads):
                    D_h = X.shape[-1] // num_heads
                    b = lambda name: 0.0 if params.get(name) is None else params[name]
                    Zs, Ps = [], []
                    for h in range(num_heads):
                        c = slice(h * D_h, (h + 1) * D_h)
                        Q, K, V = (X @ params[f"W_{k}"][:, c] + (0.0 if params.get(f"b_{k}") is None
                                   else params[f"b_{k}"][c]) for k in "QKV")
                        Z_h, P_h = tnp.scaled_dot_product_attention(Q, K, V, scale=1 / math.sqrt(X.shape[-1]))
                        Zs.append(Z_h)
                        Ps.append(P_h)
                    return np.concatenate(Zs, axis=-1) @ params["W_O"] + b("b_O"), np.stack(Ps, axis=-3)
            """), "the scores were divided by sqrt(D)"),
            "b_O forgotten": (_code("""
                def multi_head_loop(X, params, num_heads):
                    D_h = X.shape[-1] // num_heads
                    Zs, Ps = [], []
                    for h in range(num_heads):
                        c = slice(h * D_h, (h + 1) * D_h)
                        Q, K, V = (X @ params[f"W_{k}"][:, c] + (0.0 if params.get(f"b_{k}") is None
                                   else params[f"b_{k}"][c]) for k in "QKV")
                        Z_h, P_h = tnp.scaled_dot_product_attention(Q, K, V)
                        Zs.append(Z_h)
                        Ps.append(P_h)
                    return np.concatenate(Zs, axis=-1) @ params["W_O"], np.stack(Ps, axis=-3)
            """), "b_O is missing"),
            "biases required": (_code("""
                def multi_head_loop(X, params, num_heads):
                    D_h = X.shape[-1] // num_heads
                    Zs, Ps = [], []
                    for h in range(num_heads):
                        c = slice(h * D_h, (h + 1) * D_h)
                        Q, K, V = (X @ params[f"W_{k}"][:, c] + params[f"b_{k}"][c] for k in "QKV")
                        Z_h, P_h = tnp.scaled_dot_product_attention(Q, K, V)
                        Zs.append(Z_h)
                        Ps.append(P_h)
                    return np.concatenate(Zs, axis=-1) @ params["W_O"] + params["b_O"], np.stack(Ps, axis=-3)
            """), "read a bias with params.get(name)"),
        },
    },
}


@functools.lru_cache(maxsize=None)
def _master(chapter: str):
    return nbformat.read(str(ROOT / "notebooks" / f"{chapter}.ipynb"), as_version=4)


@functools.lru_cache(maxsize=None)
def _imports(chapter: str) -> str:
    """Every top-level import of the chapter's ordinary code cells, in order."""
    lines, transform = [], TransformerManager().transform_cell
    for cell in _master(chapter).cells:
        if cell.cell_type != "code" or cell.get("metadata", {}).get("nbgrader"):
            continue
        tree = ast.parse(transform(cell.source))
        lines += [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return "\n".join(dict.fromkeys(lines))


def _run(chapter: str, answer: str, test_source: str) -> tuple[BaseException | None, str]:
    """Run an answer, then a test cell's source, in a namespace with the chapter's imports."""
    ns: dict = {"__name__": "__exercise__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out), np.errstate(all="ignore"):
        exec(compile(_imports(chapter), f"<{chapter} imports>", "exec"), ns)  # noqa: S102
        exec(compile(answer, "<answer>", "exec"), ns)  # noqa: S102
        try:
            exec(compile(test_source, "<test cell>", "exec"), ns)  # noqa: S102
        except Exception as exc:  # noqa: BLE001
            return exc, out.getvalue()
    return None, out.getvalue()


def _plan(chapter: str) -> course_judge.Plan:
    return course_judge.plan(_master(chapter), chapter)


CASES = [(c, gid, m) for c, per in MISTAKES.items() for gid, ms in per.items() for m in ms]


@pytest.mark.parametrize("chapter,gid,mistake", CASES, ids=[f"{g}:{m}" for _, g, m in CASES])
def test_each_named_mistake_fails_the_visible_test(chapter, gid, mistake):
    wrong, words = MISTAKES[chapter][gid][mistake]
    test = _plan(chapter).test(gid)
    exc, printed = _run(chapter, wrong, test.visible)
    assert isinstance(exc, AssertionError), (mistake, exc, printed)
    assert words in str(exc), (mistake, str(exc))
    assert any(line.startswith("✘") and words in line for line in printed.splitlines()), printed


@pytest.mark.parametrize("chapter,gid", sorted({(c, g) for c, g, _ in CASES}))
def test_the_solution_passes_the_whole_test_cell(chapter, gid):
    plan = _plan(chapter)
    test = plan.test(gid)
    exc, printed = _run(chapter, plan.answers[test.answer], test.source)
    assert exc is None, (exc, printed)
    assert "✘" not in printed


@pytest.mark.parametrize("chapter", [c for c in MISTAKES])
def test_every_implement_it_exercise_names_two_mistakes(chapter):
    plan = _plan(chapter)
    implement = [t.gid for t in plan.tests if any(mode == "call" for _, mode in t.names)]
    assert implement, chapter
    for gid in implement:
        assert len(MISTAKES[chapter].get(gid, {})) >= 2, gid


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_exercise_has_its_own_answer_names(chapter):
    plan = _plan(chapter)
    bound = {gid: set(course_judge._bound_names(src)) for gid, src in plan.answers.items()}
    seen: dict[str, str] = {}
    for gid, names in bound.items():
        for n in names:
            assert n not in seen, f"{n} is bound by both {seen[n]} and {gid}"
            seen[n] = gid
    for test in plan.tests:
        used = {n for n, _ in test.names}
        assert used and used <= bound[test.answer], (test.gid, used, bound[test.answer])
    # and no ordinary cell binds an answer's name (a stale value could be graded)
    for cell in _master(chapter).cells:
        if cell.cell_type == "code" and not cell.get("metadata", {}).get("nbgrader"):
            clash = set(course_judge._bound_names(TransformerManager().transform_cell(cell.source))) & set(seen)
            assert not clash, (chapter, clash)
