"""Efficient attention: the KV cache, blocked attention (the reference, fast), tiled attention
(online softmax) and linear attention.

Part of :mod:`tfbook.numpy` (which re-exports every public name); the twins are in
:mod:`tfbook.torch.functional.efficient`.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import _validate as _v
from ..measure import threads as _threads
from ._common import _as_float
from .attention import _check_attention_args, softmax

__all__ = [
    "kv_cache_append",
    "blocked_attention",
    "tiled_attention",
    "linear_attention",
]


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
