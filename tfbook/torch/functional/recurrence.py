"""PyTorch twins of :mod:`tfbook.numpy.recurrence` (chapter 23), reached as
:mod:`tfbook.torch.functional.recurrence`.

Same names, arguments and semantics: causal linear attention (with an optional per-step decay
``exp(g_t)``) in its quadratic, recurrent and chunked forms; the delta rule and the gated delta
rule, recurrent and chunked (UT transform); ``segsum``, the log of the 1-semiseparable decay
mask. Every function supports autograd (the models of :mod:`tfbook.torch.recurrence` train
through the chunked forms) and keeps the dtype of its inputs.
"""

from __future__ import annotations

import torch

from ... import _validate as _v
from ...numpy.recurrence import _check_shapes
from ._common import _common_dtype, _float

__all__ = ["segsum", "linear_attention_quadratic", "linear_attention_recurrent", "linear_attention_chunked",
           "delta_rule_recurrent", "delta_rule_chunked"]


def _shape(x):
    return None if x is None else tuple(x.shape)


def _inputs(Q, K, V, beta=None, g=None, S0=None) -> tuple:
    Q, K, V = _float(Q, "Q"), _float(K, "K"), _float(V, "V")
    beta = None if beta is None else _float(beta, "beta")
    g = None if g is None else _float(g, "g")
    S0 = None if S0 is None else _float(S0, "S0")
    _check_shapes(tuple(Q.shape), tuple(K.shape), tuple(V.shape), _shape(beta), _shape(g), _shape(S0))
    dt = _common_dtype(Q, K, V)
    return tuple(None if x is None else x.to(dt) for x in (Q, K, V, beta, g, S0))


def _initial(K, V, S0):
    if S0 is not None:
        return S0
    return K.new_zeros(K.shape[:-2] + (K.shape[-1], V.shape[-1]))


def _tril(n, like, diagonal=0):
    return torch.ones(n, n, dtype=torch.bool, device=like.device).tril(diagonal)


def segsum(g):
    """``log L (..., T, T)``: entry ``(i, j)`` is ``g_{j+1} + ... + g_i`` for ``i >= j`` and
    ``-inf`` above the diagonal (see the NumPy twin)."""
    g = _float(g, "g")
    _v.check_ndim("g", g, 1, what="(..., T)")
    T = g.shape[-1]
    G = g[..., :, None].expand(*g.shape, T).masked_fill(~_tril(T, g, -1), 0.0)
    return torch.cumsum(G, dim=-2).masked_fill(~_tril(T, g), float("-inf"))


def linear_attention_quadratic(Q, K, V, g=None):
    """``Z = ((Q K^T) * L) V``, ``L`` the causal (decay) mask. ``Z (..., T, D_V)``."""
    Q, K, V, _, g, _ = _inputs(Q, K, V, g=g)
    T = Q.shape[-2]
    L = _tril(T, Q).to(Q.dtype) if g is None else torch.exp(segsum(g))
    return ((Q @ K.transpose(-1, -2)) * L) @ V


def linear_attention_recurrent(Q, K, V, g=None, S0=None):
    """``(Z, S)``: ``S_t = a_t S_{t-1} + k_t v_t^T``, ``z_t = S_t^T q_t``, one token at a time."""
    Q, K, V, _, g, S0 = _inputs(Q, K, V, g=g, S0=S0)
    S = _initial(K, V, S0)
    Z = []
    for t in range(Q.shape[-2]):
        if g is not None:
            S = torch.exp(g[..., t])[..., None, None] * S
        S = S + K[..., t, :, None] * V[..., t, None, :]
        Z.append((Q[..., t, None, :] @ S)[..., 0, :])
    return (torch.stack(Z, dim=-2) if Z else V.new_zeros(V.shape)), S


def _chunks(T: int, chunk_size: int):
    return [(s, min(s + chunk_size, T)) for s in range(0, T, chunk_size)]


def linear_attention_chunked(Q, K, V, g=None, chunk_size=16, S0=None):
    """``(Z, S)``: quadratic inside each chunk, the state carried across chunks."""
    chunk_size = _v.check_positive_int("chunk_size", chunk_size)
    Q, K, V, _, g, S0 = _inputs(Q, K, V, g=g, S0=S0)
    S = _initial(K, V, S0)
    Z = []
    for s, e in _chunks(Q.shape[-2], chunk_size):
        q, k, v = Q[..., s:e, :], K[..., s:e, :], V[..., s:e, :]
        n = e - s
        if g is None:
            Zc = ((q @ k.transpose(-1, -2)) * _tril(n, q).to(q.dtype)) @ v + q @ S
            S = S + k.transpose(-1, -2) @ v
        else:
            c = torch.cumsum(g[..., s:e], dim=-1)
            L, gam, rest = torch.exp(segsum(g[..., s:e])), torch.exp(c), torch.exp(c[..., -1:] - c)
            Zc = ((q @ k.transpose(-1, -2)) * L) @ v + (q * gam[..., None]) @ S
            S = gam[..., -1, None, None] * S + (k * rest[..., None]).transpose(-1, -2) @ v
        Z.append(Zc)
    return (torch.cat(Z, dim=-2) if Z else V.new_zeros(V.shape)), S


def delta_rule_recurrent(Q, K, V, beta, g=None, S0=None):
    """``(Z, S)``: ``S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T``, ``z_t = S_t^T q_t``."""
    Q, K, V, beta, g, S0 = _inputs(Q, K, V, beta, g, S0)
    S = _initial(K, V, S0)
    Z = []
    for t in range(Q.shape[-2]):
        if g is not None:
            S = torch.exp(g[..., t])[..., None, None] * S
        k = K[..., t, :]
        pred = (k[..., None, :] @ S)[..., 0, :]
        S = S + k[..., :, None] * (beta[..., t, None] * (V[..., t, :] - pred))[..., None, :]
        Z.append((Q[..., t, None, :] @ S)[..., 0, :])
    return (torch.stack(Z, dim=-2) if Z else V.new_zeros(V.shape)), S


def delta_rule_chunked(Q, K, V, beta, g=None, chunk_size=16, S0=None):
    """``(Z, S)``: the (gated) delta rule a chunk at a time through the UT transform
    (``(I + A) U = diag(beta) (V - diag(gamma) K S)``, one triangular solve per chunk)."""
    chunk_size = _v.check_positive_int("chunk_size", chunk_size)
    Q, K, V, beta, g, S0 = _inputs(Q, K, V, beta, g, S0)
    S = _initial(K, V, S0)
    Z = []
    for s, e in _chunks(Q.shape[-2], chunk_size):
        q, k, v, b = Q[..., s:e, :], K[..., s:e, :], V[..., s:e, :], beta[..., s:e]
        n = e - s
        if g is None:
            L = _tril(n, q).to(q.dtype)
            gam = rest = torch.ones_like(b)
        else:
            c = torch.cumsum(g[..., s:e], dim=-1)
            L, gam, rest = torch.exp(segsum(g[..., s:e])), torch.exp(c), torch.exp(c[..., -1:] - c)
        kk = (k @ k.transpose(-1, -2)) * L
        A = torch.tril(b[..., :, None] * kk, -1)
        rhs = b[..., None] * (v - gam[..., None] * (k @ S))
        I = torch.eye(n, dtype=q.dtype, device=q.device)
        U = torch.linalg.solve_triangular((I + A).expand(*rhs.shape[:-2], n, n), rhs, upper=False,
                                          unitriangular=True)
        Z.append(gam[..., None] * (q @ S) + ((q @ k.transpose(-1, -2)) * L) @ U)
        S = gam[..., -1, None, None] * S + (k * rest[..., None]).transpose(-1, -2) @ U
    return (torch.cat(Z, dim=-2) if Z else V.new_zeros(V.shape)), S
