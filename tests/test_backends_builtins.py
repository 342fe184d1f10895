"""Both backends against PyTorch's own built-ins, with copied weights.

Weights are copied by hand here (not through tfbook's from_torch helpers), so these
tests are independent of the module classes. Mask convention: ours is True = may
attend; nn.MultiheadAttention and nn.Transformer*Layer take True = blocked, so they
get ``~mask``.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tfbook.numpy as tnp
from tfbook.torch import functional as TF

ATOL = 1e-10  # float64; the built-ins use fused kernels and another summation order


def _np(t):
    return t.detach().cpu().numpy()


def _mha_params(m: nn.MultiheadAttention):
    """nn.MultiheadAttention -> API.md dict. in_proj_weight is (3D, D) in out x in layout."""
    D = m.embed_dim
    W, b = _np(m.in_proj_weight), _np(m.in_proj_bias)
    return {
        "W_Q": W[:D].T, "W_K": W[D:2 * D].T, "W_V": W[2 * D:].T, "W_O": _np(m.out_proj.weight).T,
        "b_Q": b[:D], "b_K": b[D:2 * D], "b_V": b[2 * D:], "b_O": _np(m.out_proj.bias),
    }


def _ffn_params(layer):
    return {"W_1": _np(layer.linear1.weight).T, "b_1": _np(layer.linear1.bias),
            "W_2": _np(layer.linear2.weight).T, "b_2": _np(layer.linear2.bias)}


def _norm_params(ln):
    return {"gamma": _np(ln.weight), "beta": _np(ln.bias)}


def _randomise(module, seed):
    """Replace every parameter (biases and norms included) by random values, so none is trivially 0 or 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return module


def _to_t(tree):
    if isinstance(tree, dict):
        return {k: _to_t(v) for k, v in tree.items()}
    return torch.as_tensor(tree)


def _mask(g, shape):
    m = g.random(shape) < 0.6
    m[..., 0] = True  # keep at least one key per query: the built-ins give NaN for empty rows
    return m


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "causal"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7, 4, 6), (1, 1, 8, 8, 16, 16)])
def test_sdpa_vs_builtin(shape, mask_kind, seed):
    B, H, T_q, T_k, D_K, D_V = shape
    g = np.random.default_rng(seed)
    Q, K, V = g.standard_normal((B, H, T_q, D_K)), g.standard_normal((B, H, T_k, D_K)), g.standard_normal((B, H, T_k, D_V))
    tQ, tK, tV = (torch.as_tensor(a) for a in (Q, K, V))
    if mask_kind == "none":
        mask, ref = None, F.scaled_dot_product_attention(tQ, tK, tV)
    elif mask_kind == "bool":
        mask = _mask(g, (B, 1, T_q, T_k))
        ref = F.scaled_dot_product_attention(tQ, tK, tV, attn_mask=torch.as_tensor(mask))
    else:
        mask = np.tril(np.ones((T_q, T_k), bool))  # is_causal is top-left aligned
        ref = F.scaled_dot_product_attention(tQ, tK, tV, is_causal=True)
    Z_np, P_np = tnp.scaled_dot_product_attention(Q, K, V, mask=mask)
    Z_t, P_t = TF.scaled_dot_product_attention(tQ, tK, tV, mask=None if mask is None else torch.as_tensor(mask))
    np.testing.assert_allclose(Z_np, _np(ref), rtol=0, atol=ATOL)
    np.testing.assert_allclose(_np(Z_t), _np(ref), rtol=0, atol=ATOL)
    # the weights against torch.softmax of independently masked scores
    S = tQ @ tK.transpose(-1, -2) / np.sqrt(D_K)
    if mask is not None:
        S = S.masked_fill(~torch.as_tensor(mask), float("-inf"))
    np.testing.assert_allclose(P_np, _np(torch.softmax(S, -1)), rtol=0, atol=ATOL)
    if mask_kind == "causal":
        np.testing.assert_allclose(tnp.tiled_attention(Q, K, V, 3, causal=True), _np(ref), rtol=0, atol=ATOL)
        np.testing.assert_allclose(_np(TF.tiled_attention(tQ, tK, tV, 3, causal=True)), _np(ref), rtol=0, atol=ATOL)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("B,T_q,T_kv,D,H", [(2, 5, 7, 8, 2), (1, 4, 4, 12, 3), (3, 6, 2, 8, 8)])
@pytest.mark.parametrize("masked", [False, True])
def test_mha_vs_nn_multihead_attention(B, T_q, T_kv, D, H, masked, seed):
    torch.manual_seed(seed)
    m = _randomise(nn.MultiheadAttention(D, H, batch_first=True, dtype=torch.float64), seed).eval()
    g = np.random.default_rng(seed)
    X_q, X_kv = g.standard_normal((B, T_q, D)), g.standard_normal((B, T_kv, D))
    mask = _mask(g, (T_q, T_kv)) if masked else None
    kw = {} if mask is None else {"attn_mask": torch.as_tensor(~mask)}  # their True = blocked
    with torch.no_grad():
        ref_Z, ref_P = m(torch.as_tensor(X_q), torch.as_tensor(X_kv), torch.as_tensor(X_kv),
                         average_attn_weights=False, **kw)
    params = _mha_params(m)
    Z, P = tnp.multi_head_attention(X_q, X_kv, params, H, mask=mask)
    np.testing.assert_allclose(Z, _np(ref_Z), rtol=0, atol=ATOL)
    np.testing.assert_allclose(P, _np(ref_P), rtol=0, atol=ATOL)
    Zt, Pt = TF.multi_head_attention(torch.as_tensor(X_q), torch.as_tensor(X_kv), _to_t(params), H,
                                     mask=None if mask is None else torch.as_tensor(mask))
    np.testing.assert_allclose(_np(Zt), _np(ref_Z), rtol=0, atol=ATOL)
    np.testing.assert_allclose(_np(Pt), _np(ref_P), rtol=0, atol=ATOL)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_layer_norm_vs_builtin(eps, seed):
    g = np.random.default_rng(seed)
    X = g.standard_normal((2, 5, 6)) * 4 + 2
    ln = _randomise(nn.LayerNorm(6, eps=eps, dtype=torch.float64), seed)
    ref = _np(ln(torch.as_tensor(X)))
    p = _norm_params(ln)
    np.testing.assert_allclose(tnp.layer_norm(X, p["gamma"], p["beta"], eps), ref, rtol=0, atol=ATOL)
    np.testing.assert_allclose(_np(TF.layer_norm(torch.as_tensor(X), ln.weight, ln.bias, eps)), ref, rtol=0, atol=ATOL)


def test_activations_vs_builtin():
    x = np.linspace(-6, 6, 101)
    np.testing.assert_allclose(tnp.gelu(x), _np(F.gelu(torch.as_tensor(x))), rtol=0, atol=1e-14)  # float64 erf
    np.testing.assert_array_equal(tnp.relu(x), _np(F.relu(torch.as_tensor(x))))


def _encoder_params(layer):
    return {"attn": _mha_params(layer.self_attn), "ffn": _ffn_params(layer),
            "norm1": _norm_params(layer.norm1), "norm2": _norm_params(layer.norm2)}


def _decoder_params(layer):
    return {"self_attn": _mha_params(layer.self_attn), "cross_attn": _mha_params(layer.multihead_attn),
            "ffn": _ffn_params(layer), "norm1": _norm_params(layer.norm1),
            "norm2": _norm_params(layer.norm2), "norm3": _norm_params(layer.norm3)}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "random"])
def test_encoder_block_vs_builtin(norm_first, activation, mask_kind, seed):
    B, T, D, H, D_ff = 2, 6, 8, 2, 16
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(D, H, D_ff, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first, dtype=torch.float64)
    _randomise(layer, seed).eval()
    g = np.random.default_rng(seed)
    X = g.standard_normal((B, T, D))
    mask = {"none": None, "causal": tnp.causal_mask(T), "random": _mask(g, (T, T))}[mask_kind]
    with torch.no_grad():
        ref = _np(layer(torch.as_tensor(X), src_mask=None if mask is None else torch.as_tensor(~mask)))
    p = _encoder_params(layer)
    out = tnp.encoder_block(X, p, H, norm_first=norm_first, activation=activation, mask=mask)
    np.testing.assert_allclose(out, ref, rtol=0, atol=ATOL)
    out_t = TF.encoder_block(torch.as_tensor(X), _to_t(p), H, norm_first, activation,
                             None if mask is None else torch.as_tensor(mask))
    np.testing.assert_allclose(_np(out_t), ref, rtol=0, atol=ATOL)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("masked", [False, True])
def test_decoder_block_vs_builtin(norm_first, activation, masked, seed):
    B, T, T_m, D, H, D_ff = 2, 5, 7, 8, 4, 12
    torch.manual_seed(seed)
    layer = nn.TransformerDecoderLayer(D, H, D_ff, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first, dtype=torch.float64)
    _randomise(layer, seed).eval()
    g = np.random.default_rng(seed)
    X, M = g.standard_normal((B, T, D)), g.standard_normal((B, T_m, D))
    self_mask = tnp.causal_mask(T) if masked else None
    cross_mask = _mask(g, (T, T_m)) if masked else None
    kw = {} if not masked else {"tgt_mask": torch.as_tensor(~self_mask), "memory_mask": torch.as_tensor(~cross_mask)}
    with torch.no_grad():
        ref = _np(layer(torch.as_tensor(X), torch.as_tensor(M), **kw))
    p = _decoder_params(layer)
    out = tnp.decoder_block(X, M, p, H, norm_first, activation, self_mask, cross_mask)
    np.testing.assert_allclose(out, ref, rtol=0, atol=ATOL)
    tm = (lambda m: None if m is None else torch.as_tensor(m))
    out_t = TF.decoder_block(torch.as_tensor(X), torch.as_tensor(M), _to_t(p), H, norm_first, activation,
                             tm(self_mask), tm(cross_mask))
    np.testing.assert_allclose(_np(out_t), ref, rtol=0, atol=ATOL)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("B,C,H,W,p,D", [(2, 3, 8, 12, 4, 5), (1, 1, 8, 8, 2, 3), (3, 2, 6, 6, 3, 7)])
def test_patchify_matmul_equals_strided_conv(B, C, H, W, p, D, seed):
    g = np.random.default_rng(seed)
    x, Wc, b = g.standard_normal((B, C, H, W)), g.standard_normal((D, C, p, p)), g.standard_normal(D)
    conv = F.conv2d(torch.as_tensor(x), torch.as_tensor(Wc), torch.as_tensor(b), stride=p)  # (B, D, H/p, W/p)
    ref = _np(conv.flatten(2).transpose(1, 2))  # (B, N, D), row-major patch order
    W_mat = Wc.reshape(D, -1).T  # (C*p*p, D)
    np.testing.assert_allclose(tnp.patchify(x, p) @ W_mat + b, ref, rtol=0, atol=ATOL)
    out_t = TF.patchify(torch.as_tensor(x), p) @ torch.as_tensor(W_mat) + torch.as_tensor(b)
    np.testing.assert_allclose(_np(out_t), ref, rtol=0, atol=ATOL)
