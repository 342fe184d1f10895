"""DecoderLM's training path (tfbook.torch.models._causal_block) is its blocks, computed for speed.

Without ``return_attention`` DecoderLM runs each plain EncoderBlock through ``_causal_block``:
``scaled_dot_product_attention(is_causal=True)`` instead of an explicit ``(T, T)`` mask, and
under autocast the biases added inside the products. On the CPU without autocast it must give
*bitwise* the block's own output and gradients (the same operations in the same order); a
block with hooks (dropout added by hooks, a recording hook) must still be called as a module.
"""

from __future__ import annotations

import pytest
import torch

from tfbook.torch import functional as F
from tfbook.torch import models as M
from tfbook.torch.models import DecoderLM, DecoderLMConfig


def _model(norm_first=True, activation="gelu", dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    cfg = DecoderLMConfig(vocab_size=11, block_size=16, d_model=24, num_heads=3, num_layers=2, d_ff=40,
                          norm_first=norm_first, activation=activation)
    m = DecoderLM(cfg).to(dtype)
    with torch.no_grad():
        for p in m.parameters():  # biases away from zero, so that a dropped bias shows
            p.add_(0.1 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_causal_block_is_bitwise_the_block(norm_first, activation, dtype):
    m = _model(norm_first, activation, dtype)
    block = m.blocks[0]
    assert M._causal_block_applies(block)
    X = torch.randn(3, 16, 24, dtype=dtype, requires_grad=True)
    mask = F.causal_mask(16)
    ours, ref = M._causal_block(block, X, mask), block(X, mask=mask)
    assert torch.equal(ours, ref)
    g = torch.randn_like(ref)
    grads_ours = torch.autograd.grad(ours, [X, *block.parameters()], g)
    grads_ref = torch.autograd.grad(block(X, mask=mask), [X, *block.parameters()], g)
    for a, b in zip(grads_ours, grads_ref):
        torch.testing.assert_close(a, b, atol=1e-13 if dtype == torch.float64 else 1e-5, rtol=0)


def test_causal_block_is_causal():
    """Changing the last token changes no earlier output (and the first token changes all)."""
    m = _model()
    idx = torch.randint(0, 11, (2, 16), generator=torch.Generator().manual_seed(1))
    idx2 = idx.clone()
    idx2[:, -1] = (idx2[:, -1] + 1) % 11
    a, b = m(idx), m(idx2)
    assert torch.equal(a[:, :-1], b[:, :-1]) and (a[:, -1] - b[:, -1]).abs().max() > 1e-3
    idx3 = idx.clone()
    idx3[:, 0] = (idx3[:, 0] + 1) % 11
    assert ((m(idx3) - a).abs().amax(dim=-1) > 1e-6).all()


def test_forward_uses_is_causal_and_no_mask(monkeypatch):
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kw):
        calls.append(kw)
        return sdpa(*args, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    m = _model()
    idx = torch.randint(0, 11, (2, 16))
    logits = m(idx)
    assert len(calls) == 2 and all(kw.get("is_causal") is True and kw.get("attn_mask") is None for kw in calls)
    # and the logits are those of the masked blocks (the path with P), to round-off
    ref, _ = m(idx, return_attention=True)
    torch.testing.assert_close(logits, ref, atol=1e-12, rtol=0)  # float64 round-off, SDPA vs textbook


def test_blocks_with_hooks_are_called_as_modules():
    m = _model()
    idx = torch.randint(0, 11, (2, 16))
    seen = []
    h = m.blocks[0].attn.register_forward_hook(lambda mod, args, out: seen.append(out[0].shape))
    assert not M._causal_block_applies(m.blocks[0]) and M._causal_block_applies(m.blocks[1])
    m(idx)
    h.remove()
    assert seen == [(2, 16, 24)]
    h = m.blocks[1].register_forward_pre_hook(lambda mod, args: seen.append("pre"))
    m(idx)
    h.remove()
    assert seen[-1] == "pre" and M._causal_block_applies(m.blocks[1])


def test_under_autocast_the_activations_stay_in_bfloat16():
    """``X @ W + b`` with a float32 bias promotes a bf16 product to float32; the path adds the bias inside."""
    m = _model(dtype=torch.float32)
    X = torch.randn(2, 16, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        qkv = M._affine(X, m.blocks[0].attn.W_Q, m.blocks[0].attn.b_Q)
        naive = X @ m.blocks[0].attn.W_Q + m.blocks[0].attn.b_Q
        Y = M._causal_block(m.blocks[0], X, F.causal_mask(16))
        logits = m(torch.randint(0, 11, (2, 16)))
    assert naive.dtype == torch.float32  # what the book's spelling gives under autocast
    assert qkv.dtype == torch.bfloat16
    ref = m.blocks[0](X, mask=F.causal_mask(16))  # float32, no autocast
    torch.testing.assert_close(Y.float(), ref, atol=0.1, rtol=0.05)  # bf16 has 8 bits of mantissa
    assert logits.shape == (2, 16, 11)


@pytest.mark.parametrize("rope", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_llama_blocks_take_the_same_path_bitwise(rope, dtype, monkeypatch):
    from tfbook.torch.modern import LlamaLM, LlamaLMConfig

    torch.manual_seed(0)
    m = LlamaLM(LlamaLMConfig(vocab_size=11, block_size=16, d_model=32, num_heads=4, num_kv_heads=2,
                              num_layers=2, d_ff=48, rope=rope)).to(dtype)
    block = m.blocks[0]
    assert block._causal_applies() and not M._causal_block_applies(block)
    X = torch.randn(3, 16, 32, dtype=dtype, requires_grad=True)
    mask = F.causal_mask(16)
    ours, ref = M._causal_block(block, X, mask), block(X, mask=mask)
    assert torch.equal(ours, ref)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(ours, [X, *block.parameters()], g),
                    torch.autograd.grad(block(X, mask=mask), [X, *block.parameters()], g)):
        torch.testing.assert_close(a, b, atol=1e-13 if dtype == torch.float64 else 1e-5, rtol=0)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **kw: (calls.append(kw), sdpa(*a, **kw))[1])
    idx = torch.randint(0, 11, (2, 16))
    logits = m(idx)
    assert len(calls) == 2 and all(kw.get("is_causal") is True and kw.get("attn_mask") is None for kw in calls)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    ref_logits, _ = m(idx, return_attention=True)
    torch.testing.assert_close(logits, ref_logits, atol=1e-12 if dtype == torch.float64 else 1e-5, rtol=0)
    # a hook sends the block back through its own forward (which then runs with the explicit mask)
    h = block.attn.register_forward_hook(lambda mod, args, out: None)
    assert not block._causal_applies()
    h.remove()


# ---- issue 40: what the GPU profile showed, checked on the CPU -------------------------------
# A profile of DecoderLM's training step on an H200 showed, beside nanoGPT's, an explicit mask
# where is_causal=True would do and an elementwise kernel run on every call (a mask built per
# forward). These tests record every attention call and every operator of a forward pass.

def _record_forward(model, idx):
    """(the keyword arguments of each scaled_dot_product_attention call, the aten ops run)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls, ops = [], []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(Q, K, V, *args, **kwargs):
        calls.append(dict(kwargs, n_args=len(args), q_stride=Q.stride(), q_shape=tuple(Q.shape)))
        return real(Q, K, V, *args, **kwargs)

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            ops.append((str(func.overloadpacket), out.dtype if isinstance(out, torch.Tensor) else None))
            return out

    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        with Ops():
            model(idx)
    finally:
        torch.nn.functional.scaled_dot_product_attention = real
    return calls, ops


@pytest.mark.parametrize("kind", ["decoder", "llama"])
def test_forward_tells_the_kernel_is_causal_and_builds_no_mask(kind):
    """Each layer calls SDPA with is_causal=True, no attn_mask, heads with unit stride in D_h,
    and the forward builds no boolean tensor at all (no (T, T) mask, no tril, per call).
    Fails if DecoderLM.forward builds F.causal_mask unconditionally (as it did) or passes it."""
    if kind == "decoder":
        m = _model(dtype=torch.float32)
    else:
        from tfbook.torch.modern import LlamaLM, LlamaLMConfig
        torch.manual_seed(0)
        m = LlamaLM(LlamaLMConfig(vocab_size=11, block_size=16, d_model=24, num_heads=4, num_kv_heads=2,
                                  num_layers=2, d_ff=40))
    idx = torch.randint(0, 11, (2, 16), generator=torch.Generator().manual_seed(0))
    calls, ops = _record_forward(m, idx)
    assert len(calls) == 2, calls
    for c in calls:
        assert c["is_causal"] is True and c.get("attn_mask") is None and c["n_args"] == 0, c
        assert c["q_stride"][-1] == 1, c  # (B, H, T, D_h) with unit stride in D_h
    bool_ops = [name for name, dtype in ops if dtype == torch.bool]
    assert not bool_ops, f"a boolean tensor (a mask) was built in the forward: {bool_ops}"
    assert not [name for name, _ in ops if name in ("aten.tril", "aten.triu")]


def test_forward_with_attention_still_masks():
    """return_attention=True still builds the causal mask (P is formed): the lazy mask is only
    skipped on the fused path; the two paths give the same logits."""
    m = _model()
    idx = torch.randint(0, 11, (2, 16), generator=torch.Generator().manual_seed(2))
    logits, P = m(idx, return_attention=True)
    assert torch.equal(P[0].triu(1), torch.zeros_like(P[0]))
    torch.testing.assert_close(logits, m(idx), atol=1e-12, rtol=0)


def test_causal_block_builds_the_mask_for_a_block_it_must_call():
    """A block with a hook is called as a module: _causal_block(block, X) with no mask builds the
    causal one, equal to passing it."""
    m = _model()
    block = m.blocks[0]
    handle = block.register_forward_hook(lambda mod, args, out: None)
    try:
        assert not M._causal_block_applies(block)
        X = torch.randn(2, 16, 24, dtype=torch.float64)
        assert torch.equal(M._causal_block(block, X), block(X, mask=F.causal_mask(16)))
    finally:
        handle.remove()


def test_cpu_kernel_refusal_falls_back_to_the_math_kernel(monkeypatch):
    """Issue 38: PyTorch's fused bf16 CPU attention raises "pack_vnni2 is only supported when
    avx512 is supported" where the kernels are forced to the portable level on an AVX-512 BF16
    CPU. The fused path then uses PyTorch's math kernel: same logits, no failed cell. Any other
    error still raises."""
    m = _model(dtype=torch.float32)
    idx = torch.randint(0, 11, (2, 16), generator=torch.Generator().manual_seed(3))
    ref = m(idx)
    real = torch.nn.functional.scaled_dot_product_attention
    from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends

    def refusing(*args, **kwargs):
        if SDPBackend.MATH not in _cur_sdpa_kernel_backends() or len(_cur_sdpa_kernel_backends()) > 1:
            raise RuntimeError("pack_vnni2 is only supported when avx512 is supported")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", refusing)
    torch.testing.assert_close(m(idx), ref, atol=1e-6, rtol=0)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("out of memory")))
    with pytest.raises(RuntimeError, match="out of memory"):
        m(idx)
