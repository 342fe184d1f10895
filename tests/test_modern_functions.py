"""The modern decoder's components (tfbook.numpy.modern and its torch twin), cross-checked.

NumPy == torch (float64), each against PyTorch's built-in (F.rms_norm, F.silu,
F.gelu(approximate="tanh"), F.scaled_dot_product_attention(enable_gqa=True)) and against a
closed form (RoPE as complex multiplication); the two RoPE layouts mapped by their
permutation; grouped-query attention equal to multi-head attention when H_kv = H.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tfbook.numpy.modern as M
import tfbook.numpy as tnp
from tfbook.torch import functional as TF

import error_cases_modern

ATOL = 1e-12  # float64 round-off (different summation orders)


def _gqa_params(g, D, H, H_kv, bias=False):
    D_K = D // H
    p = {"W_Q": g.standard_normal((D, D)) / math.sqrt(D), "W_K": g.standard_normal((D, H_kv * D_K)) / math.sqrt(D),
         "W_V": g.standard_normal((D, H_kv * D_K)) / math.sqrt(D), "W_O": g.standard_normal((D, D)) / math.sqrt(D)}
    if bias:
        p.update(b_Q=g.standard_normal(D), b_K=g.standard_normal(H_kv * D_K), b_V=g.standard_normal(H_kv * D_K),
                 b_O=g.standard_normal(D))
    return p


def _swiglu_params(g, D, D_ff):
    return {"W_gate": g.standard_normal((D, D_ff)) / math.sqrt(D), "W_up": g.standard_normal((D, D_ff)) / math.sqrt(D),
            "W_down": g.standard_normal((D_ff, D)) / math.sqrt(D_ff)}


def _bool(g, shape, p=0.7):
    return g.random(shape) < p


def _llama_block_params(g, D, H, H_kv, D_ff):
    return {"norm_attn": {"gamma": 1 + 0.3 * g.standard_normal(D)}, "attn": _gqa_params(g, D, H, H_kv),
            "norm_mlp": {"gamma": 1 + 0.3 * g.standard_normal(D)}, "mlp": _swiglu_params(g, D, D_ff)}


def _llama_params(g, V, D, H, H_kv, D_ff, L=2, tied=True):
    return {"W_E": g.standard_normal((V, D)), "blocks": [_llama_block_params(g, D, H, H_kv, D_ff) for _ in range(L)],
            "norm": {"gamma": 1 + 0.3 * g.standard_normal(D)}, "W_U": None if tied else g.standard_normal((D, V))}


# name -> builders g -> (args, kwargs, torch_extra); the same format as tests/test_backends_parity.py
PARITY_CASES = {
    "rms_norm": [lambda g: ((g.standard_normal((2, 5, 6)) * 3 + 1, g.standard_normal(6)), {}, {}),
                 lambda g: ((g.standard_normal((4, 6)), None), {"eps": 1e-3}, {})],
    "silu": [lambda g: ((g.standard_normal((4, 5)) * 10,), {}, {})],
    "gelu_tanh": [lambda g: ((g.standard_normal((4, 5)) * 3,), {}, {})],
    "swiglu": [lambda g: ((g.standard_normal((2, 5, 6)), _swiglu_params(g, 6, 16)), {}, {})],
    "rope_rotate_half": [
        lambda g: ((g.standard_normal((2, 5, 6)),), {}, {}),
        lambda g: ((g.standard_normal((2, 5, 6)),), {"positions": np.array([3, 1, 4, 1, 5]), "base": 100.0}, {}),
    ],
    "rope_permutation": [lambda g: ((8,), {}, {})],
    "rope_attention": [
        lambda g, lay=lay: ((g.standard_normal((2, 3, 5, 4)), g.standard_normal((2, 3, 7, 4)),
                             g.standard_normal((2, 3, 7, 3))), {"mask": _bool(g, (5, 7)), "layout": lay}, {})
        for lay in ("interleaved", "half")
    ] + [lambda g: ((g.standard_normal((2, 4, 4)), g.standard_normal((2, 6, 4)), g.standard_normal((2, 6, 3))),
                    {"q_positions": np.array([9, 2, 4, 0]), "k_positions": np.arange(6) * 2, "scale": 0.3}, {})],
    "grouped_query_attention": [
        lambda g, hkv=hkv, rope=rope: ((g.standard_normal((2, 5, 8)), g.standard_normal((2, 7, 8)),
                                        _gqa_params(g, 8, 4, hkv, bias=hkv == 2), 4, hkv),
                                       {"mask": _bool(g, (2, 5, 7)), "rope": rope}, {})
        for hkv in (4, 2, 1) for rope in (None, "half")
    ],
    "llama_block": [
        lambda g, hkv=hkv, rope=rope: ((g.standard_normal((2, 5, 8)), _llama_block_params(g, 8, 4, hkv, 12), 4, hkv),
                                       {"mask": np.tril(np.ones((5, 5), bool)), "rope": rope}, {})
        for hkv, rope in ((4, "half"), (2, "interleaved"), (1, None))
    ],
    "llama_lm": [
        lambda g, hkv=hkv, tied=tied: ((g.integers(0, 11, (2, 6)), _llama_params(g, 11, 8, 4, hkv, 12, tied=tied), 4, hkv),
                                       {"rope": "half"}, {})
        for hkv, tied in ((4, True), (2, False))
    ],
}
PARITY_IDS = [(n, i) for n, bs in PARITY_CASES.items() for i in range(len(bs))]


def _t(x):
    if isinstance(x, np.ndarray):
        return torch.as_tensor(x)
    if isinstance(x, dict):
        return {k: _t(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_t(v) for v in x]
    return x


def _np(x):
    return x.detach().cpu().numpy()


def test_every_component_has_parity_and_error_cases():
    assert set(PARITY_CASES) == set(M.__all__)
    assert {c[0] for c in error_cases_modern.CASES} == set(M.__all__)
    import tfbook.torch as tt

    for name in M.__all__:  # re-exported by both backends, same argument names
        assert getattr(tnp, name) is getattr(M, name) and getattr(tt, name) is getattr(TF, name)
        import inspect

        a = list(inspect.signature(getattr(tnp, name)).parameters)
        b = list(inspect.signature(getattr(TF, name)).parameters)
        assert b[: len(a)] == a and set(b[len(a):]) <= {"device"}, (name, a, b)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name,i", PARITY_IDS, ids=[f"{n}-{i}" for n, i in PARITY_IDS])
def test_numpy_equals_torch(name, i, seed):
    g = np.random.default_rng(seed)
    args, kwargs, extra = PARITY_CASES[name][i](g)
    out_np = getattr(tnp, name)(*args, **kwargs)
    out_t = getattr(TF, name)(*(_t(a) for a in args), **_t(kwargs), **extra)
    outs = zip(out_np, out_t) if isinstance(out_np, tuple) else [(out_np, out_t)]
    for a, b in outs:
        assert a.shape == tuple(b.shape)
        if a.dtype.kind == "i":
            np.testing.assert_array_equal(_np(b), a)
        else:
            np.testing.assert_allclose(_np(b), a, rtol=0, atol=ATOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtypes_preserved(dtype):
    g = np.random.default_rng(0)
    X = g.standard_normal((2, 5, 8)).astype(dtype)
    p = {k: v.astype(dtype) for k, v in _gqa_params(g, 8, 4, 2).items()}
    s = {k: v.astype(dtype) for k, v in _swiglu_params(g, 8, 12).items()}
    outs = [tnp.rms_norm(X, np.ones(8, dtype)), tnp.silu(X), tnp.gelu_tanh(X), tnp.swiglu(X, s),
            tnp.rope_rotate_half(X), *tnp.rope_attention(X, X, X), *tnp.grouped_query_attention(X, X, p, 4, 2, rope="half")]
    assert all(o.dtype == dtype for o in outs)
    tX = torch.as_tensor(X)
    outs = [TF.rms_norm(tX, torch.ones(8, dtype=tX.dtype)), TF.silu(tX), TF.gelu_tanh(tX), TF.swiglu(tX, _t(s)),
            TF.rope_rotate_half(tX), *TF.rope_attention(tX, tX, tX),
            *TF.grouped_query_attention(tX, tX, _t(p), 4, 2, rope="half")]
    assert all(o.dtype == tX.dtype for o in outs)


# ------------------------------------------------------------------ against PyTorch's built-ins


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_rms_norm_equals_F_rms_norm(eps):
    g = np.random.default_rng(0)
    X, gamma = g.standard_normal((3, 4, 16)) * 5 + 2, g.standard_normal(16)
    ref = F.rms_norm(torch.as_tensor(X), (16,), torch.as_tensor(gamma), eps).numpy()
    np.testing.assert_allclose(tnp.rms_norm(X, gamma, eps), ref, rtol=0, atol=ATOL)
    np.testing.assert_allclose(_np(TF.rms_norm(torch.as_tensor(X), torch.as_tensor(gamma), eps)), ref, rtol=0, atol=ATOL)
    # it is not LayerNorm: with a non-zero mean the two differ by far more than round-off
    assert np.abs(tnp.rms_norm(X, None, eps) - tnp.layer_norm(X, None, None, eps)).max() > 0.1


def test_silu_swiglu_equal_F_silu_reference():
    g = np.random.default_rng(1)
    x = np.concatenate([g.standard_normal(100) * 5, [-800.0, 800.0, 0.0]])  # extremes: no overflow warning
    with np.errstate(over="raise", invalid="raise"):
        np.testing.assert_allclose(tnp.silu(x), F.silu(torch.as_tensor(x)).numpy(), rtol=0, atol=ATOL)
    X, p = g.standard_normal((2, 5, 6)), _swiglu_params(g, 6, 16)
    tX, tp = torch.as_tensor(X), _t(p)
    ref = (F.silu(tX @ tp["W_gate"]) * (tX @ tp["W_up"])) @ tp["W_down"]
    np.testing.assert_allclose(tnp.swiglu(X, p), ref.numpy(), rtol=0, atol=ATOL)
    # the gate and the up projection are not interchangeable: swapping them changes the output
    swapped = {**p, "W_gate": p["W_up"], "W_up": p["W_gate"]}
    assert np.abs(tnp.swiglu(X, swapped) - ref.numpy()).max() > 1e-3


def test_gelu_tanh_equals_F_gelu_tanh_and_its_error_against_exact():
    x = np.linspace(-10, 10, 200_001)
    ref = F.gelu(torch.as_tensor(x), approximate="tanh").numpy()
    np.testing.assert_allclose(tnp.gelu_tanh(x), ref, rtol=0, atol=ATOL)
    np.testing.assert_allclose(_np(TF.gelu_tanh(torch.as_tensor(x))), ref, rtol=0, atol=ATOL)
    err = np.abs(tnp.gelu_tanh(x) - tnp.gelu(x))
    # measured: max |tanh approximation - exact| = 4.7e-4 at |x| = 2.70 (float64, grid step 1e-4)
    assert 4.5e-4 < err.max() < 5e-4
    assert 2.6 < abs(x[err.argmax()]) < 2.8


# ------------------------------------------------------------------ RoPE


def _rope_complex(X, positions, base=10000.0):
    """RoPE as complex multiplication: pair (2i, 2i+1) is the number x_2i + j x_2i+1, times e^{j p w_i}."""
    D = X.shape[-1]
    z = X[..., 0::2] + 1j * X[..., 1::2]
    w = base ** (-np.arange(0, D, 2) / D)
    z = z * np.exp(1j * positions[:, None] * w)
    out = np.empty_like(X)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def test_rope_layouts_equal_after_the_permutation_and_the_closed_form():
    g = np.random.default_rng(2)
    X, pos = g.standard_normal((3, 6, 10)), np.array([0.0, 1, 2, 7, 100, 3000])
    p = tnp.rope_permutation(10)
    assert sorted(p.tolist()) == list(range(10))  # a permutation
    inter = tnp.rope(X, pos)
    np.testing.assert_allclose(inter, _rope_complex(X, pos), rtol=0, atol=1e-12)
    np.testing.assert_allclose(tnp.rope_rotate_half(X[..., p], pos), inter[..., p], rtol=0, atol=1e-12)
    # without the permutation the layouts differ
    assert np.abs(tnp.rope_rotate_half(X, pos) - inter).max() > 0.1
    # Hugging Face's formula: x * cos + rotate_half(x) * sin with cos, sin repeated over the halves
    w = 10000.0 ** (-np.arange(0, 10, 2) / 10)
    th = np.concatenate([pos[:, None] * w] * 2, axis=-1)
    rot = np.concatenate([-X[..., 5:], X[..., :5]], axis=-1)
    np.testing.assert_allclose(tnp.rope_rotate_half(X, pos), X * np.cos(th) + rot * np.sin(th), rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rope_attention_scores_depend_only_on_the_offset(layout):
    g = np.random.default_rng(3)
    q, k, v = g.standard_normal((1, 8)), g.standard_normal((1, 8)), g.standard_normal((1, 3))
    scores = {}
    for m, n in [(0, 0), (5, 5), (40, 40), (3, 0), (10, 7), (103, 100), (0, 3), (7, 10)]:
        _, P = tnp.rope_attention(q, np.vstack([k, k * 0]), np.vstack([v, v]), layout=layout,
                                  q_positions=np.array([m]), k_positions=np.array([n, n]))
        scores[(m, n)] = math.log(P[0, 0] / P[0, 1])  # = score(k) - score(0) = score(k)
    for off in (0, 3, -3):
        vals = [s for (m, n), s in scores.items() if m - n == off]
        assert max(vals) - min(vals) < 1e-12, (off, vals)
    assert abs(scores[(3, 0)] - scores[(0, 0)]) > 1e-3  # the offset does change it
    # the value vectors are not rotated: equal weights give the plain average of V
    Z, _ = tnp.rope_attention(q, np.zeros((2, 8)), np.vstack([v, 2 * v]), layout=layout)
    np.testing.assert_allclose(Z, 1.5 * v, rtol=0, atol=1e-15)


def test_rope_attention_default_positions_are_those_of_a_kv_cache():
    g = np.random.default_rng(4)
    Q, K, V = g.standard_normal((2, 9, 4)), g.standard_normal((2, 9, 4)), g.standard_normal((2, 9, 3))
    full, _ = tnp.rope_attention(Q, K, V, mask=tnp.causal_mask(9))
    last, _ = tnp.rope_attention(Q[:, -2:], K, V, mask=tnp.causal_mask(9)[-2:])
    np.testing.assert_allclose(last, full[:, -2:], rtol=0, atol=1e-12)


# ------------------------------------------------------------------ grouped-query attention


def test_gqa_with_as_many_kv_heads_as_heads_is_multi_head_attention():
    g = np.random.default_rng(5)
    X, Y, mask = g.standard_normal((2, 5, 8)), g.standard_normal((2, 7, 8)), _bool(g, (2, 5, 7))
    p = _gqa_params(g, 8, 4, 4, bias=True)
    Z, P = tnp.grouped_query_attention(X, Y, p, 4, 4, mask=mask)
    Z2, P2 = tnp.multi_head_attention(X, Y, p, 4, mask=mask)
    np.testing.assert_allclose(Z, Z2, rtol=0, atol=ATOL)
    np.testing.assert_allclose(P, P2, rtol=0, atol=ATOL)


@pytest.mark.parametrize("H_kv", [4, 2, 1])
def test_gqa_equals_sdpa_enable_gqa(H_kv):
    g = np.random.default_rng(6)
    B, T, D, H = 2, 6, 16, 4
    X, p = torch.as_tensor(g.standard_normal((B, T, D))), _t(_gqa_params(g, D, H, H_kv))
    mask = TF.causal_mask(T)
    Q = (X @ p["W_Q"]).view(B, T, H, D // H).transpose(1, 2)  # (B, H, T, D_K)
    K = (X @ p["W_K"]).view(B, T, H_kv, D // H).transpose(1, 2)  # (B, H_kv, T, D_K)
    V = (X @ p["W_V"]).view(B, T, H_kv, D // H).transpose(1, 2)
    Zh = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, enable_gqa=True)
    ref = (Zh.transpose(1, 2).reshape(B, T, D) @ p["W_O"]).numpy()
    Z_np, _ = tnp.grouped_query_attention(X.numpy(), X.numpy(), {k: v.numpy() for k, v in p.items()}, H, H_kv,
                                          mask=mask.numpy())
    np.testing.assert_allclose(Z_np, ref, rtol=0, atol=ATOL)
    from tfbook.torch.functional.modern import _grouped_query_attention

    Z_fused, P = _grouped_query_attention(X, X, p, H, H_kv, mask=mask, return_attention=False)
    assert P is None
    np.testing.assert_allclose(Z_fused.numpy(), ref, rtol=0, atol=ATOL)


def test_gqa_head_grouping_is_consecutive_and_mqa_shares_one_head():
    g = np.random.default_rng(7)
    X, p = g.standard_normal((1, 5, 8)), _gqa_params(g, 8, 4, 2)
    _, P = tnp.grouped_query_attention(X, X, p, 4, 2)
    # heads 0 and 1 read kv head 0: with equal query weights their weights coincide
    p_same = {**p, "W_Q": p["W_Q"].copy()}
    p_same["W_Q"][:, 2:4] = p_same["W_Q"][:, 0:2]  # query head 1 := query head 0
    _, P2 = tnp.grouped_query_attention(X, X, p_same, 4, 2)
    np.testing.assert_allclose(P2[0, 1], P2[0, 0], rtol=0, atol=1e-15)
    p_other = {**p, "W_Q": p["W_Q"].copy()}
    p_other["W_Q"][:, 4:6] = p_other["W_Q"][:, 0:2]  # query head 2 := query head 0, but another group
    _, P3 = tnp.grouped_query_attention(X, X, p_other, 4, 2)
    assert np.abs(P3[0, 2] - P3[0, 0]).max() > 1e-3
    # multi-query: one key/value head of width D_K = D / H
    pm = _gqa_params(g, 8, 4, 1)
    assert pm["W_K"].shape == (8, 2)
    Z, P = tnp.grouped_query_attention(X, X, pm, 4, 1, rope="interleaved")
    assert Z.shape == (1, 5, 8) and P.shape == (1, 4, 5, 5)


def test_gqa_fully_masked_row_gives_zeros():
    g = np.random.default_rng(8)
    X, p = g.standard_normal((1, 4, 8)), _gqa_params(g, 8, 4, 2, bias=False)
    mask = np.ones((4, 4), bool)
    mask[2] = False
    Z, P = tnp.grouped_query_attention(X, X, p, 4, 2, mask=mask)
    assert np.all(P[0, :, 2] == 0) and np.all(Z[0, 2] == 0)
    from tfbook.torch.functional.modern import _grouped_query_attention

    Zf, _ = _grouped_query_attention(torch.as_tensor(X), torch.as_tensor(X), _t(p), 4, 2, torch.as_tensor(mask),
                                     return_attention=False)
    np.testing.assert_allclose(Zf.numpy(), Z, rtol=0, atol=ATOL)


def test_gradcheck():
    g = np.random.default_rng(9)

    def leaf(*shape):
        return torch.tensor(g.standard_normal(shape), requires_grad=True)

    X = leaf(2, 3, 4)
    assert torch.autograd.gradcheck(lambda X, w: TF.rms_norm(X, w), (X, leaf(4)))
    assert torch.autograd.gradcheck(lambda X: TF.gelu_tanh(X) + TF.silu(X), (X,))
    assert torch.autograd.gradcheck(lambda X, a, b, c: TF.swiglu(X, {"W_gate": a, "W_up": b, "W_down": c}),
                                    (X, leaf(4, 6), leaf(4, 6), leaf(6, 4)))
    assert torch.autograd.gradcheck(lambda Q, K: TF.rope_attention(Q, K, K, layout="half")[0], (X, leaf(2, 3, 4)))
    p = {k: torch.tensor(v, requires_grad=True) for k, v in _gqa_params(g, 4, 2, 1).items()}
    keys = sorted(p)
    assert torch.autograd.gradcheck(
        lambda X, *w: TF.grouped_query_attention(X, X, dict(zip(keys, w)), 2, 1, rope="interleaved")[0],
        (X, *[p[k] for k in keys]))
