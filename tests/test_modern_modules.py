"""The modern decoder's modules (tfbook.torch.modern) against the functions and each other.

Module == functional (float64, copied weights); the Llama block == its NumPy composition;
cached generation == uncached; the KV cache's bytes per token == the formula; the GQA
module with H_kv = H == the book's MultiHeadAttention with the same weights.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tfbook.numpy as tnp
import tfbook.torch as tt
from tfbook.torch.models import num_params
from tfbook.torch.modern import (GroupedQueryAttention, LlamaBlock, LlamaLM, LlamaLMConfig, RMSNorm, SwiGLU,
                                 kv_cache_bytes_per_token, swiglu_d_ff)
from tfbook.torch.modules import KVCache, MultiHeadAttention

ATOL = 1e-12  # float64 round-off


def _randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
    return module


def test_rms_norm_and_swiglu_modules_equal_the_functions():
    X = torch.randn(2, 5, 8, dtype=torch.float64)
    n = _randomize(RMSNorm(8, eps=1e-5).double())
    torch.testing.assert_close(n(X), tt.rms_norm(X, n.gamma, 1e-5), rtol=0, atol=ATOL)
    m = _randomize(SwiGLU(8, 12).double())
    torch.testing.assert_close(m(X), tt.swiglu(X, m.params()), rtol=0, atol=ATOL)
    np.testing.assert_allclose(tnp.swiglu(X.numpy(), m.numpy_params()), m(X).detach().numpy(), rtol=0, atol=ATOL)


@pytest.mark.parametrize("rope", [None, "interleaved", "half"])
@pytest.mark.parametrize("H_kv", [4, 2, 1])
@pytest.mark.parametrize("return_attention", [True, False])
def test_gqa_module_equals_the_function(rope, H_kv, return_attention):
    torch.manual_seed(0)
    m = GroupedQueryAttention(16, 4, H_kv, rope=rope).double()
    X = torch.randn(2, 7, 16, dtype=torch.float64)
    mask = tt.causal_mask(7)
    Z, P = m(X, mask=mask, return_attention=return_attention)
    Z_ref, P_ref = tt.grouped_query_attention(X, X, m.params(), 4, H_kv, mask=mask, rope=rope)
    torch.testing.assert_close(Z, Z_ref, rtol=0, atol=ATOL)
    assert (P is None) != return_attention
    if return_attention:
        torch.testing.assert_close(P, P_ref, rtol=0, atol=ATOL)
    Z_np, _ = tnp.grouped_query_attention(X.numpy(), X.numpy(), m.numpy_params(), 4, H_kv, mask=mask.numpy(), rope=rope)
    np.testing.assert_allclose(Z.detach().numpy(), Z_np, rtol=0, atol=ATOL)


def test_gqa_module_with_all_heads_equals_multi_head_attention():
    torch.manual_seed(1)
    g = GroupedQueryAttention(16, 4, 4, rope=None).double()
    mha = MultiHeadAttention(16, 4, bias=False).double()
    with torch.no_grad():
        for k in ("W_Q", "W_K", "W_V", "W_O"):
            getattr(mha, k).copy_(getattr(g, k))
    X = torch.randn(3, 6, 16, dtype=torch.float64)
    mask = tt.causal_mask(6)
    torch.testing.assert_close(g(X, mask=mask)[0], mha(X, mask=mask)[0], rtol=0, atol=ATOL)


@pytest.mark.parametrize("H_kv", [4, 2, 1])
def test_kv_cache_equals_full_attention_and_its_bytes(H_kv):
    torch.manual_seed(2)
    m = GroupedQueryAttention(16, 4, H_kv, rope="half").double()
    X = torch.randn(2, 9, 16, dtype=torch.float64)
    full, _ = m(X, mask=tt.causal_mask(9))
    cache, outs = KVCache(), []
    for t in range(9):
        outs.append(m(X[:, t:t + 1], kv_cache=cache)[0])
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=0, atol=ATOL)
    assert cache.K.shape == (2, H_kv, 9, 4)  # (B, H_kv, T, D_K): the cache is H / H_kv times smaller
    measured = (cache.K.nbytes + cache.V.nbytes) / (2 * 9)  # bytes per token (batch of 2)
    assert measured == m.kv_cache_bytes_per_token(torch.float64) == 2 * H_kv * 4 * 8


def test_llama_block_equals_its_numpy_composition():
    torch.manual_seed(3)
    b = _randomize(LlamaBlock(16, 4, 2, 24, rope="half", eps=1e-6).double(), seed=3)
    X = torch.randn(2, 6, 16, dtype=torch.float64)
    mask = tt.causal_mask(6)
    p = b.numpy_params()
    Xn = X.numpy()
    A = tnp.rms_norm(Xn, p["norm_attn"]["gamma"], 1e-6)
    Y = Xn + tnp.grouped_query_attention(A, A, p["attn"], 4, 2, mask=mask.numpy(), rope="half")[0]
    Y = Y + tnp.swiglu(tnp.rms_norm(Y, p["norm_mlp"]["gamma"], 1e-6), p["mlp"])
    np.testing.assert_allclose(b(X, mask=mask).detach().numpy(), Y, rtol=0, atol=1e-11)  # float64, 2 residual adds


def _lm(H_kv=2, rope="half", layers=2):
    torch.manual_seed(4)
    return LlamaLM(LlamaLMConfig(vocab_size=11, block_size=12, d_model=16, num_heads=4, num_kv_heads=H_kv,
                                 num_layers=layers, d_ff=24, rope=rope)).double().eval()


@pytest.mark.parametrize("rope", ["half", "interleaved"])
def test_llama_lm_cached_generation_equals_uncached(rope):
    m = _lm(rope=rope)
    idx = torch.randint(0, 11, (2, 3), generator=torch.Generator().manual_seed(0))
    a = m.generate(idx, 15, greedy=True)  # outgrows block_size=12: the cache is rebuilt
    b = m.generate(idx, 15, greedy=True, use_cache=False)
    assert torch.equal(a, b)
    logits, P = m(idx, return_attention=True)
    torch.testing.assert_close(logits, m(idx), rtol=0, atol=ATOL)
    assert len(P) == 2 and P[0].shape == (2, 4, 3, 3)
    # causal: changing the last token leaves earlier logits alone
    idx2 = idx.clone()
    idx2[:, -1] = (idx2[:, -1] + 1) % 11
    torch.testing.assert_close(m(idx2)[:, :-1], m(idx)[:, :-1], rtol=0, atol=ATOL)


def test_llama_lm_kv_cache_bytes_formula_and_measured():
    m = _lm(H_kv=1, layers=3)
    caches = [KVCache() for _ in m.blocks]
    m.forward_cached(torch.zeros(1, 7, dtype=torch.long), caches)
    measured = sum(c.K.nbytes + c.V.nbytes for c in caches) / 7
    assert measured == m.kv_cache_bytes_per_token(torch.float64) == 2 * 3 * 1 * 4 * 8
    assert kv_cache_bytes_per_token(32, 8, 128, torch.float16) == 131072  # Llama-3-8B: 128 KiB per token


def test_rope_is_applied_in_the_rotate_half_layout_by_default_and_layouts_differ():
    a, b = _lm(rope="half"), _lm(rope="interleaved")
    b.load_state_dict(a.state_dict())
    idx = torch.arange(8)[None] % 11
    assert (a(idx) - b(idx)).abs().max() > 1e-6
    # permuting the columns of W_Q and W_K of every head maps one layout onto the other:
    # rope_half(q) . rope_half(k) == rope(q[p^-1]) . rope(k[p^-1]) with p = rope_permutation(D_K)
    inv = torch.argsort(tt.rope_permutation(4))
    with torch.no_grad():
        for blk in b.blocks:
            for k in ("W_Q", "W_K"):
                W = getattr(blk.attn, k)
                cols = torch.cat([h * 4 + inv for h in range(W.shape[1] // 4)])
                W.copy_(W[:, cols])
    torch.testing.assert_close(a(idx), b(idx), rtol=0, atol=1e-10)


def test_swiglu_d_ff_and_equal_parameter_count():
    assert swiglu_d_ff(64, 256) == 171 and swiglu_d_ff(4096, 16384, 256) == 11008  # Llama-7B's width
    from tfbook.tasks import modern

    n = {k: num_params(modern._model(modern.config(k))) for k in modern.KINDS}
    assert all(abs(v - n["2017"]) <= 0.002 * n["2017"] for v in n.values()), n  # within 0.2%


def test_bad_input():
    with pytest.raises(ValueError, match=r"num_kv_heads=3 does not divide num_heads=4"):
        GroupedQueryAttention(16, 4, 3)
    with pytest.raises(ValueError, match=r"even head width.*3"):
        GroupedQueryAttention(12, 4, 2, rope="half")
    with pytest.raises(ValueError, match=r"X has last axis 8 but d_model=16"):
        GroupedQueryAttention(16, 4, 2)(torch.zeros(1, 3, 8))
    with pytest.raises(ValueError, match=r"rope must be one of"):
        LlamaLMConfig(vocab_size=5, rope="neox")
    with pytest.raises(ValueError, match=r"idx has T=13 > block_size=12"):
        _lm()(torch.zeros(1, 13, dtype=torch.long))
    with pytest.raises(ValueError, match=r"need one KVCache per block"):
        _lm().forward_cached(torch.zeros(1, 2, dtype=torch.long), [KVCache()])
