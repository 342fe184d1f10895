"""Multi-head attention: splitting and merging the heads, and attention with projections.

Part of :mod:`tfbook.torch.functional` (which re-exports every public name); the twins are in
:mod:`tfbook.numpy.heads`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import _validate as _v
from ._common import _float, _linear, _tensor
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
    """``(..., T, D) -> (..., H, T, D / H)``."""
    _tensor(X, "X")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    *lead, T, D = X.shape
    H = _v.check_heads(D, num_heads, tuple(X.shape), name="X")
    return X.reshape(*lead, T, H, D // H).transpose(-2, -3)


def merge_heads(X):
    """``(..., H, T, D_h) -> (..., T, H * D_h)``."""
    _tensor(X, "X")
    _v.check_ndim("X", X, 3, what="(..., H, T, D_h)")
    *lead, H, T, Dh = X.shape
    return X.transpose(-2, -3).reshape(*lead, T, H * Dh)


_MHA_KEYS = ("W_Q", "W_K", "W_V", "W_O")


def _check_mha_params(params, D, name="params"):
    _v.check_params(name, params, _MHA_KEYS)
    for k in _MHA_KEYS:
        _tensor(params[k], f"{name}['{k}']")
        _v.check_matrix(f"{name}['{k}']", params[k], D, D, "(D, D)")
        b = params.get("b" + k[1:])
        if b is not None:
            _tensor(b, f"{name}['b{k[1:]}']")
            _v.check_vector(f"{name}['b{k[1:]}']", b, D, "D")


def _attend(Q, K, V, mask=None, return_attention=True):
    """The attention core of the models: ``(Z, P)`` like :func:`scaled_dot_product_attention`,
    computed by PyTorch's fused kernel when the weights are not wanted.

    With ``return_attention=True`` this is the textbook function (``P`` materialised).
    With ``False`` it calls ``torch.nn.functional.scaled_dot_product_attention`` (which may
    never hold the ``(T_q, T_k)`` matrix) and returns ``(Z, None)``. Both use the book's
    conventions: boolean ``mask``, True = may attend (torch's boolean ``attn_mask`` means
    the same), and a query row that may attend to nothing gives a zero output row. For
    such rows the fused path attends everywhere (a finite, throw-away result) and then
    zeroes them, so neither the output nor a gradient becomes NaN. No shape checks here:
    callers (:func:`multi_head_attention`, the KV cache) have checked ``Q, K, V, mask``.

    Parameters
    ----------
    Q : (..., T_q, D_K) Tensor
    K : (..., T_k, D_K) Tensor
    V : (..., T_k, D_V) Tensor
    mask : (..., T_q, T_k) bool Tensor, optional
    return_attention : bool

    Returns
    -------
    Z : (..., T_q, D_V) Tensor
    P : (..., T_q, T_k) Tensor, or None when ``return_attention=False``
    """
    if return_attention:
        return scaled_dot_product_attention(Q, K, V, mask=mask)
    if mask is None:
        return F.scaled_dot_product_attention(Q, K, V), None
    mask = mask.to(Q.device)
    row_ok = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1): the row may attend to something
    if bool(row_ok.all()):
        return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask), None
    Z = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask | ~row_ok)
    return Z.masked_fill(~row_ok, 0.0), None


def multi_head_attention(X_q, X_kv, params, num_heads, mask=None):
    """Multi-head attention; see :func:`tfbook.numpy.multi_head_attention`.

    Parameters
    ----------
    X_q : (..., T_q, D) Tensor
    X_kv : (..., T_kv, D) Tensor
    params : dict
        ``W_Q, W_K, W_V, W_O (D, D)`` and biases ``b_Q, b_K, b_V, b_O (D,)`` (may be None).
    num_heads : int
    mask : bool Tensor, optional
        Broadcastable to ``(..., T_q, T_kv)`` (shared by heads), or with one more
        axis than ``X_q`` to ``(..., H, T_q, T_kv)``.

    Returns
    -------
    Z : (..., T_q, D) Tensor
    P : (..., H, T_q, T_kv) Tensor

    :class:`~tfbook.torch.modules.MultiHeadAttention` calls :func:`_multi_head_attention`,
    the same function with a ``return_attention`` switch: ``False`` computes the heads with
    PyTorch's fused kernel (:func:`_attend`) and returns ``P = None``. (The public signature
    stays that of :func:`tfbook.numpy.multi_head_attention`, argument for argument.)
    """
    return _multi_head_attention(X_q, X_kv, params, num_heads, mask=mask)


def _multi_head_attention(X_q, X_kv, params, num_heads, mask=None, return_attention=True):
    """:func:`multi_head_attention`; ``return_attention=False`` uses the fused kernel, ``P = None``."""
    X_q, X_kv = _float(X_q, "X_q"), _float(X_kv, "X_kv")
    _v.check_ndim("X_q", X_q, 2, what="(..., T_q, D)")
    _v.check_ndim("X_kv", X_kv, 2, what="(..., T_kv, D)")
    D = X_q.shape[-1]
    if X_kv.shape[-1] != D:
        raise ValueError(f"X_q has D={D} but X_kv has D={X_kv.shape[-1]} "
                         f"(X_q: {tuple(X_q.shape)}, X_kv: {tuple(X_kv.shape)})")
    H = _v.check_heads(D, num_heads, tuple(X_q.shape))
    _check_mha_params(params, D)
    batch = _v.broadcast_batch({"X_q": tuple(X_q.shape[:-2]), "X_kv": tuple(X_kv.shape[:-2])})
    if mask is not None:
        _tensor(mask, "mask")
        m = mask[..., None, :, :] if 3 <= mask.ndim <= X_q.ndim else mask
        try:
            _v.check_mask(m, X_q.shape[-2], X_kv.shape[-2], batch + (H,))
        except ValueError:
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} does not broadcast to (..., T_q, T_kv) = "
                f"{batch + (X_q.shape[-2], X_kv.shape[-2])} (or (..., H, T_q, T_kv) with H={H})"
            ) from None
        mask = m
    if X_kv is X_q:
        # Self-attention: the three projections as one (D, 3D) product, as nn.MultiheadAttention
        # does; one large matrix product is faster than three narrow ones (same arithmetic).
        W_QKV = torch.cat([params["W_Q"], params["W_K"], params["W_V"]], dim=1)  # (D, 3D)
        biases = [params.get(k) for k in ("b_Q", "b_K", "b_V")]
        b_QKV = None
        if any(b is not None for b in biases):
            b_QKV = torch.cat([torch.zeros(D, dtype=X_q.dtype, device=X_q.device) if b is None else b
                               for b in biases])
        Q, K, V = (split_heads(Y, H) for Y in _linear(X_q, W_QKV, b_QKV).split(D, dim=-1))
    else:
        Q = split_heads(_linear(X_q, params["W_Q"], params.get("b_Q")), H)  # (..., H, T_q, D/H)
        K = split_heads(_linear(X_kv, params["W_K"], params.get("b_K")), H)  # (..., H, T_kv, D/H)
        V = split_heads(_linear(X_kv, params["W_V"], params.get("b_V")), H)  # (..., H, T_kv, D/H)
    Z, P = _attend(Q, K, V, mask=mask, return_attention=return_attention)
    return _linear(merge_heads(Z), params["W_O"], params.get("b_O")), P
