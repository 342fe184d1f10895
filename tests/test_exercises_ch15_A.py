"""The implement-it exercises of chapters 15 to 18 and A teach through their visible tests.

The contract and the generic tests are those of tests/exercise_harness.py: each likely mistake
that a visible test names is written here as a deliberately wrong answer and must fail the
test cell's *visible* part with that mistake's words, on a ``✘`` line; the master's solution
must pass the whole cell, hidden part included; every implement-it exercise names at least two
mistakes; every exercise binds its own answer names; exercise headings carry the chapter's
number.

The test cells run in a namespace holding only the chapter's imports, plus the few helper
functions of the chapter that a test cell names (``elu1`` in chapter 17, for instance),
copied from the chapter's own cells (no other cell of the chapter runs)."""

from __future__ import annotations

import pytest
from exercise_harness import check_mistake_fails_visible_test, check_solution_passes_whole_cell, code, exercise_tests, master, plan, run, variant

CHAPTERS = ("15_vision_transformer", "16_cost", "17_efficient_attention", "18_parallel_training", "A_history")


_ROLLOUT = """
def pruned_rollout(attentions, kept):
    R = None
    for l, P in enumerate(attentions):
        A = HEADS
        A = RESIDUAL
        R = A if R is None else PRODUCT
        if l < len(attentions) - 1:
            R = PRUNE
    return R
"""


def _rollout(**change):
    """Exercise 15.2's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_ROLLOUT, dict(HEADS="P.mean(axis=-3)", RESIDUAL="(A + np.eye(A.shape[-1])) / 2",
                                  PRODUCT="A @ R", PRUNE="R[..., np.asarray(kept[l]), :]"), **change)


_RESIZE = """
def resize_positions(E, new_grid):
    E = np.asarray(E, dtype=np.float64)
    g = int(round(np.sqrt(E.shape[0] - 1)))
    grid = torch.from_numpy(E[1:]).reshape(g, g, -1).permute(PERM)[None]
    out = F.interpolate(grid, size=(new_grid, new_grid), mode="bilinear", align_corners=CORNERS)
    patches = out[0].permute(1, 2, 0).reshape(new_grid * new_grid, -1).numpy()
    return KEEP
"""


def _resize(**change):
    """Exercise 15.1's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_RESIZE, dict(PERM="2, 0, 1", CORNERS="False",
                                 KEEP="np.concatenate([E[:1], patches], axis=0)"), **change)


# {chapter: {test grade_id: {mistake: (wrong answer, words its visible failure must contain)}}}
MISTAKES: dict[str, dict[str, dict[str, tuple[str, str]]]] = {}

MISTAKES["15_vision_transformer"] = {
    "ex15-1-resize-positions-tests": {
        "class token's row dropped": (_resize(KEEP="patches"), "the class token's row comes first"),
        "class token's row interpolated away": (_resize(KEEP="np.concatenate([np.zeros_like(E[:1]), patches], axis=0)"),
                                                "kept as it is"),
        "grid read column-major": (_resize(PERM="2, 1, 0"), "rows and columns swapped"),
        "corners aligned": (_resize(CORNERS="True"), "half-pixel centres"),
    },
    "ex15-2-pruned-rollout-tests": {
        "input tokens pruned too": (_rollout(PRUNE="R[..., np.asarray(kept[l]), :][..., np.asarray(kept[l])]"),
                                    "its columns are the T = 5 input tokens"),
        "kept order ignored": (_rollout(PRUNE="R[..., np.sort(kept[l]), :]"), "taken in sorted order"),
        "no residual": (_rollout(RESIDUAL="A"), "the residual is missing"),
        "heads summed": (_rollout(HEADS="P.sum(axis=-3)", RESIDUAL="(A + np.eye(A.shape[-1])) / "
                                  "(A + np.eye(A.shape[-1])).sum(axis=-1, keepdims=True)"), "the heads were summed"),
        "layers in the wrong order": (_rollout(PRODUCT="R @ A"), "pruned_rollout raised"),
    },
}


MISTAKES["16_cost"] = {
    "ex16-1-cross-attention-flops-tests": {
        "every projection over T_q rows": (code("""
            def cross_attention_flops(T_q, T_k, D, H):
                return 8 * T_q * D * D + 4 * T_q * T_k * D
        """), "the key and value projections were charged for T_q rows"),
        "the core of one head": (code("""
            def cross_attention_flops(T_q, T_k, D, H):
                return 4 * T_q * D * D + 4 * T_k * D * D + 4 * T_q * T_k * (D // H)
        """), "counted for one head of width D / H"),
        "a multiply-add as one FLOP": (code("""
            def cross_attention_flops(T_q, T_k, D, H):
                return 2 * T_q * D * D + 2 * T_k * D * D + 2 * T_q * T_k * D
        """), "a multiply-add is 2 FLOPs"),
        "a float": (code("""
            def cross_attention_flops(T_q, T_k, D, H):
                return 4.0 * T_q * D * D + 4 * T_k * D * D + 4 * T_q * T_k * D
        """), "return an int"),
    },
    "ex16-2-crossover-softmax-tests": {
        "ops_per_score ignored": (code("""
            def crossover_with_softmax(D, D_ff, H, ops_per_score):
                return float(max(D_ff - 2 * D, 0))
        """), "ops_per_score was ignored"),
        "softmax without the heads": (code("""
            def crossover_with_softmax(D, D_ff, H, ops_per_score):
                return float(max((4 * D * D_ff - 8 * D * D) / (4 * D + ops_per_score), 0.0))
        """), "so it costs c H T^2"),
        "softmax on the MLP's side": (code("""
            def crossover_with_softmax(D, D_ff, H, ops_per_score):
                return float(max((4 * D * D_ff - 8 * D * D) / (4 * D - ops_per_score * H), 0.0))
        """), "the softmax was put on the MLP's side"),
        "a negative length": (code("""
            def crossover_with_softmax(D, D_ff, H, ops_per_score):
                return (4 * D * D_ff - 8 * D * D) / (4 * D + ops_per_score * H)
        """), "a negative root is not a length"),
        "an int zero": (code("""
            def crossover_with_softmax(D, D_ff, H, ops_per_score):
                T = (4 * D * D_ff - 8 * D * D) / (4 * D + ops_per_score * H)
                return T if T > 0 else 0
        """), "the answer is 0.0 (a float)"),
    },
}


_MERGE = """
def merge_attention(Z_a, lse_a, Z_b, lse_b):
    m = np.maximum(lse_a, lse_b)
    w_a, w_b = WEIGHTS
    total = w_a + w_b
    return ZED, LSE
"""


def _merge(**change):
    """Exercise 17.1's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_MERGE, dict(WEIGHTS="np.exp(lse_a - m), np.exp(lse_b - m)",
                                ZED="(w_a[:, None] * Z_a + w_b[:, None] * Z_b) / total[:, None]",
                                LSE="m + np.log(total)"), **change)


# The two attacks of issue 28 on the former exercise 17.1 (attention by key blocks, whose memory was
# measured in the student's process): hide the peak with tracemalloc.reset_peak(), or compute the
# scores in PyTorch where tracemalloc does not look. Against the merge they have nothing to compute
# with: no key, value or score reaches the function, so each falls back to a guess and must score
# zero for the test cell (visible part and whole cell).
_ATTACK = """
import sys, tracemalloc
def merge_attention(Z_a, lse_a, Z_b, lse_b):
    tracemalloc.reset_peak()                      # attack 1: hide the peak of all scores at once
    frame = sys._getframe(1)
    while frame is not None:                      # look for the keys anywhere up the stack
        names = {**frame.f_globals, **frame.f_locals}
        if all(n in names for n in ("Q", "K", "V")):
            Q, K, V = (np.asarray(names[n], dtype=np.float64) for n in ("Q", "K", "V"))
            S = COMPUTE
            return Z, lse
        frame = frame.f_back
    return (Z_a + Z_b) / 2, np.maximum(lse_a, lse_b)
"""
_NUMPY_ALL = ("Q @ K.T / np.sqrt(Q.shape[1]); lse = np.log(np.exp(S - S.max(1, keepdims=True)).sum(1)) + S.max(1); "
              "Z = np.exp(S - lse[:, None]) @ V")
_TORCH_ALL = ("torch.from_numpy(Q) @ torch.from_numpy(K).T / Q.shape[1] ** 0.5; lse = torch.logsumexp(S, -1).numpy(); "
              "Z = torch.softmax(S, -1).numpy() @ V")
ATTACKS = {
    ("17_efficient_attention", "ex17-1-merge-attention-tests"): {
        "tracemalloc.reset_peak() and all scores at once": variant(_ATTACK, dict(COMPUTE=_NUMPY_ALL)),
        "all scores at once in PyTorch": variant(_ATTACK, dict(COMPUTE=_TORCH_ALL)).replace(
            "tracemalloc.reset_peak()                      # attack 1: hide the peak of all scores at once",
            "pass                                          # attack 2: PyTorch's memory is not traced"),
    },
}


MISTAKES["17_efficient_attention"] = {
    "ex17-1-merge-attention-tests": {
        "equal weights": (_merge(ZED="(Z_a + Z_b) / 2"), "averaged with equal weights"),
        "not divided by the total mass": (_merge(WEIGHTS="np.exp(lse_a), np.exp(lse_b)",
                                                 ZED="w_a[:, None] * Z_a + w_b[:, None] * Z_b"),
                                          "not divided by the total mass"),
        "lse as the maximum": (_merge(LSE="m"), "not the larger of the two"),
        "lse as a sum": (_merge(LSE="lse_a + lse_b"), "not lse_a + lse_b"),
        "no maximum subtracted": (_merge(WEIGHTS="np.exp(lse_a), np.exp(lse_b)", LSE="np.log(total)"),
                                  "subtract the larger lse before exp"),
        "attack: " + next(iter(ATTACKS["17_efficient_attention", "ex17-1-merge-attention-tests"])):
            (ATTACKS["17_efficient_attention", "ex17-1-merge-attention-tests"][
                "tracemalloc.reset_peak() and all scores at once"], "averaged with equal weights"),
        "attack: all scores at once in PyTorch":
            (ATTACKS["17_efficient_attention", "ex17-1-merge-attention-tests"]["all scores at once in PyTorch"],
             "averaged with equal weights"),
    },
    "ex17-4-linear-rnn-tests": {
        "read before the update": (code("""
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
        "not causal": (code("""
            def linear_attention_rnn(Q, K, V):
                U = elu1(K).T @ V
                n = elu1(K).sum(axis=0)
                return np.stack([(elu1(q) @ U) / (elu1(q) @ n) for q in Q])
        """), "the output is not causal"),
        "no normaliser": (code("""
            def linear_attention_rnn(Q, K, V):
                T, D_K = Q.shape
                U, Z = np.zeros((D_K, V.shape[1])), np.empty((T, V.shape[1]))
                for i in range(T):
                    U += np.outer(elu1(K[i]), V[i])
                    Z[i] = elu1(Q[i]) @ U
                return Z
        """), "the normaliser is missing"),
        "phi not applied": (code("""
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


_BUCKETS = """
def bucketed_allreduce(rank_grads, cap_bytes, first_cap_bytes=None):
    buckets, current, size = [], [], 0
    limit = FIRST
    for i in ORDER:
        if CLOSE_BEFORE and current and size + SIZE > limit:
            buckets.append(current)
            current, size, limit = [], 0, NEXT
        current.append(i)
        size += SIZE
        if not CLOSE_BEFORE and size >= limit:
            buckets.append(current)
            current, size, limit = [], 0, NEXT
    if current:
        buckets.append(current)
    flat_sums = [REDUCE(np.concatenate([g[i].ravel() for i in INNER]) for g in rank_grads) for b in buckets]
    return buckets, flat_sums
"""


def _buckets(**change):
    """Exercise 18.1's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_BUCKETS, dict(ORDER="reversed(range(len(rank_grads[0])))", CLOSE_BEFORE="False",
                                  SIZE="rank_grads[0][i].nbytes", REDUCE="sum", INNER="b",
                                  FIRST="cap_bytes if first_cap_bytes is None else first_cap_bytes",
                                  NEXT="cap_bytes"), **change)


_TOKEN_MEAN = """
def token_mean(rank_losses, rank_grads, rank_masks):
    counts = [COUNT for m in rank_masks]
    N = TOTAL
    loss = sum(n / N * float(l) for l, n in zip(rank_losses, counts) if n > 0)
    grad = sum(n / N * np.asarray(g) for g, n in zip(rank_grads, counts) if n > 0)
    return loss, grad
"""


def _token_mean(**change):
    """Exercise 18.2's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_TOKEN_MEAN, dict(COUNT="int(np.count_nonzero(m))", TOTAL="sum(counts)"), **change)


MISTAKES["18_parallel_training"] = {
    "ex18-1-buckets-tests": {
        "forward order": (_buckets(ORDER="range(len(rank_grads[0]))"), "the parameters were taken in forward order"),
        "numbers, not bytes": (_buckets(SIZE="rank_grads[0][i].size"), "compared with a count of numbers"),
        "closed before passing the cap": (_buckets(CLOSE_BEFORE="True"), "a bucket was closed before the tensor"),
        "averaged over the ranks": (_buckets(REDUCE="(lambda xs: sum(xs) / len(rank_grads))"),
                                    "the buffers were averaged over the ranks"),
        "flattened in parameter order": (_buckets(INNER="sorted(b)"), "flattened in another order"),
        "first bucket's cap ignored": (_buckets(FIRST="cap_bytes"), "first_cap_bytes was ignored"),
        "first cap for every bucket": (_buckets(NEXT="limit"), "every bucket was given first_cap_bytes"),
    },
    "ex18-2-padded-tests": {
        "rank means averaged": (code("""
            def token_mean(rank_losses, rank_grads, rank_masks):
                return float(np.mean(rank_losses)), np.mean(rank_grads, axis=0)
        """), "the ranks' mean losses were averaged with equal weights"),
        "padding counted": (_token_mean(COUNT="m.size"), "padding included"),
        "sequences counted": (_token_mean(COUNT="m.shape[0]"), "weighted by their numbers of sequences"),
        "not divided by N": (_token_mean(TOTAL="1"), "the weights N_r were not divided by N"),
    },
}


MISTAKES["A_history"] = {
    "exA-1-additive-scores-tests": {
        "axes swapped": (code("""
            def additive_scores(Q, K, W_q, W_k, v):
                return np.tanh((Q @ W_q)[None, :, :] + (K @ W_k)[:, None, :]) @ v
        """), "the axes are swapped"),
        "tanh of each term": (code("""
            def additive_scores(Q, K, W_q, W_k, v):
                return (np.tanh(Q @ W_q) @ v)[:, None] + (np.tanh(K @ W_k) @ v)[None, :]
        """), "tanh was applied to q_i W_q and k_j W_k separately"),
        "no tanh": (code("""
            def additive_scores(Q, K, W_q, W_k, v):
                return ((Q @ W_q)[:, None, :] + (K @ W_k)[None, :, :]) @ v
        """), "the tanh is missing"),
    },
}


globals().update(exercise_tests(MISTAKES, CHAPTERS))


@pytest.mark.parametrize("chapter,gid,attack", [(c, g, a) for (c, g), per in ATTACKS.items() for a in per])
def test_attacks_score_zero_for_their_test_cell(chapter, gid, attack):
    """An attack of issue 28 fails the whole test cell (hidden part included): zero points for it."""
    exc, printed = run(chapter, ATTACKS[chapter, gid][attack], plan(chapter).test(gid).source)
    assert isinstance(exc, AssertionError), (attack, exc, printed)
    assert "✔ the merge uses only" not in printed, printed


# Wrong answers that pass the visible tests and that a hidden case catches: each must fail the whole
# test cell (zero points for it) while its visible part passes.
HIDDEN_CATCHES = {
    ("15_vision_transformer", "ex15-2-pruned-rollout-tests"): {
        "only the first pruning applied (two layers only)": _rollout(PRUNE="R[..., np.asarray(kept[0]), :] if l == 0 else R"),
        "heads on axis 1 (one batch axis only)": _rollout(HEADS="P.mean(axis=1)"),
    },
    ("17_efficient_attention", "ex17-1-merge-attention-tests"): {
        "part a's lse as the reference (overflows when b dominates)": code("""
            def merge_attention(Z_a, lse_a, Z_b, lse_b):
                w_b = np.exp(lse_b - lse_a)
                return (Z_a + w_b[:, None] * Z_b) / (1 + w_b)[:, None], lse_a + np.log1p(w_b)
        """),
        "the result squeezed (one query loses its axis)": _merge(ZED="((w_a[:, None] * Z_a + w_b[:, None] * Z_b) "
                                                                 "/ total[:, None]).squeeze()"),
    },
}


@pytest.mark.parametrize("chapter,gid,wrong", [(c, g, w) for (c, g), per in HIDDEN_CATCHES.items() for w in per])
def test_hidden_cases_catch_what_the_visible_tests_let_through(chapter, gid, wrong):
    source = HIDDEN_CATCHES[chapter, gid][wrong]
    exc, printed = run(chapter, source, plan(chapter).test(gid).visible)
    assert exc is None, (wrong, "the visible part already fails", exc, printed)
    exc, printed = run(chapter, source, plan(chapter).test(gid).source)
    assert exc is not None, (wrong, "no hidden case caught it", printed)


# Exercise 17.2 predicts a number that an ordinary cell of the chapter computes (window_cache_mib); each
# answer below runs that cell first, then the prediction. 6.0 is the trap of taking G for the number of
# cached heads: the chapter's G = H / H_KV is the group size (4 here), the cache holds H_KV = 3 heads.
def _ch17_cache_cell() -> str:
    return next(c.source for c in master("17_efficient_attention").cells
                if c.cell_type == "code" and "window_cache_mib =" in c.source and not c.metadata.get("nbgrader"))


PREDICTION_MISTAKES_17_2 = {
    "G taken for the cached heads": ("prediction_17_2 = 2 * 12 * 4 * 64 * 512 * 2 / 2**20", "G = 4 as the number of cached heads"),
    "no grouping": ("prediction_17_2 = 2 * 12 * 12 * 64 * 512 * 2 / 2**20", "all 12 heads (no grouping)"),
    "no window": ("prediction_17_2 = 2 * 12 * 3 * 64 * 2048 * 2 / 2**20", "all 2048 tokens (no window)"),
    "keys only": ("prediction_17_2 = 12 * 3 * 64 * 512 * 2 / 2**20", "the keys alone"),
    "float32": ("prediction_17_2 = 2 * 12 * 3 * 64 * 512 * 4 / 2**20", "float32"),
}


@pytest.mark.parametrize("mistake", PREDICTION_MISTAKES_17_2)
def test_exercise_17_2_named_mistakes(mistake):
    wrong, words = PREDICTION_MISTAKES_17_2[mistake]
    check_mistake_fails_visible_test("17_efficient_attention", "ex17-2-window-gqa-cache-tests", mistake,
                                     _ch17_cache_cell() + "\n" + wrong, words)


def test_exercise_17_2_solution_passes():
    gid = "ex17-2-window-gqa-cache-tests"
    test = plan("17_efficient_attention").test(gid)
    exc, printed = run("17_efficient_attention",
                       _ch17_cache_cell() + "\n" + plan("17_efficient_attention").answers[test.answer], test.source)
    assert exc is None and "✘" not in printed, (exc, printed)
