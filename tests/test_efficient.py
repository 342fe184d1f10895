"""Tests for tfbook.iosim: IO simulators, the recomputing backward pass, graph depth, FAVOR+."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tfbook import iosim as eff


def _reference(Q, K, V):
    return F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (Q, K, V))).numpy()


@pytest.mark.parametrize("sim, formula", [(eff.naive_attention_io, eff.naive_io_formula),
                                          (eff.tiled_attention_io, eff.tiled_io_formula)])
@pytest.mark.parametrize("N, d, M", [(300, 16, 4096), (97, 8, 1024), (64, 16, 2**14)])
def test_simulators_compute_attention_and_match_closed_form(sim, formula, N, d, M):
    rng = np.random.default_rng(N + d)
    Q, K, V = (rng.normal(size=(N, d)) for _ in range(3))
    fm, Z = sim(N, d, M, Q, K, V)
    np.testing.assert_allclose(Z, _reference(Q, K, V), atol=1e-12)      # float64 round-off
    assert fm.moved == formula(N, d, M) == sim(N, d, M)[0].moved
    assert fm.peak <= M and fm.used == 0


def test_fast_memory_overflow_raises():
    fm = eff.FastMemory(10)
    fm.load(6)
    with pytest.raises(MemoryError):
        fm.alloc(5)
    with pytest.raises(ValueError):
        eff.tiled_blocks(64, 8 * 64 * 64)          # below 8 d^2 + 8 d


def test_io_scaling_theorem2():
    d = 32
    Ns, Ms = np.array([1024, 2048, 4096]), np.array([2**14, 2**16])
    tiled = np.array([[eff.tiled_io_formula(N, d, M) for M in Ms] for N in Ns])
    naive = np.array([[eff.naive_io_formula(N, d, M) for M in Ms] for N in Ns])
    assert 1.9 < np.polyfit(np.log(Ns), np.log(tiled[:, 0]), 1)[0] <= 2.0
    assert -1.0 <= np.log(tiled[-1, 1] / tiled[-1, 0]) / np.log(Ms[1] / Ms[0]) < -0.9
    assert abs(np.log(naive[-1, 1] / naive[-1, 0]) / np.log(Ms[1] / Ms[0])) < 0.1
    assert np.all(tiled < naive)


def test_recompute_attention_gradients_and_saved_bytes():
    torch.manual_seed(0)
    Q, K, V = (torch.randn(2, 70, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda q, k, v: eff.RecomputeAttention.apply(q, k, v, 16), (Q, K, V))
    Z = eff.RecomputeAttention.apply(Q, K, V, 16)
    Zr = F.scaled_dot_product_attention(Q, K, V)
    g = torch.autograd.grad(Z.square().sum(), (Q, K, V))
    gr = torch.autograd.grad(Zr.square().sum(), (Q, K, V))
    for a, b in zip(g, gr):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    for T in (64, 256):
        q, k, v = (torch.randn(T, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
        _, saved = eff.saved_tensor_bytes(lambda a, b, c: eff.RecomputeAttention.apply(a, b, c, 32), q, k, v)
        assert saved == 8 * (4 * T * 8 + T)
        _, saved_naive = eff.saved_tensor_bytes(
            lambda a, b, c: torch.softmax(a @ b.T / math.sqrt(8), -1) @ c, q, k, v)
        assert saved_naive >= 8 * T * T


def test_matmul_depth_rnn_vs_attention():
    torch.manual_seed(0)
    cell = torch.nn.RNNCell(4, 4)
    for T in (3, 11):
        X = torch.randn(2, T, 4)
        h = torch.zeros(2, 4)
        for t in range(T):
            h = cell(X[:, t], h)
        assert eff.matmul_depth(h) == T
        W = torch.randn(3, 4, 4, requires_grad=True)
        z = torch.softmax((X @ W[0]) @ (X @ W[1]).transpose(1, 2), -1) @ (X @ W[2])
        assert eff.matmul_depth(z) == 3


def test_favor_features_unbiased_kernel():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(1, 4)) * 0.5, rng.normal(size=(1, 4)) * 0.5
    est = [(eff.favor_features(q, W) @ eff.favor_features(k, W).T).item()
           for W in (rng.normal(size=(256, 4)) for _ in range(400))]
    exact = math.exp((q @ k.T).item())
    assert abs(np.mean(est) - exact) < 4 * np.std(est) / math.sqrt(len(est))   # unbiased, 4 standard errors
