"""The implement-it exercises of chapters 2 to 5 teach through their visible tests.

The contract and the generic tests are those of tests/exercise_harness.py: each likely mistake
that a visible test names is written here as a deliberately wrong answer and must fail the
test cell's *visible* part with that mistake's words, on a ``✘`` line; the master's solution
must pass the whole cell, hidden part included; every implement-it exercise names at least two
mistakes; every exercise binds its own answer names. The test cells run in a namespace holding
only the chapter's imports, so this file is quick; the grader itself is exercised by
tests/test_exercises_pipeline.py and tests/test_grader_chapters.py.
"""

from __future__ import annotations

from exercise_harness import code, exercise_tests, variant

CHAPTERS = ("02_attention_as_averaging", "03_why_scale", "04_self_attention", "05_multi_head_attention")


_PACKED = """
def packed_self_attention(X, W_Q, W_K, W_V, doc):
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    S = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    doc, T = np.asarray(doc), X.shape[-2]
    allowed = SAME & CAUSAL
    S = BEFORE
    E = np.exp(S - S.max(axis=-1, keepdims=True))
    P = E / E.sum(axis=-1, keepdims=True)
    P = AFTER
    return P @ V, P
"""


def _packed(**change):
    """Exercise 4.1's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_PACKED, dict(SAME="(doc[..., :, None] == doc[..., None, :])",
                                 CAUSAL="np.tril(np.ones((T, T), dtype=bool))",
                                 BEFORE="np.where(allowed, S, -np.inf)", AFTER="P"), **change)


_PRUNE = """
def prune_heads(params, num_heads, keep):
    D_h = params["W_Q"].shape[1] // num_heads
    cols = np.concatenate([np.arange(h * D_h, (h + 1) * D_h) for h in HEADS])
    pruned = {f"W_{k}": params[f"W_{k}"][:, cols] for k in "QKV"}
    pruned.update({f"b_{k}": params[f"b_{k}"]BQKV for k in "QKV"})
    pruned["W_O"] = WOUTPUT
    BOUT
    return pruned
"""


def _prune(**change):
    """Exercise 5.1's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_PRUNE, dict(HEADS="keep", BQKV="[cols]", WOUTPUT='params["W_O"][cols, :]',
                                BOUT='pruned["b_O"] = params["b_O"].copy()'), **change)


# {chapter: {test grade_id: {mistake: (wrong answer, words its visible failure must contain)}}}
MISTAKES: dict[str, dict[str, dict[str, tuple[str, str]]]] = {
    "02_attention_as_averaging": {
        "ex2-1-masked-weights-tests": {
            "mask applied after the softmax": (code("""
                def masked_weights(S, mask):
                    return tnp.softmax(S) * mask
            """), "the mask was applied after the softmax"),
            "no max subtracted": (code("""
                def masked_weights(S, mask):
                    E = np.exp(S) * mask
                    return E / E.sum(axis=-1, keepdims=True)
            """), "exp(1000) overflows"),
            "-inf minus -inf on a fully blocked row": (code("""
                def masked_weights(S, mask):
                    S = np.where(mask, S, -np.inf)
                    E = np.exp(S - S.max(axis=-1, keepdims=True))
                    return E / E.sum(axis=-1, keepdims=True)
            """), "a fully blocked row gives NaN"),
            "a large finite number instead of -inf": (code("""
                def masked_weights(S, mask):
                    return tnp.softmax(np.where(mask, S, -1e9))
            """), "a fully blocked row comes out uniform"),
        },
        "ex2-3-additive-tests": {
            "tanh of each term": (code("""
                def additive_scores(Q, K, W_q, W_k, a):
                    return (np.tanh(Q @ W_q) @ a)[..., :, None] + (np.tanh(K @ W_k) @ a)[..., None, :]
            """), "tanh was applied to q W_q and k W_k separately"),
            "no tanh": (code("""
                def additive_scores(Q, K, W_q, W_k, a):
                    return ((Q @ W_q)[..., :, None, :] + (K @ W_k)[..., None, :, :]) @ a
            """), "the tanh is missing"),
            "axes swapped": (code("""
                def additive_scores(Q, K, W_q, W_k, a):
                    return np.tanh((Q @ W_q)[..., None, :, :] + (K @ W_k)[..., :, None, :]) @ a
            """), "the broadcast axes are swapped"),
            "axes fixed for 2-D inputs": (code("""
                def additive_scores(Q, K, W_q, W_k, a):
                    return np.tanh((Q @ W_q)[:, None, :] + (K @ W_k)[None, :, :]) @ a
            """), "let batch axes through"),
        },
    },
    "03_why_scale": {
        "ex3-1-score-std-tests": {
            "the weights ignored (the chapter's 1)": (code("""
                def scaled_score_std(W_Q, W_K):
                    return 1.0
            """), "the weights were ignored"),
            "the product of the norms": (code("""
                def scaled_score_std(W_Q, W_K):
                    return float(np.linalg.norm(W_Q) * np.linalg.norm(W_K) / np.sqrt(W_Q.shape[1]))
            """), "only an upper bound"),
            "1/sqrt(D_K) forgotten": (code("""
                def scaled_score_std(W_Q, W_K):
                    return float(np.linalg.norm(W_Q @ W_K.T))
            """), "the 1/sqrt(D_K) of the scaled score is missing"),
            "the variance, not the standard deviation": (code("""
                def scaled_score_std(W_Q, W_K):
                    return float(np.linalg.norm(W_Q @ W_K.T) ** 2 / W_Q.shape[1])
            """), "this is the variance"),
        },
        "ex3-3-entropy-gradient-tests": {
            "dH/dp instead of dH/ds": (code("""
                def entropy_gradient(S):
                    return -(np.log(tnp.softmax(S)) + 1)
            """), "this is dH/dp"),
            "diagonal of the Jacobian only": (code("""
                def entropy_gradient(S):
                    p = tnp.softmax(S)
                    return -p * (np.log(p) + 1)
            """), "only the diagonal of the Jacobian was used"),
            "sign flipped": (code("""
                def entropy_gradient(S):
                    p = tnp.softmax(S)
                    H = -np.sum(p * np.log(p), axis=-1, keepdims=True)
                    return p * (np.log(p) + H)
            """), "the sign is flipped"),
            "log of an underflowed weight": (code("""
                def entropy_gradient(S):
                    p = tnp.softmax(S)
                    H = -np.sum(p * np.log(p), axis=-1, keepdims=True)
                    return -p * (np.log(p) + H)
            """), "NaN or inf for a saturated row"),
        },
    },
    "04_self_attention": {
        "ex4-1-self-attention-tests": {
            "documents ignored (causal only)": (_packed(SAME="True"), "attended to the documents packed before it"),
            "not causal (documents only)": (_packed(CAUSAL="True"), "attended to later tokens of its own document"),
            "mask after the softmax": (_packed(BEFORE="S", AFTER="P * allowed"), "zeroed after the softmax"),
            "no batch axis in the comparison": (_packed(SAME="(doc[:, None] == doc[None, :])"),
                                                "with a batch axis, compare doc[..., :, None]"),
        },
        "ex4-3-book-weights-tests": {
            "no transpose": (code("""
                def book_weights(lin_q, lin_k, lin_v):
                    return tuple(lin.weight.detach().clone() for lin in (lin_q, lin_k, lin_v))
            """), "W_Q has nn.Linear's layout"),
            "reshape for transpose": (code("""
                def book_weights(lin_q, lin_k, lin_v):
                    return tuple(lin.weight.detach().reshape(lin.in_features, lin.out_features)
                                 for lin in (lin_q, lin_k, lin_v))
            """), "a reshape keeps the memory order"),
            "W_Q and W_K swapped": (code("""
                def book_weights(lin_q, lin_k, lin_v):
                    return tuple(lin.weight.detach().T for lin in (lin_k, lin_q, lin_v))
            """), "W_Q and W_K are swapped"),
        },
        "ex4-4-orthonormal-keys-tests": {
            "W_Q unchanged": (code("""
                def orthonormal_keys(W_Q, W_K):
                    U, R = np.linalg.qr(W_K)
                    return W_Q, U
            """), "W_Q was left unchanged"),
            "W_Q times R, not R^T": (code("""
                def orthonormal_keys(W_Q, W_K):
                    U, R = np.linalg.qr(W_K)
                    return W_Q @ R, U
            """), "W_Q was multiplied by R, not by its transpose"),
            "W_Q times R^-1": (code("""
                def orthonormal_keys(W_Q, W_K):
                    U, R = np.linalg.qr(W_K)
                    return W_Q @ np.linalg.inv(R), U
            """), "W_Q was multiplied by R^-1"),
        },
    },
    "05_multi_head_attention": {
        "ex5-1-prune-heads-tests": {
            "heads taken as columns": (_prune(HEADS="keep", BQKV="[keep]").replace(
                "np.concatenate([np.arange(h * D_h, (h + 1) * D_h) for h in keep])", "np.asarray(keep)"),
                "keep lists heads, not columns"),
            "W_O cut by columns": (_prune(WOUTPUT='params["W_O"][:, cols]'), "W_O was cut by columns"),
            "W_O not cut": (_prune(WOUTPUT='params["W_O"]'), "W_O still has the rows of the removed heads"),
            "b_Q, b_K, b_V not cut": (_prune(BQKV=""), "b_Q, b_K and b_V belong to the heads too"),
            "b_O cut": (_prune(BOUT='pruned["b_O"] = params["b_O"][cols]'), "b_O was cut"),
            "b_O dropped": (_prune(BOUT="pass"), "b_O was dropped"),
            "the first heads kept": (_prune(HEADS="range(len(keep))"), "you kept the first len(keep) heads"),
            "params changed in place": (code("""
                def prune_heads(params, num_heads, keep):
                    D_h = params["W_Q"].shape[1] // num_heads
                    cols = np.concatenate([np.arange(h * D_h, (h + 1) * D_h) for h in keep])
                    for k in "QKV":
                        params[f"W_{k}"][:, [c for c in range(params["W_Q"].shape[1]) if c not in cols]] = 0.0
                    return {**{f"W_{k}": params[f"W_{k}"][:, cols] for k in "QKV"},
                            **{f"b_{k}": params[f"b_{k}"][cols] for k in "QKV"},
                            "W_O": params["W_O"][cols, :], "b_O": params["b_O"]}
            """), "prune_heads changed the params it was given"),
        },
    },
}


globals().update(exercise_tests(MISTAKES, CHAPTERS))
