"""Bad-input cases for chapter 19's components (tfbook.numpy.experts and its torch twin),
collected by test_backends_errors.py; every name in ``tfbook.numpy.experts.__all__`` has at
least one (tests/test_experts.py checks).

Each case is (name, args, kwargs, message regex), as CASES there.
"""

import numpy as np

g = np.random.default_rng(0)


def r(*shape):
    return g.standard_normal(shape)


def _sw(D=6, F=10):
    return {"W_gate": r(D, F), "W_up": r(D, F), "W_down": r(F, D)}


def _moe(D=6, E=4, **changes):
    p = {"W_router": r(D, E), "experts": [_sw(D) for _ in range(E)], "shared": None}
    p.update(changes)
    return p


CASES: list = [
    ("top_k_router", (r(2, 5, 6), r(8, 4), 2), {}, r"X has D=6 but W_router has D=8 \(X: \(2, 5, 6\), W_router: \(8, 4\)\)"),
    ("top_k_router", (r(2, 5, 6), r(6, 4), 5), {}, r"k=5 exceeds the number of experts E=4 \(W_router: \(6, 4\)\)"),
    ("top_k_router", (r(2, 5, 6), r(6, 4), 0), {}, r"k must be an integer >= 1, got 0"),
    ("top_k_router", (r(2, 5, 6), r(6), 1), {}, r"W_router must have exactly 2 axes \(D, E\), got shape \(6,\)"),
    ("load_balancing_loss", (r(2, 5, 4), np.zeros((2, 4, 2), dtype=np.int64)), {},
     r"same leading \(token\) axes \(probs: \(2, 5, 4\), experts: \(2, 4, 2\)\)"),
    ("load_balancing_loss", (r(5, 4), np.zeros((5, 6), dtype=np.int64)), {},
     r"experts has k=6 choices per token but probs has only E=4 experts"),
    ("load_balancing_loss", (r(5, 4), np.zeros((5, 2))), {}, r"experts must be integer expert ids, got dtype (torch\.)?float64 \(shape \(5, 2\)\)"),
    ("router_z_loss", (np.array(1.0),), {}, r"logits must have at least 1 axes \(\.\.\., E\), got shape \(\)"),
    ("biased_top_k_router", (r(2, 5, 6), r(6, 4), 2, r(3)), {}, r"bias must have one entry per expert, E=4, got shape \(3,\)"),
    ("biased_top_k_router", (r(2, 5, 6), r(6, 4), 2, r(4, 1)), {}, r"bias must have exactly 1 axes \(E,\), got shape \(4, 1\)"),
    ("biased_top_k_router", (r(2, 5, 6), r(6, 4), 2, r(4)), {"score": "tanh"}, r"score must be 'softmax' or 'sigmoid', got 'tanh'"),
    ("balance_bias_update", (r(4), np.zeros((5, 2))), {"rate": 0.1}, r"experts must be integer expert ids"),
    ("balance_bias_update", (r(4), np.full((5, 2), 4, dtype=np.int64), 0.1), {}, r"experts must be ids in \[0, E=4\)"),
    ("balance_bias_update", (r(4), np.zeros((5, 2), dtype=np.int64), -1.0), {}, r"rate must be a finite number >= 0, got -1.0"),
    ("expert_capacity", (64, 8, 2, 0.0), {}, r"capacity_factor must be a number > 0 or None, got 0.0"),
    ("expert_capacity", (64, 2, 3, 1.0), {}, r"k=3 exceeds num_experts=2"),
    ("expert_capacity", (0, 8, 2, 1.0), {}, r"num_tokens must be an integer >= 1, got 0"),
    ("moe", (r(2, 5, 6), _moe(experts=[_sw() for _ in range(3)]), 2), {},
     r"params\['experts'\] must be a list of E=4 SwiGLU dicts.*W_router \(6, 4\).*got 3"),
    ("moe", (r(2, 5, 6), _moe(experts=[_sw(), _sw(), _sw(), _sw(6, 10) | {"W_up": r(6, 9)}]), 2), {},
     r"params\['experts'\]\[3\]\['W_up'\] must have shape \(D, D_ff\) = \(6, 10\), got \(6, 9\)"),
    ("moe", (r(2, 5, 6), _moe(shared=_sw(5)), 2), {}, r"params\['shared'\]\['W_gate'\] must have shape \(D, D_ff\) = \(6, \?\), got \(5, 10\)"),
    ("moe", (r(2, 5, 6), _moe(), 2), {"capacity_factor": -1.0}, r"capacity_factor must be a number > 0 or None, got -1.0"),
    ("moe", (r(2, 5, 6), _moe(), 2), {"bias": r(3)}, r"bias must have one entry per expert, E=4, got shape \(3,\)"),
    ("moe", (r(2, 5, 6), {"experts": []}, 2), {}, r"params is missing keys \['W_router'\]"),
    ("moe_dense", (r(2, 5, 7), _moe(), 2), {}, r"X has D=7 but W_router has D=6 \(X: \(2, 5, 7\), W_router: \(6, 4\)\)"),
    ("moe_dense", (r(2, 5, 6), _moe(), 9), {}, r"k=9 exceeds the number of experts E=4"),
    ("lora_linear", (r(3, 6), r(6, 5), r(6, 2), r(3, 5), 2.0), {},
     r"B must have shape \(r, D_out\) = \(2, 5\) \(W: \(6, 5\), A: \(6, 2\), B: \(3, 5\)\)"),
    ("lora_linear", (r(3, 6), r(6, 5), r(5, 2), r(2, 5), 2.0), {}, r"A must have shape \(D_in, r\) with D_in=6 rows"),
    ("lora_linear", (r(3, 4), r(6, 5), r(6, 2), r(2, 5), 2.0), {}, r"X has last axis 4 but W has D_in=6 \(X: \(3, 4\), W: \(6, 5\)\)"),
    ("lora_linear", (r(3, 6), r(6, 5), r(6, 2), r(2, 5), float("nan")), {}, r"alpha must be a finite number"),
    ("lora_merge", (r(6, 5), r(6, 2), r(2, 4), 2.0), {}, r"B must have shape \(r, D_out\) = \(2, 5\)"),
    ("lora_merge", (r(6, 5, 1), r(6, 2), r(2, 5), 2.0), {}, r"W must have exactly 2 axes \(D_in, D_out\), got shape \(6, 5, 1\)"),
]
