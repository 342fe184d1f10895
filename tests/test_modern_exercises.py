"""Chapter 14's exercises teach through their visible tests: each likely mistake that a visible
test names is written here as a deliberately wrong answer and must fail that test with its
name; the chapter's own solution must pass. (The machinery is that of
tests/test_exercises_ch06_09.py: the grader's judge runs the master notebook once.)"""

from __future__ import annotations

import pytest

from test_exercises_ch06_09 import _judge, run_visible

NB = "14_modern_decoder"

MUTANTS = {
    "ex14-1-rotate-half-tests": [
        ("in place", """
            def to_rotate_half(W, num_heads):
                D_K = W.shape[1] // num_heads
                pi = np.concatenate([np.arange(0, D_K, 2), np.arange(1, D_K, 2)])
                cols = np.concatenate([h * D_K + pi for h in range(num_heads)])
                W[:] = W[:, cols]
                return W
            """, "changed in place"),
        ("whole width", """
            def to_rotate_half(W, num_heads):
                D = W.shape[1]
                return W[:, np.concatenate([np.arange(0, D, 2), np.arange(1, D, 2)])]
            """, "all 16 columns at once"),
        ("inverse", """
            def to_rotate_half(W, num_heads):
                D_K = W.shape[1] // num_heads
                pi = np.argsort(np.concatenate([np.arange(0, D_K, 2), np.arange(1, D_K, 2)]))
                return W[:, np.concatenate([h * D_K + pi for h in range(num_heads)])]
            """, "inverse permutation"),
        ("rows", """
            def to_rotate_half(W, num_heads):
                D_K = W.shape[1] // num_heads
                pi = np.concatenate([np.arange(0, D_K, 2), np.arange(1, D_K, 2)])
                return W[np.concatenate([h * D_K + pi for h in range(num_heads)])]
            """, "rows were reordered"),
        ("unchanged", """
            def to_rotate_half(W, num_heads):
                return W.copy()
            """, "W returned unchanged"),
        ("float64 permutation matrix", """
            def to_rotate_half(W, num_heads):
                D_K = W.shape[1] // num_heads
                pi = np.concatenate([np.arange(0, D_K, 2), np.arange(1, D_K, 2)])
                cols = np.concatenate([h * D_K + pi for h in range(num_heads)])
                return W @ np.eye(W.shape[1])[:, cols]
            """, "keep W's dtype"),
    ],
    "ex14-2-cache-size-tests": [
        ("keys only", "prediction_cache_mib = 192", "one of them was forgotten"),
        ("all heads", "prediction_cache_mib = 1536", "instead of H_kv D_K"),
        ("float32", "prediction_cache_mib = 768", "float32"),
        ("one layer", "prediction_cache_mib = 16", "one layer only"),
        ("MB", "prediction_cache_mib = 402.65", "MB (10^6 bytes) instead of MiB"),
    ],
    "ex14-3-gqa-from-mha-tests": [
        ("W_Q pooled", """
            def gqa_from_mha(params, num_heads, num_kv_heads):
                D = params["W_K"].shape[0]
                D_K, G = D // num_heads, num_heads // num_kv_heads
                pool = lambda W: W.reshape(D, num_kv_heads, G, D_K).mean(axis=2).reshape(D, -1)
                return {"W_Q": np.repeat(pool(params["W_Q"]).reshape(D, num_kv_heads, D_K), G, axis=1).reshape(D, D),
                        "W_K": pool(params["W_K"]), "W_V": pool(params["W_V"]), "W_O": params["W_O"]}
            """, "W_Q or W_O changed"),
        ("strided", """
            def gqa_from_mha(params, num_heads, num_kv_heads):
                D = params["W_K"].shape[0]
                D_K, G = D // num_heads, num_heads // num_kv_heads
                pool = lambda W: W.reshape(D, G, num_kv_heads, D_K).mean(axis=1).reshape(D, -1)
                return {"W_Q": params["W_Q"], "W_K": pool(params["W_K"]), "W_V": pool(params["W_V"]), "W_O": params["W_O"]}
            """, "strided heads"),
        ("summed", """
            def gqa_from_mha(params, num_heads, num_kv_heads):
                D = params["W_K"].shape[0]
                D_K, G = D // num_heads, num_heads // num_kv_heads
                pool = lambda W: W.reshape(D, num_kv_heads, G, D_K).sum(axis=2).reshape(D, -1)
                return {"W_Q": params["W_Q"], "W_K": pool(params["W_K"]), "W_V": pool(params["W_V"]), "W_O": params["W_O"]}
            """, "summed"),
        ("first head", """
            def gqa_from_mha(params, num_heads, num_kv_heads):
                D = params["W_K"].shape[0]
                D_K, G = D // num_heads, num_heads // num_kv_heads
                pool = lambda W: W.reshape(D, num_kv_heads, G, D_K)[:, :, 0].reshape(D, -1)
                return {"W_Q": params["W_Q"], "W_K": pool(params["W_K"]), "W_V": pool(params["W_V"]), "W_O": params["W_O"]}
            """, "first head of each group"),
    ],
}
CASES = [(gid, mid, src, words) for gid, ms in MUTANTS.items() for mid, src, words in ms]


@pytest.mark.parametrize("gid", list(MUTANTS))
def test_the_solution_passes_and_at_least_two_mistakes_are_named(gid):
    judge = _judge(NB)
    answer = judge.plan.answers[judge.plan.test(gid).answer]
    ok, out = run_visible(NB, gid, answer)
    assert ok, out
    assert "✘" not in out
    assert len(MUTANTS[gid]) >= 2


@pytest.mark.parametrize("gid,mutant,source,words", CASES, ids=[f"{g}:{m}" for g, m, _, _ in CASES])
def test_a_named_mistake_fails_the_visible_test_with_its_name(gid, mutant, source, words):
    ok, out = run_visible(NB, gid, source)
    assert not ok, f"{mutant}: the visible test passed"
    first = next((line for line in out.splitlines() if line.startswith("✘")), "")
    assert words in first, f"{mutant}: expected a ✘ line naming {words!r}, got:\n{out}"
