"""Closed forms and properties, in both backends.

Expected values come from definitions written out here (loops over the formula),
from identities (rotation, relative position), or from hand arithmetic (the
lecture's worked example); hypothesis checks the properties on random inputs.
"""

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tfbook.numpy as tnp
from tfbook.torch import functional as TF

from conftest import random_encoder_params

BACKENDS = ["numpy", "torch"]
F64 = torch.float64


def _run(backend, name, *args, **kw):
    """Call ``name`` in a backend with NumPy inputs; return NumPy outputs."""
    if backend == "numpy":
        return getattr(tnp, name)(*args, **kw)
    def conv(a):
        if isinstance(a, np.ndarray):
            return torch.as_tensor(a)
        if isinstance(a, dict):
            return {k: conv(v) for k, v in a.items()}
        if isinstance(a, list):
            return [conv(v) for v in a]
        return a

    out = getattr(TF, name)(*[conv(a) for a in args], **{k: conv(v) for k, v in kw.items()})
    if isinstance(out, tuple):
        return tuple(o.detach().numpy() for o in out)
    return out.detach().numpy()


def _pe(backend, *args, **kw):
    if backend == "torch":
        kw["dtype"] = F64
    return _run(backend, *args, **kw)


# ---------------------------------------------------------------------------
# Positions
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T,D,base", [(7, 8, 10000.0), (50, 16, 10000.0), (5, 6, 100.0)])
def test_sinusoidal_element_by_element(backend, T, D, base):
    PE = _pe(backend, "sinusoidal_positional_encoding", T, D, base=base)
    for p in range(T):
        for i in range(D // 2):
            angle = p / base ** (2 * i / D)
            assert abs(PE[p, 2 * i] - math.sin(angle)) < 1e-12  # float64 round-off
            assert abs(PE[p, 2 * i + 1] - math.cos(angle)) < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("D", [4, 16, 64])
def test_shift_matrix_moves_encoding_by_k(backend, D):
    T = 120
    PE = _pe(backend, "sinusoidal_positional_encoding", T, D)
    for k in [0, 1, 3, 17, 50, -5]:
        M = _pe(backend, "sinusoidal_shift_matrix", k, D)
        for p in range(max(0, -k), min(T, T - k), 7):
            np.testing.assert_allclose(M @ PE[p], PE[p + k], rtol=0, atol=1e-11)  # float64, angles up to ~170 rad
        np.testing.assert_allclose(M @ M.T, np.eye(D), rtol=0, atol=1e-13)  # a rotation


@pytest.mark.parametrize("backend", BACKENDS)
def test_sinusoidal_2d_from_definition(backend):
    H, W, D = 3, 5, 8
    PE = _pe(backend, "sinusoidal_positional_encoding_2d", H, W, D)
    assert PE.shape == (H * W, D)
    for r in range(H):
        for c in range(W):
            for half, pos in ((0, r), (1, c)):
                for i in range(D // 4):
                    angle = pos / 10000.0 ** (2 * i / (D // 2))
                    assert abs(PE[r * W + c, half * D // 2 + 2 * i] - math.sin(angle)) < 1e-12
                    assert abs(PE[r * W + c, half * D // 2 + 2 * i + 1] - math.cos(angle)) < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rope_scores_depend_only_on_offset(backend, seed):
    g = np.random.default_rng(seed)
    D = 8
    q, k = g.standard_normal((1, D)), g.standard_normal((1, D))

    def score(m, n):
        rq = _run(backend, "rope", q, positions=np.array([m]))
        rk = _run(backend, "rope", k, positions=np.array([n]))
        return float(rq[0] @ rk[0])

    for m, n in [(0, 0), (5, 2), (2, 5), (40, 13), (100, 100)]:
        base = score(m - n, 0) if m >= n else score(0, n - m)
        for shift in (1, 7, 250):
            assert abs(score(m + shift, n + shift) - base) < 1e-10  # float64, angles of a few hundred rad
    # and it does depend on the offset
    assert abs(score(3, 0) - score(0, 0)) > 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_is_a_rotation_per_pair(backend):
    g = np.random.default_rng(0)
    X = g.standard_normal((3, 6, 10))
    R = _run(backend, "rope", X)
    np.testing.assert_allclose(R[..., 0::2] ** 2 + R[..., 1::2] ** 2, X[..., 0::2] ** 2 + X[..., 1::2] ** 2,
                               rtol=0, atol=1e-12)  # norm of each pair preserved
    np.testing.assert_allclose(R[:, 0], X[:, 0], rtol=0, atol=0)  # position 0 is not rotated
    theta = 2 * 1.0 / 10000 ** (2 * 1 / 10)  # pair i=1 at position 2
    c, s = math.cos(theta), math.sin(theta)
    np.testing.assert_allclose(R[:, 2, 2], X[:, 2, 2] * c - X[:, 2, 3] * s, rtol=0, atol=1e-14)
    np.testing.assert_allclose(R[:, 2, 3], X[:, 2, 2] * s + X[:, 2, 3] * c, rtol=0, atol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
def test_learned_positional_embedding_adds_rows_and_limits_length(backend):
    g = np.random.default_rng(0)
    X, table = g.standard_normal((2, 4, 3)), g.standard_normal((6, 3))
    out = _run(backend, "learned_positional_embedding", X, table)
    for t in range(4):
        np.testing.assert_array_equal(out[:, t], X[:, t] + table[t])
    with pytest.raises(ValueError, match=r"T=7.*T_max=6"):
        _run(backend, "learned_positional_embedding", g.standard_normal((2, 7, 3)), table)


# ---------------------------------------------------------------------------
# The lecture's worked example and attention facts
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_worked_example_102_99(backend):
    # D_K = 3; q . k1 = 102 and q . k2 = 99 by construction
    Q = np.array([[1.0, 1.0, 1.0]])
    K = np.array([[34.0, 34.0, 34.0], [33.0, 33.0, 33.0]])
    V = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert (Q @ K.T).tolist() == [[102.0, 99.0]]
    assert [round(s / math.sqrt(3), 2) for s in (102, 99)] == [58.89, 57.16]
    Z, P = _run(backend, "scaled_dot_product_attention", Q, K, V)
    assert np.round(P, 2).tolist() == [[0.85, 0.15]]
    # 1 / (1 + exp(-3 / sqrt 3)), written out by hand
    assert abs(P[0, 0] - 1 / (1 + math.exp(-3 / math.sqrt(3)))) < 1e-15
    np.testing.assert_allclose(Z, P, rtol=0, atol=0)  # V = I picks out the weights
    _, P_raw = _run(backend, "scaled_dot_product_attention", Q, K, V, scale=1.0)  # no scaling: sharper
    assert np.round(P_raw, 2).tolist() == [[0.95, 0.05]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_row_is_zero_not_nan(backend):
    g = np.random.default_rng(0)
    Q, K, V = g.standard_normal((2, 4, 3)), g.standard_normal((2, 5, 3)), g.standard_normal((2, 5, 2))
    mask = np.ones((2, 4, 5), bool)
    mask[0, 2] = False
    mask[1, :, 3] = False
    Z, P = _run(backend, "scaled_dot_product_attention", Q, K, V, mask=mask)
    assert np.all(np.isfinite(Z)) and np.all(np.isfinite(P))
    np.testing.assert_array_equal(Z[0, 2], 0)
    np.testing.assert_array_equal(P[0, 2], 0)
    np.testing.assert_array_equal(P[1, :, 3], 0)
    np.testing.assert_allclose(P.sum(-1)[1], 1, rtol=0, atol=1e-15)  # float64 round-off
    S = np.full((1, 5), -np.inf)
    np.testing.assert_array_equal(_run(backend, "softmax", S), 0)
    Wq, Wk, v = g.standard_normal((3, 4)), g.standard_normal((3, 4)), g.standard_normal(4)
    Za, Pa = _run(backend, "additive_attention", Q, K, V, Wq, Wk, v, mask=mask)
    assert np.all(np.isfinite(Za)) and np.all(Za[0, 2] == 0) and np.all(Pa[0, 2] == 0)
    params = {k: g.standard_normal((4, 4)) for k in ("W_Q", "W_K", "W_V", "W_O")}
    X = g.standard_normal((2, 5, 4))
    m = np.ones((5, 5), bool)
    m[1] = False
    Zm, Pm = _run(backend, "multi_head_attention", X, X, params, 2, mask=m)
    assert np.all(np.isfinite(Zm)) and np.all(Pm[:, :, 1] == 0)
    np.testing.assert_array_equal(Zm[:, 1], 0)  # no bias: zero row through W_O stays zero


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_logits_float32(backend):
    x = np.array([[1e4, -1e4, 0.0, 1e4 - 1.0], [-1e4, -1e4, -1e4, -1e4]], np.float32)
    P = _run(backend, "softmax", x)
    assert P.dtype == np.float32 and np.all(np.isfinite(P))
    e = math.exp(-1.0)
    np.testing.assert_allclose(P[0], [1 / (1 + e), 0, 0, e / (1 + e)], rtol=0, atol=1e-6)  # float32 eps
    np.testing.assert_allclose(P[1], 0.25, rtol=0, atol=1e-7)
    Q = np.array([[100.0, 0.0], [-100.0, 0.0]], np.float32)  # scores +-1e4 * scale
    K = np.array([[100.0, 0.0], [0.0, 100.0]], np.float32)
    V = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    Z, P = _run(backend, "scaled_dot_product_attention", Q, K, V, scale=1.0)
    assert Z.dtype == np.float32 and np.all(np.isfinite(Z))
    np.testing.assert_allclose(P, [[1, 0], [0, 1]], rtol=0, atol=0)
    np.testing.assert_allclose(Z, V, rtol=0, atol=0)


def test_large_logits_float16_torch():
    x = torch.tensor([[1e4, -1e4, 0.0, 9999.0], [-6e4, -6e4, 6e4, 0.0]], dtype=torch.float16)
    P = TF.softmax(x)
    assert P.dtype == torch.float16 and torch.isfinite(P).all()
    assert abs(float(P[0, 0]) - 0.5) < 1e-3  # 1e4 and 9999 round to the same float16 (spacing 8)
    assert float(P[1, 2]) == 1.0
    Q = torch.tensor([[[100.0, 0.0]]], dtype=torch.float16)
    K = torch.tensor([[[100.0, 0.0], [-100.0, 0.0]]], dtype=torch.float16)
    V = torch.tensor([[[1.0], [2.0]]], dtype=torch.float16)
    Z, P = TF.scaled_dot_product_attention(Q, K, V, scale=1.0)
    assert Z.dtype == torch.float16 and torch.isfinite(Z).all()
    assert P.tolist() == [[[1.0, 0.0]]] and Z.tolist() == [[[1.0]]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_output_in_convex_hull_and_rows_sum_to_one(backend):
    g = np.random.default_rng(3)
    Q, K, V = g.standard_normal((3, 6, 4)) * 3, g.standard_normal((3, 8, 4)), g.standard_normal((3, 8, 2))
    Z, P = _run(backend, "scaled_dot_product_attention", Q, K, V)
    np.testing.assert_allclose(P.sum(-1), 1, rtol=0, atol=1e-14)  # float64 round-off
    assert np.all(P >= 0)
    np.testing.assert_allclose(Z, np.einsum("bij,bjd->bid", P, V), rtol=0, atol=1e-14)
    assert np.all(Z <= V.max(axis=1, keepdims=True) + 1e-12) and np.all(Z >= V.min(axis=1, keepdims=True) - 1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_additive_attention_from_definition(backend):
    g = np.random.default_rng(0)
    Q, K, V = g.standard_normal((4, 3)), g.standard_normal((5, 2)), g.standard_normal((5, 2))
    Wq, Wk, v = g.standard_normal((3, 6)), g.standard_normal((2, 6)), g.standard_normal(6)
    Z, P = _run(backend, "additive_attention", Q, K, V, Wq, Wk, v)
    for i in range(4):
        s = [sum(v[a] * math.tanh(Q[i] @ Wq[:, a] + K[j] @ Wk[:, a]) for a in range(6)) for j in range(5)]
        e = [math.exp(x) for x in s]
        np.testing.assert_allclose(P[i], [x / sum(e) for x in e], rtol=0, atol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masks_from_definition(backend):
    conv = (lambda m: m) if backend == "numpy" else (lambda m: m.numpy())
    lib = tnp if backend == "numpy" else TF
    T = 6
    C = conv(lib.causal_mask(T))
    for w in (1, 2, 4, 10):
        Wm = conv(lib.sliding_window_mask(T, w))
        for i in range(T):
            for j in range(T):
                assert C[i, j] == (j <= i)
                assert Wm[i, j] == (0 <= i - j < w)
    lengths = np.array([2, 6, 0])
    valid = _run(backend, "padding_mask", lengths, T)
    assert valid.tolist() == [[t < n for t in range(T)] for n in lengths]
    both = _run(backend, "attention_mask_from_padding", valid) & np.tril(np.ones((T, T), bool))
    assert both.shape == (3, T, T)
    assert both[0].tolist() == [[j <= i and j < 2 for j in range(T)] for i in range(T)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_hot_matmul_equals_lookup(backend):
    g = np.random.default_rng(0)
    ids, W_E = g.integers(0, 9, (3, 5)), g.standard_normal((9, 4))
    kw = {"dtype": F64} if backend == "torch" else {}
    oh = _run(backend, "one_hot", ids, 9, **kw)
    assert oh.sum(-1).tolist() == [[1.0] * 5] * 3 and np.all(oh[np.arange(3)[:, None], np.arange(5), ids] == 1)
    np.testing.assert_array_equal(oh @ W_E, _run(backend, "embedding_lookup", ids, W_E))


@pytest.mark.parametrize("backend", BACKENDS)
def test_patchify_by_hand_and_round_trip(backend):
    g = np.random.default_rng(0)
    x = g.standard_normal((2, 3, 6, 9))
    p = 3
    P = _run(backend, "patchify", x, p)
    assert P.shape == (2, 6, 27)
    for n in range(6):
        r, c = divmod(n, 3)  # row-major over a 2 x 3 grid
        np.testing.assert_array_equal(P[:, n], x[:, :, r * p:(r + 1) * p, c * p:(c + 1) * p].reshape(2, -1))
    np.testing.assert_array_equal(_run(backend, "unpatchify", P, p, (3, 6, 9)), x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_rollout_by_hand(backend):
    g = np.random.default_rng(0)
    Ps = [tnp.softmax(g.standard_normal((2, 3, 4, 4))) for _ in range(3)]
    R = _run(backend, "attention_rollout", Ps)
    np.testing.assert_allclose(R.sum(-1), 1, rtol=0, atol=1e-14)  # rows sum to 1
    A = [0.5 * P.mean(axis=1) + 0.5 * np.eye(4) for P in Ps]  # (P + I) / 2 per layer
    expected = np.stack([A[2][b] @ A[1][b] @ A[0][b] for b in range(2)])
    np.testing.assert_allclose(R, expected, rtol=0, atol=1e-14)
    R0 = _run(backend, "attention_rollout", Ps, residual=False)
    np.testing.assert_allclose(R0, np.stack([Ps[2][b].mean(0) @ Ps[1][b].mean(0) @ Ps[0][b].mean(0)
                                             for b in range(2)]), rtol=0, atol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_from_definition(backend, causal):
    g = np.random.default_rng(0)
    Q, K, V = g.standard_normal((2, 6, 3)), g.standard_normal((2, 6, 3)), g.standard_normal((2, 6, 2))

    def phi(x):
        return np.where(x > 0, x + 1.0, np.exp(x))  # elu(x) + 1

    A = phi(Q) @ np.swapaxes(phi(K), -1, -2)  # (2, T, T) kernel scores
    if causal:
        A = A * np.tril(np.ones((6, 6)))
    expected = (A / A.sum(-1, keepdims=True)) @ V
    np.testing.assert_allclose(_run(backend, "linear_attention", Q, K, V, causal=causal), expected,
                               rtol=0, atol=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_incremental_equals_causal(backend):
    g = np.random.default_rng(0)
    T = 6
    Q, K, V = g.standard_normal((2, T, 4)), g.standard_normal((2, T, 4)), g.standard_normal((2, T, 3))
    full, _ = _run(backend, "scaled_dot_product_attention", Q, K, V, mask=np.tril(np.ones((T, T), bool)))
    lib = tnp if backend == "numpy" else TF
    conv = (lambda a: a) if backend == "numpy" else torch.as_tensor
    cache = None
    for t in range(T):
        cache = lib.kv_cache_append(cache, conv(K[:, t:t + 1]), conv(V[:, t:t + 1]))
        assert cache[0].shape == (2, t + 1, 4)
        z, _ = lib.scaled_dot_product_attention(conv(Q[:, t:t + 1]), *cache)
        np.testing.assert_allclose(np.asarray(z)[:, 0], full[:, t], rtol=0, atol=1e-14)  # float64 round-off


# ---------------------------------------------------------------------------
# hypothesis properties
# ---------------------------------------------------------------------------

SETTINGS = settings(max_examples=30, deadline=None)
arrays = st.integers(0, 2**32 - 1)


@SETTINGS
@given(seed=arrays, rows=st.integers(1, 5), cols=st.integers(1, 9), scale=st.floats(0.1, 1e3),
       shift=st.floats(-1e3, 1e3), backend=st.sampled_from(BACKENDS))
def test_softmax_rows_sum_to_one_and_ignore_shift(seed, rows, cols, scale, shift, backend):
    x = np.random.default_rng(seed).standard_normal((rows, cols)) * scale
    P = _run(backend, "softmax", x)
    np.testing.assert_allclose(P.sum(-1), 1, rtol=0, atol=1e-13)  # float64 round-off over <= 9 terms
    assert np.all(P >= 0)
    # exp(x + c) / sum exp(x + c) = exp(x) / sum exp(x); tolerance: the shift rounds x at ~1e-13 relative
    np.testing.assert_allclose(_run(backend, "softmax", x + shift), P, rtol=0, atol=1e-9)


@SETTINGS
@given(seed=arrays, T=st.integers(1, 7), norm_first=st.booleans(), backend=st.sampled_from(BACKENDS))
def test_encoder_block_permutation_equivariant(seed, T, norm_first, backend):
    g = np.random.default_rng(seed)
    X = g.standard_normal((2, T, 8))
    params = random_encoder_params(g, 8, 16)
    perm = g.permutation(T)
    Y = _run(backend, "encoder_block", X, params, 2, norm_first=norm_first)
    Yp = _run(backend, "encoder_block", X[:, perm], params, 2, norm_first=norm_first)
    np.testing.assert_allclose(Yp, Y[:, perm], rtol=0, atol=1e-12)  # float64 round-off


def test_causal_mask_breaks_permutation_equivariance():
    g = np.random.default_rng(0)
    X = g.standard_normal((1, 5, 8))
    params = random_encoder_params(g, 8, 16)
    perm = np.array([4, 3, 2, 1, 0])
    Y = tnp.encoder_block(X, params, 2, mask=tnp.causal_mask(5))
    Yp = tnp.encoder_block(X[:, perm], params, 2, mask=tnp.causal_mask(5))
    assert np.abs(Yp - Y[:, perm]).max() > 1e-3


@SETTINGS
@given(seed=arrays, T_q=st.integers(1, 40), T_k=st.integers(1, 40), block=st.integers(1, 17),
       causal=st.booleans(), backend=st.sampled_from(BACKENDS))
def test_tiled_equals_naive(seed, T_q, T_k, block, causal, backend):
    g = np.random.default_rng(seed)
    Q, K, V = g.standard_normal((2, T_q, 4)) * 2, g.standard_normal((2, T_k, 4)) * 2, g.standard_normal((2, T_k, 3))
    mask = np.tril(np.ones((T_q, T_k), bool)) if causal else None
    Z_naive, _ = tnp.scaled_dot_product_attention(Q, K, V, mask=mask)
    Z = _run(backend, "tiled_attention", Q, K, V, block_size=block, causal=causal)
    np.testing.assert_allclose(Z, Z_naive, rtol=0, atol=1e-13)  # float64 round-off


# ---------------------------------------------------------------------------
# The large-problem paths of the NumPy implementation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [tnp.scaled_dot_product_attention, tnp.blocked_attention], ids=["reference", "blocked"])
def test_numpy_attention_large_problem_with_masks(fn):
    # B H T_q T_k = 2^20 score entries: blocked_attention runs its query blocks on a thread pool
    g = np.random.default_rng(0)
    Q, K, V = g.standard_normal((2, 2, 512, 16)) * 3, g.standard_normal((2, 2, 512, 16)), g.standard_normal((2, 2, 512, 8))
    mask = g.random((2, 1, 512, 512)) < 0.5
    mask[0, 0, 7] = False  # a fully masked row
    Q[1, 1, 3] *= 1e3  # a row whose scores overflow exp without the shift
    Z, P = fn(Q, K, V, mask=mask)
    tQ, tK, tV, tm = (torch.as_tensor(a) for a in (Q, K, V, mask))
    S = (tQ @ tK.transpose(-1, -2) / 4).masked_fill(~tm, float("-inf"))
    P_ref = torch.softmax(S, -1).nan_to_num(0.0)  # torch gives NaN for the empty row; ours gives 0
    np.testing.assert_allclose(P, P_ref.numpy(), rtol=0, atol=1e-12)  # float64 round-off
    np.testing.assert_allclose(Z, (P_ref @ tV).numpy(), rtol=0, atol=1e-12)
    assert np.all(P[0, :, 7] == 0) and np.all(Z[0, :, 7] == 0)


def _fast_cases():
    """(Q shape, K shape, V shape, mask shape or None or "causal"): batch axes, broadcasting, ragged sizes."""
    return [
        ((5, 4), (7, 4), (7, 3), None),  # no batch axes
        ((2, 3, 9, 4), (2, 3, 9, 4), (2, 3, 9, 5), "causal"),
        ((2, 1, 33, 8), (1, 3, 40, 8), (1, 3, 40, 2), (2, 3, 33, 40)),  # broadcast batch, full mask
        ((3, 300, 16), (3, 517, 16), (3, 517, 8), (300, 517)),  # more than one query block per batch
        ((2, 2, 512, 16), (2, 2, 512, 16), (2, 2, 512, 8), (2, 1, 512, 512)),  # threaded, mask with batch axes
    ]


# tiled_attention takes no general mask (causal only), so it runs on the other cases
_FAST = [(v, c) for v in ("blocked", "tiled") for c in _fast_cases() if v == "blocked" or c[3] in (None, "causal")]


@pytest.mark.parametrize("variant,case", _FAST, ids=[f"{v}-" + "x".join(map(str, c[0])) for v, c in _FAST])
def test_fast_attention_equals_reference(variant, case):
    sq, sk, sv, ms = case
    g = np.random.default_rng(len(sq) + sq[-2])
    Q, K, V = 3 * g.standard_normal(sq), g.standard_normal(sk), g.standard_normal(sv)  # scores of tens
    T_q, T_k = sq[-2], sk[-2]
    if ms == "causal":
        mask = np.tril(np.ones((T_q, T_k), bool))
    elif ms is not None:
        mask = g.random(ms) < 0.6
        mask[..., 1, :] = False  # fully masked rows
    else:
        mask = None
    Z_ref, P_ref = tnp.scaled_dot_product_attention(Q, K, V, mask=mask)
    if variant == "blocked":
        Z, P = tnp.blocked_attention(Q, K, V, mask=mask)
        np.testing.assert_allclose(P, P_ref, rtol=0, atol=1e-12)  # float64 round-off
    else:
        Z = tnp.tiled_attention(Q, K, V, block_size=16, causal=ms == "causal")
    assert Z.shape == Z_ref.shape and Z.dtype == Z_ref.dtype == np.float64
    np.testing.assert_allclose(Z, Z_ref, rtol=0, atol=1e-12)  # float64 round-off, other summation order
    if mask is not None and ms != "causal":
        assert np.all(Z[..., 1, :] == 0) and np.all(Z_ref[..., 1, :] == 0)


def test_blocked_attention_scale_and_large_logits():
    g = np.random.default_rng(5)
    Q, K, V = g.standard_normal((2, 6, 4)), g.standard_normal((2, 8, 4)), g.standard_normal((2, 8, 3))
    for scale in (0.3, 1.0, 50.0):  # 50: scores in the hundreds, exp overflows without the shift
        for a, b in zip(tnp.blocked_attention(Q, K, V, scale=scale), tnp.scaled_dot_product_attention(Q, K, V, scale=scale)):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)  # float64 round-off
    # scores 1000 + w_i u_j and -1000 + w_i u_j: exp overflows (and underflows) for every key, yet the
    # weights are far from one-hot, so a wrong recomputation of those rows cannot hide
    w, u = g.standard_normal(4), g.standard_normal(9)
    Qo = np.stack([np.array([1.0, -1.0, 1.0, -1.0]), w], axis=-1)  # (4, 2)
    Ko = np.stack([np.full(9, 1000.0), u], axis=-1)  # (9, 2)
    Vo = g.standard_normal((9, 3))
    S = Qo @ Ko.T
    P_exact = np.exp(S - S.max(axis=-1, keepdims=True))
    P_exact /= P_exact.sum(axis=-1, keepdims=True)
    assert P_exact.max() < 0.9
    for fn in (tnp.blocked_attention, tnp.scaled_dot_product_attention):
        Z, P = fn(Qo, Ko, Vo, scale=1.0)
        np.testing.assert_allclose(P, P_exact, rtol=0, atol=1e-12)  # float64 round-off
        np.testing.assert_allclose(Z, P_exact @ Vo, rtol=0, atol=1e-12)
    Q32 = np.array([[100.0, 0.0], [-100.0, 0.0]], np.float32)  # scores +-1e4
    K32 = np.array([[100.0, 0.0], [0.0, 100.0]], np.float32)
    Z, P = tnp.blocked_attention(Q32, K32, K32, scale=1.0)
    assert Z.dtype == P.dtype == np.float32
    np.testing.assert_array_equal(P, [[1, 0], [0, 1]])


def test_tiled_attention_memory_is_linear_in_T():
    import tracemalloc

    T, D = 4096, 64
    g = np.random.default_rng(0)
    Q, K, V = (g.standard_normal((T, D), dtype=np.float32) for _ in range(3))
    bs, itemsize = 128, Q.itemsize
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    Z = tnp.tiled_attention(Q, K, V, block_size=bs)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    # The bound, counted. The output Z: T * D. Each query block in flight holds q, the running acc
    # and the two temporaries of `alpha * acc + S @ V` and the new acc (5 arrays of bs x D), the score
    # tile S (bs x bs) and the causal-mask tile (bs x bs bools, itemsize 1 < 4: counted as one more
    # tile); tiled_attention runs up to min(cpu_count, T / bs) query blocks at once on threads
    # (tfbook.numpy._run_blocks), so a 16-core machine holds 16 of them. The interpreter's own
    # allocations (thread objects, frames, the pool's queues) get 256 KiB. Nothing here grows as
    # T^2: the full score matrix alone is T^2 * 4 bytes = 64 MiB, far above the bound (at most
    # 1 + 32 * 0.28 + 0.25 MiB, about 10 MiB, on any number of cores).
    in_flight = min(os.cpu_count() or 1, -(-T // bs))
    per_block = (5 * bs * D + 2 * bs * bs) * itemsize
    bound = T * D * itemsize + in_flight * per_block + 256 * 2**10
    assert bound < T * T * itemsize / 4  # the check can tell linear from quadratic
    assert peak < bound, f"peak extra memory {peak / 2**20:.2f} MiB > {bound / 2**20:.2f} MiB ({in_flight} blocks at once)"
    Z_naive, _ = tnp.scaled_dot_product_attention(Q[:256], K, V)
    np.testing.assert_allclose(Z[:256], Z_naive, rtol=0, atol=1e-5)  # float32 round-off over 4096 terms
