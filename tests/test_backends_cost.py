"""tfbook.cost against independent counts.

Matrix-product FLOPs are checked against torch.utils.flop_counter.FlopCounterMode
running the torch functions (it counts 2 m k n per product, the same convention,
and knows nothing of our formulas); sizes against loops and real tensors.
"""

import itertools

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tfbook import cost
from tfbook.torch import functional as TF

from conftest import random_encoder_params, random_ffn_params, random_mha_params, to_torch


def _count(fn, *args, **kw):
    with FlopCounterMode(display=False) as fc:
        fn(*args, **kw)
    return fc.get_total_flops()


def test_matmul_flops_by_loop():
    m, k, n = 3, 4, 5
    ops = 0
    for _i, _j, _l in itertools.product(range(m), range(n), range(k)):
        ops += 2  # one multiply, one add
    assert cost.matmul_flops(m, k, n) == ops


@pytest.mark.parametrize("T,D_K,D_V,H", [(16, 8, 8, 1), (32, 16, 4, 4), (7, 3, 5, 2)])
def test_scores_and_pv_vs_flop_counter(T, D_K, D_V, H):
    Q, K, V = torch.randn(H, T, D_K, dtype=torch.float64), torch.randn(H, T, D_K, dtype=torch.float64), \
        torch.randn(H, T, D_V, dtype=torch.float64)
    counted = _count(TF.scaled_dot_product_attention, Q, K, V)
    assert counted == cost.score_flops(T, D_K, H) + cost.pv_flops(T, D_V, H)
    assert cost.score_flops(T, D_K, H) == 2 * H * T * T * D_K


@pytest.mark.parametrize("T,D,H", [(10, 8, 2), (16, 32, 4)])
def test_mha_vs_flop_counter(T, D, H):
    g = np.random.default_rng(0)
    p = to_torch(random_mha_params(g, D, bias=False))
    X = torch.randn(1, T, D, dtype=torch.float64)
    counted = _count(TF.multi_head_attention, X, X, p, H)
    proj = cost.projection_flops(T, D, H)
    assert set(proj) == {"Q", "K", "V", "O"}
    assert counted == sum(proj.values()) + cost.score_flops(T, D // H, H) + cost.pv_flops(T, D // H, H)
    assert sum(proj.values()) == 8 * T * D * D


@pytest.mark.parametrize("T,D,D_ff", [(5, 8, 32), (12, 16, 24)])
def test_mlp_vs_flop_counter(T, D, D_ff):
    p = to_torch(random_ffn_params(np.random.default_rng(0), D, D_ff))
    X = torch.randn(1, T, D, dtype=torch.float64)
    assert _count(TF.feed_forward, X, p) == cost.mlp_flops(T, D, D_ff) == 2 * 2 * T * D * D_ff


def test_layer_breakdown_vs_flop_counter():
    T, D, H, D_ff = 9, 16, 4, 40
    p = to_torch(random_encoder_params(np.random.default_rng(0), D, D_ff))
    X = torch.randn(1, T, D, dtype=torch.float64)
    br = cost.layer_flops(T, D, H, D_ff)
    assert br["total"] == sum(v for k, v in br.items() if k != "total")
    # FlopCounterMode counts matrix products only: everything but the softmax term
    assert _count(TF.encoder_block, X, p, H) == br["total"] - br["softmax"]
    assert br["softmax"] == H * T * T
    assert cost.softmax_flops(T, H, ops_per_score=5) == 5 * H * T * T


@pytest.mark.parametrize("D,D_ff", [(64, 256), (512, 2048), (96, 200)])
def test_crossover(D, D_ff):
    def attn(T):
        return cost.score_flops(T, D, 1) + cost.pv_flops(T, D, 1)  # H D_K = H D_V = D

    T_star = cost.attention_mlp_crossover_T(D, D_ff)
    assert attn(int(T_star)) == cost.mlp_flops(int(T_star), D, D_ff)
    assert attn(int(T_star) - 1) < cost.mlp_flops(int(T_star) - 1, D, D_ff)
    assert attn(int(T_star) + 1) > cost.mlp_flops(int(T_star) + 1, D, D_ff)
    T2 = int(cost.attention_mlp_crossover_T(D, D_ff, include_projections=True))
    if T2 > 0:
        with_proj = attn(T2) + sum(cost.projection_flops(T2, D, 1).values())
        assert with_proj == cost.mlp_flops(T2, D, D_ff)


@pytest.mark.parametrize("dtype,size", [(torch.float32, 4), (torch.float64, 8), (torch.float16, 2),
                                        (np.float32, 4), ("bfloat16", 2), ("float64", 8)])
def test_score_matrix_bytes_vs_real_tensor(dtype, size):
    T, H = 12, 3
    assert cost.dtype_bytes(dtype) == size
    Q = torch.randn(H, T, 4, dtype=torch.float32)
    _, P = TF.scaled_dot_product_attention(Q, Q, Q)
    assert cost.score_matrix_bytes(T, H, torch.float32) == P.numel() * P.element_size()
    assert cost.score_matrix_bytes(T, H, dtype) == H * T * T * size
    assert cost.score_matrix_bytes(16384, 1, "float32") == 2**30  # the 1 GiB of the benchmark


def test_bad_arguments():
    with pytest.raises(ValueError, match="H=3 does not divide D=8"):
        cost.layer_flops(4, 8, 3, 16)
    with pytest.raises(ValueError, match="unknown dtype"):
        cost.dtype_bytes("int4x")
    with pytest.raises(ValueError, match="D=0"):
        cost.attention_mlp_crossover_T(0, 10)


def test_activation_bytes_sum():
    br = cost.layer_activation_bytes(10, 8, 2, 32, "float32")
    assert br["total"] == sum(v for k, v in br.items() if k != "total")
    assert br["scores"] == 2 * 10 * 10 * 4
