"""Chapter 14's exercises teach through their visible tests: each likely mistake that a visible
test names is written here as a deliberately wrong answer and must fail that test with its
name; the chapter's own solution must pass the whole test cell. (The contract and the generic
tests are those of tests/exercise_harness.py; the grader's judge runs the master notebook once.)"""

from __future__ import annotations

from exercise_harness import exercise_tests, variant

NB = "14_modern_decoder"

_GQA = """
def gqa_from_mha(params, num_heads, num_kv_heads):
    D = params["W_K"].shape[0]
    D_K, G = D // num_heads, num_heads // num_kv_heads
    pool = lambda W: POOL.reshape(D, -1)
    return {"W_Q": QUERY, "W_K": pool(params["W_K"]), "W_V": pool(params["W_V"]), "W_O": params["W_O"]}
"""


def _gqa(**change) -> str:
    """Exercise 14.3's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_GQA, dict(POOL="W.reshape(D, num_kv_heads, G, D_K).mean(axis=2)", QUERY='params["W_Q"]'), **change)

MUTANTS = {NB: {
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
    "ex14-2-llama-params-tests": [
        ("tied head", "prediction_params = 68_976_648_192 - 32000 * 8192", "tied to the embedding"),
        ("keys of all heads", "prediction_params = 68_976_648_192 + 2 * 80 * 8192 * (8192 - 1024)", "D x H_KV D_K"),
        ("two-matrix MLP", "prediction_params = 68_976_648_192 - 80 * 8192 * 28672", "SwiGLU has three"),
        ("LayerNorm", "prediction_params = 68_976_648_192 + 161 * 8192", "RMSNorm has a gain only"),
        ("no final norm", "prediction_params = 68_976_648_192 - 8192", "final RMSNorm"),
        ("position table", "prediction_params = 68_976_648_192 + 4096 * 8192", "rotary positions have no parameters"),
    ],
    "ex14-3-gqa-from-mha-tests": [
        ("W_Q pooled", _gqa(QUERY='np.repeat(pool(params["W_Q"]).reshape(D, num_kv_heads, D_K), G, axis=1).reshape(D, D)'),
         "W_Q or W_O changed"),
        ("strided", _gqa(POOL="W.reshape(D, G, num_kv_heads, D_K).mean(axis=1)"), "strided heads"),
        ("summed", _gqa(POOL="W.reshape(D, num_kv_heads, G, D_K).sum(axis=2)"), "summed"),
        ("first head", _gqa(POOL="W.reshape(D, num_kv_heads, G, D_K)[:, :, 0]"), "first head of each group"),
    ],
}}


globals().update(exercise_tests(MUTANTS, via="judge"))
