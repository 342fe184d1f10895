"""tfbook.torch.modules against PyTorch's built-in layers, tfbook.numpy and gradcheck.

Tolerances
----------
Everything here runs in float64. Two implementations of the same formula differ only
by the order of floating-point operations (PyTorch fuses the three input projections
into one matmul, its kernels block the sums differently), which costs a few units of
float64 round-off (~1e-16 relative) per operation. ``ATOL = 1e-12`` leaves a margin of
about a thousand over the largest difference measured in this file (1.3e-15), while a
real mistake (a transposed weight, a wrong eps, the wrong activation or LayerNorm
placement) moves outputs by 1e-6 or much more.
"""

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

import tfbook.numpy as tnp
from tfbook.torch import functional as TF
from tfbook.torch.modules import (
    DecoderBlock,
    EncoderBlock,
    FeedForward,
    KVCache,
    LayerNorm,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    PatchEmbedding,
    SinusoidalPositionalEncoding,
)

ATOL = 1e-12  # float64 round-off, see the module docstring
DT = torch.float64


def close(a, b, atol=ATOL):
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=0, atol=atol)


def key_valid(B, T, seed):
    """(B, T) validity with padding at the end; every sequence keeps at least one token."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T  # at least one full row
    lengths[-1] = max(1, T - 2)  # at least one padded row
    return torch.arange(T)[None, :] < lengths[:, None]


# --- MultiHeadAttention ------------------------------------------------------------------

MHA_CASES = [
    # B, T_q, T_kv, D, H, bias, seed
    (2, 5, 5, 16, 4, True, 0),
    (3, 4, 7, 12, 3, True, 1),
    (1, 6, 6, 8, 1, False, 2),
    (2, 3, 9, 32, 8, False, 3),
]


@pytest.mark.parametrize("B, T_q, T_kv, D, H, bias, seed", MHA_CASES)
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding", "random"])
def test_mha_from_torch_matches(B, T_q, T_kv, D, H, bias, seed, mask_kind):
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(D, H, bias=bias, batch_first=True, dtype=DT)
    if bias:  # torch starts its biases at zero; make them count
        with torch.no_grad():
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    ours = MultiHeadAttention.from_torch(ref)
    assert ours.W_Q.dtype == DT and ours.num_heads == H and ours.bias == bias
    X_q = torch.randn(B, T_q, D, dtype=DT)
    X_kv = X_q if T_q == T_kv else torch.randn(B, T_kv, D, dtype=DT)

    mask = attn_mask = key_padding = None
    if mask_kind == "causal":
        # the queries are the last T_q of T_kv positions (as with a KV cache)
        mask = torch.ones(T_q, T_kv, dtype=torch.bool).tril(diagonal=T_kv - T_q)
        attn_mask = ~mask  # torch: True = blocked
    elif mask_kind == "padding":
        valid = key_valid(B, T_kv, seed)
        mask = valid[:, None, :]  # (B, 1, T_kv), ours: True = may attend
        key_padding = ~valid
    elif mask_kind == "random":
        g = torch.Generator().manual_seed(seed + 100)
        mask = torch.rand(T_q, T_kv, generator=g) < 0.6
        mask[:, 0] = True  # no query row may be fully blocked (torch would give NaN)
        attn_mask = ~mask

    Z_ref, P_ref = ref(X_q, X_kv, X_kv, attn_mask=attn_mask, key_padding_mask=key_padding,
                       need_weights=True, average_attn_weights=False)
    Z, P = ours(X_q, None if X_kv is X_q else X_kv, mask=mask)
    assert Z.shape == (B, T_q, D) and P.shape == (B, H, T_q, T_kv)
    close(Z, Z_ref)
    close(P, P_ref)

    # the NumPy reference with the exported parameters
    params = ours.numpy_params()
    assert all(v.dtype == np.float64 for v in params.values() if v is not None)
    assert (params["b_Q"] is None) == (not bias)
    Z_np, P_np = tnp.multi_head_attention(
        X_q.numpy(), X_kv.numpy(), params, H, mask=None if mask is None else mask.numpy()
    )
    close(Z_np, Z)
    close(P_np, P)


@pytest.mark.parametrize("return_attention", [True, False], ids=["textbook", "fused"])
def test_mha_row_with_nothing_to_attend_is_zero_not_nan(return_attention):
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2).double()
    with torch.no_grad():
        m.b_O.normal_()
    X = torch.randn(1, 3, 8, dtype=DT)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False  # query 1 may attend to nothing
    Z, P = m(X, mask=mask, return_attention=return_attention)
    assert torch.isfinite(Z).all()
    if return_attention:
        assert torch.all(P[:, :, 1] == 0)
    close(Z[0, 1], m.b_O)  # zero attention output, then only the output bias remains


def test_mha_kv_cache_equals_full_causal():
    torch.manual_seed(1)
    B, T, D, H = 2, 6, 16, 4
    m = MultiHeadAttention(D, H).double()
    X = torch.randn(B, T, D, dtype=DT)
    # causal, and in sequence 1 key 1 is blocked as well: a mask that differs per sequence
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[1, 1] = False
    M = TF.causal_mask(T) & valid[:, None, :]  # (B, T, T)
    Z_full, _ = m(X, mask=M)
    cache = KVCache()
    Z_parts = [m(X[:, :3], mask=M[:, :3, :3], kv_cache=cache)[0]]  # a prefill of 3 tokens
    for t in range(3, T):  # then one token at a time
        Z_parts.append(m(X[:, t:t + 1], mask=M[:, t:t + 1, :t + 1], kv_cache=cache)[0])
        assert len(cache) == t + 1
    close(torch.cat(Z_parts, dim=1), Z_full)
    with pytest.raises(ValueError, match="self-attention"):
        m(X[:, :1], X, kv_cache=cache)


def test_layer_norm_from_torch():
    torch.manual_seed(0)
    ref = nn.LayerNorm(6, eps=1e-6, dtype=DT)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
    ours = LayerNorm.from_torch(ref)
    X = torch.randn(2, 3, 6, dtype=DT)
    assert ours.eps == 1e-6
    close(ours(X), ref(X))


def test_mha_from_torch_rejects_unsupported():
    with pytest.raises(ValueError, match="kdim"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, kdim=4, vdim=4))
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))


def test_mha_bad_input():
    with pytest.raises(ValueError, match="num_heads=3 does not divide D=10"):
        MultiHeadAttention(10, 3)
    m = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"X_q has last axis 7 but d_model=8.*\(2, 5, 7\)"):
        m(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match=r"X_kv has last axis 6 but d_model=8"):
        m(torch.randn(2, 5, 8), torch.randn(2, 4, 6))
    with pytest.raises(ValueError, match="mask"):
        m(torch.randn(2, 5, 8), mask=torch.ones(4, 4, dtype=torch.bool))


# --- encoder and decoder blocks ----------------------------------------------------------

BLOCK_CASES = [
    # B, T, D, H, D_ff, eps, seed
    (2, 5, 16, 4, 32, 1e-5, 0),
    (3, 7, 12, 2, 48, 1e-6, 1),
]


def _randomise_norms(layer):
    # torch starts LayerNorm at gamma = 1, beta = 0, which would hide a swapped gamma/beta
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.startswith("norm"):
                p.normal_(mean=1.0 if name.endswith("weight") else 0.0, std=0.3)


@pytest.mark.parametrize("B, T, D, H, D_ff, eps, seed", BLOCK_CASES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding"])
def test_encoder_block_from_torch_matches(B, T, D, H, D_ff, eps, seed, norm_first, activation, mask_kind):
    torch.manual_seed(seed)
    ref = nn.TransformerEncoderLayer(D, H, D_ff, dropout=0.0, activation=activation,
                                     layer_norm_eps=eps, batch_first=True,
                                     norm_first=norm_first, dtype=DT)
    _randomise_norms(ref)
    ours = EncoderBlock.from_torch(ref)
    assert (ours.norm_first, ours.activation, ours.eps) == (norm_first, activation, eps)
    X = torch.randn(B, T, D, dtype=DT)

    mask = src_mask = key_padding = None
    if mask_kind == "causal":
        mask = TF.causal_mask(T)
        src_mask = ~mask
    elif mask_kind == "padding":
        valid = key_valid(B, T, seed)
        mask = valid[:, None, :]
        key_padding = ~valid
    Y_ref = ref(X, src_mask=src_mask, src_key_padding_mask=key_padding)
    Y = ours(X, mask=mask)
    assert Y.shape == (B, T, D)
    close(Y, Y_ref)  # padded query rows too: they attend to the valid keys

    np_mask = None if mask is None else mask.numpy()
    Y_np = tnp.encoder_block(X.numpy(), ours.numpy_params(), H, norm_first=norm_first,
                             activation=activation, mask=np_mask, eps=eps)
    close(Y_np, Y)
    Y_fn = TF.encoder_block(X, ours.params(), H, norm_first=norm_first, activation=activation,
                            mask=mask, eps=eps)
    close(Y_fn, Y)


@pytest.mark.parametrize("B, T, D, H, D_ff, eps, seed", BLOCK_CASES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("masked", [False, True])
def test_decoder_block_from_torch_matches(B, T, D, H, D_ff, eps, seed, norm_first, activation, masked):
    torch.manual_seed(seed)
    ref = nn.TransformerDecoderLayer(D, H, D_ff, dropout=0.0, activation=activation,
                                     layer_norm_eps=eps, batch_first=True,
                                     norm_first=norm_first, dtype=DT)
    _randomise_norms(ref)
    ours = DecoderBlock.from_torch(ref)
    assert (ours.norm_first, ours.activation, ours.eps) == (norm_first, activation, eps)
    S = T + 2
    X = torch.randn(B, T, D, dtype=DT)
    memory = torch.randn(B, S, D, dtype=DT)

    if masked:
        tgt_valid = key_valid(B, T, seed)
        mem_valid = key_valid(B, S, seed + 1)
        self_mask = TF.causal_mask(T) & tgt_valid[:, None, :]  # (B, T, T)
        cross_mask = mem_valid[:, None, :]  # (B, 1, S)
        Y_ref = ref(X, memory, tgt_mask=~TF.causal_mask(T), tgt_key_padding_mask=~tgt_valid,
                    memory_key_padding_mask=~mem_valid)
    else:
        self_mask = cross_mask = None
        Y_ref = ref(X, memory)
    Y = ours(X, memory, self_mask=self_mask, cross_mask=cross_mask)
    assert Y.shape == (B, T, D)
    close(Y, Y_ref)

    to_np = (lambda m: None if m is None else m.numpy())
    Y_np = tnp.decoder_block(X.numpy(), memory.numpy(), ours.numpy_params(), H,
                             norm_first=norm_first, activation=activation,
                             self_mask=to_np(self_mask), cross_mask=to_np(cross_mask), eps=eps)
    close(Y_np, Y)
    Y_fn = TF.decoder_block(X, memory, ours.params(), H, norm_first=norm_first,
                            activation=activation, self_mask=self_mask, cross_mask=cross_mask, eps=eps)
    close(Y_fn, Y)


def test_block_attention_weights_are_returned():
    torch.manual_seed(0)
    enc = EncoderBlock(8, 2, 16).double()
    X = torch.randn(2, 4, 8, dtype=DT)
    Y, P = enc(X, return_attention=True)
    # without return_attention the block runs PyTorch's fused kernel: the same Y to
    # float64 round-off (tests below compare the two paths everywhere)
    close(Y, enc(X))
    assert P.shape == (2, 2, 4, 4)
    close(P.sum(-1), torch.ones(2, 2, 4, dtype=DT), atol=1e-12)  # rows of P sum to one
    dec = DecoderBlock(8, 2, 16).double()
    memory = torch.randn(2, 6, 8, dtype=DT)
    _, (P_self, P_cross) = dec(X, memory, return_attention=True)
    assert P_self.shape == (2, 2, 4, 4) and P_cross.shape == (2, 2, 4, 6)


def test_from_torch_reads_activation_or_refuses():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation=nn.GELU(), batch_first=True)
    assert EncoderBlock.from_torch(layer).activation == "gelu"
    layer = nn.TransformerEncoderLayer(8, 2, 16, activation=nn.functional.silu, batch_first=True)
    with pytest.raises(ValueError, match="activation"):
        EncoderBlock.from_torch(layer)
    layer = nn.TransformerDecoderLayer(8, 2, 16, activation=nn.GELU(approximate="tanh"), batch_first=True)
    with pytest.raises(ValueError, match="approximate"):
        DecoderBlock.from_torch(layer)
    with pytest.raises(ValueError, match="TransformerEncoderLayer"):
        EncoderBlock.from_torch(nn.Linear(3, 3))


def test_from_torch_without_biases():
    torch.manual_seed(3)
    ref = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, bias=False, dtype=DT)
    ours = EncoderBlock.from_torch(ref)
    X = torch.randn(2, 5, 8, dtype=DT)
    close(ours(X), ref(X))


def test_block_bad_input():
    with pytest.raises(ValueError, match="num_heads=3 does not divide"):
        EncoderBlock(16, 3, 32)
    with pytest.raises(ValueError, match="activation"):
        DecoderBlock(16, 4, 32, activation="tanh")
    dec = DecoderBlock(16, 4, 32)
    with pytest.raises(ValueError, match=r"memory has last axis 8 but d_model=16"):
        dec(torch.randn(2, 3, 16), torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="d_model=16"):
        EncoderBlock(16, 4, 32)(torch.randn(2, 3, 12))


# --- gradcheck ---------------------------------------------------------------------------


def _gradcheck_module(module, *inputs, **kwargs):
    """gradcheck with respect to the inputs and every parameter of ``module``."""
    module = module.double()
    names = [n for n, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for _, p in module.named_parameters()]
    inputs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    n_in = len(inputs)

    def f(*args):
        out = functional_call(module, dict(zip(names, args[n_in:])), tuple(args[:n_in]), kwargs)
        return out[0] if isinstance(out, tuple) else out

    assert torch.autograd.gradcheck(f, (*inputs, *params), eps=1e-6, atol=1e-5)


def test_gradcheck_mha():
    torch.manual_seed(0)
    _gradcheck_module(MultiHeadAttention(4, 2), torch.randn(2, 3, 4, dtype=DT),
                      torch.randn(2, 2, 4, dtype=DT))


@pytest.mark.parametrize("norm_first", [False, True])
def test_gradcheck_encoder_block(norm_first):
    torch.manual_seed(1)
    _gradcheck_module(EncoderBlock(4, 2, 6, norm_first=norm_first, activation="gelu"),
                      torch.randn(2, 3, 4, dtype=DT), mask=TF.causal_mask(3))


def test_gradcheck_decoder_block():
    torch.manual_seed(2)
    _gradcheck_module(DecoderBlock(4, 2, 6, norm_first=True), torch.randn(1, 3, 4, dtype=DT),
                      torch.randn(1, 2, 4, dtype=DT), self_mask=TF.causal_mask(3))


def test_gradcheck_small_modules():
    torch.manual_seed(3)
    _gradcheck_module(LayerNorm(5), torch.randn(2, 3, 5, dtype=DT))
    _gradcheck_module(FeedForward(4, 6, "relu"), torch.randn(2, 3, 4, dtype=DT))
    _gradcheck_module(LearnedPositionalEmbedding(6, 4), torch.randn(2, 3, 4, dtype=DT))
    _gradcheck_module(SinusoidalPositionalEncoding(4, 6), torch.randn(2, 3, 4, dtype=DT))
    _gradcheck_module(PatchEmbedding(2, 2, 3), torch.randn(1, 2, 4, 4, dtype=DT))


# --- positions and patches ---------------------------------------------------------------


def test_sinusoidal_module_matches_closed_form():
    D, max_len = 8, 20
    pe = SinusoidalPositionalEncoding(D, max_len).double()
    X = torch.zeros(1, 5, D, dtype=DT)
    out = pe(X, offset=7)
    for p in range(5):
        for i in range(D // 2):
            angle = (p + 7) / 10000.0 ** (2 * i / D)  # the paper's formula, typed in
            assert abs(out[0, p, 2 * i].item() - math.sin(angle)) < 1e-12  # float64 round-off
            assert abs(out[0, p, 2 * i + 1].item() - math.cos(angle)) < 1e-12
    assert "PE" not in pe.state_dict()  # a fixed table is not saved with the weights


def test_learned_positional_embedding_offsets_and_limits():
    torch.manual_seed(0)
    emb = LearnedPositionalEmbedding(10, 4)
    X = torch.randn(2, 3, 4)
    close(emb(X, offset=4), X + emb.weight[4:7], atol=0)  # a plain addition: exact
    with pytest.raises(ValueError, match=r"exceed max_len=10"):
        emb(torch.randn(2, 11, 4))
    with pytest.raises(ValueError, match=r"exceed max_len=10"):
        emb(X, offset=8)
    with pytest.raises(ValueError, match=r"exceed max_len=6"):
        SinusoidalPositionalEncoding(4, 6)(torch.randn(1, 7, 4))


@pytest.mark.parametrize("C, p, D, HW, seed", [(1, 2, 8, (8, 8), 0), (3, 4, 16, (8, 12), 1)])
def test_patch_embedding_equals_strided_conv(C, p, D, HW, seed):
    torch.manual_seed(seed)
    conv = nn.Conv2d(C, D, kernel_size=p, stride=p, dtype=DT)
    ours = PatchEmbedding.from_conv(conv)
    images = torch.randn(2, C, *HW, dtype=DT)
    ref = conv(images).flatten(2).transpose(1, 2)  # (B, D, H/p, W/p) -> (B, N, D), row-major
    out = ours(images)
    assert out.shape == (2, (HW[0] // p) * (HW[1] // p), D)
    close(out, ref)


def test_patch_embedding_bad_input():
    pe = PatchEmbedding(3, 4, 8)
    with pytest.raises(ValueError, match=r"C=1 channels but in_channels=3"):
        pe(torch.randn(2, 1, 8, 8))
    with pytest.raises(ValueError, match="stride"):
        PatchEmbedding.from_conv(nn.Conv2d(3, 8, kernel_size=4, stride=2))
    with pytest.raises(ValueError, match="padding"):
        PatchEmbedding.from_conv(nn.Conv2d(3, 8, kernel_size=4, stride=4, padding=1))


# --- fused attention (return_attention=False) equals the explicit path -----------------
#
# Without return_attention the modules call torch.nn.functional.scaled_dot_product_attention
# and never form P. These tests compare that path with the textbook one (P materialised),
# in float64 to ATOL (round-off; a mask ignored or a row not zeroed moves Z by 1e-2 or more),
# with every kind of mask, and their gradients too.


def _mask(kind, B, T_q, T_kv, H, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "none":
        return None
    if kind == "causal":
        return torch.ones(T_q, T_kv, dtype=torch.bool).tril(diagonal=T_kv - T_q)  # (T_q, T_kv)
    if kind == "padding":
        return key_valid(B, T_kv, seed)[:, None, :]  # (B, 1, T_kv)
    if kind == "per_head":
        m = torch.rand(B, H, T_q, T_kv, generator=g) < 0.6  # (B, H, T_q, T_kv)
        m[..., 0] = True
        return m
    if kind == "empty_rows":  # some query rows may attend to nothing
        m = torch.rand(B, T_q, T_kv, generator=g) < 0.6
        m[:, 1] = False
        m[0, -1] = False
        return m
    raise AssertionError(kind)


FUSED_MASKS = ["none", "causal", "padding", "per_head", "empty_rows"]


@pytest.mark.parametrize("B, T_q, T_kv, D, H, bias, seed", MHA_CASES)
@pytest.mark.parametrize("mask_kind", FUSED_MASKS)
def test_mha_fused_equals_explicit(B, T_q, T_kv, D, H, bias, seed, mask_kind):
    torch.manual_seed(seed)
    m = MultiHeadAttention(D, H, bias=bias).double()
    X_q = torch.randn(B, T_q, D, dtype=DT, requires_grad=True)
    X_kv = torch.randn(B, T_kv, D, dtype=DT, requires_grad=True)
    mask = _mask(mask_kind, B, T_q, T_kv, H, seed)
    Z_ref, P = m(X_q, X_kv, mask=mask)
    Z, none = m(X_q, X_kv, mask=mask, return_attention=False)
    assert none is None and P is not None
    close(Z, Z_ref)
    # the functional layer: the same switch
    Z_f, P_f = TF._multi_head_attention(X_q, X_kv, m.params(), H, mask=mask, return_attention=False)
    assert P_f is None
    close(Z_f, Z_ref)
    close(TF.multi_head_attention(X_q, X_kv, m.params(), H, mask=mask)[0], Z_ref)  # public: explicit
    # gradients through both paths (rows with nothing to attend to: zero, not NaN)
    w = torch.randn(Z.shape, dtype=DT, generator=torch.Generator().manual_seed(9))
    g_ref = torch.autograd.grad((Z_ref * w).sum(), [X_q, X_kv, m.W_Q, m.W_V])
    g = torch.autograd.grad((Z * w).sum(), [X_q, X_kv, m.W_Q, m.W_V])
    for a, b in zip(g, g_ref):
        assert torch.isfinite(a).all()
        close(a, b)


def test_mha_fused_preserves_dtype():
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2)
    X = torch.randn(2, 5, 8)
    Z, _ = m(X, mask=TF.causal_mask(5), return_attention=False)
    assert Z.dtype == torch.float32
    # float32: the kernels round differently; 1e-5 is ~100 float32 ulps at |Z| ~ 1
    torch.testing.assert_close(Z, m(X, mask=TF.causal_mask(5))[0], atol=1e-5, rtol=0)


def test_mha_fused_kv_cache_equals_explicit():
    torch.manual_seed(1)
    B, T, D, H = 2, 6, 16, 4
    m = MultiHeadAttention(D, H).double()
    X = torch.randn(B, T, D, dtype=DT)
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[1, 1] = False
    M = TF.causal_mask(T) & valid[:, None, :]  # (B, T, T), differs per sequence
    Z_full, _ = m(X, mask=M)
    for need in (True, False):
        cache = KVCache()
        parts = [m(X[:, :3], mask=M[:, :3, :3], kv_cache=cache, return_attention=need)]
        for t in range(3, T):
            parts.append(m(X[:, t:t + 1], mask=M[:, t:t + 1, :t + 1], kv_cache=cache,
                           return_attention=need))
        assert all((P is None) == (not need) for _, P in parts)
        close(torch.cat([Z for Z, _ in parts], dim=1), Z_full)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding", "empty_rows"])
def test_encoder_block_fused_equals_explicit(norm_first, mask_kind):
    torch.manual_seed(2)
    B, T, D, H = 3, 6, 16, 4
    block = EncoderBlock(D, H, 32, norm_first=norm_first, activation="gelu").double()
    X = torch.randn(B, T, D, dtype=DT)
    mask = _mask(mask_kind, B, T, T, H, 2)
    Y_ref, P = block(X, mask=mask, return_attention=True)
    close(block(X, mask=mask), Y_ref)
    close(block(X, mask=mask), TF.encoder_block(X, block.params(), H, norm_first=norm_first,
                                                activation="gelu", mask=mask))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_decoder_block_fused_equals_explicit(norm_first, masked):
    torch.manual_seed(3)
    B, T, S, D, H = 3, 5, 7, 16, 4
    block = DecoderBlock(D, H, 32, norm_first=norm_first).double()
    X = torch.randn(B, T, D, dtype=DT)
    memory = torch.randn(B, S, D, dtype=DT)
    self_mask = TF.causal_mask(T) if masked else None
    cross_mask = key_valid(B, S, 3)[:, None, :] if masked else None
    Y_ref, _ = block(X, memory, self_mask, cross_mask, return_attention=True)
    close(block(X, memory, self_mask, cross_mask), Y_ref)
