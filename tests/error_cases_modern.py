"""Bad-input cases for the modern chapter's components, collected by test_backends_errors.py.

Each case is (name, args, kwargs, message regex), as CASES there; every name in
``tfbook.numpy.modern.__all__`` has at least one (tests/test_modern_functions.py checks).
"""

import re

import numpy as np

g = np.random.default_rng(0)


def r(*shape):
    return g.standard_normal(shape)


def _gqa(D=8, H_kv=2, D_K=2):
    return {"W_Q": r(D, D), "W_K": r(D, H_kv * D_K), "W_V": r(D, H_kv * D_K), "W_O": r(D, D)}


SWIGLU = {"W_gate": r(6, 16), "W_up": r(6, 16), "W_down": r(16, 6)}


def _block(D=8, H_kv=2, D_ff=16, changes=()):
    b = {"norm_attn": {"gamma": r(D)}, "attn": _gqa(D, H_kv, D // 4), "norm_mlp": {"gamma": r(D)},
         "mlp": {"W_gate": r(D, D_ff), "W_up": r(D, D_ff), "W_down": r(D_ff, D)}}
    for part, key, value in changes:
        b[part][key] = value
    return b


def _llama(V=11, D=8, **changes):
    p = {"W_E": r(V, D), "blocks": [_block(), _block()], "norm": {"gamma": r(D)}, "W_U": None}
    p.update(changes)
    return p

CASES: list = [
    ("rms_norm", (r(2, 5, 6), r(5)), {}, r"gamma must have shape \(D,\) = \(6,\), got \(5,\)"),
    ("rms_norm", (np.ones(()), None), {}, r"X must have at least 1 axes \(\.\.\., D\), got shape \(\)"),
    ("rms_norm", (r(2, 6), None), {"eps": -1.0}, r"eps must be >= 0.*\(2, 6\)"),
    ("silu", (np.array(["a"]),), {}, r"x must be floating point.*\(1,\)"),
    ("gelu_tanh", (np.array(["a"]),), {}, r"x must be floating point.*\(1,\)"),
    ("swiglu", (r(2, 5, 8), SWIGLU), {}, r"W_gate.*\(8, \?\).*\(6, 16\)"),
    ("swiglu", (r(2, 5, 6), {**SWIGLU, "W_up": r(6, 12)}), {}, r"W_up.*\(6, 16\).*\(6, 12\)"),
    ("swiglu", (r(2, 5, 6), {**SWIGLU, "W_down": r(16, 5)}), {}, r"W_down.*\(16, 6\).*\(16, 5\)"),
    ("swiglu", (r(2, 5, 6), {"W_gate": SWIGLU["W_gate"]}), {}, r"missing keys.*W_up"),
    ("rope_rotate_half", (r(2, 5, 7),), {}, r"D=7.*even.*\(2, 5, 7\)"),
    ("rope_rotate_half", (r(2, 5, 6),), {"positions": np.arange(4)}, r"positions .*T=5.*\(4,\).*\(2, 5, 6\)"),
    ("rope_permutation", (7,), {}, r"D=7 must be even"),
    ("rope_permutation", (0,), {}, r"D must be an integer >= 1, got 0"),
    ("rope_attention", (r(2, 5, 6), r(2, 7, 4), r(2, 7, 4)), {},
     re.escape("Q has D_K=6 but K has D_K=4 (Q: (2, 5, 6), K: (2, 7, 4))")),
    ("rope_attention", (r(2, 5, 5), r(2, 7, 5), r(2, 7, 4)), {}, r"D_K=5.*even.*\(2, 5, 5\)"),
    ("rope_attention", (r(2, 5, 4), r(2, 7, 4), r(2, 7, 4)), {"layout": "neox"}, r"layout must be one of"),
    ("rope_attention", (r(2, 9, 4), r(2, 7, 4), r(2, 7, 4)), {}, r"q_positions is required when T_q=9 > T_k=7"),
    ("rope_attention", (r(2, 5, 4), r(2, 7, 4), r(2, 7, 4)), {"q_positions": np.arange(4)},
     r"q_positions must have shape \(\.\.\., T\) with T=5, got \(4,\) \(Q: \(2, 5, 4\)\)"),
    ("rope_attention", (r(2, 5, 4), r(2, 7, 4), r(2, 7, 4)), {"mask": np.ones((5, 6), bool)},
     r"mask of shape \(5, 6\).*\(2, 5, 7\)"),
    ("grouped_query_attention", (r(2, 5, 8), r(2, 7, 8), _gqa(), 4, 3), {},
     r"num_kv_heads=3 does not divide num_heads=4 \(X_q: \(2, 5, 8\)\)"),
    ("grouped_query_attention", (r(2, 5, 8), r(2, 7, 8), _gqa(), 3, 1), {},
     r"num_heads=3 does not divide D=8 \(X_q: \(2, 5, 8\)\)"),
    ("grouped_query_attention", (r(2, 5, 8), r(2, 7, 8), _gqa(H_kv=4), 4, 2), {},
     r"W_K'\] must have shape \(D, H_kv \* D_K\) = \(8, 4\), got \(8, 8\)"),
    ("grouped_query_attention", (r(2, 5, 8), r(2, 7, 6), _gqa(), 4, 2), {}, r"X_q has D=8 but X_kv has D=6.*\(2, 7, 6\)"),
    ("grouped_query_attention", (r(2, 5, 8), r(2, 7, 8), _gqa(), 4, 2), {"mask": np.ones((5, 5), bool)},
     r"mask of shape \(5, 5\).*\(2, 5, 7\)"),
    ("grouped_query_attention", (r(2, 5, 8), r(2, 7, 8), _gqa(), 4, 2), {"rope": "neox"}, r"rope must be one of"),
    ("grouped_query_attention", (r(2, 9, 8), r(2, 7, 8), _gqa(), 4, 2), {"rope": "half"},
     r"T_q=9 must be <= T_kv=7 \(X_q: \(2, 9, 8\), X_kv: \(2, 7, 8\)\)"),
    ("grouped_query_attention", (r(2, 5, 12), r(2, 5, 12), _gqa(12, 2, 3), 4, 2), {"rope": "half"},
     r"even head width.*D_K = D / H = 3.*\(2, 5, 12\)"),
    ("llama_block", (r(2, 5, 8), _block(changes=[("attn", "W_K", r(8, 8))]), 4, 2), {},
     re.escape("params['attn']['W_K'] must have shape (D, H_kv * D_K) = (8, 4), got (8, 8)")),
    ("llama_block", (r(2, 5, 8), _block(changes=[("norm_mlp", "gamma", r(6))]), 4, 2), {},
     re.escape("params['norm_mlp']['gamma'] must have shape (D,) = (8,), got (6,)")),
    ("llama_block", (r(2, 5, 8), {"attn": _gqa()}, 4, 2), {}, r"params is missing keys \['norm_attn', 'norm_mlp', 'mlp'\]"),
    ("llama_block", (r(2, 5, 8), _block(), 4, 3), {}, r"num_kv_heads=3 does not divide num_heads=4 \(X_q: \(2, 5, 8\)\)"),
    ("llama_lm", (np.array([[0, 3, 11, 2, 1]]), _llama(), 4, 2), {},
     re.escape("ids must lie in [0, V=11), got values in [0, 11] (ids: (1, 5), params['W_E']: (11, 8))")),
    ("llama_lm", (r(2, 5), _llama(), 4, 2), {}, r"ids must be integers, got dtype \S*float64 \(ids: \(2, 5\)\)"),
    ("llama_lm", (np.zeros((2, 5), np.int64), _llama(blocks=[_block(), _block(changes=[("mlp", "W_down", r(16, 6))])]), 4, 2), {},
     re.escape("params['blocks'][1]['mlp']['W_down'] must have shape (D_ff, D) = (16, 8), got (16, 6)")),
    ("llama_lm", (np.zeros((2, 5), np.int64), _llama(W_U=r(8, 10)), 4, 2), {},
     re.escape("params['W_U'] must have shape (D, V) = (8, 11), got (8, 10)")),
]
