"""tfbook.numpy == tfbook.torch for every public function, on every available device.

Both backends are fed the same float64 inputs; outputs must agree to float64
round-off. Also: both expose the same public function names, dtypes are preserved,
and gradients pass torch.autograd.gradcheck.
"""

import inspect

import numpy as np
import pytest
import torch

import tfbook.numpy as tnp
import tfbook.torch as tt
from tfbook.torch import functional as TF

from conftest import random_decoder_params, random_encoder_params, random_ffn_params, random_mha_params

import error_cases_training
import test_experts
import test_modern_functions
import test_serving

ATOL = 1e-12  # float64 round-off (different summation orders in NumPy and torch)

# Public NumPy functions with no torch twin of their own: name -> (the torch function computing
# the same thing, which the parity and error tests compare against, and the reason).
NUMPY_ONLY = {
    "blocked_attention": (
        "scaled_dot_product_attention",
        "a CPU/NumPy speed-up of the reference (query blocks sized for the L2 cache, run on a thread "
        "pool while NumPy releases the GIL); in PyTorch that job is done by its own kernels",
    ),
}


def _public_functions(mod):
    return {n for n in mod.__all__ if inspect.isfunction(getattr(mod, n))}


def _twin(name):
    """The torch function that a NumPy public function is compared with."""
    return NUMPY_ONLY[name][0] if name in NUMPY_ONLY else name


def test_same_public_function_names():
    np_names, torch_names = _public_functions(tnp), _public_functions(TF)
    assert set(NUMPY_ONLY) <= np_names and not set(NUMPY_ONLY) & torch_names  # the exemptions are current
    assert np_names - set(NUMPY_ONLY) == torch_names, (np_names ^ torch_names)
    assert all(reason for _, reason in NUMPY_ONLY.values())
    # and the package re-exports every torch function
    assert torch_names <= set(tt.__all__)
    for name in torch_names:
        assert getattr(tt, name) is getattr(TF, name)


def test_same_argument_names():
    for name in _public_functions(tnp):
        a = list(inspect.signature(getattr(tnp, name)).parameters)
        b = list(inspect.signature(getattr(TF, _twin(name))).parameters)
        # torch may add trailing device= (and takes dtype in torch form); the shared prefix is identical
        assert b[: len(a)] == a, (name, a, b)
        assert set(b[len(a):]) <= {"device"}, (name, b)


def _bool(rng, shape, p=0.7):
    return rng.random(shape) < p


def _cases():
    """name -> list of builders; a builder takes rng and returns (args, kwargs, torch_extra_kwargs)."""
    r = np.random.default_rng
    C = {}
    C["softmax"] = [
        lambda g: ((g.standard_normal((3, 4, 5)) * 5,), {}, {}),
        lambda g: ((g.standard_normal((3, 4, 5)),), {"axis": 0}, {}),
    ]

    def sdpa(g, masked=True, scale=None):
        Q, K, V = g.standard_normal((2, 3, 5, 4)), g.standard_normal((2, 3, 7, 4)), g.standard_normal((2, 3, 7, 6))
        m = _bool(g, (5, 7))
        m[1] = False  # a query that may attend to nothing
        return (Q, K, V), {"mask": m if masked else None, "scale": scale}, {}

    C["scaled_dot_product_attention"] = [sdpa, lambda g: sdpa(g, False, 0.3)]
    C["blocked_attention"] = C["scaled_dot_product_attention"]  # compared with the torch reference
    C["additive_attention"] = [
        lambda g: ((g.standard_normal((2, 5, 4)), g.standard_normal((2, 6, 3)), g.standard_normal((2, 6, 2)),
                    g.standard_normal((4, 8)), g.standard_normal((3, 8)), g.standard_normal(8)),
                   {"mask": _bool(g, (2, 5, 6))}, {}),
    ]
    C["causal_mask"] = [lambda g: ((5,), {}, {})]
    C["padding_mask"] = [lambda g: ((np.array([3, 0, 5]), 5), {}, {})]
    C["attention_mask_from_padding"] = [lambda g: ((_bool(g, (3, 5)),), {}, {})]
    C["sliding_window_mask"] = [lambda g: ((6, 2), {}, {}), lambda g: ((4, 9), {}, {})]
    C["split_heads"] = [lambda g: ((g.standard_normal((2, 5, 8)), 2), {}, {})]
    C["merge_heads"] = [lambda g: ((g.standard_normal((2, 2, 5, 4)),), {}, {})]

    def mha(g, bias=True, mask_shape=(2, 5, 7)):
        m = _bool(g, mask_shape)
        return ((g.standard_normal((2, 5, 8)), g.standard_normal((2, 7, 8)), random_mha_params(g, 8, bias), 2),
                {"mask": m}, {})

    C["multi_head_attention"] = [mha, lambda g: mha(g, False, (5, 7)), lambda g: mha(g, True, (2, 2, 5, 7))]
    C["one_hot"] = [lambda g: ((g.integers(0, 7, (2, 5)), 7), {}, {"dtype": torch.float64})]
    C["embedding_lookup"] = [lambda g: ((g.integers(0, 7, (2, 5)), g.standard_normal((7, 3))), {}, {})]
    f64 = {"dtype": torch.float64}
    C["sinusoidal_positional_encoding"] = [lambda g: ((9, 8), {}, f64), lambda g: ((4, 6), {"base": 100.0}, f64)]
    C["sinusoidal_shift_matrix"] = [lambda g: ((3, 8), {}, f64), lambda g: ((-2.5, 4), {"base": 50.0}, f64)]
    C["sinusoidal_positional_encoding_2d"] = [lambda g: ((3, 4, 8), {}, f64)]
    C["learned_positional_embedding"] = [lambda g: ((g.standard_normal((2, 5, 4)), g.standard_normal((9, 4))), {}, {})]
    C["rope"] = [
        lambda g: ((g.standard_normal((2, 5, 6)),), {}, {}),
        lambda g: ((g.standard_normal((2, 5, 6)),), {"positions": np.array([3, 1, 4, 1, 5]), "base": 100.0}, {}),
    ]
    C["layer_norm"] = [lambda g: ((g.standard_normal((2, 5, 6)) * 3 + 1, g.standard_normal(6), g.standard_normal(6)), {}, {})]
    C["relu"] = [lambda g: ((g.standard_normal((4, 5)),), {}, {})]
    C["gelu"] = [lambda g: ((g.standard_normal((4, 5)) * 3,), {}, {})]
    C["feed_forward"] = [
        lambda g, a=a: ((g.standard_normal((2, 5, 6)), random_ffn_params(g, 6, 12)), {"activation": a}, {})
        for a in ("relu", "gelu")
    ]
    C["encoder_block"] = [
        lambda g, nf=nf, a=a: ((g.standard_normal((2, 5, 8)), random_encoder_params(g, 8, 16), 2),
                               {"norm_first": nf, "activation": a, "mask": tnp.causal_mask(5)}, {})
        for nf in (False, True) for a in ("relu", "gelu")
    ]
    C["decoder_block"] = [
        lambda g, nf=nf: ((g.standard_normal((2, 5, 8)), g.standard_normal((2, 6, 8)), random_decoder_params(g, 8, 16), 4),
                          {"norm_first": nf, "activation": "gelu", "self_mask": tnp.causal_mask(5),
                           "cross_mask": _bool(g, (2, 1, 6))}, {})
        for nf in (False, True)
    ]
    C["patchify"] = [lambda g: ((g.standard_normal((2, 3, 8, 12)), 4), {}, {})]
    C["unpatchify"] = [lambda g: ((g.standard_normal((2, 6, 48)), 4, (3, 8, 12)), {}, {})]
    C["attention_rollout"] = [
        lambda g, res=res: (([tnp.softmax(g.standard_normal((2, 3, 5, 5))) for _ in range(3)],), {"residual": res}, {})
        for res in (True, False)
    ]
    C["kv_cache_append"] = [
        lambda g: ((None, g.standard_normal((2, 1, 4)), g.standard_normal((2, 1, 3))), {}, {}),
        lambda g: (((g.standard_normal((2, 3, 4)), g.standard_normal((2, 3, 3))),
                    g.standard_normal((2, 1, 4)), g.standard_normal((2, 1, 3))), {}, {}),
    ]
    C["tiled_attention"] = [
        lambda g, c=c: ((g.standard_normal((2, 9, 4)), g.standard_normal((2, 9, 4)), g.standard_normal((2, 9, 3))),
                        {"block_size": 4, "causal": c}, {})
        for c in (False, True)
    ]
    C["linear_attention"] = [
        lambda g, c=c: ((g.standard_normal((2, 7, 4)), g.standard_normal((2, 7, 4)), g.standard_normal((2, 7, 3))),
                        {"causal": c}, {})
        for c in (False, True)
    ]
    del r
    # the training and modern-decoder chapters keep their cases next to their error cases
    C.update(error_cases_training.PARITY_CASES)
    C.update(test_modern_functions.PARITY_CASES)
    C.update(test_serving.BACKEND_PARITY_CASES)
    C.update(test_experts.PARITY_CASES)
    return C


CASES = _cases()
CASE_IDS = [(name, i) for name, builders in CASES.items() for i in range(len(builders))]


def _to_torch(obj, device):
    if isinstance(obj, np.ndarray):
        return torch.as_tensor(obj, device=device)
    if isinstance(obj, dict):
        return {k: _to_torch(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_torch(v, device) for v in obj)
    return obj


def _assert_same(a_np, a_t):
    if isinstance(a_np, dict):  # chapter 19's routing record
        assert isinstance(a_t, dict) and set(a_np) == set(a_t)
        for k in a_np:
            _assert_same(a_np[k], a_t[k])
        return
    if isinstance(a_np, (int, np.integer)) and not isinstance(a_np, np.ndarray):  # a count
        assert int(a_np) == int(a_t)
        return
    if isinstance(a_np, tuple):
        assert isinstance(a_t, tuple) and len(a_np) == len(a_t)
        for x, y in zip(a_np, a_t):
            _assert_same(x, y)
        return
    y = a_t.detach().cpu().numpy()
    assert y.shape == a_np.shape
    if a_np.dtype == bool:
        assert y.dtype == bool
        np.testing.assert_array_equal(y, a_np)
    else:
        assert np.all(np.isfinite(a_np))
        np.testing.assert_allclose(y, a_np, rtol=0, atol=ATOL)


def test_every_function_has_a_parity_case():
    assert set(CASES) == _public_functions(tnp)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name,i", CASE_IDS, ids=[f"{n}-{i}" for n, i in CASE_IDS])
def test_numpy_equals_torch(name, i, seed, device):
    g = np.random.default_rng(seed)
    args, kwargs, torch_extra = CASES[name][i](g)
    out_np = getattr(tnp, name)(*args, **kwargs)
    if name in ("causal_mask", "sliding_window_mask", "rope_permutation", "rope_frequencies"):
        torch_extra = {**torch_extra, "device": device}
    if name.startswith("sinusoidal"):
        torch_extra = {**torch_extra, "device": device}
    out_t = getattr(TF, _twin(name))(*_to_torch(args, device), **_to_torch(kwargs, device), **torch_extra)
    for o in out_t if isinstance(out_t, tuple) else (out_t,):
        if isinstance(o, torch.Tensor):  # (a count or a routing record is not a tensor)
            assert o.device.type == device.type  # runs where its inputs live
    _assert_same(out_np, out_t)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtypes_preserved(dtype):
    g = np.random.default_rng(0)
    Q, K, V = (g.standard_normal((2, 6, 4)).astype(dtype) for _ in range(3))
    tdt = torch.float32 if dtype == np.float32 else torch.float64
    outs_np = [*tnp.scaled_dot_product_attention(Q, K, V), *tnp.blocked_attention(Q, K, V), tnp.softmax(Q),
               tnp.tiled_attention(Q, K, V, 4),
               tnp.rope(Q), tnp.gelu(Q), tnp.layer_norm(Q, None, None), tnp.linear_attention(Q, K, V),
               tnp.multi_head_attention(Q, K, {k: v.astype(dtype) for k, v in random_mha_params(g, 4).items()}, 2)[0]]
    for o in outs_np:
        assert o.dtype == dtype
    tQ, tK, tV = (torch.as_tensor(a) for a in (Q, K, V))
    outs_t = [*TF.scaled_dot_product_attention(tQ, tK, tV), TF.softmax(tQ), TF.tiled_attention(tQ, tK, tV, 4),
              TF.rope(tQ), TF.gelu(tQ), TF.layer_norm(tQ, None, None), TF.linear_attention(tQ, tK, tV)]
    for o in outs_t:
        assert o.dtype == tdt


# ---------------------------------------------------------------------------
# gradcheck (float64, small sizes)
# ---------------------------------------------------------------------------


def _t(g, *shape):
    return torch.tensor(g.standard_normal(shape), dtype=torch.float64, requires_grad=True)


def _leaves(params):
    return {k: (None if v is None else torch.tensor(v, requires_grad=True)) for k, v in params.items()}


def test_gradcheck_softmax_attention_rope_tiled():
    g = np.random.default_rng(0)
    x = _t(g, 3, 5)
    assert torch.autograd.gradcheck(lambda x: TF.softmax(x), (x,))
    Q, K, V = _t(g, 2, 4, 3), _t(g, 2, 5, 3), _t(g, 2, 5, 2)
    mask = torch.as_tensor(_bool(g, (4, 5)))
    assert torch.autograd.gradcheck(lambda Q, K, V: TF.scaled_dot_product_attention(Q, K, V, mask=mask), (Q, K, V))
    assert torch.autograd.gradcheck(lambda X: TF.rope(X), (_t(g, 2, 4, 6),))
    Qs, Ks, Vs = _t(g, 7, 3), _t(g, 7, 3), _t(g, 7, 2)
    for causal in (False, True):
        assert torch.autograd.gradcheck(lambda Q, K, V: TF.tiled_attention(Q, K, V, 3, causal), (Qs, Ks, Vs))


def test_gradcheck_mha_norm_ffn():
    g = np.random.default_rng(1)
    p = _leaves(random_mha_params(g, 4))
    X, Y = _t(g, 2, 3, 4), _t(g, 2, 5, 4)
    keys = sorted(p)
    fn = lambda X, Y, *w: TF.multi_head_attention(X, Y, dict(zip(keys, w)), 2)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (X, Y, *[p[k] for k in keys]))
    gamma, beta = _t(g, 4), _t(g, 4)
    assert torch.autograd.gradcheck(lambda X, a, b: TF.layer_norm(X, a, b), (X, gamma, beta))
    f = _leaves(random_ffn_params(g, 4, 6))
    for act in ("relu", "gelu"):
        assert torch.autograd.gradcheck(
            lambda X, W1, b1, W2, b2: TF.feed_forward(X, {"W_1": W1, "b_1": b1, "W_2": W2, "b_2": b2}, act),
            (X, f["W_1"], f["b_1"], f["W_2"], f["b_2"]))


@pytest.mark.parametrize("norm_first", [False, True])
def test_gradcheck_blocks(norm_first):
    g = np.random.default_rng(2)
    enc = _to_torch(random_encoder_params(g, 4, 6), "cpu")
    dec = _to_torch(random_decoder_params(g, 4, 6), "cpu")
    X, M = _t(g, 1, 3, 4), _t(g, 1, 4, 4)
    enc["attn"]["W_Q"].requires_grad_(True)
    dec["cross_attn"]["W_K"].requires_grad_(True)
    causal = TF.causal_mask(3)
    assert torch.autograd.gradcheck(
        lambda X, W: TF.encoder_block(X, {**enc, "attn": {**enc["attn"], "W_Q": W}}, 2, norm_first, "gelu", causal),
        (X, enc["attn"]["W_Q"]))
    assert torch.autograd.gradcheck(
        lambda X, M, W: TF.decoder_block(X, M, {**dec, "cross_attn": {**dec["cross_attn"], "W_K": W}}, 2,
                                         norm_first, "relu", causal),
        (X, M, dec["cross_attn"]["W_K"]))
