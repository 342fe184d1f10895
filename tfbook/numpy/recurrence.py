"""NumPy components of attention as a recurrence (chapter 23), reached as :mod:`tfbook.numpy.recurrence`.

Causal attention without the softmax is a recurrence over a state matrix ``S (D_K, D_V)``.
Every function here takes one head's queries, keys and values, ``Q (..., T, D_K)``,
``K (..., T, D_K)``, ``V (..., T, D_V)``, and returns the outputs ``Z (..., T, D_V)``; the
recurrent and chunked forms also return the final state ``S (..., D_K, D_V)`` (so a long
sequence can be processed piece by piece, starting from ``S0``). Row ``t`` of ``Z`` is
``z_t = S_t^T q_t``. Nothing is scaled or normalised here: a model scales ``q`` by
``1/sqrt(D_K)`` and L2-normalises ``q`` and ``k`` before calling these (Qwen3-Next does both).

* linear attention, ``S_t = a_t S_{t-1} + k_t v_t^T``, with an optional decay
  ``a_t = exp(g_t)`` per step (``g`` is the log-decay, ``g_t <= 0``; ``g=None`` means no decay):
  :func:`linear_attention_quadratic` (``Z = ((Q K^T) * L) V``, ``L`` the causal decay mask),
  :func:`linear_attention_recurrent` (one step per token) and :func:`linear_attention_chunked`
  (quadratic inside a chunk, recurrent across chunks);
* the delta rule (DeltaNet) and the gated delta rule (Gated DeltaNet, ``g`` given):
  ``S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T``, one step of gradient descent
  on ``||S^T k_t - v_t||^2 / 2`` with learning rate ``beta_t``: :func:`delta_rule_recurrent`
  and :func:`delta_rule_chunked` (the UT transform of each chunk, one triangular solve);
* :func:`segsum`: ``log L``, the log of the 1-semiseparable decay mask
  ``L_ij = a_{j+1} ... a_i`` (``i >= j``; ``-inf`` above the diagonal), as Mamba-2's
  ``segment_sum`` computes it.

A Mamba-2 state-space layer with scalar decay, ``h_t = a_t h_{t-1} + B_t x_t^T``,
``y_t = h_t^T C_t``, is linear attention with ``Q = C``, ``K = B``, ``V = X``: state-space
duality.

Conventions of :mod:`tfbook.numpy`: float64 in (other float dtypes are kept), bad input raises
``ValueError`` naming the argument and showing the shapes.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as _v
from ._common import _as_float

__all__ = ["segsum", "linear_attention_quadratic", "linear_attention_recurrent", "linear_attention_chunked",
           "delta_rule_recurrent", "delta_rule_chunked"]


def _check_shapes(Q: tuple, K: tuple, V: tuple, beta: tuple | None = None, g: tuple | None = None,
                  S0: tuple | None = None) -> None:
    """Shape checks shared by both twins: ``Q, K (..., T, D_K)``, ``V (..., T, D_V)``,
    ``beta, g (..., T)``, ``S0 (..., D_K, D_V)``."""
    for name, s in (("Q", Q), ("K", K), ("V", V)):
        if len(s) < 2:
            raise ValueError(f"{name} must be (..., T, D), got shape {s}")
    if Q != K:
        raise ValueError(f"Q and K must have the same shape (..., T, D_K), got Q {Q} and K {K}")
    if V[:-1] != K[:-1]:
        raise ValueError(f"V must be (..., T, D_V) = {K[:-1]} + (D_V,) to match K {K}, got V {V}")
    for name, s in (("beta", beta), ("g", g)):
        if s is not None and s != K[:-1]:
            raise ValueError(f"{name} must be (..., T) = {K[:-1]} to match K {K}, got {name} {s}")
    if S0 is not None and S0 != K[:-2] + (K[-1], V[-1]):
        raise ValueError(f"S0 must be (..., D_K, D_V) = {K[:-2] + (K[-1], V[-1])} for K {K} and V {V}, got S0 {S0}")


def _shape(x):
    return None if x is None else tuple(x.shape)


def _inputs(Q, K, V, beta=None, g=None, S0=None) -> tuple:
    """Convert and check; everything in the common float dtype of ``Q, K, V``."""
    Q, K, V = _as_float(Q, "Q"), _as_float(K, "K"), _as_float(V, "V")
    beta = None if beta is None else _as_float(beta, "beta")
    g = None if g is None else _as_float(g, "g")
    S0 = None if S0 is None else _as_float(S0, "S0")
    _check_shapes(Q.shape, K.shape, V.shape, _shape(beta), _shape(g), _shape(S0))
    dt = np.result_type(Q, K, V)
    return tuple(None if x is None else x.astype(dt, copy=False) for x in (Q, K, V, beta, g, S0))


def _initial(K, V, S0):
    if S0 is not None:
        return S0.copy()
    return np.zeros(K.shape[:-2] + (K.shape[-1], V.shape[-1]), dtype=K.dtype)


def segsum(g):
    """``log L (..., T, T)`` from the log-decays ``g (..., T)``: entry ``(i, j)`` is
    ``g_{j+1} + ... + g_i`` for ``i >= j`` (0 on the diagonal) and ``-inf`` above it, so that
    ``exp(segsum(g))`` is the causal decay mask ``L_ij = a_{j+1} ... a_i``. Summed directly
    (no difference of cumulative sums), as Mamba-2's ``segment_sum``."""
    g = _as_float(g, "g")
    _v.check_ndim("g", g, 1, what="(..., T)")
    T = g.shape[-1]
    # entry (i, j) sums g_l over j < l <= i: mask the columns l <= j of a row-repeated copy, then cumsum down i
    G = np.broadcast_to(g[..., :, None], g.shape + (T,))          # G[..., l, j] = g_l
    G = np.where(np.tril(np.ones((T, T), dtype=bool), -1), G, 0.0)  # keep l > j
    out = np.cumsum(G, axis=-2)                                    # out[..., i, j] = sum_{j < l <= i} g_l
    return np.where(np.tril(np.ones((T, T), dtype=bool)), out, -np.inf).astype(g.dtype)


def linear_attention_quadratic(Q, K, V, g=None):
    """``Z = ((Q K^T) * L) V``: causal linear attention in its quadratic (masked) form, ``L`` the
    lower-triangular mask (all ones, or the decay mask ``exp(segsum(g))``). ``Z (..., T, D_V)``."""
    Q, K, V, _, g, _ = _inputs(Q, K, V, g=g)
    T = Q.shape[-2]
    L = np.tril(np.ones((T, T), dtype=Q.dtype)) if g is None else np.exp(segsum(g))
    return ((Q @ np.swapaxes(K, -1, -2)) * L) @ V


def linear_attention_recurrent(Q, K, V, g=None, S0=None):
    """``(Z, S)``: one step per token, ``S_t = a_t S_{t-1} + k_t v_t^T``, ``z_t = S_t^T q_t``
    (``a_t = exp(g_t)``, 1 when ``g`` is None); ``S`` is the last state ``(..., D_K, D_V)``."""
    Q, K, V, _, g, S0 = _inputs(Q, K, V, g=g, S0=S0)
    S = _initial(K, V, S0)
    Z = np.empty(V.shape, dtype=V.dtype)
    for t in range(Q.shape[-2]):
        if g is not None:
            S = np.exp(g[..., t])[..., None, None] * S
        S = S + K[..., t, :, None] * V[..., t, None, :]            # + k_t v_t^T
        Z[..., t, :] = (Q[..., t, None, :] @ S)[..., 0, :]         # z_t^T = q_t^T S_t
    return Z, S


def _chunks(T: int, chunk_size: int):
    return [(s, min(s + chunk_size, T)) for s in range(0, T, chunk_size)]


def linear_attention_chunked(Q, K, V, g=None, chunk_size=16, S0=None):
    """``(Z, S)``: the quadratic form inside each chunk of ``chunk_size`` tokens plus the read of
    the state carried in from the chunks before; the state is updated once per chunk.
    Equal to :func:`linear_attention_recurrent` and :func:`linear_attention_quadratic`."""
    chunk_size = _v.check_positive_int("chunk_size", chunk_size)
    Q, K, V, _, g, S0 = _inputs(Q, K, V, g=g, S0=S0)
    S = _initial(K, V, S0)
    Z = np.empty(V.shape, dtype=V.dtype)
    for s, e in _chunks(Q.shape[-2], chunk_size):
        q, k, v = Q[..., s:e, :], K[..., s:e, :], V[..., s:e, :]
        n = e - s
        if g is None:
            L, gam, rest = np.tril(np.ones((n, n), dtype=Q.dtype)), np.ones(q.shape[:-1], Q.dtype), None
        else:
            c = np.cumsum(g[..., s:e], axis=-1)                    # c_i = log(a_s+1 ... a_i) inside the chunk
            L, gam, rest = np.exp(segsum(g[..., s:e])), np.exp(c), np.exp(c[..., -1:] - c)
        Z[..., s:e, :] = ((q @ np.swapaxes(k, -1, -2)) * L) @ v + (q * gam[..., None]) @ S
        kd = k if rest is None else k * rest[..., None]            # each key decayed to the chunk's end
        S = (1.0 if g is None else gam[..., -1, None, None]) * S + np.swapaxes(kd, -1, -2) @ v
    return Z, S


def delta_rule_recurrent(Q, K, V, beta, g=None, S0=None):
    """``(Z, S)``: the (gated) delta rule one token at a time,
    ``S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T``, ``z_t = S_t^T q_t``
    (``a_t = exp(g_t)``, 1 when ``g`` is None: DeltaNet; with ``g``: Gated DeltaNet)."""
    Q, K, V, beta, g, S0 = _inputs(Q, K, V, beta, g, S0)
    S = _initial(K, V, S0)
    Z = np.empty(V.shape, dtype=V.dtype)
    for t in range(Q.shape[-2]):
        if g is not None:
            S = np.exp(g[..., t])[..., None, None] * S
        k = K[..., t, :]
        pred = (k[..., None, :] @ S)[..., 0, :]                    # S^T k_t: what the state recalls for k_t
        S = S + k[..., :, None] * (beta[..., t, None] * (V[..., t, :] - pred))[..., None, :]
        Z[..., t, :] = (Q[..., t, None, :] @ S)[..., 0, :]
    return Z, S


def delta_rule_chunked(Q, K, V, beta, g=None, chunk_size=16, S0=None):
    """``(Z, S)``: the (gated) delta rule a chunk at a time. Inside a chunk the new values
    ``U`` solve ``(I + A) U = diag(beta) (V - diag(gamma) K S)``, ``A`` strictly lower
    triangular with ``A_ij = beta_i exp(c_i - c_j) k_i . k_j`` (the UT transform; ``c`` the
    cumulative log-decay, ``gamma = exp(c)``); then ``Z = gamma * Q S + ((Q K^T) * L) U`` and
    ``S <- gamma_n S + (K * exp(c_n - c))^T U``. Equal to :func:`delta_rule_recurrent`."""
    chunk_size = _v.check_positive_int("chunk_size", chunk_size)
    Q, K, V, beta, g, S0 = _inputs(Q, K, V, beta, g, S0)
    S = _initial(K, V, S0)
    Z = np.empty(V.shape, dtype=V.dtype)
    for s, e in _chunks(Q.shape[-2], chunk_size):
        q, k, v, b = Q[..., s:e, :], K[..., s:e, :], V[..., s:e, :], beta[..., s:e]
        n = e - s
        if g is None:
            L, gam, rest = np.tril(np.ones((n, n), dtype=Q.dtype)), np.ones(b.shape, Q.dtype), np.ones(b.shape, Q.dtype)
        else:
            c = np.cumsum(g[..., s:e], axis=-1)
            L, gam, rest = np.exp(segsum(g[..., s:e])), np.exp(c), np.exp(c[..., -1:] - c)
        kk = (k @ np.swapaxes(k, -1, -2)) * L                      # decayed k_i . k_j
        A = np.tril(b[..., :, None] * kk, -1)
        rhs = b[..., None] * (v - gam[..., None] * (k @ S))         # beta (v - gamma S^T k)
        U = np.linalg.solve(np.eye(n, dtype=Q.dtype) + A, rhs)
        Z[..., s:e, :] = gam[..., None] * (q @ S) + ((q @ np.swapaxes(k, -1, -2)) * L) @ U
        S = gam[..., -1, None, None] * S + np.swapaxes(k * rest[..., None], -1, -2) @ U
    return Z, S
