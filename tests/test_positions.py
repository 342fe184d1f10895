"""tfbook.numpy.positions and vision: layouts, RoPE attention, ALiBi, T5 buckets, video tubelets.

Expected values come from the definitions written out by hand, from PyTorch's
built-ins (nn.Conv3d, F.scaled_dot_product_attention) or from identities.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tfbook.numpy as tnp
import tfbook.torch as tt
from tfbook.numpy import positions as tp
from tfbook.numpy.vision import tubelets
from tfbook.torch.functional.vision import tubelets as tubelets_torch

F64 = torch.float64


@pytest.mark.parametrize("D", [2, 8, 32])
def test_interleave_permutation_maps_concatenated_to_interleaved(D):
    T = 20
    w = 10000.0 ** (-np.arange(0, D, 2) / D)
    angle = np.arange(T)[:, None] * w
    concat = np.concatenate([np.sin(angle), np.cos(angle)], axis=1)
    P = tp.interleave_permutation(D)
    np.testing.assert_allclose(concat @ P, tnp.sinusoidal_positional_encoding(T, D), atol=1e-12)
    np.testing.assert_array_equal(P.T @ P, np.eye(D))                  # a permutation: exactly
    assert sorted(P.sum(0)) == [1.0] * D and sorted(P.sum(1)) == [1.0] * D


def test_interleave_permutation_rejects_odd_width():
    with pytest.raises(ValueError):
        tp.interleave_permutation(5)


def test_rope_attention_matches_torch_and_is_shift_invariant():
    rng = np.random.default_rng(0)
    T, D, D_K = 9, 12, 8
    X = rng.normal(size=(2, T, D))
    W_Q, W_K, W_V = rng.normal(size=(3, D, D_K)) / math.sqrt(D)
    pos = np.arange(T)
    Z, S = tp.rope_self_attention(X, W_Q, W_K, W_V, pos)
    Xt = torch.from_numpy(X)
    Q = tt.rope(Xt @ torch.from_numpy(W_Q), torch.from_numpy(pos))
    K = tt.rope(Xt @ torch.from_numpy(W_K), torch.from_numpy(pos))
    Z_t = F.scaled_dot_product_attention(Q, K, Xt @ torch.from_numpy(W_V))
    np.testing.assert_allclose(Z, Z_t.numpy(), atol=1e-12)             # float64 round-off
    Z2, S2 = tp.rope_self_attention(X, W_Q, W_K, W_V, pos + 1000)
    np.testing.assert_allclose(S2, S, atol=1e-10)                     # angles up to ~1e3 rad
    np.testing.assert_allclose(Z2, Z, atol=1e-10)
    _, S_perm = tp.rope_self_attention(X, W_Q, W_K, W_V, pos[::-1].copy())
    assert np.abs(S_perm - S).max() > 1e-2                             # positions do matter


def test_alibi_slopes_and_bias_by_hand():
    np.testing.assert_array_equal(tp.alibi_slopes(8), [2.0 ** -k for k in range(1, 9)])
    np.testing.assert_array_equal(tp.alibi_slopes(2), [2.0 ** -4, 2.0 ** -8])
    with pytest.raises(ValueError):
        tp.alibi_slopes(6)
    B = tp.alibi_bias(3, 3, [0.5])
    expected = np.array([[0.0, -np.inf, -np.inf], [-0.5, 0.0, -np.inf], [-1.0, -0.5, 0.0]])
    np.testing.assert_array_equal(B[0], expected)
    # queries are the last T_q positions (decoding with a cache)
    np.testing.assert_array_equal(tp.alibi_bias(1, 4, [1.0])[0], [[-3.0, -2.0, -1.0, 0.0]])
    np.testing.assert_array_equal(tp.alibi_bias(2, 2, [2.0], causal=False)[0], [[0.0, -2.0], [-2.0, 0.0]])


def test_t5_buckets_by_hand():
    rel = np.array([0, 1, 7, 8, 16, 32, 64, 127, 128, 1000])
    # bidirectional, 32 buckets: 16 per sign, exact below 8, log-spaced up to 128
    np.testing.assert_array_equal(tp.t5_relative_bucket(-rel), [0, 1, 7, 8, 10, 12, 14, 15, 15, 15])
    np.testing.assert_array_equal(tp.t5_relative_bucket(rel), [0, 17, 23, 24, 26, 28, 30, 31, 31, 31])
    # unidirectional: the future collapses to bucket 0, the past gets all 32 buckets
    np.testing.assert_array_equal(tp.t5_relative_bucket(rel, bidirectional=False), np.zeros(10))
    uni = tp.t5_relative_bucket(-np.arange(300), bidirectional=False)
    np.testing.assert_array_equal(uni[:16], np.arange(16))
    assert np.all(np.diff(uni) >= 0) and uni.max() == 31


@pytest.mark.parametrize("shape,t,p", [((2, 3, 4, 8, 12), 2, 4), ((1, 1, 6, 6, 6), 3, 3)])
def test_tubelets_equal_conv3d_with_copied_weights(shape, t, p):
    torch.manual_seed(0)
    video = torch.randn(*shape, dtype=F64)
    C = shape[1]
    conv = nn.Conv3d(C, 5, kernel_size=(t, p, p), stride=(t, p, p)).double()
    W = conv.weight.detach().reshape(5, -1).T                          # (C t p p, D)
    ours_np = tubelets(video.numpy(), t, p) @ W.numpy() + conv.bias.detach().numpy()
    ours_t = tubelets_torch(video, t, p) @ W + conv.bias.detach()
    ref = conv(video).flatten(2).transpose(1, 2)                       # (B, N, D)
    np.testing.assert_allclose(ours_np, ref.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(ours_t.detach().numpy(), ref.detach().numpy(), atol=1e-12)
    B, _, Fr, H, Wd = shape
    assert ours_np.shape == (B, (Fr // t) * (H // p) * (Wd // p), 5)


def test_tubelets_of_one_frame_are_patches():
    rng = np.random.default_rng(1)
    video = rng.normal(size=(2, 3, 1, 8, 8))
    np.testing.assert_array_equal(tubelets(video, 1, 4), tnp.patchify(video[:, :, 0], 4))


def test_tubelets_reject_indivisible_shapes():
    with pytest.raises(ValueError):
        tubelets(np.zeros((1, 1, 5, 8, 8)), 2, 4)
