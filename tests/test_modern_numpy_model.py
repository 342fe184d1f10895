"""The Llama block and the whole Llama-style model in NumPy, equal to tfbook.torch.modern's.

``tfbook.numpy.llama_block`` and ``tfbook.numpy.llama_lm`` take the PyTorch modules' weights
(``numpy_params()``, copied) and must give the modules' outputs in float64 to round-off: the
NumPy code is written from the functions (rms_norm, grouped_query_attention, swiglu), the
modules from PyTorch's fused kernels (``F.rms_norm``, cached rotary tables, fused attention
with ``enable_gqa``). The last tests show the comparison fails when one thing differs: a
weight perturbed by 1e-6, the causal mask left out, the other rotary layout.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tfbook.numpy as tnp
import tfbook.torch.functional as TF
from tfbook.torch.modern import LlamaBlock, LlamaLM, LlamaLMConfig

# float64 round-off: logits of size about 1 after two blocks differ by about 6e-16
ATOL = 1e-12

CONFIGS = [  # (num_kv_heads, rope, tie_weights)
    (4, "half", True),
    (2, "interleaved", False),
    (1, "half", True),
]


def _model(H_kv, rope, tied, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaLMConfig(vocab_size=13, block_size=16, d_model=16, num_heads=4, num_kv_heads=H_kv, num_layers=2,
                        d_ff=24, rope=rope, tie_weights=tied)
    model = LlamaLM(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():  # away from the initial values (RMSNorm gains of 1), all of size ~1
            p.normal_(0.0, 0.3).add_(1.0 if p.dim() == 1 else 0.0)
    return model


def _numpy_logits(model, ids, params=None, **overrides):
    c = model.config
    kw = {**dict(rope=c.rope, base=c.rope_base, eps=c.eps), **overrides}
    return tnp.llama_lm(ids, model.numpy_params() if params is None else params, c.num_heads, c.num_kv_heads, **kw)


def _max_err(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


@pytest.mark.parametrize("H_kv,rope,tied", CONFIGS)
def test_numpy_llama_lm_equals_the_torch_model(H_kv, rope, tied):
    model = _model(H_kv, rope, tied)
    ids = torch.randint(0, 13, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).numpy()  # (3, 9, 13), the fused path
        ref_p = model(ids, return_attention=True)[0].numpy()  # the path that materialises P
    out = _numpy_logits(model, ids.numpy())
    assert out.shape == (3, 9, 13) and out.dtype == np.float64
    assert _max_err(out, ref) < ATOL and _max_err(out, ref_p) < ATOL
    assert np.abs(ref).max() > 0.5  # not a comparison of near-zero numbers
    # one sequence without a batch axis gives that sequence's row
    assert _max_err(_numpy_logits(model, ids[1].numpy()), ref[1]) < ATOL


@pytest.mark.parametrize("H_kv,rope,tied", CONFIGS)
def test_torch_function_llama_lm_equals_the_model_and_the_numpy_twin(H_kv, rope, tied):
    model = _model(H_kv, rope, tied)
    ids = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(2))
    params = model.numpy_params()
    t_params = {"W_E": model.W_E, "W_U": model.W_U, "norm": {"gamma": model.norm.gamma},
                "blocks": [{"norm_attn": {"gamma": b.norm_attn.gamma}, "attn": b.attn.params(),
                            "norm_mlp": {"gamma": b.norm_mlp.gamma}, "mlp": b.mlp.params()} for b in model.blocks]}
    out_t = TF.llama_lm(ids, t_params, 4, H_kv, rope=rope)
    with torch.no_grad():
        ref = model(ids)
    assert _max_err(out_t.detach().numpy(), ref.numpy()) < ATOL
    assert _max_err(out_t.detach().numpy(), _numpy_logits(model, ids.numpy(), params)) < ATOL
    out_t.square().sum().backward()  # differentiable: every weight gets a gradient
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in model.parameters())


@pytest.mark.parametrize("masked", [True, False])
def test_numpy_llama_block_equals_the_module(masked):
    torch.manual_seed(3)
    block = LlamaBlock(16, 4, 2, 24, rope="half").double()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3).add_(1.0 if p.dim() == 1 else 0.0)
    X = torch.randn(2, 6, 16, dtype=torch.float64)
    mask = torch.ones(6, 6, dtype=torch.bool).tril() if masked else None
    with torch.no_grad():
        ref = block(X, mask=mask).numpy()
    out = tnp.llama_block(X.numpy(), block.numpy_params(), 4, 2, mask=None if mask is None else mask.numpy())
    assert _max_err(out, ref) < ATOL
    assert _max_err(out, X.numpy()) > 0.1  # the block changed its input


def test_bad_input_names_the_argument_and_the_shapes():
    model = _model(2, "half", True)
    ids = np.zeros((2, 5), np.int64)
    with pytest.raises(ValueError, match=r"num_kv_heads=3 does not divide num_heads=4 \(X_q: \(2, 5, 16\)\)"):
        tnp.llama_lm(ids, model.numpy_params(), 4, 3)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, V=13\), got values in \[0, 13\] \(ids: \(2, 5\)"):
        tnp.llama_lm(ids + np.arange(5) * 13 // 4, model.numpy_params(), 4, 2)
    params = model.numpy_params()
    params["blocks"][1]["attn"]["W_V"] = params["blocks"][1]["attn"]["W_V"][:, :4]
    with pytest.raises(ValueError, match=r"params\['blocks'\]\[1\]\['attn'\]\['W_V'\] must have shape "
                                         r"\(D, H_kv \* D_K\) = \(16, 8\), got \(16, 4\)"):
        tnp.llama_lm(ids, params, 4, 2)


# The comparison above, shown to fail: each mutation changes one thing on the NumPy side.
def _perturbed(params):
    params["blocks"][1]["attn"]["W_K"][0, 0] += 1e-6
    return params


MUTATIONS = {
    "one weight of the second block's W_K is perturbed by 1e-6":
        lambda model, ids: _numpy_logits(model, ids, _perturbed(model.numpy_params())),
    "the other rotary layout is used (interleaved pairs instead of rotate-half)":
        lambda model, ids: _numpy_logits(model, ids, rope="interleaved"),
    "the RMSNorm epsilon is 1e-5 instead of 1e-6":
        lambda model, ids: _numpy_logits(model, ids, eps=1e-5),
    "the untied output head is ignored (W_E^T used instead)":
        lambda model, ids: _numpy_logits(model, ids, dict(model.numpy_params(), W_U=None)),
}


@pytest.mark.parametrize("fails_if", list(MUTATIONS))
def test_the_comparison_fails_when(fails_if):
    model = _model(2, "half", False)
    ids = torch.randint(0, 13, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).numpy()
    assert _max_err(_numpy_logits(model, ids.numpy()), ref) < ATOL  # unmutated: passes
    assert _max_err(MUTATIONS[fails_if](model, ids.numpy()), ref) > ATOL  # mutated: the check fails


def test_the_comparison_fails_without_the_causal_mask():
    """The NumPy block given no mask sees later tokens: every row but the last changes."""
    model = _model(4, "half", True)
    ids = np.array([[1, 5, 2, 9, 3]])
    p = model.numpy_params()
    c = model.config
    X = p["W_E"][ids]
    causal = tnp.llama_block(X, p["blocks"][0], 4, 4, mask=np.tril(np.ones((5, 5), bool)))
    full = tnp.llama_block(X, p["blocks"][0], 4, 4, mask=None)
    with torch.no_grad():
        ref = model.blocks[0](torch.as_tensor(X), mask=torch.ones(5, 5, dtype=torch.bool).tril()).numpy()
    assert _max_err(causal, ref) < ATOL and c.num_layers == 2
    assert np.all(np.abs(full - ref)[0, :-1].max(axis=-1) > ATOL)
    assert _max_err(full[0, -1], ref[0, -1]) < ATOL  # the last token sees everything either way
