"""Bad input raises ValueError naming the argument and showing the shapes, in both backends.

Every public function has at least one case (a test checks that); each message must
contain the offending shapes, not a deep broadcasting error.
"""

import re

import numpy as np
import pytest
import torch

import tfbook.numpy as tnp
from tfbook.torch import functional as TF

from conftest import random_decoder_params, random_encoder_params, random_ffn_params, random_mha_params
from test_backends_parity import NUMPY_ONLY
import error_cases_experts
import error_cases_modern
import error_cases_serving
import error_cases_training

g = np.random.default_rng(0)


def r(*shape):
    return g.standard_normal(shape)


def b(*shape):
    return np.ones(shape, bool)


MHA = random_mha_params(g, 8)
FFN = random_ffn_params(g, 8, 16)
ENC = random_encoder_params(g, 8, 16)
DEC = random_decoder_params(g, 8, 16)

# (function, args, kwargs, regex the message must match)
CASES = [
    ("softmax", (r(3, 4),), {"axis": 2}, r"axis=2 .*\(3, 4\)"),
    ("softmax", (np.ones(()),), {}, r"x must have at least 1 axis, got shape \(\)"),
    ("scaled_dot_product_attention", (r(2, 5, 64), r(2, 7, 32), r(2, 7, 8)), {},
     re.escape("Q has D_K=64 but K has D_K=32 (Q: (2, 5, 64), K: (2, 7, 32))")),
    ("scaled_dot_product_attention", (r(2, 5, 4), r(2, 7, 4), r(2, 6, 8)), {}, r"T_k=7.*T_k=6.*\(2, 7, 4\).*\(2, 6, 8\)"),
    ("scaled_dot_product_attention", (r(5,), r(7, 4), r(7, 4)), {}, r"Q must have at least 2 axes.*\(5,\)"),
    ("scaled_dot_product_attention", (r(2, 5, 4), r(3, 7, 4), r(3, 7, 4)), {}, r"batch axes.*\(2,\).*\(3,\)"),
    ("scaled_dot_product_attention", (r(2, 5, 4), r(2, 7, 4), r(2, 7, 4)), {"mask": b(5, 6)},
     r"mask of shape \(5, 6\).*\(2, 5, 7\)"),
    ("scaled_dot_product_attention", (r(2, 5, 4), r(2, 7, 4), r(2, 7, 4)), {"mask": np.ones((5, 7))},
     r"mask must be boolean.*\(5, 7\)"),
]
# blocked_attention validates exactly as the reference: the same cases, the same messages
CASES += [("blocked_attention",) + c[1:] for c in CASES if c[0] == "scaled_dot_product_attention"]
CASES += [
    ("additive_attention", (r(5, 3), r(6, 2), r(6, 4), r(4, 8), r(2, 8), r(8)), {}, r"W_q.*\(3, \?\).*\(4, 8\)"),
    ("additive_attention", (r(5, 3), r(6, 2), r(6, 4), r(3, 8), r(2, 8), r(7)), {}, r"v .*\(8,\).*\(7,\)"),
    ("additive_attention", (r(5, 3), r(6, 2), r(7, 4), r(3, 8), r(2, 8), r(8)), {}, r"T_k=6.*T_k=7"),
    ("scaled_dot_product_attention", (r(2, 5, 4), r(2, 0, 4), r(2, 0, 8)), {}, r"T_k=0.*\(2, 0, 4\)"),
    ("scaled_dot_product_attention", (r(2, 5, 0), r(2, 7, 0), r(2, 7, 8)), {}, r"D_K=0.*\(2, 5, 0\)"),
    ("softmax", (r(3, 0),), {}, r"no entries along axis=-1.*\(3, 0\)"),
    ("causal_mask", (0,), {}, r"T must be an integer >= 1, got 0"),
    ("padding_mask", (np.array([3, 9]), 5), {}, r"lengths must lie in \[0, T=5\].*\(2,\)"),
    ("padding_mask", (np.array([[3]]), 5), {}, r"lengths .*\(1, 1\)"),
    ("attention_mask_from_padding", (b(2, 3, 4),), {}, r"valid .*\(2, 3, 4\)"),
    ("sliding_window_mask", (5, 0), {}, r"window must be an integer >= 1, got 0"),
    ("split_heads", (r(2, 5, 8), 3), {}, r"num_heads=3 does not divide D=8 \(X: \(2, 5, 8\)\)"),
    ("merge_heads", (r(5, 8),), {}, r"X must have at least 3 axes.*\(5, 8\)"),
    ("multi_head_attention", (r(2, 5, 8), r(2, 7, 8), MHA, 3), {}, r"num_heads=3 does not divide D=8 \(X_q: \(2, 5, 8\)\)"),
    ("multi_head_attention", (r(2, 5, 8), r(2, 7, 6), MHA, 2), {}, r"X_q has D=8 but X_kv has D=6.*\(2, 7, 6\)"),
    ("multi_head_attention", (r(2, 5, 6), r(2, 7, 6), MHA, 2), {}, r"W_Q.*\(6, 6\).*\(8, 8\)"),
    ("multi_head_attention", (r(2, 5, 8), r(2, 7, 8), MHA, 2), {"mask": b(5, 5)},
     r"mask of shape \(5, 5\).*\(2, 5, 7\)"),
    ("multi_head_attention", (r(2, 5, 8), r(2, 7, 8), {"W_Q": MHA["W_Q"]}, 2), {}, r"missing keys.*W_K"),
    ("one_hot", (np.array([0, 7]), 7), {}, r"ids must lie in \[0, 7\).*max 7.*\(2,\)"),
    ("embedding_lookup", (np.array([[1, 2]]), r(5)), {}, r"W_E must have exactly 2 axes.*\(5,\)"),
    ("embedding_lookup", (np.array([1.0]), r(5, 3)), {}, r"ids must be integers.*\(1,\)"),
    ("sinusoidal_positional_encoding", (4, 7), {}, r"D=7 must be even"),
    ("sinusoidal_shift_matrix", (1, 5), {}, r"D=5 must be even"),
    ("sinusoidal_positional_encoding_2d", (3, 4, 6), {}, r"D=6 must be divisible by 4"),
    ("learned_positional_embedding", (r(2, 9, 4), r(8, 4)), {}, r"T=9.*T_max=8.*\(2, 9, 4\).*\(8, 4\)"),
    ("learned_positional_embedding", (r(2, 5, 4), r(8, 3)), {}, r"D=4.*D=3.*\(2, 5, 4\).*\(8, 3\)"),
    ("rope", (r(2, 5, 7),), {}, r"D=7.*even.*\(2, 5, 7\)"),
    ("rope", (r(2, 5, 6),), {"positions": np.arange(4)}, r"positions .*T=5.*\(4,\).*\(2, 5, 6\)"),
    ("layer_norm", (r(2, 5, 6), r(5), r(6)), {}, r"gamma must have shape \(D,\) = \(6,\), got \(5,\)"),
    ("relu", (np.array(["a"]),), {}, r"x must be floating point.*\(1,\)"),
    ("gelu", (np.array(["a"]),), {}, r"x must be floating point.*\(1,\)"),
    ("feed_forward", (r(2, 5, 6), FFN), {}, r"W_1.*\(6, \?\).*\(8, 16\)"),
    ("feed_forward", (r(2, 5, 8), FFN), {"activation": "tanh"}, r"activation must be one of"),
    ("encoder_block", (r(2, 5, 8), ENC, 3), {}, r"num_heads=3 does not divide D=8"),
    ("encoder_block", (r(2, 5, 8), ENC, 2), {"mask": b(4, 4)}, r"mask of shape \(4, 4\).*\(2, 5, 5\)"),
    ("encoder_block", (r(8,), ENC, 2), {}, r"X must have at least 2 axes.*\(8,\)"),
    ("decoder_block", (r(2, 5, 8), r(2, 6, 4), DEC, 2), {}, r"X has D=8 but memory has D=4.*\(2, 6, 4\)"),
    ("decoder_block", (r(2, 5, 8), r(2, 6, 8), DEC, 2), {"cross_mask": b(5, 5)}, r"mask of shape \(5, 5\).*\(2, 5, 6\)"),
    ("patchify", (r(2, 3, 10, 12), 4), {}, r"images of shape \(2, 3, 10, 12\).*patch_size=4"),
    ("patchify", (r(3, 8, 8), 4), {}, r"images must have exactly 4 axes.*\(3, 8, 8\)"),
    ("unpatchify", (r(2, 5, 48), 4, (3, 8, 12)), {}, r"patches of shape \(2, 5, 48\).*\(B, 6, 48\)"),
    ("unpatchify", (r(2, 6, 48), 4, (3, 8, 10)), {}, r"image_shape=\(3, 8, 10\).*patch_size=4"),
    ("attention_rollout", ([r(2, 4, 4), r(2, 5, 5)],), {}, r"attentions\[1\] has shape \(2, 5, 5\).*\(2, 4, 4\)"),
    ("attention_rollout", ([r(2, 4, 5)],), {}, r"square.*\(2, 4, 5\)"),
    ("attention_rollout", ([],), {}, r"at least one layer"),
    ("kv_cache_append", ((r(2, 3, 4), r(2, 3, 4)), r(2, 1, 5), r(2, 1, 4)), {}, r"cache K of shape \(2, 3, 4\).*\(2, 1, 5\)"),
    ("kv_cache_append", (None, r(2, 1, 4), r(2, 2, 4)), {}, r"K_new: \(2, 1, 4\), V_new: \(2, 2, 4\)"),
    ("tiled_attention", (r(2, 5, 64), r(2, 7, 32), r(2, 7, 8)), {}, re.escape("(Q: (2, 5, 64), K: (2, 7, 32))")),
    ("tiled_attention", (r(2, 5, 4), r(2, 7, 4), r(2, 7, 4)), {"block_size": 0}, r"block_size must be an integer >= 1"),
    ("linear_attention", (r(2, 5, 4), r(2, 7, 4), r(2, 7, 4)), {"causal": True}, r"T_q == T_k.*\(2, 5, 4\).*\(2, 7, 4\)"),
    ("linear_attention", (r(2, 5, 4), r(2, 7, 3), r(2, 7, 4)), {}, r"D_K=4 but K has D_K=3"),
]
ERROR_CASES = CASES + error_cases_training.CASES + error_cases_modern.CASES + error_cases_serving.CASES + error_cases_experts.CASES


def _conv(a):
    if isinstance(a, np.ndarray) and a.dtype.kind in "biuf":
        return torch.as_tensor(a)
    if isinstance(a, dict):
        return {k: _conv(v) for k, v in a.items()}
    if isinstance(a, list):
        return [_conv(v) for v in a]
    if isinstance(a, tuple) and any(isinstance(v, np.ndarray) for v in a):
        return tuple(_conv(v) for v in a)
    return a


def test_every_public_function_has_an_error_case():
    assert {c[0] for c in ERROR_CASES} == set(tnp.__all__)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("name,args,kwargs,pattern", ERROR_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(ERROR_CASES)])
def test_bad_input_raises_value_error_with_shapes(backend, name, args, kwargs, pattern):
    if backend == "torch":
        if any(isinstance(a, np.ndarray) and a.dtype.kind == "U" for a in args):
            args = (torch.tensor([1, 2]),)  # torch has no string tensors: use an integer tensor
            pattern = r"x must be floating point.*\(2,\)"
        twin = NUMPY_ONLY[name][0] if name in NUMPY_ONLY else name  # the torch function computing the same
        fn, args, kwargs = getattr(TF, twin), tuple(_conv(a) for a in args), _conv(kwargs)
    else:
        fn = getattr(tnp, name)
    with pytest.raises(ValueError, match=pattern):
        fn(*args, **kwargs)


def test_torch_rejects_numpy_inputs_clearly():
    with pytest.raises(ValueError, match=r"Q must be a torch.Tensor, got ndarray"):
        TF.scaled_dot_product_attention(r(2, 3), torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"params\['W_Q'\] must be a torch.Tensor"):
        TF.multi_head_attention(torch.zeros(1, 2, 8), torch.zeros(1, 2, 8), MHA, 2)


def test_relu_promotes_integers_and_booleans_in_numpy():
    assert tnp.relu(np.array([-1, 2])).tolist() == [0.0, 2.0]
    with pytest.raises(ValueError, match=r"x must be floating point"):
        TF.relu(torch.tensor([-1, 2]))


def test_mixed_dtypes_and_integers_the_documented_way():
    """Issue 38: the twins' contract on dtypes (book/api.md, "dtypes are preserved"): NumPy
    promotes as NumPy does; PyTorch refuses with a ValueError naming each dtype (it raised a bare
    RuntimeError from the product before)."""
    Q, K, V = r(2, 3), r(4, 3), r(4, 5)
    Z, _ = tnp.scaled_dot_product_attention(Q.astype(np.float32), K, V)
    assert Z.dtype == np.float64
    assert tnp.scaled_dot_product_attention(Q.round().astype(int), K, V)[0].dtype == np.float64
    with pytest.raises(ValueError, match=r"Q, K, V must share one dtype, got Q: torch.float32 \(2, 3\), "
                                         r"K: torch.float64 \(4, 3\)"):
        TF.scaled_dot_product_attention(torch.tensor(Q, dtype=torch.float32), torch.tensor(K), torch.tensor(V))
    with pytest.raises(ValueError, match=r"Q must be floating point, got dtype torch.int64"):
        TF.scaled_dot_product_attention(torch.ones(2, 3, dtype=torch.long), torch.tensor(K), torch.tensor(V))


def test_nan_propagates_in_both_twins_and_check_finite_finds_it():
    """The documented choice: NaN is not checked per call; it reaches the outputs it touches."""
    from tfbook.checks import check_finite

    Q, K, V = r(2, 3), r(4, 3), r(4, 5)
    Q[0, 0] = np.nan
    Zn, _ = tnp.scaled_dot_product_attention(Q, K, V)
    Zt, _ = TF.scaled_dot_product_attention(torch.tensor(Q), torch.tensor(K), torch.tensor(V))
    assert np.isnan(Zn[0]).all() and np.isfinite(Zn[1]).all()
    assert torch.isnan(Zt[0]).all() and torch.isfinite(Zt[1]).all()
    with pytest.raises(AssertionError):
        check_finite(Zn, "Z")
