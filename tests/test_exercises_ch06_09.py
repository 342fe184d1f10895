"""Exercises of chapters 6 to 9 teach through their visible tests.

The contract and the generic tests are those of tests/exercise_harness.py: each likely mistake
that the visible test cell names is written here as a deliberately wrong answer and must fail
the released (visible) part of the test cell with that mistake's name on its first ``✘`` line;
the chapter's own solution must pass the whole cell, hidden part included; every implement-it
exercise names at least two mistakes; every exercise binds its own answer names.

The test cells run in the master notebook's own namespace: the grader's judge
(:class:`tfbook.course.judge.Judge`) runs each master notebook once and keeps a snapshot of the
namespace before every test cell. Slow-ish: each of the four notebooks runs once, in this process."""

from __future__ import annotations

from exercise_harness import exercise_tests, variant

# {notebook: {test grade_id: [(mutant id, wrong answer source, words the ✘ line must contain)]}}
MUTANTS: dict[str, dict[str, list[tuple[str, str, str]]]] = {}

MUTANTS["06_permutation_equivariance"] = {
    "ex6-1-multiset-attention-tests": [
        ("counted once", """
            def attention_with_counts(Q, K, V, counts):
                return tnp.scaled_dot_product_attention(Q, K, V)[0]
            """, "every distinct token was counted once"),
        ("counts after the softmax", """
            def attention_with_counts(Q, K, V, counts):
                P = tnp.softmax(Q @ K.T / np.sqrt(Q.shape[-1]))
                return (P * np.asarray(counts)) @ V
            """, "multiplied by the counts after the softmax"),
        ("counts times the scores", """
            def attention_with_counts(Q, K, V, counts):
                return tnp.softmax(np.asarray(counts) * (Q @ K.T) / np.sqrt(Q.shape[-1])) @ V
            """, "the counts multiplied the scores"),
        ("counts times the values", """
            def attention_with_counts(Q, K, V, counts):
                return tnp.scaled_dot_product_attention(Q, K, np.asarray(counts)[:, None] * V)[0]
            """, "or the values by their counts"),
        ("overflow: no max subtracted", """
            def attention_with_counts(Q, K, V, counts):
                E = np.asarray(counts) * np.exp(Q @ K.T / np.sqrt(Q.shape[-1]))
                return E / E.sum(axis=-1, keepdims=True) @ V
            """, "exp overflowed"),
    ],
    "ex6-4-table-equivariance-tests": [
        ("columns not permuted", """
            def table_equivariance_error(f, X, row_perm, col_perm):
                permute = lambda A: np.asarray(A)[..., row_perm, :]
                return float(np.max(np.abs(f(permute(X)) - permute(f(X)))))
            """, "col_perm was not applied"),
        ("inverse column permutation", """
            def table_equivariance_error(f, X, row_perm, col_perm):
                inv = np.argsort(col_perm)
                permute = lambda A: np.asarray(A)[..., row_perm, :][..., :, inv]
                return float(np.max(np.abs(f(permute(X)) - permute(f(X)))))
            """, "applied as its inverse"),
        ("output not permuted", """
            def table_equivariance_error(f, X, row_perm, col_perm):
                permute = lambda A: np.asarray(A)[..., row_perm, :][..., :, col_perm]
                return float(np.max(np.abs(f(permute(X)) - f(X))))
            """, "measures invariance, not equivariance"),
        ("first axis permuted", """
            def table_equivariance_error(f, X, row_perm, col_perm):
                permute = lambda A: np.asarray(A)[row_perm][..., :, col_perm]
                return float(np.max(np.abs(f(permute(X)) - permute(f(X)))))
            """, "the first axis was permuted"),
        ("0-d array returned", """
            def table_equivariance_error(f, X, row_perm, col_perm):
                permute = lambda A: np.asarray(A)[..., row_perm, :][..., :, col_perm]
                return np.asarray(np.max(np.abs(f(permute(X)) - permute(f(X)))))
            """, "return a Python float"),
    ],
}

_DECODE = """
def decode_position(pe, base=10000.0):
    pe = np.asarray(pe, dtype=float)
    D = pe.shape[-1]
    omega = base ** (-FREQ / D)
    angle = ANGLE
    return ROUND
"""


def _decode(**change) -> str:
    """Exercise 7.1's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_DECODE, dict(FREQ="(D - 2)", ANGLE="np.arctan2(pe[..., D - 2], pe[..., D - 1]) % (2 * np.pi)",
                                 ROUND="np.rint(angle / omega).astype(int)"), **change)


_ROT2 = """
def rotary_2d(X, rows, cols, base=10000.0):
    D = X.shape[-1]
    h = D // 2
    out = np.empty(np.shape(X))
    for lo, pos in ((0, ROWS), (h, COLS)):
        theta = np.asarray(pos, dtype=float)[:, None] * BASE ** (-np.arange(0, h, 2) / WIDTH)
        c, s = np.cos(theta), np.sin(theta)
        x0, x1 = X[..., lo:lo + h:2], X[..., lo + 1:lo + h:2]
        out[..., lo:lo + h:2] = EVEN
        out[..., lo + 1:lo + h:2] = ODD
    return out
"""


def _rot2(**change) -> str:
    """Exercise 7.2's answer (written out, without tnp.rope), with the mistake put in by replacing one of its
    upper-case parts."""
    return variant(_ROT2, dict(ROWS="rows", COLS="cols", BASE="base", WIDTH="h",
                               EVEN="x0 * c - x1 * s", ODD="x0 * s + x1 * c"), **change)


MUTANTS["07_positional_information"] = {
    "ex7-1-sinusoidal-tests": [
        ("float positions", _decode(ROUND="np.rint(angle / omega)"), "integer array"),
        ("the sine alone", _decode(ANGLE="np.arcsin(pe[..., D - 2])"), "the sine alone is ambiguous"),
        ("the cosine alone", _decode(ANGLE="np.arccos(pe[..., D - 1])"), "the cosine alone cannot tell"),
        ("arctan2 not wrapped", _decode(ANGLE="np.arctan2(pe[..., D - 2], pe[..., D - 1])"),
         "np.arctan2 returns angles in (-pi, pi]"),
        ("the fastest pair", _decode(FREQ="0", ANGLE="np.arctan2(pe[..., 0], pe[..., 1]) % (2 * np.pi)"),
         "the fastest pair turns once every 2 pi"),
        ("exponent without the 2", _decode(FREQ="(D / 2 - 1)"), "times too large"),
        ("exponent -1", _decode(FREQ="D"), "times too large"),
        ("truncated, not rounded", _decode(ROUND="(angle / omega).astype(int)"), "one too small"),
    ],
    "ex7-2-rotary-tests": [
        ("clockwise", _rot2(EVEN="x0 * c + x1 * s", ODD="-x0 * s + x1 * c"), "the pairs turn clockwise"),
        ("rows and columns swapped", _rot2(ROWS="cols", COLS="rows"), "rows and columns swapped"),
        ("columns ignored", _rot2(COLS="rows"), "the cols argument was ignored"),
        ("width-D frequencies", _rot2(WIDTH="D"), "each half is a rotary embedding of width D/2"),
        ("interleaved axes", """
            def rotary_2d(X, rows, cols, base=10000.0):
                D = X.shape[-1]
                w = base ** (-np.arange(0, D // 2, 2) / (D // 2))            # the D/4 frequencies of a half
                pos = np.stack([np.asarray(rows), np.asarray(cols)], -1)    # even pairs: the row; odd pairs: the column
                theta = np.repeat(w, 2)[None, :] * pos[:, np.arange(D // 2) % 2]
                c, s = np.cos(theta), np.sin(theta)
                out = np.empty(np.shape(X))
                out[..., 0::2] = X[..., 0::2] * c - X[..., 1::2] * s
                out[..., 1::2] = X[..., 0::2] * s + X[..., 1::2] * c
                return out
            """, "interleaved"),
        ("base ignored", _rot2(BASE="10000.0"), "the base argument was ignored"),
        ("tnp.rope called", """
            def rotary_2d(X, rows, cols, base=10000.0):
                h = X.shape[-1] // 2
                return np.concatenate([tnp.rope(X[..., :h], np.asarray(rows), base=base),
                                       tnp.rope(X[..., h:], np.asarray(cols), base=base)], axis=-1)
            """, "tnp.rope was called"),
    ],
}

_RMS_BACKWARD = """
def rms_norm_backward(X, gamma, G, eps=1e-6):
    r = np.sqrt((X * X).mean(axis=-1, keepdims=True)EPS)
    g = GRAD
    return (g MEAN_TERM X_TERM) / r
"""


def _rms_backward(**change) -> str:
    """Exercise 8.2's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_RMS_BACKWARD, dict(EPS=" + eps", GRAD="G * gamma", MEAN_TERM="",
                                       X_TERM="- X * (g * X).mean(axis=-1, keepdims=True) / r ** 2"), **change)


MUTANTS["08_mlp_residuals_layernorm"] = {
    "ex8-1-rms-norm-tests": [
        ("mean subtracted", """
            def rms_norm(X, gamma, eps=1e-6):
                Xc = X - X.mean(axis=-1, keepdims=True)
                return (Xc / np.sqrt(np.mean(Xc * Xc, axis=-1, keepdims=True) + eps) * gamma).astype(X.dtype)
            """, "the mean was subtracted"),
        ("sum instead of mean", """
            def rms_norm(X, gamma, eps=1e-6):
                return (X / np.sqrt(np.sum(X * X, axis=-1, keepdims=True) + eps) * gamma).astype(X.dtype)
            """, "the root of the sum of squares"),
        ("eps after the square root", """
            def rms_norm(X, gamma, eps=1e-6):
                return (X / (np.sqrt(np.mean(X * X, axis=-1, keepdims=True)) + eps) * gamma).astype(X.dtype)
            """, "eps was added after the square root"),
        ("no eps: 0/0", """
            def rms_norm(X, gamma, eps=1e-6):
                return (X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True)) * gamma).astype(X.dtype)
            """, "an all-zero row gives 0/0"),
        ("eps argument ignored", """
            def rms_norm(X, gamma, eps=1e-6):
                return (X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True) + 1e-6) * gamma).astype(X.dtype)
            """, "the eps argument was ignored"),
        ("float64 out", """
            def rms_norm(X, gamma, eps=1e-6):
                X = np.asarray(X, dtype=float)
                return X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True) + eps) * gamma
            """, "keep the dtype of X"),
    ],
    "ex8-2-rms-backward-tests": [
        ("gain left out", _rms_backward(GRAD="G"), "the gain was left out"),
        ("r held constant", _rms_backward(X_TERM=""), "r depends on x too"),
        ("LayerNorm's mean term", _rms_backward(MEAN_TERM="- g.mean(axis=-1, keepdims=True)"),
         "RMSNorm subtracts no mean"),
        ("eps left out", _rms_backward(EPS=""), "eps was left out"),
        ("eps argument ignored", _rms_backward(EPS=" + 1e-6"), "the eps argument was ignored"),
    ],
}

_PARALLEL = """
    def parallel_block(X, params, num_heads):
        n = lambda A: tnp.layer_norm(A, params["norm"]["gamma"], params["norm"]["beta"])
        mha = lambda A: tnp.multi_head_attention(A, A, params["attn"], {heads})[0]
        ffn = lambda A: tnp.feed_forward(A, params["ffn"])
        {body}
    """
_par = dict(heads="num_heads")
_FOLD = """
    def fold_norms(params):
        def fold(norm, W, b):
            return {W}, {b}

        attn, ffn = {copy_attn}, dict(params["ffn"])
        for k in "QKV":
            attn[f"W_{{k}}"], attn[f"b_{{k}}"] = fold(params["norm1"], attn[f"W_{{k}}"], attn[f"b_{{k}}"])
        {ffn}
        plain = lambda n: {{"gamma": np.ones_like(n["gamma"]), "beta": np.zeros_like(n["beta"])}}
        return {{"attn": attn, "ffn": ffn, "norm1": {n1}, "norm2": plain(params["norm2"])}}
    """
_fold = dict(W='norm["gamma"][:, None] * W', b='norm["beta"] @ W + b', copy_attn='dict(params["attn"])',
             ffn='ffn["W_1"], ffn["b_1"] = fold(params["norm2"], ffn["W_1"], ffn["b_1"])', n1='plain(params["norm1"])')
_POOL = """
    def masked_mean_pool(X, valid):
        w = np.asarray(valid, dtype=float)[..., None]
        {body}
    """

MUTANTS["09_encoder"] = {
    "ex9-3-masked-mean-tests": [
        ("padding averaged in", _POOL.format(body="return np.asarray(X).mean(axis=-2)"),
         "padded positions were averaged in"),
        ("divided by T", _POOL.format(body="return (np.asarray(X) * w).sum(axis=-2) / np.asarray(X).shape[-2]"),
         "you divided by T"),
        ("mask inverted", _POOL.format(body="w = 1.0 - w\n        return (np.asarray(X) * w).sum(axis=-2) / w.sum(axis=-2)"),
         "your mask is inverted"),
    ],
    "ex9-1-block-tests": [
        ("sequential", _PARALLEL.format(**_par, body="Y = X + mha(n(X))\n        return Y + ffn(n(Y))"),
         "you built the sequential Pre-LN block"),
        ("no residual", _PARALLEL.format(**_par, body="return mha(n(X)) + ffn(n(X))"), "the residual is missing"),
        ("Post-LN", _PARALLEL.format(**_par, body="return n(X + mha(X) + ffn(X))"), "you normalised the sum"),
        ("MLP reads X", _PARALLEL.format(**_par, body="return X + mha(n(X)) + ffn(X)"), "the MLP read X itself"),
        ("one head", _PARALLEL.format(heads="1", body="return X + mha(n(X)) + ffn(n(X))"),
         "num_heads was not passed on"),
    ],
    "ex9-2-fold-norms-tests": [
        ("gamma on the columns", _FOLD.format(**dict(_fold, W='W * norm["gamma"][None, :]')),
         "gamma scaled the columns of W"),
        ("beta dropped", _FOLD.format(**dict(_fold, b="b")), "beta was dropped"),
        ("beta not through W", _FOLD.format(**dict(_fold, b='b + norm["beta"]')),
         "beta was added to the bias as it is"),
        ("beta through the folded W", _FOLD.format(**dict(_fold, b='norm["beta"] @ (norm["gamma"][:, None] * W) + b')),
         "beta was multiplied by the folded W"),
        ("norms not reset", _FOLD.format(**dict(_fold, n1='params["norm1"]')), "norm1 still applies its gamma"),
        ("norm2 not folded", _FOLD.format(**dict(_fold, ffn="pass")), "norm2 was not folded"),
        ("params changed in place", _FOLD.format(**dict(_fold, copy_attn='params["attn"]')),
         "fold_norms changed the params it was given"),
    ],
}


globals().update(exercise_tests(MUTANTS, via="judge"))
