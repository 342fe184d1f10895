"""NumPy reference implementations of every transformer component.

Plain functions with explicit parameters and no hidden state. The file reads top
to bottom in the order of the book: softmax, attention, masks, heads, positions,
norms and the MLP, blocks, image patches, and finally efficient attention (the
fast variants of the reference attention: blocked, tiled, linear).

Conventions (see :mod:`tfbook` for the notation table): row vectors, so a sequence
is ``X (..., T, D)`` and ``Q = X @ W_Q`` with ``W_Q (D, D_K)``; masks are boolean
with ``True`` meaning "may attend"; a query row that may attend to nothing gets a
zero weight row and a zero output row; dtypes are preserved; bad input raises
``ValueError`` naming the argument and showing the shapes.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import _validate as _v
from .measure import threads as _threads

__all__ = [
    # softmax and attention
    "softmax",
    "scaled_dot_product_attention",
    "additive_attention",
    # masks
    "causal_mask",
    "padding_mask",
    "attention_mask_from_padding",
    "sliding_window_mask",
    # heads
    "split_heads",
    "merge_heads",
    "multi_head_attention",
    # tokens and positions
    "one_hot",
    "embedding_lookup",
    "sinusoidal_positional_encoding",
    "sinusoidal_shift_matrix",
    "sinusoidal_positional_encoding_2d",
    "learned_positional_embedding",
    "rope",
    # norms and the MLP
    "layer_norm",
    "relu",
    "gelu",
    "feed_forward",
    # blocks
    "encoder_block",
    "decoder_block",
    # images
    "patchify",
    "unpatchify",
    "attention_rollout",
    # efficient attention
    "kv_cache_append",
    "blocked_attention",
    "tiled_attention",
    "linear_attention",
]


def _as_float(x, name: str) -> np.ndarray:
    """``x`` as an ndarray; integer and boolean input becomes float64."""
    x = np.asarray(x)
    if x.dtype.kind in "biu":
        x = x.astype(np.float64)
    _v.check_floating(name, x)
    return x


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


def _linear(X, W, b):
    Y = X @ W
    return Y if b is None else Y + b


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


# ---------------------------------------------------------------------------
# Tokens and positions
# ---------------------------------------------------------------------------


def _check_ids(ids, num_classes, name="ids"):
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise ValueError(f"{name} must be integers, got dtype {ids.dtype} (shape {ids.shape})")
    if ids.size and (ids.min() < 0 or ids.max() >= num_classes):
        raise ValueError(
            f"{name} must lie in [0, {num_classes}), got min {ids.min()} and max {ids.max()} (shape {ids.shape})"
        )
    return ids


def one_hot(ids, num_classes, dtype=np.float64):
    """One-hot rows: ``(...) int -> (..., num_classes)`` with a single 1 per row."""
    num_classes = _v.check_positive_int("num_classes", num_classes)
    ids = _check_ids(ids, num_classes)
    return (ids[..., None] == np.arange(num_classes)).astype(dtype)


def embedding_lookup(ids, W_E):
    """Row lookup ``W_E[ids]``; equals ``one_hot(ids, V) @ W_E``.

    Parameters
    ----------
    ids : (...) int ndarray
        Token ids in ``[0, V)``.
    W_E : (V, D) ndarray
        Embedding table.

    Returns
    -------
    (..., D) ndarray
    """
    W_E = np.asarray(W_E)
    _v.check_ndim("W_E", W_E, 2, 2, what="(V, D)")
    ids = _check_ids(ids, W_E.shape[0])
    return W_E[ids]


def _frequencies(D, base):
    """``omega_i = base ** (-2i / D)`` for ``i = 0 .. D/2 - 1``."""
    return base ** (-np.arange(0, D, 2, dtype=np.float64) / D)


def _check_even(name, D):
    D = _v.check_positive_int(name, D)
    if D % 2:
        raise ValueError(f"{name}={D} must be even (positions use (sin, cos) pairs)")
    return D


def sinusoidal_positional_encoding(T, D, base=10000.0, dtype=np.float64):
    """Sinusoidal encoding of Vaswani et al., interleaved as in the paper.

    ``PE[p, 2i] = sin(p / base**(2i/D))`` and ``PE[p, 2i+1] = cos(p / base**(2i/D))``.

    Returns
    -------
    (T, D) ndarray
    """
    T = _v.check_positive_int("T", T)
    D = _check_even("D", D)
    angle = np.arange(T, dtype=np.float64)[:, None] * _frequencies(D, base)  # (T, D/2)
    PE = np.empty((T, D), dtype=np.float64)
    PE[:, 0::2] = np.sin(angle)
    PE[:, 1::2] = np.cos(angle)
    return PE.astype(dtype, copy=False)


def sinusoidal_shift_matrix(k, D, base=10000.0, dtype=np.float64):
    """The block-diagonal rotation ``M(k)`` with ``PE[p + k] == M(k) @ PE[p]`` for every ``p``.

    Each ``(sin, cos)`` pair at frequency ``w`` turns clockwise by the angle ``k w``: it is
    multiplied by ``R(-k w)``, where ``R(theta)`` is the book's counter-clockwise rotation
    ``[[cos, -sin], [sin, cos]]`` (chapter 7), from
    ``sin(a + b) = sin a cos b + cos a sin b`` and ``cos(a + b) = cos a cos b - sin a sin b``.

    Returns
    -------
    (D, D) ndarray
    """
    D = _check_even("D", D)
    theta = float(k) * _frequencies(D, base)
    c, s = np.cos(theta), np.sin(theta)
    M = np.zeros((D, D), dtype=np.float64)
    i = np.arange(0, D, 2)
    M[i, i], M[i, i + 1] = c, s
    M[i + 1, i], M[i + 1, i + 1] = -s, c
    return M.astype(dtype, copy=False)


def sinusoidal_positional_encoding_2d(H, W, D, base=10000.0, dtype=np.float64):
    """2D sinusoidal encoding for an ``H x W`` grid of patches, in row-major order.

    The first ``D/2`` channels are the 1D encoding (width ``D/2``) of the row,
    the last ``D/2`` that of the column. ``D`` must be divisible by 4.

    Returns
    -------
    (H*W, D) ndarray
        Row ``r * W + c`` encodes grid position ``(r, c)`` (the order of :func:`patchify`).
    """
    H = _v.check_positive_int("H", H)
    W = _v.check_positive_int("W", W)
    D = _v.check_positive_int("D", D)
    if D % 4:
        raise ValueError(f"D={D} must be divisible by 4 (two halves of (sin, cos) pairs)")
    rows = sinusoidal_positional_encoding(H, D // 2, base)  # (H, D/2)
    cols = sinusoidal_positional_encoding(W, D // 2, base)  # (W, D/2)
    PE = np.concatenate(
        [np.repeat(rows, W, axis=0), np.tile(cols, (H, 1))], axis=1
    )  # (H*W, D)
    return PE.astype(dtype, copy=False)


def learned_positional_embedding(X, table):
    """Add a learned position table: ``X + table[:T]``.

    Parameters
    ----------
    X : (..., T, D) ndarray
    table : (T_max, D) ndarray
        One learned row per position; ``T_max`` is the longest sequence the
        model can ever take.

    Returns
    -------
    (..., T, D) ndarray
    """
    X = _as_float(X, "X")
    table = np.asarray(table)
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    _v.check_ndim("table", table, 2, 2, what="(T_max, D)")
    T, D = X.shape[-2:]
    if table.shape[1] != D:
        raise ValueError(f"X has D={D} but table has D={table.shape[1]} (X: {X.shape}, table: {table.shape})")
    if T > table.shape[0]:
        raise ValueError(
            f"X has T={T} positions but table only T_max={table.shape[0]} "
            f"(X: {X.shape}, table: {table.shape}): a learned table cannot go past T_max"
        )
    return X + table[:T]


def _rope_angles(X, positions, base, name="positions"):
    T, D = X.shape[-2:]
    if positions is None:
        positions = np.arange(T, dtype=np.float64)
    positions = np.asarray(positions, dtype=np.float64)
    if positions.ndim == 0 or positions.shape[-1] != T:
        raise ValueError(f"{name} must have shape (..., T) with T={T}, got {positions.shape} (X: {X.shape})")
    _v.broadcast_batch({"X": X.shape[:-2], name: positions.shape[:-1]})
    return positions[..., None] * _frequencies(D, base)  # (..., T, D/2)


def rope(X, positions=None, base=10000.0):
    """Rotary position embedding: rotate each pair ``(2i, 2i+1)`` by ``position / base**(2i/D)``.

    Applied to queries and keys, the score ``rope(q at m) . rope(k at n)``
    depends on the positions only through ``m - n``.

    Parameters
    ----------
    X : (..., T, D) ndarray
        ``D`` even.
    positions : (..., T) array, optional
        Position of each row; defaults to ``0 .. T-1``.

    Returns
    -------
    (..., T, D) ndarray
    """
    X = _as_float(X, "X")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    if X.shape[-1] % 2:
        raise ValueError(f"X has D={X.shape[-1]}, which must be even for rope (X: {X.shape})")
    theta = _rope_angles(X, positions, base)
    c, s = np.cos(theta).astype(X.dtype), np.sin(theta).astype(X.dtype)
    x0, x1 = X[..., 0::2], X[..., 1::2]
    out = np.empty(np.broadcast_shapes(X.shape, c.shape[:-1] + (X.shape[-1],)), dtype=X.dtype)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


# ---------------------------------------------------------------------------
# Norms and the position-wise MLP
# ---------------------------------------------------------------------------


def layer_norm(X, gamma, beta, eps=1e-5):
    """LayerNorm over the last axis with biased variance, as ``nn.LayerNorm``.

    Parameters
    ----------
    X : (..., D) ndarray
    gamma, beta : (D,) ndarray or None
        Gain and shift (``None``: 1 and 0).

    Returns
    -------
    (..., D) ndarray
    """
    X = _as_float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., D)")
    D = X.shape[-1]
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p is not None:
            _v.check_vector(name, np.asarray(p), D, "D")
    mu = X.mean(axis=-1, keepdims=True)
    var = ((X - mu) ** 2).mean(axis=-1, keepdims=True)
    Y = (X - mu) / np.sqrt(var + eps)
    if gamma is not None:
        Y = Y * gamma
    if beta is not None:
        Y = Y + beta
    return Y.astype(X.dtype, copy=False)


def relu(x):
    """``max(x, 0)`` elementwise."""
    x = _as_float(x, "x")
    return np.maximum(x, 0)


try:  # SciPy's erf is vectorised; it comes with scikit-learn
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover - exact but slower
    _erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x):
    """GELU, exact form ``x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))``."""
    x = _as_float(x, "x")
    return (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))).astype(x.dtype, copy=False)


_ACTIVATIONS = {"relu": relu, "gelu": gelu}


def feed_forward(X, params, activation="relu"):
    """Position-wise MLP ``act(X W_1 + b_1) W_2 + b_2``.

    Parameters
    ----------
    X : (..., T, D) ndarray
    params : dict
        ``W_1 (D, D_ff)``, ``b_1 (D_ff,)``, ``W_2 (D_ff, D)``, ``b_2 (D,)`` (biases may be None).
    activation : {"relu", "gelu"}

    Returns
    -------
    (..., T, D) ndarray
    """
    X = _as_float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., D)")
    _v.check_choice("activation", activation, _ACTIVATIONS)
    _v.check_params("params", params, ("W_1", "W_2"))
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
    """One encoder block, equal to ``nn.TransformerEncoderLayer(batch_first=True, dropout=0)``.

    Post-LN (``norm_first=False``, the original paper)::

        X = LN1(X + MHA(X));  X = LN2(X + FFN(X))

    Pre-LN (``norm_first=True``)::

        X = X + MHA(LN1(X));  X = X + FFN(LN2(X))

    Parameters
    ----------
    X : (..., T, D) ndarray
    params : dict
        ``{"attn": mha, "ffn": ffn, "norm1": norm, "norm2": norm}``.
    mask : bool ndarray, optional
        True = may attend, broadcastable to ``(..., T, T)``.

    Returns
    -------
    (..., T, D) ndarray
    """
    X = _as_float(X, "X")
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
    """One decoder block, equal to ``nn.TransformerDecoderLayer(batch_first=True, dropout=0)``.

    Self-attention over ``X`` (usually with a causal ``self_mask``), cross-attention
    from ``X`` to ``memory``, then the MLP; each with a residual and a LayerNorm,
    placed after (Post-LN) or before (Pre-LN, ``norm_first=True``) the sublayer.

    Parameters
    ----------
    X : (..., T, D) ndarray
        Decoder input.
    memory : (..., T_m, D) ndarray
        Encoder output.
    params : dict
        ``{"self_attn", "cross_attn", "ffn", "norm1", "norm2", "norm3"}``.
    self_mask : bool ndarray, optional
        Broadcastable to ``(..., T, T)``.
    cross_mask : bool ndarray, optional
        Broadcastable to ``(..., T, T_m)``.

    Returns
    -------
    (..., T, D) ndarray
    """
    X, memory = _as_float(X, "X"), _as_float(memory, "memory")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    _v.check_ndim("memory", memory, 2, what="(..., T_m, D)")
    if memory.shape[-1] != X.shape[-1]:
        raise ValueError(f"X has D={X.shape[-1]} but memory has D={memory.shape[-1]} "
                         f"(X: {X.shape}, memory: {memory.shape})")
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


def _check_images(images, patch_size, name="images"):
    _v.check_ndim(name, images, 4, 4, what="(B, C, H, W)")
    p = _v.check_positive_int("patch_size", patch_size)
    B, C, H, W = images.shape
    if H % p or W % p:
        raise ValueError(f"{name} of shape {tuple(images.shape)} has H={H}, W={W}, "
                         f"not divisible into patches of patch_size={p}")
    return p


def patchify(images, patch_size):
    """Cut images into non-overlapping square patches and flatten each.

    Parameters
    ----------
    images : (B, C, H, W) ndarray
        ``H`` and ``W`` divisible by ``patch_size = p``.

    Returns
    -------
    (B, N, C*p*p) ndarray
        ``N = (H/p) (W/p)`` patches in row-major order, each flattened in
        ``(C, p, p)`` order, so that ``patchify(x) @ W.reshape(D, -1).T`` equals a
        convolution with kernel ``W (D, C, p, p)`` and stride ``p``.
    """
    images = np.asarray(images)
    p = _check_images(images, patch_size)
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // p, p, W // p, p)
    x = x.transpose(0, 2, 4, 1, 3, 5)  # (B, H/p, W/p, C, p, p)
    return x.reshape(B, (H // p) * (W // p), C * p * p)


def unpatchify(patches, patch_size, image_shape):
    """Inverse of :func:`patchify`.

    Parameters
    ----------
    patches : (B, N, C*p*p) ndarray
    image_shape : (C, H, W) tuple

    Returns
    -------
    (B, C, H, W) ndarray
    """
    patches = np.asarray(patches)
    p, (C, H, W) = _check_unpatchify(patches, patch_size, image_shape)
    B = patches.shape[0]
    x = patches.reshape(B, H // p, W // p, C, p, p)
    return x.transpose(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)


def _check_unpatchify(patches, patch_size, image_shape):
    _v.check_ndim("patches", patches, 3, 3, what="(B, N, C*p*p)")
    p = _v.check_positive_int("patch_size", patch_size)
    try:
        C, H, W = (int(s) for s in image_shape)
    except (TypeError, ValueError):
        raise ValueError(f"image_shape must be (C, H, W), got {image_shape!r}") from None
    if H % p or W % p:
        raise ValueError(f"image_shape={(C, H, W)} has H={H}, W={W}, not divisible into patches of patch_size={p}")
    want = ((H // p) * (W // p), C * p * p)
    if tuple(patches.shape[1:]) != want:
        raise ValueError(f"patches of shape {tuple(patches.shape)} do not match image_shape={(C, H, W)} "
                         f"with patch_size={p}: expected (B, N, C*p*p) = (B, {want[0]}, {want[1]})")
    return p, (C, H, W)


def attention_rollout(attentions, residual=True):
    """Attention rollout (Abnar and Zuidema, 2020): how much each input token feeds each output.

    For each layer the heads are averaged; with ``residual`` the identity is
    added (the skip connection) and rows renormalised, ``A = (P + I) / 2``. The
    layers are then chained: ``R = A_L ... A_2 A_1``.

    Parameters
    ----------
    attentions : sequence of (..., H, T, T) ndarray
        Attention weights of each layer, first layer first.

    Returns
    -------
    (..., T, T) ndarray
        Rows sum to one.
    """
    attentions = list(attentions)
    if not attentions:
        raise ValueError("attentions must hold at least one layer, got an empty sequence")
    shape0 = None
    R = None
    for layer, P in enumerate(attentions):
        P = _as_float(P, f"attentions[{layer}]")
        _v.check_ndim(f"attentions[{layer}]", P, 3, what="(..., H, T, T)")
        if P.shape[-1] != P.shape[-2]:
            raise ValueError(f"attentions[{layer}] must be square in its last two axes (..., H, T, T), got {P.shape}")
        if shape0 is None:
            shape0 = P.shape
        elif P.shape != shape0:
            raise ValueError(f"attentions[{layer}] has shape {P.shape} but attentions[0] has {shape0}")
        A = P.mean(axis=-3)  # (..., T, T)
        if residual:
            A = A + np.eye(A.shape[-1], dtype=A.dtype)
            A = A / A.sum(axis=-1, keepdims=True)
        R = A if R is None else A @ R
    return R


# ---------------------------------------------------------------------------
# Efficient attention: KV cache, blocked (fast reference), tiled (online softmax), linear
# ---------------------------------------------------------------------------


def kv_cache_append(cache, K_new, V_new):
    """Append new keys and values to a cache, along the time axis ``-2``.

    Parameters
    ----------
    cache : None or tuple (K, V)
        ``K (..., T, D_K)`` and ``V (..., T, D_V)`` so far; ``None`` starts a cache.
    K_new : (..., T_new, D_K) ndarray
    V_new : (..., T_new, D_V) ndarray

    Returns
    -------
    (K, V) : tuple of (..., T + T_new, D_K) and (..., T + T_new, D_V) ndarray
    """
    K_new, V_new = np.asarray(K_new), np.asarray(V_new)
    _check_kv_cache(cache, K_new, V_new)
    if cache is None:
        return K_new, V_new
    K, V = cache
    return np.concatenate([K, K_new], axis=-2), np.concatenate([V, V_new], axis=-2)


def _check_kv_cache(cache, K_new, V_new):
    _v.check_ndim("K_new", K_new, 2, what="(..., T_new, D_K)")
    _v.check_ndim("V_new", V_new, 2, what="(..., T_new, D_V)")
    if K_new.shape[:-1] != V_new.shape[:-1]:
        raise ValueError(f"K_new and V_new must agree except in the last axis "
                         f"(K_new: {tuple(K_new.shape)}, V_new: {tuple(V_new.shape)})")
    if cache is None:
        return
    if not (isinstance(cache, (tuple, list)) and len(cache) == 2):
        raise ValueError(f"cache must be None or a (K, V) tuple, got {type(cache).__name__}")
    K, V = cache
    for name, old, new in (("K", K, K_new), ("V", V, V_new)):
        if old.ndim != new.ndim or old.shape[:-2] != new.shape[:-2] or old.shape[-1] != new.shape[-1]:
            raise ValueError(f"cache {name} of shape {tuple(old.shape)} cannot take {name}_new of shape "
                             f"{tuple(new.shape)} (only axis -2 may differ)")


def _query_block(T_k: int, itemsize: int) -> int:
    """Query rows per block so that a block of scores is about 2 MiB (stays in a core's L2 cache)."""
    return max(32, min(1024, (2 << 20) // max(1, T_k * itemsize)))


def _run_blocks(work, tasks, size):
    """Run ``work(task)`` for every task; on several threads when the problem is large.

    NumPy's elementwise functions use one core; running independent query blocks
    on threads (NumPy releases the GIL inside them) uses them all. BLAS is kept
    to one thread meanwhile: its own threads gain nothing on these small blocks
    and, when cores are busy, fight with ours and slow everything down badly.
    ``size`` is the number of score entries; tiny problems just run.
    """
    if size < (1 << 16):
        for t in tasks:
            work(t)
        return
    n = min(os.cpu_count() or 1, len(tasks)) if size >= (1 << 20) else 1
    with _threads(1, include_torch=False):
        if n == 1:
            for t in tasks:
                work(t)
            return
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(lambda part: [work(t) for t in part], [tasks[i::n] for i in range(n)]))


def blocked_attention(Q, K, V, mask=None, scale=None):
    """:func:`scaled_dot_product_attention`, fast: query blocks in cache, on several threads.

    Same arguments, same result ``(Z, P)`` (tested equal to the reference to float64
    round-off), same validation. It holds one ``(..., T_q, T_k)`` array (``P`` itself)
    plus a few blocks, instead of the reference's three, and on a multi-core CPU it runs
    query blocks on a thread pool.

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

    Notes
    -----
    The work is done in blocks of query rows: the scores of a block are written
    straight into the output ``P`` and turned into weights there, in place,
    while they are still in cache. Scaling ``Q`` costs ``T_q D_K`` multiplies
    instead of ``T_q T_k`` for scaling ``S``. Rows are first exponentiated
    without subtracting their maximum (the same softmax, one pass fewer); any row
    where that overflows or underflows is recomputed the textbook way, with the
    row maximum subtracted (:func:`softmax`), so logits of +-1e4 are safe.
    While the query blocks run on threads, BLAS is pinned to one thread
    (:func:`tfbook.measure.threads` with ``include_torch=False``) so that its own
    threads do not compete with ours.
    """
    Q, K, V, mask = _check_attention_args(Q, K, V, mask)
    batch = _v.broadcast_batch({"Q": Q.shape[:-2], "K": K.shape[:-2], "V": V.shape[:-2]})
    T_q, D_K = Q.shape[-2:]
    T_k, D_V = V.shape[-2:]
    if mask is not None:
        batch = _v.broadcast_batch({"Q, K, V": batch, "mask": mask.shape[:-2]})
    dtype = np.result_type(Q, K, V)
    if scale is None:
        scale = 1.0 / math.sqrt(D_K)
    Qs = np.broadcast_to((Q * scale).astype(dtype, copy=False), batch + (T_q, D_K))  # (..., T_q, D_K)
    Kt = np.broadcast_to(np.swapaxes(K, -1, -2), batch + (D_K, T_k))  # (..., D_K, T_k)
    # V with a column of ones: E @ [V | 1] gives the numerators and the row sums in one product
    V1 = np.concatenate([V.astype(dtype, copy=False), np.ones(V.shape[:-1] + (1,), dtype)], axis=-1)
    V1 = np.broadcast_to(V1, batch + (T_k, D_V + 1))  # (..., T_k, D_V + 1)
    blocked = None if mask is None else np.broadcast_to(~mask, batch + (T_q, T_k))
    safe = np.sqrt(np.finfo(dtype).tiny)  # a row sum above this kept full precision

    P = np.empty(batch + (T_q, T_k), dtype=dtype)
    Z = np.empty(batch + (T_q, D_V), dtype=dtype)

    def block(task):
        b, i0 = task
        rows = b + (slice(i0, i0 + step),)
        S = P[rows]  # (rows, T_k) view: the scores become the weights in place
        np.matmul(Qs[rows], Kt[b], out=S)
        if blocked is not None:
            np.copyto(S, -np.inf, where=blocked[rows])
        # Fast path: exp(S) / sum exp(S) is softmax exactly; it only fails numerically when
        # exp overflows or a whole row underflows, and those rows are redone with the shift.
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            np.exp(S, out=S)
            ZU = S @ V1[b]  # (rows, D_V + 1): unnormalised outputs | row sums
        s = ZU[:, -1:]
        bad = ~(np.isfinite(ZU).all(axis=-1) & (s[:, 0] > safe))
        if bad.any():
            S_bad = Qs[rows][bad] @ Kt[b]  # recompute the scores of those rows
            if blocked is not None:
                S_bad[blocked[rows][bad]] = -np.inf
            P_bad = softmax(S_bad, axis=-1)  # subtracts the row max; all-masked rows -> 0
            S[bad] = P_bad
            ZU[bad, :-1] = P_bad @ V1[b][:, :-1]
            s[bad] = 1
        r = 1 / s
        S *= r
        np.multiply(ZU[:, :-1], r, out=Z[rows])

    step = _query_block(T_k, P.itemsize)
    tasks = [(b, i0) for b in np.ndindex(*batch) for i0 in range(0, T_q, step)]
    _run_blocks(block, tasks, P.size)
    return Z, P


def tiled_attention(Q, K, V, block_size=128, causal=False, scale=None):
    """Attention by tiles with an online softmax (the idea of FlashAttention).

    Queries are processed in blocks; for each query block the key/value blocks
    are visited in turn, keeping a running row maximum ``m``, a running
    denominator ``l`` and a running numerator ``acc``. When a new block raises
    the maximum, the old sums are rescaled by ``exp(m_old - m_new)``. The
    ``(T_q, T_k)`` score matrix is never held; extra memory is
    ``O(block_size * (block_size + D))`` per batch element (times the number of
    cores, which work on different query blocks at once).

    Parameters
    ----------
    Q : (..., T_q, D_K) ndarray
    K : (..., T_k, D_K) ndarray
    V : (..., T_k, D_V) ndarray
    block_size : int
        Rows per query block and per key block.
    causal : bool
        Query ``i`` attends to keys ``j <= i`` (``F.scaled_dot_product_attention(is_causal=True)``).
    scale : float, optional
        Defaults to ``1 / sqrt(D_K)``.

    Returns
    -------
    Z : (..., T_q, D_V) ndarray
        Equal to ``scaled_dot_product_attention(Q, K, V, mask)[0]``.
    """
    Q, K, V = _as_float(Q, "Q"), _as_float(K, "K"), _as_float(V, "V")
    batch = _v.check_qkv(Q, K, V)
    bs = _v.check_positive_int("block_size", block_size)
    T_q, D_K = Q.shape[-2:]
    T_k, D_V = V.shape[-2:]
    dtype = np.result_type(Q, K, V)
    if scale is None:
        scale = 1.0 / math.sqrt(D_K)
    Q = np.broadcast_to(Q, batch + Q.shape[-2:])
    Kt = np.broadcast_to(np.swapaxes(K, -1, -2), batch + (D_K, T_k))
    V = np.broadcast_to(V, batch + V.shape[-2:])
    Z = np.empty(batch + (T_q, D_V), dtype=dtype)

    def query_block(i0):
        i1 = min(i0 + bs, T_q)
        q = (Q[..., i0:i1, :] * scale).astype(dtype, copy=False)  # (..., bq, D_K)
        m = np.full(batch + (i1 - i0, 1), -np.inf, dtype=dtype)  # running row max
        l = np.zeros(batch + (i1 - i0, 1), dtype=dtype)  # running denominator
        acc = np.zeros(batch + (i1 - i0, D_V), dtype=dtype)  # running numerator
        j_end = min(T_k, i1) if causal else T_k  # key blocks past the diagonal are all masked
        for j0 in range(0, j_end, bs):
            j1 = min(j0 + bs, T_k)
            S = q @ Kt[..., j0:j1]  # (..., bq, bk)
            if causal and j1 - 1 > i0:
                future = np.arange(j0, j1)[None, :] > np.arange(i0, i1)[:, None]
                S[..., future] = -np.inf
            m_new = np.maximum(m, S.max(axis=-1, keepdims=True))
            m_new[~np.isfinite(m_new)] = 0  # nothing seen yet: any shift works
            alpha = np.exp(m - m_new)  # rescales the old sums to the new maximum
            S -= m_new
            np.exp(S, out=S)
            l = alpha * l + S.sum(axis=-1, keepdims=True)
            acc = alpha * acc + S @ V[..., j0:j1, :]
            m = m_new
        l[l == 0] = 1
        Z[..., i0:i1, :] = acc / l

    n_batch = math.prod(batch)
    _run_blocks(query_block, list(range(0, T_q, bs)), n_batch * T_q * T_k)
    return Z


def _elu1(x):
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))


_FEATURE_MAPS = {"elu1": _elu1}


def linear_attention(Q, K, V, feature_map="elu1", causal=False):
    """Linear attention (Katharopoulos et al., 2020) with ``phi(x) = elu(x) + 1``.

    Replacing ``exp(q . k)`` by ``phi(q) . phi(k)`` lets the sum over keys be
    taken first::

        Z_i = phi(q_i) (sum_j phi(k_j)^T v_j) / (phi(q_i) . sum_j phi(k_j))

    which costs ``O(T D_K D_V)`` instead of ``O(T^2 D)``. With ``causal`` the sums
    run over ``j <= i`` (prefix sums).

    Parameters
    ----------
    Q : (..., T_q, D_K) ndarray
    K : (..., T_k, D_K) ndarray
    V : (..., T_k, D_V) ndarray
    feature_map : "elu1" or callable
        ``phi``; must give positive features.
    causal : bool
        Needs ``T_q == T_k``.

    Returns
    -------
    Z : (..., T_q, D_V) ndarray
    """
    Q, K, V = _as_float(Q, "Q"), _as_float(K, "K"), _as_float(V, "V")
    _v.check_qkv(Q, K, V)
    if callable(feature_map):
        phi = feature_map
    else:
        _v.check_choice("feature_map", feature_map, _FEATURE_MAPS)
        phi = _FEATURE_MAPS[feature_map]
    if causal and Q.shape[-2] != K.shape[-2]:
        raise ValueError(f"causal linear attention needs T_q == T_k (Q: {Q.shape}, K: {K.shape})")
    fQ, fK = phi(Q), phi(K)  # (..., T_q, D_K), (..., T_k, D_K)
    if causal:
        KV = np.cumsum(fK[..., :, :, None] * V[..., :, None, :], axis=-3)  # (..., T, D_K, D_V)
        k_sum = np.cumsum(fK, axis=-2)  # (..., T, D_K)
        num = (fQ[..., :, None, :] @ KV)[..., 0, :]  # (..., T, D_V)
        den = np.sum(fQ * k_sum, axis=-1, keepdims=True)
    else:
        KV = np.swapaxes(fK, -1, -2) @ V  # (..., D_K, D_V)
        num = fQ @ KV
        den = fQ @ np.sum(fK, axis=-2)[..., :, None]  # (..., T_q, 1)
    return (num / den).astype(np.result_type(Q, K, V), copy=False)


# Components of the training chapter (cross-entropy and the backward passes) and of the
# modern-decoder chapter (RMSNorm, SwiGLU, RoPE attention, grouped-query attention) live in
# their own files; they are part of this module's API, listed in its __all__.
from tfbook import _numpy_modern as _modern_mod  # noqa: E402
from tfbook import _numpy_training as _training_mod  # noqa: E402

for _mod in (_training_mod, _modern_mod):
    globals().update({_n: getattr(_mod, _n) for _n in _mod.__all__})
    __all__ += [_n for _n in _mod.__all__ if _n not in __all__]
del _mod
