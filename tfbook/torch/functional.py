"""The functions of :mod:`tfbook.numpy`, for ``torch.Tensor``.

Same names, same arguments, same semantics. Every function runs on the device of
its inputs, supports autograd and preserves the dtype (float16 and bfloat16 are
computed in float32 inside softmax and cast back). Masks are boolean with
``True`` meaning "may attend"; a fully masked query row gives zeros, not NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import _validate as _v

__all__ = [
    "softmax",
    "scaled_dot_product_attention",
    "additive_attention",
    "causal_mask",
    "padding_mask",
    "attention_mask_from_padding",
    "sliding_window_mask",
    "split_heads",
    "merge_heads",
    "multi_head_attention",
    "one_hot",
    "embedding_lookup",
    "sinusoidal_positional_encoding",
    "sinusoidal_shift_matrix",
    "sinusoidal_positional_encoding_2d",
    "learned_positional_embedding",
    "rope",
    "layer_norm",
    "relu",
    "gelu",
    "feed_forward",
    "encoder_block",
    "decoder_block",
    "patchify",
    "unpatchify",
    "attention_rollout",
    "kv_cache_append",
    "tiled_attention",
    "linear_attention",
]


def _tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _float(x, name: str) -> torch.Tensor:
    x = _tensor(x, name)
    _v.check_floating(name, x)
    return x


def _common_dtype(*xs):
    dt = xs[0].dtype
    for x in xs[1:]:
        dt = torch.promote_types(dt, x.dtype)
    return dt


# ---------------------------------------------------------------------------
# Softmax and attention
# ---------------------------------------------------------------------------


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


def _linear(X, W, b):
    Y = X @ W
    return Y if b is None else Y + b


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


# ---------------------------------------------------------------------------
# Tokens and positions
# ---------------------------------------------------------------------------


def _check_ids(ids, num_classes, name="ids"):
    _tensor(ids, name)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be integers, got dtype {ids.dtype} (shape {tuple(ids.shape)})")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_classes):
        raise ValueError(f"{name} must lie in [0, {num_classes}), got min {int(ids.min())} and "
                         f"max {int(ids.max())} (shape {tuple(ids.shape)})")
    return ids


def one_hot(ids, num_classes, dtype=None):
    """One-hot rows ``(...) -> (..., num_classes)``; ``dtype`` defaults to torch's default float."""
    num_classes = _v.check_positive_int("num_classes", num_classes)
    ids = _check_ids(ids, num_classes)
    return F.one_hot(ids.long(), num_classes).to(dtype or torch.get_default_dtype())


def embedding_lookup(ids, W_E):
    """Row lookup ``W_E[ids]`` with ``W_E (V, D)``; equals ``one_hot(ids, V) @ W_E``."""
    _tensor(W_E, "W_E")
    _v.check_ndim("W_E", W_E, 2, 2, what="(V, D)")
    ids = _check_ids(ids, W_E.shape[0])
    return W_E[ids.long()]


def _frequencies(D, base, device):
    return base ** (-torch.arange(0, D, 2, dtype=torch.float64, device=device) / D)


def _check_even(name, D):
    D = _v.check_positive_int(name, D)
    if D % 2:
        raise ValueError(f"{name}={D} must be even (positions use (sin, cos) pairs)")
    return D


def sinusoidal_positional_encoding(T, D, base=10000.0, dtype=None, device=None):
    """``(T, D)`` interleaved sinusoidal encoding: ``PE[p, 2i] = sin(p w_i)``, ``PE[p, 2i+1] = cos(p w_i)``,
    ``w_i = base**(-2i/D)``. Computed in float64, returned in ``dtype`` (default: torch's default)."""
    T = _v.check_positive_int("T", T)
    D = _check_even("D", D)
    angle = torch.arange(T, dtype=torch.float64, device=device)[:, None] * _frequencies(D, base, device)
    PE = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).reshape(T, D)  # interleave
    return PE.to(dtype or torch.get_default_dtype())


def sinusoidal_shift_matrix(k, D, base=10000.0, dtype=None, device=None):
    """``(D, D)`` block-diagonal rotation ``M(k)`` with ``PE[p + k] == M(k) @ PE[p]``."""
    D = _check_even("D", D)
    theta = float(k) * _frequencies(D, base, device)
    c, s = torch.cos(theta), torch.sin(theta)
    blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)  # (D/2, 2, 2)
    return torch.block_diag(*blocks).to(dtype or torch.get_default_dtype())


def sinusoidal_positional_encoding_2d(H, W, D, base=10000.0, dtype=None, device=None):
    """``(H*W, D)`` 2D encoding: first ``D/2`` channels encode the row, last ``D/2`` the column."""
    H = _v.check_positive_int("H", H)
    W = _v.check_positive_int("W", W)
    D = _v.check_positive_int("D", D)
    if D % 4:
        raise ValueError(f"D={D} must be divisible by 4 (two halves of (sin, cos) pairs)")
    rows = sinusoidal_positional_encoding(H, D // 2, base, torch.float64, device)
    cols = sinusoidal_positional_encoding(W, D // 2, base, torch.float64, device)
    PE = torch.cat([rows.repeat_interleave(W, dim=0), cols.repeat(H, 1)], dim=1)
    return PE.to(dtype or torch.get_default_dtype())


def learned_positional_embedding(X, table):
    """``X (..., T, D) + table[:T]`` with ``table (T_max, D)``; ValueError when ``T > T_max``."""
    X = _float(X, "X")
    _tensor(table, "table")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    _v.check_ndim("table", table, 2, 2, what="(T_max, D)")
    T, D = X.shape[-2:]
    if table.shape[1] != D:
        raise ValueError(f"X has D={D} but table has D={table.shape[1]} "
                         f"(X: {tuple(X.shape)}, table: {tuple(table.shape)})")
    if T > table.shape[0]:
        raise ValueError(f"X has T={T} positions but table only T_max={table.shape[0]} "
                         f"(X: {tuple(X.shape)}, table: {tuple(table.shape)}): "
                         f"a learned table cannot go past T_max")
    return X + table[:T]


def _rope_angles(X, positions, base):
    """The angles ``positions * omega_i`` of every channel pair, ``(..., T, D/2)`` in float64;
    ``positions`` defaults to ``0..T-1`` and is checked against ``X (..., T, D)``."""
    T, D = X.shape[-2:]
    if positions is None:
        positions = torch.arange(T, device=X.device)
    _tensor(positions, "positions")
    if positions.ndim == 0 or positions.shape[-1] != T:
        raise ValueError(f"positions must have shape (..., T) with T={T}, got {tuple(positions.shape)} "
                         f"(X: {tuple(X.shape)})")
    _v.broadcast_batch({"X": tuple(X.shape[:-2]), "positions": tuple(positions.shape[:-1])})
    return positions.to(torch.float64)[..., None] * _frequencies(D, base, X.device)


def rope(X, positions=None, base=10000.0):
    """Rotary position embedding: rotate each pair ``(2i, 2i+1)`` by ``position / base**(2i/D)``.

    Parameters
    ----------
    X : (..., T, D) Tensor
    positions : (..., T) Tensor, optional
        Defaults to ``0 .. T-1``.

    Returns
    -------
    (..., T, D) Tensor
    """
    X = _float(X, "X")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    T, D = X.shape[-2:]
    if D % 2:
        raise ValueError(f"X has D={D}, which must be even for rope (X: {tuple(X.shape)})")
    theta = _rope_angles(X, positions, base)
    c, s = torch.cos(theta).to(X.dtype), torch.sin(theta).to(X.dtype)
    x0, x1 = X[..., 0::2], X[..., 1::2]
    out = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1)  # (..., T, D/2, 2)
    return out.flatten(-2)


# ---------------------------------------------------------------------------
# Norms and the MLP
# ---------------------------------------------------------------------------


def layer_norm(X, gamma, beta, eps=1e-5):
    """LayerNorm over the last axis, biased variance (as ``nn.LayerNorm``); ``gamma, beta (D,)`` or None."""
    X = _float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., D)")
    D = X.shape[-1]
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p is not None:
            _tensor(p, name)
            _v.check_vector(name, p, D, "D")
    mu = X.mean(dim=-1, keepdim=True)
    var = ((X - mu) ** 2).mean(dim=-1, keepdim=True)
    Y = (X - mu) / torch.sqrt(var + eps)
    if gamma is not None:
        Y = Y * gamma
    if beta is not None:
        Y = Y + beta
    return Y


def relu(x):
    """``max(x, 0)`` elementwise."""
    return torch.relu(_float(x, "x"))


def gelu(x):
    """Exact GELU ``0.5 x (1 + erf(x / sqrt 2))`` (PyTorch's fused kernel computes exactly this;
    ``tfbook.numpy.gelu`` spells the formula out, and the two are tested equal)."""
    x = _float(x, "x")
    return torch.nn.functional.gelu(x)


_ACTIVATIONS = {"relu": relu, "gelu": gelu}


def feed_forward(X, params, activation="relu"):
    """Position-wise MLP ``act(X W_1 + b_1) W_2 + b_2``; ``W_1 (D, D_ff)``, ``W_2 (D_ff, D)``."""
    X = _float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., D)")
    _v.check_choice("activation", activation, _ACTIVATIONS)
    _v.check_params("params", params, ("W_1", "W_2"))
    for k in ("W_1", "b_1", "W_2", "b_2"):
        if params.get(k) is not None:
            _tensor(params[k], f"params['{k}']")
    D = X.shape[-1]
    _v.check_matrix("params['W_1']", params["W_1"], D, None, "(D, D_ff)")
    D_ff = params["W_1"].shape[1]
    _v.check_matrix("params['W_2']", params["W_2"], D_ff, D, "(D_ff, D)")
    if params.get("b_1") is not None:
        _v.check_vector("params['b_1']", params["b_1"], D_ff, "D_ff")
    if params.get("b_2") is not None:
        _v.check_vector("params['b_2']", params["b_2"], D, "D")
    Hd = _ACTIVATIONS[activation](_linear(X, params["W_1"], params.get("b_1")))  # (..., T, D_ff)
    return _linear(Hd, params["W_2"], params.get("b_2"))


# ---------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------


def _norm(X, p, eps):
    return layer_norm(X, p.get("gamma"), p.get("beta"), eps)


def encoder_block(X, params, num_heads, norm_first=False, activation="relu", mask=None, eps=1e-5):
    """Encoder block equal to ``nn.TransformerEncoderLayer(batch_first=True, dropout=0)``.

    ``params = {"attn", "ffn", "norm1", "norm2"}``; ``mask`` True = may attend. Post-LN
    ``X = LN1(X + MHA(X)); X = LN2(X + FFN(X))``, or Pre-LN with ``norm_first``.
    """
    X = _float(X, "X")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    _v.check_params("params", params, ("attn", "ffn", "norm1", "norm2"))
    _v.check_choice("activation", activation, _ACTIVATIONS)

    def sa(Y):
        return multi_head_attention(Y, Y, params["attn"], num_heads, mask=mask)[0]

    def ff(Y):
        return feed_forward(Y, params["ffn"], activation)

    if norm_first:
        X = X + sa(_norm(X, params["norm1"], eps))
        X = X + ff(_norm(X, params["norm2"], eps))
    else:
        X = _norm(X + sa(X), params["norm1"], eps)
        X = _norm(X + ff(X), params["norm2"], eps)
    return X


def decoder_block(X, memory, params, num_heads, norm_first=False, activation="relu",
                  self_mask=None, cross_mask=None, eps=1e-5):
    """Decoder block equal to ``nn.TransformerDecoderLayer(batch_first=True, dropout=0)``.

    ``params = {"self_attn", "cross_attn", "ffn", "norm1", "norm2", "norm3"}``;
    ``self_mask`` broadcastable to ``(..., T, T)``, ``cross_mask`` to ``(..., T, T_m)``.
    """
    X, memory = _float(X, "X"), _float(memory, "memory")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    _v.check_ndim("memory", memory, 2, what="(..., T_m, D)")
    if memory.shape[-1] != X.shape[-1]:
        raise ValueError(f"X has D={X.shape[-1]} but memory has D={memory.shape[-1]} "
                         f"(X: {tuple(X.shape)}, memory: {tuple(memory.shape)})")
    _v.check_params("params", params, ("self_attn", "cross_attn", "ffn", "norm1", "norm2", "norm3"))
    _v.check_choice("activation", activation, _ACTIVATIONS)

    def sa(Y):
        return multi_head_attention(Y, Y, params["self_attn"], num_heads, mask=self_mask)[0]

    def ca(Y):
        return multi_head_attention(Y, memory, params["cross_attn"], num_heads, mask=cross_mask)[0]

    def ff(Y):
        return feed_forward(Y, params["ffn"], activation)

    if norm_first:
        X = X + sa(_norm(X, params["norm1"], eps))
        X = X + ca(_norm(X, params["norm2"], eps))
        X = X + ff(_norm(X, params["norm3"], eps))
    else:
        X = _norm(X + sa(X), params["norm1"], eps)
        X = _norm(X + ca(X), params["norm2"], eps)
        X = _norm(X + ff(X), params["norm3"], eps)
    return X


# ---------------------------------------------------------------------------
# Image patches and attention rollout
# ---------------------------------------------------------------------------


def patchify(images, patch_size):
    """``(B, C, H, W) -> (B, N, C*p*p)``: row-major patches, each flattened in ``(C, p, p)`` order."""
    _tensor(images, "images")
    _v.check_ndim("images", images, 4, 4, what="(B, C, H, W)")
    p = _v.check_positive_int("patch_size", patch_size)
    B, C, H, W = images.shape
    if H % p or W % p:
        raise ValueError(f"images of shape {tuple(images.shape)} has H={H}, W={W}, "
                         f"not divisible into patches of patch_size={p}")
    x = images.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)  # (B, H/p, W/p, C, p, p)
    return x.reshape(B, (H // p) * (W // p), C * p * p)


def unpatchify(patches, patch_size, image_shape):
    """Inverse of :func:`patchify`: ``(B, N, C*p*p) -> (B, C, H, W)`` with ``image_shape = (C, H, W)``."""
    from ..numpy import _check_unpatchify

    _tensor(patches, "patches")
    p, (C, H, W) = _check_unpatchify(patches, patch_size, image_shape)
    B = patches.shape[0]
    x = patches.reshape(B, H // p, W // p, C, p, p).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(B, C, H, W)


def attention_rollout(attentions, residual=True):
    """Attention rollout (Abnar and Zuidema, 2020): average heads, add ``I`` and renormalise
    when ``residual``, multiply through the layers (first layer first). Returns ``(..., T, T)``."""
    attentions = list(attentions)
    if not attentions:
        raise ValueError("attentions must hold at least one layer, got an empty sequence")
    shape0 = None
    R = None
    for layer, P in enumerate(attentions):
        P = _float(P, f"attentions[{layer}]")
        _v.check_ndim(f"attentions[{layer}]", P, 3, what="(..., H, T, T)")
        if P.shape[-1] != P.shape[-2]:
            raise ValueError(f"attentions[{layer}] must be square in its last two axes (..., H, T, T), "
                             f"got {tuple(P.shape)}")
        if shape0 is None:
            shape0 = tuple(P.shape)
        elif tuple(P.shape) != shape0:
            raise ValueError(f"attentions[{layer}] has shape {tuple(P.shape)} but attentions[0] has {shape0}")
        A = P.mean(dim=-3)
        if residual:
            A = A + torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
            A = A / A.sum(dim=-1, keepdim=True)
        R = A if R is None else A @ R
    return R


# ---------------------------------------------------------------------------
# Efficient attention
# ---------------------------------------------------------------------------


def kv_cache_append(cache, K_new, V_new):
    """Append ``K_new (..., T_new, D_K)``, ``V_new (..., T_new, D_V)`` to ``cache`` (None or ``(K, V)``)
    along axis -2; returns the new ``(K, V)``."""
    from ..numpy import _check_kv_cache

    _tensor(K_new, "K_new")
    _tensor(V_new, "V_new")
    _check_kv_cache(cache, K_new, V_new)
    if cache is None:
        return K_new, V_new
    K, V = cache
    return torch.cat([K, K_new], dim=-2), torch.cat([V, V_new], dim=-2)


def tiled_attention(Q, K, V, block_size=128, causal=False, scale=None):
    """Attention by tiles with an online softmax; never holds the ``(T_q, T_k)`` matrix.

    See :func:`tfbook.numpy.tiled_attention`. ``causal``: query ``i`` attends to keys
    ``j <= i``. Returns ``Z (..., T_q, D_V)``.
    """
    Q, K, V = _float(Q, "Q"), _float(K, "K"), _float(V, "V")
    batch = _v.check_qkv(Q, K, V)
    bs = _v.check_positive_int("block_size", block_size)
    T_q, D_K = Q.shape[-2:]
    T_k, D_V = V.shape[-2:]
    if scale is None:
        scale = 1.0 / math.sqrt(D_K)
    Kt = K.transpose(-1, -2)
    out = []
    for i0 in range(0, T_q, bs):
        i1 = min(i0 + bs, T_q)
        q = Q[..., i0:i1, :] * scale  # (..., bq, D_K)
        m = torch.full(batch + (i1 - i0, 1), float("-inf"), dtype=q.dtype, device=q.device)
        l = torch.zeros(batch + (i1 - i0, 1), dtype=q.dtype, device=q.device)
        acc = torch.zeros(batch + (i1 - i0, D_V), dtype=q.dtype, device=q.device)
        j_end = min(T_k, i1) if causal else T_k
        for j0 in range(0, j_end, bs):
            j1 = min(j0 + bs, T_k)
            S = q @ Kt[..., j0:j1]  # (..., bq, bk)
            if causal and j1 - 1 > i0:
                future = (torch.arange(j0, j1, device=q.device)[None, :]
                          > torch.arange(i0, i1, device=q.device)[:, None])
                S = S.masked_fill(future, float("-inf"))
            m_new = torch.maximum(m, S.detach().amax(dim=-1, keepdim=True))
            m_new = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.exp(m - m_new)
            E = torch.exp(S - m_new)
            l = alpha * l + E.sum(dim=-1, keepdim=True)
            acc = alpha * acc + E @ V[..., j0:j1, :]
            m = m_new
        out.append(acc / torch.where(l == 0, torch.ones_like(l), l))
    return torch.cat(out, dim=-2)


def _elu1(x):
    return F.elu(x) + 1


_FEATURE_MAPS = {"elu1": _elu1}


def linear_attention(Q, K, V, feature_map="elu1", causal=False):
    """Linear attention (Katharopoulos et al., 2020), ``phi(x) = elu(x) + 1``; see
    :func:`tfbook.numpy.linear_attention`. Returns ``Z (..., T_q, D_V)``."""
    Q, K, V = _float(Q, "Q"), _float(K, "K"), _float(V, "V")
    _v.check_qkv(Q, K, V)
    if callable(feature_map):
        phi = feature_map
    else:
        _v.check_choice("feature_map", feature_map, _FEATURE_MAPS)
        phi = _FEATURE_MAPS[feature_map]
    if causal and Q.shape[-2] != K.shape[-2]:
        raise ValueError(f"causal linear attention needs T_q == T_k (Q: {tuple(Q.shape)}, K: {tuple(K.shape)})")
    fQ, fK = phi(Q), phi(K)
    if causal:
        KV = torch.cumsum(fK[..., :, :, None] * V[..., :, None, :], dim=-3)  # (..., T, D_K, D_V)
        k_sum = torch.cumsum(fK, dim=-2)
        num = (fQ[..., :, None, :] @ KV)[..., 0, :]
        den = (fQ * k_sum).sum(dim=-1, keepdim=True)
    else:
        num = fQ @ (fK.transpose(-1, -2) @ V)
        den = fQ @ fK.sum(dim=-2)[..., :, None]
    return num / den


# The twins of tfbook._numpy_training and tfbook._numpy_modern, in their own files.
from tfbook.torch import _functional_modern as _modern_mod  # noqa: E402
from tfbook.torch import _functional_training as _training_mod  # noqa: E402

for _mod in (_training_mod, _modern_mod):
    globals().update({_n: getattr(_mod, _n) for _n in _mod.__all__})
    __all__ += [_n for _n in _mod.__all__ if _n not in __all__]
del _mod
