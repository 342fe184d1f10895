"""Bad-input cases of chapter 20's components (tfbook.numpy.serving and its torch twin), in the
form of tests/test_backends_errors.py: (name, args, kwargs, message pattern)."""

import re

import numpy as np

g = np.random.default_rng(20)


def r(*shape):
    return g.standard_normal(shape)


def _mla(D=32, H=4, D_c=8, D_R=4, D_nope=6, D_V=5):
    return {"W_DKV": r(D, D_c), "gamma_KV": r(D_c), "W_KR": r(D, D_R), "W_UK": r(D_c, H * D_nope),
            "W_UV": r(D_c, H * D_V), "W_O": r(H * D_V, D), "W_Q": r(D, H * (D_nope + D_R))}


_P, _Q = np.full((2, 3), 1 / 3), np.full((2, 3), 1 / 3)

CASES = [
    ("rope_frequencies", (7,), {}, r"D_K=7 must be even"),
    ("rope_frequencies", (8,), {"scaling": "linear"}, r"scaling must be one of"),
    ("rope_frequencies", (8,), {"scaling": "yarn", "factor": 2.0}, r"original_length must be an integer"),
    ("rope_rotate", (r(2, 5, 8), r(3)), {}, r"omega must have shape \(D/2,\) = \(4,\), got \(3,\)"),
    ("rope_rotate", (r(2, 5, 8), r(4)), {"positions": np.arange(4.0)}, r"T=5, got \(4,\).*\(2, 5, 8\)"),
    ("mla_cache", (r(5, 30), _mla()), {}, re.escape("params['W_DKV'] must have shape (D, D_c) = (30, ?), got (32, 8)")),
    ("mla_attention", (r(5, 32), _mla(), 5), {}, r"num_heads=5 does not divide the 24 columns of params\['W_UK'\]"),
    ("mla_attention", (r(5, 32), _mla(), 4), {"mask": np.ones((4, 4), bool)}, r"mask of shape \(4, 4\).*\(5, 5\)"),
    ("quantize_int8", (r(3, 4),), {"axis": 2}, r"axis=2 is out of range for axis of shape \(3, 4\)"),
    ("quantize_int4", (r(10, 4),), {"group_size": 4}, r"group_size=4 does not divide D_in=10.*\(10, 4\)"),
    ("dequantize", (r(8, 4), r(2, 4)), {"group_size": 4}, r"q must hold integers.*\(8, 4\)"),
    ("dequantize", (np.ones((8, 4), np.int8), r(3, 4)), {"group_size": 4}, r"scale must have shape.*\(2, 4\).*\(3, 4\)"),
    ("speculative_accept", (_P, _Q, np.array([0, 5]), np.array([0.5, 0.5])), {}, r"token must lie in \[0, V=3\)"),
    ("speculative_accept", (_P, _Q, np.array([0, 1]), np.array([0.5])), {}, r"u must have shape.*\(2,\), got \(1,\)"),
    ("speculative_distribution", (_P, np.full((2, 4), 0.25)), {}, r"same shape.*\(2, 3\).*\(2, 4\)"),
    ("speculative_distribution", (_P * 2, _Q), {}, r"p must be probability vectors.*\(2, 3\)"),
    ("paged_write", (r(5, 4, 2, 3), r(2, 3, 3), np.zeros((2, 2), int), np.zeros(2, int)), {},
     r"K_new must have H_kv = 2 heads"),
    ("paged_attention", (r(2, 3, 3), r(5, 4, 2, 3), r(5, 4, 2, 3), np.zeros((2, 2), int), np.ones(2, int)), {},
     r"Q's H = 3 heads must be a multiple of the cache's H_kv = 2"),
    ("gptq_quantize", (r(8, 4), r(4, 4)), {}, re.escape("H must have shape (D_in, D_in) = (8, 8)")),
]
