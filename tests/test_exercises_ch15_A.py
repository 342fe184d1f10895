"""The implement-it exercises of chapters 15 to 18 and A teach through their visible tests.

For every implement-it exercise, each likely mistake that its visible test names is written
here as a deliberately wrong answer, and the test cell's *visible* part (what a student
receives: :func:`tfbook.course_judge.released_test_source`) must fail on it with that
mistake's words, printed as a ``✘`` line; the master's own solution must pass the whole
cell, hidden part included. Also: every exercise binds its own answer names, so no test
cell can grade a value left over from another exercise.

The test cells run in a namespace holding only the chapter's imports, plus the few helper
functions of the chapter that a test cell names (``elu1`` in chapter 17, for instance),
copied from the chapter's own cells (no other cell of the chapter runs)."""

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
CHAPTERS = ("15_vision_transformer", "16_cost", "17_efficient_attention", "18_parallel_training", "A_history")


def _code(source: str) -> str:
    return textwrap.dedent(source).strip() + "\n"


# {chapter: {test grade_id: {mistake: (wrong answer, words its visible failure must contain)}}}
MISTAKES: dict[str, dict[str, dict[str, tuple[str, str]]]] = {}

MISTAKES["15_vision_transformer"] = {
    "ex15-1-embed-patches-tests": {
        "kernel flattened channels last": (_code("""
            def embed_patches(images, kernel, bias):
                D, C, p, _ = kernel.shape
                return tnp.patchify(images, p) @ kernel.transpose(0, 2, 3, 1).reshape(D, -1).T + bias
        """), "the kernel was flattened in the order (p, p, C)"),
        "reshape for the transpose": (_code("""
            def embed_patches(images, kernel, bias):
                D, C, p, _ = kernel.shape
                return tnp.patchify(images, p) @ kernel.reshape(C * p * p, D) + bias
        """), "is not the transpose"),
        "bias forgotten": (_code("""
            def embed_patches(images, kernel, bias):
                D, C, p, _ = kernel.shape
                return tnp.patchify(images, p) @ kernel.reshape(D, -1).T
        """), "the bias is missing"),
    },
    "ex15-2-rollout-tests": {
        "layers in the wrong order": (_code("""
            def my_rollout(attentions, residual=True):
                R = None
                for P in attentions:
                    A = P.mean(axis=-3)
                    if residual:
                        A = (A + np.eye(A.shape[-1])) / 2
                    R = A if R is None else R @ A
                return R
        """), "the layers are multiplied in the wrong order"),
        "rows not renormalised": (_code("""
            def my_rollout(attentions, residual=True):
                R = None
                for P in attentions:
                    A = P.mean(axis=-3)
                    if residual:
                        A = A + np.eye(A.shape[-1])
                    R = A if R is None else A @ R
                return R
        """), "the rows were not renormalised"),
        "heads summed": (_code("""
            def my_rollout(attentions, residual=True):
                R = None
                for P in attentions:
                    A = P.sum(axis=-3)
                    if residual:
                        A = A + np.eye(A.shape[-1])
                        A = A / A.sum(axis=-1, keepdims=True)
                    R = A if R is None else A @ R
                return R
        """), "the heads were summed"),
        "residual flag ignored": (_code("""
            def my_rollout(attentions, residual=True):
                R = None
                for P in attentions:
                    A = (P.mean(axis=-3) + np.eye(P.shape[-1])) / 2
                    R = A if R is None else A @ R
                return R
        """), "residual=False was ignored"),
        "head axis hard-coded as axis 1": (_code("""
            def my_rollout(attentions, residual=True):
                R = None
                for P in attentions:
                    A = P.mean(axis=1)
                    if residual:
                        A = (A + np.eye(A.shape[-1])) / 2
                    R = A if R is None else A @ R
                return R
        """), "the heads sit on axis -3 (not axis 1)"),
        "np.dot for the product": (_code("""
            def my_rollout(attentions, residual=True):
                R = None
                for P in attentions:
                    A = P.mean(axis=-3)
                    if residual:
                        A = (A + np.eye(A.shape[-1])) / 2
                    R = A if R is None else np.dot(A, R)
                return R
        """), "np.dot does not"),
    },
}


MISTAKES["16_cost"] = {
    "ex16-1-cross-attention-flops-tests": {
        "every projection over T_q rows": (_code("""
            def cross_attention_flops(T_q, T_k, D, H):
                return 8 * T_q * D * D + 4 * T_q * T_k * D
        """), "the key and value projections were charged for T_q rows"),
        "the core of one head": (_code("""
            def cross_attention_flops(T_q, T_k, D, H):
                return 4 * T_q * D * D + 4 * T_k * D * D + 4 * T_q * T_k * (D // H)
        """), "counted for one head of width D / H"),
        "a multiply-add as one FLOP": (_code("""
            def cross_attention_flops(T_q, T_k, D, H):
                return 2 * T_q * D * D + 2 * T_k * D * D + 2 * T_q * T_k * D
        """), "a multiply-add is 2 FLOPs"),
        "a float": (_code("""
            def cross_attention_flops(T_q, T_k, D, H):
                return 4.0 * T_q * D * D + 4 * T_k * D * D + 4 * T_q * T_k * D
        """), "return an int"),
    },
    "ex16-2-crossover-softmax-tests": {
        "ops_per_score ignored": (_code("""
            def crossover_with_softmax(D, D_ff, H, ops_per_score):
                return float(max(D_ff - 2 * D, 0))
        """), "ops_per_score was ignored"),
        "softmax without the heads": (_code("""
            def crossover_with_softmax(D, D_ff, H, ops_per_score):
                return float(max((4 * D * D_ff - 8 * D * D) / (4 * D + ops_per_score), 0.0))
        """), "so it costs c H T^2"),
        "softmax on the MLP's side": (_code("""
            def crossover_with_softmax(D, D_ff, H, ops_per_score):
                return float(max((4 * D * D_ff - 8 * D * D) / (4 * D - ops_per_score * H), 0.0))
        """), "the softmax was put on the MLP's side"),
        "a negative length": (_code("""
            def crossover_with_softmax(D, D_ff, H, ops_per_score):
                return (4 * D * D_ff - 8 * D * D) / (4 * D + ops_per_score * H)
        """), "a negative root is not a length"),
        "an int zero": (_code("""
            def crossover_with_softmax(D, D_ff, H, ops_per_score):
                T = (4 * D * D_ff - 8 * D * D) / (4 * D + ops_per_score * H)
                return T if T > 0 else 0
        """), "the answer is 0.0 (a float)"),
    },
}


_BLOCKS = """
def attention_by_blocks(Q, K, V, block_size):
    T_q, D_K = Q.shape
    q = Q / SCALE
    m = np.full((T_q, 1), -np.inf)
    l = np.zeros((T_q, 1))
    acc = np.zeros((T_q, V.shape[1]))
    for j0 in range(0, STOP, block_size):
        S = q @ K[j0:j0 + block_size].T
        m_new = np.maximum(m, S.max(axis=1, keepdims=True))
        alpha = ALPHA
        E = np.exp(S - SHIFT)
        l = alpha * l + E.sum(axis=1, keepdims=True)
        acc = alpha * acc + E @ V[j0:j0 + block_size]
        m = m_new
    return acc / l
"""


def _blocks(**change):
    src = _BLOCKS
    for k, v in {"SCALE": "math.sqrt(D_K)", "STOP": "K.shape[0]", "ALPHA": "np.exp(m - m_new)",
                 "SHIFT": "m_new", **change}.items():
        src = src.replace(k, v)
    return _code(src)


MISTAKES["17_efficient_attention"] = {
    "ex17-1-attention-by-blocks-tests": {
        "scores not scaled": (_blocks(SCALE="1.0"), "the scores were not divided by sqrt(D_K)"),
        "ragged last block dropped": (_blocks(STOP="K.shape[0] - block_size + 1"),
                                      "the last, shorter block was dropped"),
        "old sums not re-based": (_blocks(ALPHA="1.0"), "multiply the old denominator and numerator by exp"),
        "no maximum subtracted": (_blocks(ALPHA="1.0", SHIFT="0.0"), "NaN or inf with scores in the hundreds"),
        "all scores at once": (_code("""
            def attention_by_blocks(Q, K, V, block_size):
                S = Q @ K.T / math.sqrt(Q.shape[1])
                E = np.exp(S - S.max(axis=1, keepdims=True))
                return (E / E.sum(axis=1, keepdims=True)) @ V
        """), "did you compute all scores at once?"),
    },
    "ex17-4-linear-rnn-tests": {
        "read before the update": (_code("""
            def linear_attention_rnn(Q, K, V):
                T, D_K = Q.shape
                U, n, Z = np.zeros((D_K, V.shape[1])), np.zeros(D_K), np.empty((T, V.shape[1]))
                for i in range(T):
                    k, q = elu1(K[i]), elu1(Q[i])
                    Z[i] = (q @ U) / (q @ n)
                    U += np.outer(k, V[i])
                    n += k
                return Z
        """), "was read before position i entered the state"),
        "not causal": (_code("""
            def linear_attention_rnn(Q, K, V):
                U = elu1(K).T @ V
                n = elu1(K).sum(axis=0)
                return np.stack([(elu1(q) @ U) / (elu1(q) @ n) for q in Q])
        """), "the output is not causal"),
        "no normaliser": (_code("""
            def linear_attention_rnn(Q, K, V):
                T, D_K = Q.shape
                U, Z = np.zeros((D_K, V.shape[1])), np.empty((T, V.shape[1]))
                for i in range(T):
                    U += np.outer(elu1(K[i]), V[i])
                    Z[i] = elu1(Q[i]) @ U
                return Z
        """), "the normaliser is missing"),
        "phi not applied": (_code("""
            def linear_attention_rnn(Q, K, V):
                T, D_K = Q.shape
                U, n, Z = np.zeros((D_K, V.shape[1])), np.zeros(D_K), np.empty((T, V.shape[1]))
                for i in range(T):
                    U += np.outer(K[i], V[i])
                    n += K[i]
                    Z[i] = (Q[i] @ U) / (Q[i] @ n)
                return Z
        """), "phi was not applied"),
    },
}


MISTAKES["18_parallel_training"] = {
    "ex18-1-combine-tests": {
        "equal weights": (_code("""
            def combine_shard_gradients(grads, sizes):
                return np.mean(grads, axis=0)
        """), "averaged with equal weights"),
        "weights not divided by N": (_code("""
            def combine_shard_gradients(grads, sizes):
                return sum(n * np.asarray(g) for g, n in zip(grads, sizes))
        """), "were not divided by N"),
        "summed": (_code("""
            def combine_shard_gradients(grads, sizes):
                return sum(np.asarray(g) for g in grads)
        """), "the shard gradients were summed"),
        "integer division": (_code("""
            def combine_shard_gradients(grads, sizes):
                N = sum(sizes)
                return sum(n // N * np.asarray(g) for g, n in zip(grads, sizes))
        """), "n // N is integer division"),
    },
}


MISTAKES["A_history"] = {
    "exA-1-additive-scores-tests": {
        "axes swapped": (_code("""
            def additive_scores(Q, K, W_q, W_k, v):
                return np.tanh((Q @ W_q)[None, :, :] + (K @ W_k)[:, None, :]) @ v
        """), "the axes are swapped"),
        "tanh of each term": (_code("""
            def additive_scores(Q, K, W_q, W_k, v):
                return (np.tanh(Q @ W_q) @ v)[:, None] + (np.tanh(K @ W_k) @ v)[None, :]
        """), "tanh was applied to q_i W_q and k_j W_k separately"),
        "no tanh": (_code("""
            def additive_scores(Q, K, W_q, W_k, v):
                return ((Q @ W_q)[:, None, :] + (K @ W_k)[None, :, :]) @ v
        """), "the tanh is missing"),
    },
}


@functools.lru_cache(maxsize=None)
def _master(chapter: str):
    return nbformat.read(str(ROOT / "notebooks" / f"{chapter}.ipynb"), as_version=4)


def _ordinary_trees(chapter: str):
    transform = TransformerManager().transform_cell
    for cell in _master(chapter).cells:
        if cell.cell_type == "code" and not cell.get("metadata", {}).get("nbgrader"):
            yield ast.parse(transform(cell.source))


@functools.lru_cache(maxsize=None)
def _prelude(chapter: str) -> str:
    """The chapter's imports, then its top-level functions that some test cell calls."""
    wanted = set()
    for test in _plan(chapter).tests:
        wanted |= {n.id for n in ast.walk(ast.parse(test.source)) if isinstance(n, ast.Name)}
    imports, defs = [], []
    for tree in _ordinary_trees(chapter):
        imports += [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        defs += [ast.unparse(n) for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    return "\n".join(dict.fromkeys(imports)) + "\n\n" + "\n\n".join(defs)


def _run(chapter: str, answer: str, test_source: str) -> tuple[BaseException | None, str]:
    """Run an answer, then a test cell's source, in a namespace with the chapter's prelude."""
    ns: dict = {"__name__": "__exercise__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out), np.errstate(all="ignore"):
        exec(compile(_prelude(chapter), f"<{chapter} prelude>", "exec"), ns)  # noqa: S102
        exec(compile(answer, "<answer>", "exec"), ns)  # noqa: S102
        try:
            exec(compile(test_source, "<test cell>", "exec"), ns)  # noqa: S102
        except Exception as exc:  # noqa: BLE001
            return exc, out.getvalue()
    return None, out.getvalue()


@functools.lru_cache(maxsize=None)
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


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_implement_it_exercise_names_two_mistakes(chapter):
    plan = _plan(chapter)
    implement = [t.gid for t in plan.tests if any(mode == "call" for _, mode in t.names)]
    assert implement, chapter
    for gid in implement:
        assert len(MISTAKES.get(chapter, {}).get(gid, {})) >= 2, gid


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
    for tree in _ordinary_trees(chapter):
        clash = set(course_judge._bound_names(ast.unparse(tree))) & set(seen)
        assert not clash, (chapter, clash)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_exercise_headings_carry_the_chapter_number(chapter):
    number = chapter.split("_")[0].lstrip("0")
    headings = [line for cell in _master(chapter).cells if cell.cell_type == "markdown"
                for line in cell.source.splitlines() if line.startswith("### Exercise ")]
    assert headings and all(h.startswith(f"### Exercise {number}.") for h in headings), headings
