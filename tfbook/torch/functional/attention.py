"""Softmax, scaled dot-product attention (the reference), additive attention, and the masks
(True = may attend): causal, padding, sliding window.

Part of :mod:`tfbook.torch.functional` (which re-exports every public name); the twins are in
:mod:`tfbook.numpy.attention`.
"""

from __future__ import annotations

import math

import torch

from ... import _validate as _v
from ._common import _float, _tensor

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


def _one_dtype(**tensors):
    """A ValueError naming each tensor's dtype and shape unless they share one dtype (the NumPy
    twin promotes, as NumPy does; PyTorch's products would raise a bare RuntimeError)."""
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) > 1:
        what = ", ".join(f"{n}: {t.dtype} {tuple(t.shape)}" for n, t in tensors.items())
        raise ValueError(f"{', '.join(tensors)} must share one dtype, got {what}; convert them first "
                         "(e.g. .double() or .float())")


def softmax(x, axis=-1):
    """Softmax along ``axis``, stable for any finite logits; an all ``-inf`` row gives zeros.

    Parameters
    ----------
    x : (...) Tensor
    axis : int

    Returns
    -------
    (...) Tensor
        Same shape, dtype and device as ``x``.
    """
    x = _float(x, "x")
    if x.ndim == 0:
        raise ValueError(f"x must have at least 1 axis, got shape {tuple(x.shape)}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis={axis} is out of range for x of shape {tuple(x.shape)}")
    if x.shape[axis] == 0:
        raise ValueError(f"x has no entries along axis={axis} to normalise (x: {tuple(x.shape)})")
    y = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    m = y.detach().amax(dim=axis, keepdim=True)  # the shift cancels, so no gradient through it
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(y - m)
    s = e.sum(dim=axis, keepdim=True)
    s = torch.where(s == 0, torch.ones_like(s), s)
    return (e / s).to(x.dtype)


def scaled_dot_product_attention(Q, K, V, mask=None, scale=None):
    """Scaled dot-product attention, ``Z = softmax(Q K^T * scale) V``.

    Parameters
    ----------
    Q : (..., T_q, D_K) Tensor
    K : (..., T_k, D_K) Tensor
    V : (..., T_k, D_V) Tensor
    mask : (..., T_q, T_k) bool Tensor, optional
        True = may attend; broadcastable.
    scale : float, optional
        Defaults to ``1 / sqrt(D_K)``.

    Returns
    -------
    Z : (..., T_q, D_V) Tensor
    P : (..., T_q, T_k) Tensor
    """
    Q, K, V = _float(Q, "Q"), _float(K, "K"), _float(V, "V")
    batch = _v.check_qkv(Q, K, V)
    _one_dtype(Q=Q, K=K, V=V)
    T_q, D_K = Q.shape[-2:]
    if mask is not None:
        _tensor(mask, "mask")
        _v.check_mask(mask, T_q, K.shape[-2], batch)
    if scale is None:
        scale = 1.0 / math.sqrt(D_K)
    S = (Q * scale) @ K.transpose(-1, -2)  # (..., T_q, T_k)
    if mask is not None:
        S = S.masked_fill(~mask.to(S.device), float("-inf"))
    P = softmax(S, axis=-1)
    return P @ V, P


def additive_attention(Q, K, V, W_q, W_k, v, mask=None):
    """Additive (Bahdanau) attention, ``S[i, j] = v . tanh(q_i W_q + k_j W_k)``.

    Parameters
    ----------
    Q : (..., T_q, D_Q) Tensor
    K : (..., T_k, D_K) Tensor
    V : (..., T_k, D_V) Tensor
    W_q : (D_Q, D_A) Tensor
    W_k : (D_K, D_A) Tensor
    v : (D_A,) Tensor
    mask : (..., T_q, T_k) bool Tensor, optional

    Returns
    -------
    Z : (..., T_q, D_V) Tensor
    P : (..., T_q, T_k) Tensor
    """
    Q, K, V = _float(Q, "Q"), _float(K, "K"), _float(V, "V")
    for name, x in (("Q", Q), ("K", K), ("V", V)):
        _v.check_ndim(name, x, 2, what="(..., T, D)")
    if K.shape[-2] != V.shape[-2]:
        raise ValueError(f"K has T_k={K.shape[-2]} but V has T_k={V.shape[-2]} "
                         f"(K: {tuple(K.shape)}, V: {tuple(V.shape)})")
    for name, x in (("W_q", W_q), ("W_k", W_k), ("v", v)):
        _tensor(x, name)
    _v.check_matrix("W_q", W_q, Q.shape[-1], None, "(D_Q, D_A)")
    _v.check_matrix("W_k", W_k, K.shape[-1], W_q.shape[1], "(D_K, D_A)")
    _v.check_vector("v", v, W_q.shape[1], "D_A")
    batch = _v.broadcast_batch({"Q": tuple(Q.shape[:-2]), "K": tuple(K.shape[:-2]), "V": tuple(V.shape[:-2])})
    if mask is not None:
        _tensor(mask, "mask")
        _v.check_mask(mask, Q.shape[-2], K.shape[-2], batch)
    A = torch.tanh((Q @ W_q)[..., :, None, :] + (K @ W_k)[..., None, :, :])  # (..., T_q, T_k, D_A)
    S = A @ v  # (..., T_q, T_k)
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))
    P = softmax(S, axis=-1)
    return P @ V, P


# ---------------------------------------------------------------------------
# Masks (True = may attend)
# ---------------------------------------------------------------------------


def causal_mask(T, device=None):
    """Causal mask ``(T, T)``: lower triangle (diagonal included) True."""
    T = _v.check_positive_int("T", T)
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def padding_mask(lengths, T):
    """Key validity ``(B, T)`` for a padded batch: ``valid[b, t] = t < lengths[b]``.

    Created on the device of ``lengths``.
    """
    T = _v.check_positive_int("T", T)
    _tensor(lengths, "lengths")
    _v.check_ndim("lengths", lengths, 1, 1, what="(B,)")
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool or lengths.dtype.is_complex:
        raise ValueError(f"lengths must be integers, got dtype {lengths.dtype} (shape {tuple(lengths.shape)})")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > T):
        raise ValueError(f"lengths must lie in [0, T={T}], got {lengths.tolist()} (shape {tuple(lengths.shape)})")
    return torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]


def attention_mask_from_padding(valid):
    """Key validity ``(B, T)`` -> attention mask ``(B, 1, T)``, broadcastable to ``(B, T_q, T_k)``.

    Combine with a causal mask by ``&``: ``attention_mask_from_padding(valid) & causal_mask(T)``;
    for an explicit head axis use ``mask[:, None]``.
    """
    _tensor(valid, "valid")
    _v.check_ndim("valid", valid, 2, 2, what="(B, T)")
    if valid.dtype != torch.bool:
        raise ValueError(f"valid must be boolean, got dtype {valid.dtype} (shape {tuple(valid.shape)})")
    return valid[:, None, :]


def sliding_window_mask(T, window, device=None):
    """Causal sliding window ``(T, T)``: True where ``0 <= i - j < window``."""
    T = _v.check_positive_int("T", T)
    window = _v.check_positive_int("window", window)
    i = torch.arange(T, device=device)
    d = i[:, None] - i[None, :]
    return (d >= 0) & (d < window)
