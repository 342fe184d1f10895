"""Position schemes beyond the basic ones in :mod:`tfbook.numpy`, and video tubelets.

Chapter 7 (*Positional information*) and chapter 1 (*Tokens and embeddings*) use these:

* :func:`interleave_permutation`: the fixed permutation between the "concatenated"
  sinusoidal layout ``[sin..., cos...]`` and the interleaved one ``[sin, cos, sin, cos, ...]``.
* :func:`rope_attention`: one head of attention with rotary embeddings on queries and keys.
* :func:`alibi_slopes`, :func:`alibi_bias`: the linear biases of ALiBi (Press et al., 2022).
* :func:`t5_relative_bucket`: the relative-position buckets of T5 (Raffel et al., 2020).
* :func:`tubelets` (NumPy) and :func:`tubelets_torch`: cut a video into ``t x p x p``
  tubelets, the 3-D patches of ViViT (Arnab et al., 2021).

Shapes follow the notation page: ``X (..., T, D)``, scores ``S (..., T_q, T_k)``.
"""

from __future__ import annotations

import math

import numpy as np

import tfbook.numpy as tnp

__all__ = [
    "interleave_permutation",
    "rope_attention",
    "alibi_slopes",
    "alibi_bias",
    "t5_relative_bucket",
    "tubelets",
    "tubelets_torch",
]


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


def rope_attention(X, W_Q, W_K, W_V, positions, base=10000.0):
    """One head of self-attention with rotary embeddings on the queries and keys.

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
    Q = tnp.rope(X @ W_Q, positions, base=base)          # (..., T, D_K)
    K = tnp.rope(X @ W_K, positions, base=base)          # (..., T, D_K)
    V = X @ W_V                                          # (..., T, D_V)
    S = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    return tnp.softmax(S, axis=-1) @ V, S


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


def _check_video(video, t, p):
    if video.ndim != 5:
        raise ValueError(f"video must be (B, C, F, H, W), got shape {tuple(video.shape)}")
    B, C, F, H, W = video.shape
    if F % t or H % p or W % p:
        raise ValueError(f"(F, H, W) = {(F, H, W)} must be divisible by (t, p, p) = {(t, p, p)}")
    return B, C, F, H, W


def tubelets(video, t, p):
    """Cut videos into non-overlapping ``t x p x p`` tubelets and flatten each (NumPy).

    Parameters
    ----------
    video : (B, C, F, H, W) ndarray
        ``F`` frames, divisible by ``t``; ``H``, ``W`` divisible by ``p``.

    Returns
    -------
    (B, N, C*t*p*p) ndarray
        ``N = (F/t)(H/p)(W/p)`` tubelets, time-major then row-major, each flattened in
        ``(C, t, p, p)`` order, so that ``tubelets(v) @ W.reshape(D, -1).T`` equals
        ``nn.Conv3d(C, D, kernel_size=(t, p, p), stride=(t, p, p))`` with weight ``W``.
    """
    video = np.asarray(video)
    B, C, F, H, W = _check_video(video, t, p)
    x = video.reshape(B, C, F // t, t, H // p, p, W // p, p)
    x = x.transpose(0, 2, 4, 6, 1, 3, 5, 7)              # (B, F/t, H/p, W/p, C, t, p, p)
    return x.reshape(B, (F // t) * (H // p) * (W // p), C * t * p * p)


def tubelets_torch(video, t, p):
    """:func:`tubelets` for a torch tensor (same shapes and order), with ``Tensor.unfold``."""
    B, C, F, H, W = _check_video(video, t, p)
    x = video.unfold(2, t, t).unfold(3, p, p).unfold(4, p, p)  # (B, C, F/t, H/p, W/p, t, p, p)
    x = x.permute(0, 2, 3, 4, 1, 5, 6, 7)                       # (B, F/t, H/p, W/p, C, t, p, p)
    return x.reshape(B, -1, C * t * p * p)
