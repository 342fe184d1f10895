"""Multi-head attention: splitting and merging the heads, and attention with projections.

Part of :mod:`tfbook.numpy` (which re-exports every public name); the twins are in
:mod:`tfbook.torch.functional.heads`.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as _v
from ._common import _as_float, _linear
from .attention import scaled_dot_product_attention

__all__ = [
    "split_heads",
    "merge_heads",
    "multi_head_attention",
]


# ---------------------------------------------------------------------------
# Multi-head attention
# ---------------------------------------------------------------------------


def split_heads(X, num_heads):
    """Split the last axis into heads: ``(..., T, D) -> (..., H, T, D / H)``. A reshape and a transpose."""
    X = np.asarray(X)
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    *lead, T, D = X.shape
    H = _v.check_heads(D, num_heads, X.shape, name="X")
    return np.swapaxes(X.reshape(*lead, T, H, D // H), -2, -3)


def merge_heads(X):
    """Inverse of :func:`split_heads`: ``(..., H, T, D_h) -> (..., T, H * D_h)``."""
    X = np.asarray(X)
    _v.check_ndim("X", X, 3, what="(..., H, T, D_h)")
    *lead, H, T, Dh = X.shape
    return np.swapaxes(X, -2, -3).reshape(*lead, T, H * Dh)


_MHA_KEYS = ("W_Q", "W_K", "W_V", "W_O")


def _check_mha_params(params, D, name="params"):
    _v.check_params(name, params, _MHA_KEYS)
    for k in _MHA_KEYS:
        _v.check_matrix(f"{name}['{k}']", params[k], D, D, "(D, D)")
        b = params.get("b" + k[1:])
        if b is not None:
            _v.check_vector(f"{name}['b{k[1:]}']", b, D, "D")


def _head_mask(mask, X_q):
    """Insert the head axis: a mask shared by heads ``(..., T_q, T_k)`` -> ``(..., 1, T_q, T_k)``.

    A mask with more axes than ``X_q`` already carries its own head axis.
    """
    if mask is None or mask.ndim < 3 or mask.ndim > X_q.ndim:
        return mask
    return mask[..., None, :, :]


def multi_head_attention(X_q, X_kv, params, num_heads, mask=None):
    """Multi-head attention with separate projections ``W_Q, W_K, W_V`` and output ``W_O``.

    Parameters
    ----------
    X_q : (..., T_q, D) ndarray
        Sequence the queries come from.
    X_kv : (..., T_kv, D) ndarray
        Sequence the keys and values come from (``X_q`` for self-attention).
    params : dict
        ``W_Q, W_K, W_V, W_O`` of shape ``(D, D)`` and biases ``b_Q, b_K, b_V,
        b_O`` of shape ``(D,)`` (missing or ``None`` means no bias).
    num_heads : int
        ``H``; must divide ``D``. Each head has ``D_K = D_V = D / H``.
    mask : bool ndarray, optional
        Broadcastable to ``(..., T_q, T_kv)`` and shared by all heads, or with one
        more axis than ``X_q``, broadcastable to ``(..., H, T_q, T_kv)``.

    Returns
    -------
    Z : (..., T_q, D) ndarray
    P : (..., H, T_q, T_kv) ndarray
        The weights of every head (not averaged).
    """
    X_q, X_kv = _as_float(X_q, "X_q"), _as_float(X_kv, "X_kv")
    _v.check_ndim("X_q", X_q, 2, what="(..., T_q, D)")
    _v.check_ndim("X_kv", X_kv, 2, what="(..., T_kv, D)")
    D = X_q.shape[-1]
    if X_kv.shape[-1] != D:
        raise ValueError(f"X_q has D={D} but X_kv has D={X_kv.shape[-1]} (X_q: {X_q.shape}, X_kv: {X_kv.shape})")
    H = _v.check_heads(D, num_heads, X_q.shape)
    _check_mha_params(params, D)
    batch = _v.broadcast_batch({"X_q": X_q.shape[:-2], "X_kv": X_kv.shape[:-2]})
    if mask is not None:
        mask = np.asarray(mask)
        m = _head_mask(mask, X_q)
        try:
            _v.check_mask(m, X_q.shape[-2], X_kv.shape[-2], batch + (H,))
        except ValueError:
            raise ValueError(
                f"mask of shape {mask.shape} does not broadcast to (..., T_q, T_kv) = "
                f"{batch + (X_q.shape[-2], X_kv.shape[-2])} (or (..., H, T_q, T_kv) with H={H})"
            ) from None
        mask = m
    Q = split_heads(_linear(X_q, params["W_Q"], params.get("b_Q")), H)  # (..., H, T_q, D/H)
    K = split_heads(_linear(X_kv, params["W_K"], params.get("b_K")), H)  # (..., H, T_kv, D/H)
    V = split_heads(_linear(X_kv, params["W_V"], params.get("b_V")), H)  # (..., H, T_kv, D/H)
    Z, P = scaled_dot_product_attention(Q, K, V, mask=mask)
    Z = _linear(merge_heads(Z), params["W_O"], params.get("b_O"))  # (..., T_q, D)
    return Z, P
