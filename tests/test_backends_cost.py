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


def _meta_decoder_lm(T, D, L, H, D_ff, V):
    from tfbook.torch.models import DecoderLM, DecoderLMConfig
    cfg = DecoderLMConfig(vocab_size=V, block_size=T, d_model=D, num_heads=H, num_layers=L, d_ff=D_ff)
    with torch.device("meta"):
        model = DecoderLM(cfg)
    return model, torch.zeros(1, T, dtype=torch.long)


@pytest.mark.parametrize("T,D,L,H,D_ff,V", [(12, 16, 2, 4, 40, 37), (9, 24, 3, 3, 48, 11)])
def test_decoder_lm_flops_vs_flop_counter(T, D, L, H, D_ff, V):
    # the explicit path (return_attention=True) computes the full T x T square with plain bmm
    model, idx = _meta_decoder_lm(T, D, L, H, D_ff, V)
    with FlopCounterMode(display=False) as fc:
        model(idx, return_attention=True)
    by_op = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
    f = cost.decoder_lm_flops(T, D, L, H, D_ff, V)
    assert by_op["aten.bmm"] == f["scores"] + f["pv"]
    assert fc.get_total_flops() == f["total"] - f["softmax"] - f["embed"]
    weights = sum(p.numel() for n, p in model.named_parameters() if p.ndim == 2 and n.startswith("blocks"))
    assert weights == cost.non_embedding_params(D, L, D_ff)


def test_decoder_lm_conventions():
    T, D, L, H, D_ff, V = 10, 8, 3, 2, 20, 7
    book, causal = cost.decoder_lm_flops(T, D, L, H, D_ff, V), cost.decoder_lm_flops(T, D, L, H, D_ff, V, "causal")
    kap, chin = cost.decoder_lm_flops(T, D, L, H, D_ff, V, "kaplan"), cost.decoder_lm_flops(T, D, L, H, D_ff, V, "chinchilla")
    # causal: query t meets t keys; a loop over queries and keys
    pairs = sum(1 for q in range(T) for k in range(T) if k <= q)
    assert causal["scores"] == causal["pv"] == L * 2 * D * pairs and causal["softmax"] == L * H * pairs
    # Kaplan's eq. 2.2 is the blocks' part of the "kaplan" row, per token
    N = cost.non_embedding_params(D, L, D_ff)
    blocks = kap["total"] - kap["embed"] - kap["head"]
    assert blocks == T * cost.kaplan_forward_flops_per_token(N, L, T, D)
    assert kap["scores"] + kap["pv"] == (book["scores"] + book["pv"]) // 2
    assert chin["total"] - book["total"] == 2 * T * V * D + 2 * L * H * T * T
    with pytest.raises(ValueError):
        cost.decoder_lm_flops(T, D, L, H, D_ff, V, "gpt")
    with pytest.raises(ValueError):
        cost.decoder_lm_flops(0, D, L, H, D_ff, V)


def test_training_is_three_forwards_and_six_n():
    T, D, L, H, D_ff, V = 8, 16, 2, 2, 64, 13
    model, idx = _meta_decoder_lm(T, D, L, H, D_ff, V)
    with FlopCounterMode(display=False) as fc:
        model(idx, return_attention=True)[0].sum().backward()
    f = cost.decoder_lm_flops(T, D, L, H, D_ff, V)
    N = cost.non_embedding_params(D, L, D_ff)
    assert fc.get_total_flops() == 3 * (f["total"] - f["softmax"])
    assert fc.get_total_flops() == 6 * (N + D * V) * T + 12 * L * T * T * D


def test_step_traffic():
    D, L, D_ff, b = 32, 3, 128, 2
    for t in (1, 50, 4000):                     # decoding: 2 / b FLOPs per byte whatever t (no head)
        s = cost.step_traffic(1, t, D, L, D_ff, b)
        assert s["flops"] == L * (8 * D * D + 4 * D * D_ff + 4 * t * D)
        assert s["bytes"] == b * L * (4 * D * D + 2 * D * D_ff + 2 * t * D)
        assert s["intensity"] == pytest.approx(2 / b, rel=1e-12)
    p = cost.step_traffic(500, 500, D, L, D_ff, b, V=100)
    assert p["flops"] == 500 * cost.step_traffic(1, 500, D, L, D_ff, b, V=100)["flops"]
    assert p["intensity"] > 100 * cost.step_traffic(1, 500, D, L, D_ff, b, V=100)["intensity"] / 2
    with pytest.raises(ValueError):
        cost.step_traffic(5, 4, D, L, D_ff)
