"""PyTorch twins of :mod:`tfbook.numpy.modern`, re-exported by :mod:`tfbook.torch.functional`.

Same names, arguments and semantics as the NumPy functions (RMSNorm, SiLU, SwiGLU, tanh
GELU, the two rotary layouts, rotary attention, grouped-query attention). Each spells out
its formula; the tests compare it with PyTorch's built-in (``F.rms_norm``, ``F.silu``,
``F.gelu(approximate="tanh")``, ``F.scaled_dot_product_attention(enable_gqa=True)``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ... import _validate as _v
from ...numpy.modern import (
    _ROPE_LAYOUTS,
    _check_gqa_heads,
    _check_ids_range,
    _check_llama_block,
    _check_llama_params,
    _check_qk_norm,
    _head_mask,
)
from ._common import _float, _tensor
from .attention import scaled_dot_product_attention
from .heads import merge_heads, split_heads
from .positions import _rope_angles, rope

__all__ = [
    "rms_norm",
    "silu",
    "swiglu",
    "gelu_tanh",
    "rope_rotate_half",
    "rope_permutation",
    "rope_attention",
    "grouped_query_attention",
    "llama_block",
    "llama_lm",
]


# ---------------------------------------------------------------------------
# Norm and activations
# ---------------------------------------------------------------------------


def rms_norm(X, gamma, eps=1e-6):
    """RMSNorm ``X / sqrt(mean(X**2) + eps) * gamma`` over the last axis; ``gamma (D,)`` or None.
    Equal to ``F.rms_norm(X, (D,), gamma, eps)`` (the modules call that fused kernel)."""
    X = _float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., D)")
    if gamma is not None:
        _tensor(gamma, "gamma")
        _v.check_vector("gamma", gamma, X.shape[-1], "D")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r} (X: {tuple(X.shape)})")
    ms = (X * X).mean(dim=-1, keepdim=True)  # (..., 1)
    Y = X / torch.sqrt(ms + eps)
    return Y if gamma is None else Y * gamma


def silu(x):
    """SiLU ``x * sigmoid(x)`` (equal to ``F.silu``)."""
    x = _float(x, "x")
    return x * torch.sigmoid(x)


def _check_swiglu_params(params, D, name="params"):
    _v.check_params(name, params, ("W_gate", "W_up", "W_down"))
    for k in ("W_gate", "W_up", "W_down"):
        _tensor(params[k], f"{name}['{k}']")
    _v.check_matrix(f"{name}['W_gate']", params["W_gate"], D, None, "(D, D_ff)")
    D_ff = params["W_gate"].shape[1]
    _v.check_matrix(f"{name}['W_up']", params["W_up"], D, D_ff, "(D, D_ff)")
    _v.check_matrix(f"{name}['W_down']", params["W_down"], D_ff, D, "(D_ff, D)")


def swiglu(X, params):
    """Gated MLP ``(silu(X W_gate) * (X W_up)) W_down``; ``W_gate, W_up (D, D_ff)``, ``W_down (D_ff, D)``."""
    X = _float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., D)")
    _check_swiglu_params(params, X.shape[-1])
    return (silu(X @ params["W_gate"]) * (X @ params["W_up"])) @ params["W_down"]


def gelu_tanh(x):
    """GELU, tanh approximation ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))``
    (equal to ``F.gelu(x, approximate="tanh")``)."""
    x = _float(x, "x")
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


# ---------------------------------------------------------------------------
# Rotary positions
# ---------------------------------------------------------------------------


def rope_rotate_half(X, positions=None, base=10000.0):
    """Rotary positions, rotate-half layout: pair ``i`` is ``(i, i + D/2)``; see
    :func:`tfbook.numpy.rope_rotate_half`. ``X (..., T, D)``, ``positions (..., T)``."""
    X = _float(X, "X")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    T, D = X.shape[-2:]
    if D % 2:
        raise ValueError(f"X has D={D}, which must be even for rope (X: {tuple(X.shape)})")
    theta = _rope_angles(X, positions, base)
    c, s = torch.cos(theta).to(X.dtype), torch.sin(theta).to(X.dtype)
    x1, x2 = X[..., : D // 2], X[..., D // 2:]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


def rope_permutation(D, device=None):
    """``[0, 2, ..., D-2, 1, 3, ..., D-1]`` (int64): ``rope_rotate_half(X[..., p]) == rope(X)[..., p]``."""
    D = _v.check_positive_int("D", D)
    if D % 2:
        raise ValueError(f"D={D} must be even (rope rotates pairs of coordinates)")
    return torch.cat([torch.arange(0, D, 2, device=device), torch.arange(1, D, 2, device=device)])


def _rope(X, positions, base, layout, name):
    try:
        return rope(X, positions, base) if layout == "interleaved" else rope_rotate_half(X, positions, base)
    except ValueError as e:
        msg = str(e).replace("positions", name).replace("X:", f"{name[0].upper()}:")
        raise ValueError(msg) from None


def _attention_positions(Q, K, q_positions, k_positions):
    T_q, T_k = Q.shape[-2], K.shape[-2]
    if k_positions is None:
        k_positions = torch.arange(T_k, device=K.device)
    _tensor(k_positions, "k_positions")
    if q_positions is None:
        if k_positions.ndim == 0 or k_positions.shape[-1] != T_k:
            raise ValueError(f"k_positions must have shape (..., T_k) with T_k={T_k}, got "
                             f"{tuple(k_positions.shape)} (K: {tuple(K.shape)})")
        if T_q > T_k:
            raise ValueError(f"q_positions is required when T_q={T_q} > T_k={T_k}: queries default to the "
                             f"last T_q key positions (Q: {tuple(Q.shape)}, K: {tuple(K.shape)})")
        q_positions = k_positions[..., T_k - T_q:]
    return q_positions, k_positions


def rope_attention(Q, K, V, mask=None, layout="interleaved", q_positions=None, k_positions=None,
                   base=10000.0, scale=None):
    """Rotate ``Q`` and ``K`` (``layout`` "interleaved" or "half"), then scaled dot-product
    attention; returns ``(Z, P)``. See :func:`tfbook.numpy.rope_attention`."""
    Q, K, V = _float(Q, "Q"), _float(K, "K"), _float(V, "V")
    _v.check_qkv(Q, K, V)
    _v.check_choice("layout", layout, _ROPE_LAYOUTS)
    if Q.shape[-1] % 2:
        raise ValueError(f"Q has D_K={Q.shape[-1]}, which must be even for rope "
                         f"(Q: {tuple(Q.shape)}, K: {tuple(K.shape)})")
    q_positions, k_positions = _attention_positions(Q, K, q_positions, k_positions)
    Q = _rope(Q, q_positions, base, layout, "q_positions")
    K = _rope(K, k_positions, base, layout, "k_positions")
    return scaled_dot_product_attention(Q, K, V, mask=mask, scale=scale)


# ---------------------------------------------------------------------------
# Grouped-query attention
# ---------------------------------------------------------------------------


def _check_gqa_params(params, D, D_kv, name="params"):
    _v.check_params(name, params, ("W_Q", "W_K", "W_V", "W_O"))
    sizes = {"Q": (D, "(D, D)"), "K": (D_kv, "(D, H_kv * D_K)"), "V": (D_kv, "(D, H_kv * D_K)"),
             "O": (D, "(D, D)")}
    for k, (cols, label) in sizes.items():
        _tensor(params[f"W_{k}"], f"{name}['W_{k}']")
        _v.check_matrix(f"{name}['W_{k}']", params[f"W_{k}"], D, cols, label)
        b = params.get(f"b_{k}")
        if b is not None:
            _tensor(b, f"{name}['b_{k}']")
            _v.check_vector(f"{name}['b_{k}']", b, cols, "D" if cols == D else "H_kv * D_K")


def _gqa_attend(Q, K, V, mask=None, return_attention=True):
    """The attention core of grouped-query attention: ``Q (..., H, T_q, D_K)`` against
    ``K, V (..., H_kv, T_kv, D_K)``; returns ``(Z (..., H, T_q, D_K), P or None)``.

    ``return_attention=True``: the key/value heads are repeated (``repeat_interleave``) and
    the textbook attention forms ``P``. ``False``: PyTorch's fused kernel with
    ``enable_gqa=True``, which reads each key/value head for its whole group without
    copying it; a fully masked query row is zeroed afterwards (no NaN), as in
    :func:`tfbook.torch.functional._attend`. No shape checks here (callers check).
    """
    G = Q.shape[-3] // K.shape[-3]
    if return_attention:
        K, V = K.repeat_interleave(G, dim=-3), V.repeat_interleave(G, dim=-3)  # (..., H, T_kv, D_K)
        return scaled_dot_product_attention(Q, K, V, mask=mask)
    if mask is None:
        return F.scaled_dot_product_attention(Q, K, V, enable_gqa=True), None
    mask = mask.to(Q.device)
    row_ok = mask.any(dim=-1, keepdim=True)
    if bool(row_ok.all()):
        return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, enable_gqa=True), None
    Z = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask | ~row_ok, enable_gqa=True)
    return Z.masked_fill(~row_ok, 0.0), None


def grouped_query_attention(X_q, X_kv, params, num_heads, num_kv_heads, mask=None, rope=None,
                            base=10000.0, eps=1e-6):
    """Grouped-query attention; see :func:`tfbook.numpy.grouped_query_attention`.

    ``W_Q, W_O (D, D)``, ``W_K, W_V (D, H_kv * D_K)``, optional QK-norm gains
    ``q_norm, k_norm (D_K,)``; returns ``Z (..., T_q, D)`` and ``P (..., H, T_q, T_kv)``.
    """
    return _grouped_query_attention(X_q, X_kv, params, num_heads, num_kv_heads, mask, rope, base, eps=eps)


def _grouped_query_attention(X_q, X_kv, params, num_heads, num_kv_heads, mask=None, rope=None,
                             base=10000.0, return_attention=True, eps=1e-6):
    X_q, X_kv = _float(X_q, "X_q"), _float(X_kv, "X_kv")
    D = _v.check_x_q_x_kv(X_q, X_kv)
    H, H_kv, D_K = _check_gqa_heads(D, num_heads, num_kv_heads, tuple(X_q.shape))
    _check_gqa_params(params, D, H_kv * D_K)
    qk_norm = _check_qk_norm(params, D_K)
    if qk_norm:
        _tensor(params["q_norm"], "params['q_norm']")
        _tensor(params["k_norm"], "params['k_norm']")
    if rope is not None:
        _v.check_choice("rope", rope, _ROPE_LAYOUTS)
        if D_K % 2:
            raise ValueError(f"rope needs an even head width, got D_K = D / H = {D_K} (X_q: {tuple(X_q.shape)})")
    T_q, T_kv = X_q.shape[-2], X_kv.shape[-2]
    if rope is not None and T_q > T_kv:
        raise ValueError(f"rope places the queries at the last T_q key positions, so T_q={T_q} must be <= "
                         f"T_kv={T_kv} (X_q: {tuple(X_q.shape)}, X_kv: {tuple(X_kv.shape)})")
    batch = _v.broadcast_batch({"X_q": tuple(X_q.shape[:-2]), "X_kv": tuple(X_kv.shape[:-2])})
    if mask is not None:
        _tensor(mask, "mask")
        mask = _head_mask(mask, X_q.ndim, batch, T_q, T_kv, H, _v.check_mask)

    def lin(X, k):
        b = params.get(f"b_{k}")
        Y = X @ params[f"W_{k}"]
        return Y if b is None else Y + b

    Q = split_heads(lin(X_q, "Q"), H)  # (..., H, T_q, D_K)
    K = split_heads(lin(X_kv, "K"), H_kv)  # (..., H_kv, T_kv, D_K)
    V = split_heads(lin(X_kv, "V"), H_kv)  # (..., H_kv, T_kv, D_K)
    if qk_norm:  # each head's rows to unit RMS, times a learned gain, before the rotation
        Q = rms_norm(Q, params["q_norm"], eps)
        K = rms_norm(K, params["k_norm"], eps)
    if rope is not None:
        pos_k = torch.arange(T_kv, device=X_q.device)
        Q = _rope(Q, pos_k[T_kv - T_q:], base, rope, "q_positions")
        K = _rope(K, pos_k, base, rope, "k_positions")
    Z, P = _gqa_attend(Q, K, V, mask=mask, return_attention=return_attention)
    return lin(merge_heads(Z), "O"), P


# ---------------------------------------------------------------------------
# The Llama block and the whole model
# ---------------------------------------------------------------------------


def _llama_block(X, params, num_heads, num_kv_heads, mask, rope, base, eps):
    Y = rms_norm(X, params["norm_attn"]["gamma"], eps)  # (..., T, D)
    Z, _ = grouped_query_attention(Y, Y, params["attn"], num_heads, num_kv_heads, mask=mask, rope=rope, base=base,
                                   eps=eps)
    X = X + Z  # (..., T, D)
    return X + swiglu(rms_norm(X, params["norm_mlp"]["gamma"], eps), params["mlp"])


def llama_block(X, params, num_heads, num_kv_heads, mask=None, rope="half", base=10000.0, eps=1e-6):
    """The pre-norm Llama block ``X + gqa(rms_norm(X))``, then ``+ swiglu(rms_norm(X))``; see
    :func:`tfbook.numpy.llama_block` (params as ``LlamaBlock.params()``-style dicts of tensors)."""
    X = _float(X, "X")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    _check_llama_block(params, X.shape[-1], num_heads, num_kv_heads, tuple(X.shape), "params")
    return _llama_block(X, params, num_heads, num_kv_heads, mask, rope, base, eps)


def llama_lm(ids, params, num_heads, num_kv_heads, rope="half", base=10000.0, eps=1e-6):
    """The Llama-style model's forward pass, ids ``(..., T)`` -> logits ``(..., T, V)``; see
    :func:`tfbook.numpy.llama_lm`."""
    V, D = _check_llama_params(params)
    W_E, W_U = _float(params["W_E"], "params['W_E']"), params.get("W_U")
    ids = _tensor(ids, "ids")
    _v.check_ndim("ids", ids, 1, what="(..., T)")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"ids must be integers, got dtype {ids.dtype} (ids: {tuple(ids.shape)})")
    if ids.numel():
        _check_ids_range(ids, V, int(ids.min()), int(ids.max()), W_E.shape)
    X = W_E[ids]  # (..., T, D)
    for i, block in enumerate(params["blocks"]):
        _check_llama_block(block, D, num_heads, num_kv_heads, tuple(X.shape), f"params['blocks'][{i}]")
    T = ids.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()  # (T, T) causal
    for block in params["blocks"]:
        X = _llama_block(X, block, num_heads, num_kv_heads, mask, rope, base, eps)
    X = rms_norm(X, params["norm"]["gamma"], eps)
    return X @ (W_E.T if W_U is None else W_U)  # (..., T, V)
