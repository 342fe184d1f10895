"""Tokens and positions: one-hot rows, the embedding lookup, the sinusoidal and learned
position tables, rotary positions (interleaved layout); and chapter 7's other schemes: the
sinusoidal layout permutation, one head of rotary self-attention, ALiBi's slopes and bias,
T5's relative-position buckets.

Part of :mod:`tfbook.numpy` (which re-exports every public name); the twins are in
:mod:`tfbook.torch.functional.positions`.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as _v
from ._common import _as_float
from .attention import softmax

__all__ = [
    "one_hot",
    "embedding_lookup",
    "sinusoidal_positional_encoding",
    "sinusoidal_shift_matrix",
    "sinusoidal_positional_encoding_2d",
    "learned_positional_embedding",
    "rope",
    # chapter 7's other position schemes (not re-exported by tfbook.numpy: NumPy only)
    "interleave_permutation",
    "rope_self_attention",
    "alibi_slopes",
    "alibi_bias",
    "t5_relative_bucket",
]


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
# Chapter 7's other position schemes
# ---------------------------------------------------------------------------


def interleave_permutation(D):
    """Permutation matrix ``P`` (D, D) with ``concat @ P == interleaved``.

    ``concat = [sin(p w_0), ..., sin(p w_{D/2-1}), cos(p w_0), ..., cos(p w_{D/2-1})]`` and
    ``interleaved = [sin(p w_0), cos(p w_0), sin(p w_1), ...]`` (the layout of
    :func:`tfbook.numpy.sinusoidal_positional_encoding`). Column ``2i`` of ``P`` picks
    channel ``i`` (the sine of pair ``i``), column ``2i + 1`` channel ``D/2 + i``.
    """
    if D <= 0 or D % 2:
        raise ValueError(f"D must be a positive even integer, got {D}")
    P = np.zeros((D, D))
    half = D // 2
    for i in range(half):
        P[i, 2 * i] = 1.0
        P[half + i, 2 * i + 1] = 1.0
    return P


def rope_self_attention(X, W_Q, W_K, W_V, positions, base=10000.0):
    """One head of self-attention with rotary embeddings on the queries and keys (chapter 7).

    Chapter 14's :func:`tfbook.numpy.rope_attention` takes ``Q, K, V`` and both layouts instead of
    ``X`` and the weights.

    Parameters
    ----------
    X : (..., T, D) ndarray
    W_Q, W_K : (D, D_K) ndarray, ``D_K`` even
    W_V : (D, D_V) ndarray
    positions : (T,) array of the tokens' positions (any integers or reals)

    Returns
    -------
    Z : (..., T, D_V) ndarray
        ``softmax(S) V``.
    S : (..., T, T) ndarray
        ``rope(X W_Q) rope(X W_K)^T / sqrt(D_K)``.
    """
    X = np.asarray(X, dtype=np.float64)
    positions = np.asarray(positions, dtype=np.float64)
    Q = rope(X @ W_Q, positions, base=base)          # (..., T, D_K)
    K = rope(X @ W_K, positions, base=base)          # (..., T, D_K)
    V = X @ W_V                                          # (..., T, D_V)
    S = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    return softmax(S, axis=-1) @ V, S


def alibi_slopes(H):
    """ALiBi's head slopes: the geometric sequence ``2^(-8 h / H)``, ``h = 1..H``.

    Press et al. (2022) define it for ``H`` a power of two (for ``H = 8``: 1/2, 1/4, ..., 1/256).
    """
    if H <= 0 or H & (H - 1):
        raise ValueError(f"H must be a power of two, got {H}")
    return 2.0 ** (-8.0 * np.arange(1, H + 1) / H)


def alibi_bias(T_q, T_k, slopes, causal=True):
    """ALiBi bias ``B[h, i, j] = -slope_h * (i - j)`` added to the scores before the softmax.

    With ``causal=True`` the query ``i`` sits at position ``T_k - T_q + i`` (the last
    ``T_q`` of ``T_k`` positions) and keys after it get ``-inf``. With ``causal=False`` the
    bias is ``-slope * |i - j|``.

    Returns
    -------
    (H, T_q, T_k) ndarray
    """
    slopes = np.asarray(slopes, dtype=np.float64).reshape(-1)
    i = np.arange(T_k - T_q, T_k)[:, None]
    j = np.arange(T_k)[None, :]
    dist = (i - j).astype(np.float64)                    # (T_q, T_k): how far back key j is
    if causal:
        bias = -slopes[:, None, None] * dist + 0.0          # + 0.0 turns -0.0 into 0.0
        return np.where(dist[None] < 0, -np.inf, bias)
    return -slopes[:, None, None] * np.abs(dist) + 0.0


def t5_relative_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """T5's bucket of a relative position ``key position - query position``.

    Half the buckets (``bidirectional``) are for each sign. Within a sign, offsets
    ``0 .. n/2 - 1`` (``n`` buckets for that sign) get a bucket each; larger offsets share
    buckets whose width grows logarithmically up to ``max_distance``; anything farther falls
    in the last bucket. The same rule as the T5 reference code.

    Returns
    -------
    int ndarray of the shape of ``relative_position``
    """
    rel = np.asarray(relative_position, dtype=np.int64)
    bucket = np.zeros_like(rel)
    n = num_buckets
    if bidirectional:
        n //= 2
        bucket = bucket + (rel > 0).astype(np.int64) * n
        dist = np.abs(rel)
    else:
        dist = np.maximum(-rel, 0)                       # only keys in the past are distinguished
    max_exact = n // 2
    is_small = dist < max_exact
    with np.errstate(divide="ignore"):
        large = max_exact + (
            np.log(np.maximum(dist, 1) / max_exact) / math.log(max_distance / max_exact)
            * (n - max_exact)
        ).astype(np.int64)
    large = np.minimum(large, n - 1)
    return bucket + np.where(is_small, dist, large)
