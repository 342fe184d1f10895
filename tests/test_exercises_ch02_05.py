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


_SELF_ATTENTION = """
def self_attention(X, W_Q, W_K, W_V, mask=None):
    Q, K, V = PROJECT
    S = Q @ np.swapaxes(K, -1, -2)SCALING
    S = BEFORE
    E = np.exp(S - S.max(axis=-1, keepdims=True))
    P = E / E.sum(axis=-1, keepdims=True)
    P = AFTER
    return P @ V, P
"""


def _self_attention(**change):
    """Exercise 4.1's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_SELF_ATTENTION, dict(PROJECT="X @ W_Q, X @ W_K, X @ W_V", SCALING=" / math.sqrt(Q.shape[-1])",
                                         BEFORE="S if mask is None else np.where(mask, S, -np.inf)", AFTER="P"),
                   **change)


_MULTI_HEAD = """
def multi_head_loop(X, params, num_heads):
    D_h = X.shape[-1] // num_heads
    Zs, Ps = [], []
    for h in range(num_heads):
        c = slice(h * D_h, (h + 1) * D_h)
        Q, K, V = (X @ params[f"W_{k}"][:, c] + QKVB for k in "QKV")
        Z_h, P_h = tnp.scaled_dot_product_attention(Q, K, VSCALE_ARG)
        Zs.append(Z_h)
        Ps.append(P_h)
    return np.concatenate(Zs, axis=-1) @ params["W_O"]B_OUT, np.stack(PsHEAD_AXIS)
"""


def _multi_head(**change):
    """Exercise 5.1's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_MULTI_HEAD, dict(QKVB='(0.0 if params.get(f"b_{k}") is None else params[f"b_{k}"][c])',
                                     SCALE_ARG="", B_OUT=' + (0.0 if params.get("b_O") is None else params["b_O"])',
                                     HEAD_AXIS=", axis=-3"), **change)


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
            "scores not scaled": (_self_attention(SCALING=""), "without the 1/sqrt(D_K) factor"),
            "weights transposed": (_self_attention(PROJECT="X @ W_Q.T, X @ W_K.T, X @ W_V.T"),
                                   "the weights are transposed"),
            "mask after the softmax": (_self_attention(BEFORE="S", AFTER="P if mask is None else P * mask"),
                                       "the mask was applied after the softmax"),
            "float64 scale promotes float32": (_self_attention(SCALING=" / np.sqrt(Q.shape[-1])"),
                                               "promotes the result"),
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
        "ex5-1-multi-head-loop-tests": {
            "heads stacked first": (_multi_head(HEAD_AXIS=""), "P has the heads first"),
            "scaled by sqrt(D)": (_multi_head(SCALE_ARG=", scale=1 / math.sqrt(X.shape[-1])"),
                                  "the scores were divided by sqrt(D)"),
            "b_O forgotten": (_multi_head(B_OUT=""), "b_O is missing"),
            "biases required": (_multi_head(QKVB='params[f"b_{k}"][c]', B_OUT=' + params["b_O"]'),
                                "read a bias with params.get(name)"),
        },
    },
}


globals().update(exercise_tests(MISTAKES, CHAPTERS))
