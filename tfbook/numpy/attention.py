"""Softmax, scaled dot-product attention (the reference), additive attention, and the masks
(True = may attend): causal, padding, sliding window.

Part of :mod:`tfbook.numpy` (which re-exports every public name); the twins are in
:mod:`tfbook.torch.functional.attention`.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as _v
from ._common import _as_float

__all__ = [
    "softmax",
    "scaled_dot_product_attention",
    "additive_attention",
    "causal_mask",
    "padding_mask",
    "attention_mask_from_padding",
    "sliding_window_mask",
]


# ---------------------------------------------------------------------------
# Softmax and attention
# ---------------------------------------------------------------------------


def softmax(x, axis=-1):
    """Softmax along ``axis``, stable for any finite logits (including +-1e4).

    The row maximum is subtracted before exponentiating, so the largest exponent
    is ``exp(0) = 1`` and nothing overflows. A row whose entries are all ``-inf``
    (everything masked) gives a row of zeros, not NaN.

    Parameters
    ----------
    x : (...) ndarray
        Logits.
    axis : int
        The axis that sums to one.

    Returns
    -------
    (...) ndarray
        Same shape and dtype as ``x``.
    """
    x = _as_float(x, "x")
    if x.ndim == 0:
        raise ValueError(f"x must have at least 1 axis, got shape {x.shape}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis={axis} is out of range for x of shape {x.shape}")
    if x.shape[axis] == 0:
        raise ValueError(f"x has no entries along axis={axis} to normalise (x: {x.shape})")
    m = np.max(x, axis=axis, keepdims=True)
    m[~np.isfinite(m)] = 0  # an all -inf row: shift by 0, exp gives zeros
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    s[s == 0] = 1  # zero row stays zero instead of 0/0
    e /= s
    return e


def scaled_dot_product_attention(Q, K, V, mask=None, scale=None):
    """Scaled dot-product attention, ``Z = softmax(Q K^T * scale) V``: the reference.

    Written as its equation, one step a line, every ``(T_q, T_k)`` array in full: the
    scores ``S``, then the weights ``P``, then ``Z``. At its peak it holds three
    ``(..., T_q, T_k)`` arrays (``S``, ``S - max`` and ``exp(S - max)``). The same
    computation, faster and in less memory, is :func:`blocked_attention` (``Z`` and
    ``P``) and :func:`tiled_attention` (``Z`` only); both are tested equal to this one.

    Parameters
    ----------
    Q : (..., T_q, D_K) ndarray
        Queries.
    K : (..., T_k, D_K) ndarray
        Keys.
    V : (..., T_k, D_V) ndarray
        Values.
    mask : (..., T_q, T_k) bool ndarray, optional
        ``True`` where query ``i`` may attend to key ``j``; any shape that
        broadcasts to ``(..., T_q, T_k)``.
    scale : float, optional
        Multiplies the scores; defaults to ``1 / sqrt(D_K)``.

    Returns
    -------
    Z : (..., T_q, D_V) ndarray
        Outputs, each a weighted average of the rows of ``V``.
    P : (..., T_q, T_k) ndarray
        Attention weights; rows sum to one (zero rows where fully masked).
    """
    Q, K, V, mask = _check_attention_args(Q, K, V, mask)
    if scale is None:
        scale = 1.0 / math.sqrt(Q.shape[-1])
    S = Q @ np.swapaxes(K, -1, -2)                  # 1. scores (..., T_q, T_k)
    S = S * scale                                   # 2. scaled, by 1/sqrt(D_K) unless told
    if mask is not None:
        S = np.where(mask, S, -np.inf)              # 3. masked keys: score -inf, weight 0
    m = S.max(axis=-1, keepdims=True)               # 4. row maxima (..., T_q, 1)
    m[~np.isfinite(m)] = 0                          #    (a fully masked row: shift by 0)
    P = np.exp(S - m)                               # 5. softmax: every exponent <= 0, no overflow
    l = P.sum(axis=-1, keepdims=True)               #    row sums (..., T_q, 1)
    P /= np.where(l == 0, 1, l)                     #    rows sum to 1; a fully masked row stays 0
    Z = P @ V                                       # 6. outputs (..., T_q, D_V)
    return Z, P


def _check_attention_args(Q, K, V, mask):
    """Validated ``Q, K, V`` (converted to one floating dtype) and ``mask`` (an ndarray or None)."""
    Q, K, V = _as_float(Q, "Q"), _as_float(K, "K"), _as_float(V, "V")
    batch = _v.check_qkv(Q, K, V)
    if mask is not None:
        mask = np.asarray(mask)
        _v.check_mask(mask, Q.shape[-2], K.shape[-2], batch)
    dtype = np.result_type(Q, K, V)
    return Q.astype(dtype, copy=False), K.astype(dtype, copy=False), V.astype(dtype, copy=False), mask


def additive_attention(Q, K, V, W_q, W_k, v, mask=None):
    """Additive (Bahdanau) attention with scores ``S[i, j] = v . tanh(q_i W_q + k_j W_k)``.

    Parameters
    ----------
    Q : (..., T_q, D_Q) ndarray
    K : (..., T_k, D_K) ndarray
    V : (..., T_k, D_V) ndarray
    W_q : (D_Q, D_A) ndarray
    W_k : (D_K, D_A) ndarray
    v : (D_A,) ndarray
    mask : (..., T_q, T_k) bool ndarray, optional

    Returns
    -------
    Z : (..., T_q, D_V) ndarray
    P : (..., T_q, T_k) ndarray
    """
    Q, K, V = _as_float(Q, "Q"), _as_float(K, "K"), _as_float(V, "V")
    for name, x in (("Q", Q), ("K", K), ("V", V)):
        _v.check_ndim(name, x, 2, what="(..., T, D)")
    if K.shape[-2] != V.shape[-2]:
        raise ValueError(f"K has T_k={K.shape[-2]} but V has T_k={V.shape[-2]} (K: {K.shape}, V: {V.shape})")
    W_q, W_k, v = np.asarray(W_q), np.asarray(W_k), np.asarray(v)
    _v.check_matrix("W_q", W_q, Q.shape[-1], None, "(D_Q, D_A)")
    _v.check_matrix("W_k", W_k, K.shape[-1], W_q.shape[1], "(D_K, D_A)")
    _v.check_vector("v", v, W_q.shape[1], "D_A")
    batch = _v.broadcast_batch({"Q": Q.shape[:-2], "K": K.shape[:-2], "V": V.shape[:-2]})
    if mask is not None:
        mask = np.asarray(mask)
        _v.check_mask(mask, Q.shape[-2], K.shape[-2], batch)
    A = np.tanh((Q @ W_q)[..., :, None, :] + (K @ W_k)[..., None, :, :])  # (..., T_q, T_k, D_A)
    S = A @ v  # (..., T_q, T_k)
    if mask is not None:
        S = np.where(mask, S, -np.inf)
    P = softmax(S, axis=-1)
    return P @ V, P


# ---------------------------------------------------------------------------
# Masks (True = may attend)
# ---------------------------------------------------------------------------


def causal_mask(T):
    """Causal mask: query ``i`` may attend to keys ``j <= i``.

    Returns
    -------
    (T, T) bool ndarray
        Lower triangle (diagonal included) True.
    """
    T = _v.check_positive_int("T", T)
    return np.tril(np.ones((T, T), dtype=bool))


def padding_mask(lengths, T):
    """Key validity for a padded batch: ``valid[b, t] = t < lengths[b]``.

    Parameters
    ----------
    lengths : (B,) int ndarray
        True length of each sequence, each in ``[0, T]``.
    T : int
        Padded length.

    Returns
    -------
    (B, T) bool ndarray
    """
    T = _v.check_positive_int("T", T)
    lengths = np.asarray(lengths)
    _v.check_ndim("lengths", lengths, 1, 1, what="(B,)")
    if lengths.dtype.kind not in "iu":
        raise ValueError(f"lengths must be integers, got dtype {lengths.dtype} (shape {lengths.shape})")
    if lengths.size and (lengths.min() < 0 or lengths.max() > T):
        raise ValueError(f"lengths must lie in [0, T={T}], got {lengths.tolist()} (shape {lengths.shape})")
    return np.arange(T)[None, :] < lengths[:, None]


def attention_mask_from_padding(valid):
    """Turn key validity ``(B, T)`` into an attention mask ``(B, 1, T)``.

    The result broadcasts to ``(B, T_q, T_k)``: every query may attend to the
    valid keys of its own sequence. Combine with a causal mask by ``&``::

        attention_mask_from_padding(valid) & causal_mask(T)   # (B, T, T)

    For multi-head attention with an explicit head axis, add it yourself:
    ``mask[:, None]`` has shape ``(B, 1, T_q, T_k)``.

    Parameters
    ----------
    valid : (B, T) bool ndarray

    Returns
    -------
    (B, 1, T) bool ndarray
    """
    valid = np.asarray(valid)
    _v.check_ndim("valid", valid, 2, 2, what="(B, T)")
    if valid.dtype != bool:
        raise ValueError(f"valid must be boolean, got dtype {valid.dtype} (shape {valid.shape})")
    return valid[:, None, :]


def sliding_window_mask(T, window):
    """Causal sliding window: query ``i`` may attend to keys ``j`` with ``0 <= i - j < window``.

    ``window=1`` lets each position see only itself; ``window >= T`` equals
    :func:`causal_mask`.

    Returns
    -------
    (T, T) bool ndarray
    """
    T = _v.check_positive_int("T", T)
    window = _v.check_positive_int("window", window)
    d = np.arange(T)[:, None] - np.arange(T)[None, :]  # i - j
    return (d >= 0) & (d < window)
