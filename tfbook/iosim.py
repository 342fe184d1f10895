"""IO counting and recompute (chapter 17): the pieces of efficient attention that count rather than time.

Its neighbours :mod:`tfbook.numpy.efficient` and :mod:`tfbook.torch.functional.efficient` compute
attention efficiently (KV cache, blocked, tiled, linear); this module counts what such algorithms
move and keep.

* :class:`FastMemory` and the two IO simulators :func:`naive_attention_io` and
  :func:`tiled_attention_io` count the numbers moved between a slow memory (HBM) and a fast
  memory of ``M`` numbers (SRAM) by standard attention and by FlashAttention's tiled loop
  (Dao et al. 2022, Algorithm 1 and Theorem 2). Given ``Q, K, V`` they also compute the
  result, so the counted algorithm is checked to be attention; without them they only count.
  :func:`naive_io_formula` and :func:`tiled_io_formula` are the closed forms of those counts.
* :class:`RecomputeAttention`: exact attention whose backward pass recomputes the scores from
  ``Q, K, V`` and the row log-sum-exp instead of storing the ``T x T`` weights;
  :func:`saved_tensor_bytes` counts what autograd keeps between forward and backward.
* :func:`matmul_depth`: the longest chain of dependent matrix products in an autograd graph
  (``T`` for a recurrent network over ``T`` steps, a constant for attention).
* :func:`favor_features`: positive random features for the softmax kernel (Performer, FAVOR+).
"""
from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["FastMemory", "naive_attention_io", "tiled_attention_io", "naive_io_formula",
           "tiled_io_formula", "tiled_blocks", "naive_block", "RecomputeAttention",
           "saved_tensor_bytes", "matmul_depth", "favor_features"]


class FastMemory:
    """A fast memory of ``capacity`` numbers that counts transfers to and from slow memory.

    ``load`` brings an array in (``reads`` grows by its size), ``alloc`` makes room for a
    result computed in fast memory, ``store`` writes an array out (``writes`` grows), ``free``
    releases space. Exceeding the capacity raises, so an algorithm that claims to fit, fits.
    """

    def __init__(self, capacity: int):
        self.capacity, self.used, self.peak = int(capacity), 0, 0
        self.reads = self.writes = 0

    def _take(self, n):
        self.used += n
        if self.used > self.capacity:
            raise MemoryError(f"fast memory overflow: {self.used} > {self.capacity} numbers")
        self.peak = max(self.peak, self.used)

    def load(self, n: int):
        self._take(n)
        self.reads += n

    def alloc(self, n: int):
        self._take(n)

    def store(self, n: int):
        self.writes += n

    def free(self, n: int):
        self.used -= n

    @property
    def moved(self) -> int:
        return self.reads + self.writes


def naive_block(d: int, M: int) -> int:
    """Largest b with a (b, d) block of Q, a (b, d) block of K and their (b, b) scores in M numbers."""
    b = int((-2 * d + math.sqrt(4 * d * d + 4 * M)) / 2)
    while 2 * b * d + b * b > M:
        b -= 1
    if b < 1:
        raise ValueError("fast memory too small")
    return b


def naive_attention_io(N, d, M, Q=None, K=None, V=None):
    """Standard attention (scores to slow memory, softmax, product) with a fast memory of M numbers.

    Returns ``(fast_memory, Z)``; ``Z`` is ``None`` unless ``Q, K, V`` (N, d) are given.
    Step 1 writes S = Q K^T / sqrt(d) block by block, step 2 reads S a few rows at a time and
    writes P = softmax(S), step 3 reads P and V by blocks and writes Z = P V.
    """
    compute = Q is not None
    fm = FastMemory(M)
    b = naive_block(d, M)
    S = np.empty((N, N)) if compute else None
    for i0 in range(0, N, b):                              # step 1: S = Q K^T / sqrt(d)
        bi = min(b, N - i0)
        fm.load(bi * d)
        for j0 in range(0, N, b):
            bj = min(b, N - j0)
            fm.load(bj * d)
            fm.alloc(bi * bj)
            if compute:
                S[i0:i0 + bi, j0:j0 + bj] = Q[i0:i0 + bi] @ K[j0:j0 + bj].T / math.sqrt(d)
            fm.store(bi * bj)
            fm.free(bj * d + bi * bj)
        fm.free(bi * d)
    r = M // (2 * N)                                       # step 2: rows of S in, rows of P out
    if r < 1:
        raise ValueError("the naive softmax needs two rows of N numbers in fast memory")
    P = np.empty((N, N)) if compute else None
    for i0 in range(0, N, r):
        ri = min(r, N - i0)
        fm.load(ri * N)
        fm.alloc(ri * N)
        if compute:
            s = S[i0:i0 + ri]
            e = np.exp(s - s.max(axis=1, keepdims=True))
            P[i0:i0 + ri] = e / e.sum(axis=1, keepdims=True)
        fm.store(ri * N)
        fm.free(2 * ri * N)
    Z = np.empty((N, d)) if compute else None
    for i0 in range(0, N, b):                              # step 3: Z = P V
        bi = min(b, N - i0)
        fm.alloc(bi * d)                                   # accumulator
        acc = np.zeros((bi, d)) if compute else None
        for j0 in range(0, N, b):
            bj = min(b, N - j0)
            fm.load(bi * bj + bj * d)
            if compute:
                acc += P[i0:i0 + bi, j0:j0 + bj] @ V[j0:j0 + bj]
            fm.free(bi * bj + bj * d)
        fm.store(bi * d)
        if compute:
            Z[i0:i0 + bi] = acc
        fm.free(bi * d)
    return fm, Z


def naive_io_formula(N, d, M):
    """Closed form of :func:`naive_attention_io`'s count: 4 N^2 + (2 + 2 ceil(N / b)) N d + ... ."""
    b = naive_block(d, M)
    nb = -(-N // b)
    reads = N * d + nb * N * d + N * N + N * N + nb * N * d      # Q once, K per row block, S, P, V per row block
    writes = N * N + N * N + N * d                                # S, P, Z
    return reads + writes


def tiled_blocks(d, M):
    """FlashAttention's block sizes: B_c = floor(M / 4d) keys, B_r = min(B_c, d) queries."""
    B_c = M // (4 * d)
    B_r = min(B_c, d)
    if B_r < 1 or 2 * B_c * d + 2 * B_r * d + 2 * B_r + B_r * B_c > M:
        raise ValueError("fast memory too small for the tiled loop (needs M >= 8 d^2 + 8 d)")
    return B_r, B_c


def tiled_attention_io(N, d, M, Q=None, K=None, V=None, causal=False):
    """FlashAttention's forward loop (Dao et al. 2022, Algorithm 1) with a fast memory of M numbers.

    Outer loop over blocks of B_c keys and values (loaded once), inner loop over blocks of B_r
    queries: load Q_i and the running O_i, l_i, m_i, update them with the online softmax,
    write them back. Returns ``(fast_memory, Z)``. With ``causal=True`` query ``i`` sees keys
    ``j <= i``: a query block that lies entirely before a key block is skipped (never loaded),
    and the diagonal tiles are masked.
    """
    compute = Q is not None
    fm = FastMemory(M)
    B_r, B_c = tiled_blocks(d, M)
    if compute:
        O, l, m = np.zeros((N, d)), np.zeros((N, 1)), np.full((N, 1), -np.inf)
    for j0 in range(0, N, B_c):
        bj = min(B_c, N - j0)
        fm.load(2 * bj * d)                                # K_j, V_j
        for i0 in range((j0 // B_r) * B_r if causal else 0, N, B_r):   # causal: skip query blocks before j0
            bi = min(B_r, N - i0)
            fm.load(2 * bi * d + 2 * bi)                   # Q_i, O_i, l_i, m_i
            fm.alloc(bi * bj)                              # S_ij, then P_ij in place
            if compute:
                sl = slice(i0, i0 + bi)
                S = Q[sl] @ K[j0:j0 + bj].T / math.sqrt(d)
                if causal:                                 # rows before j0 saw an earlier key block: m is finite
                    S = np.where(np.arange(j0, j0 + bj)[None, :] > np.arange(i0, i0 + bi)[:, None], -np.inf, S)
                m_new = np.maximum(m[sl], S.max(axis=1, keepdims=True))
                E, alpha = np.exp(S - m_new), np.exp(m[sl] - m_new)
                l_new = alpha * l[sl] + E.sum(axis=1, keepdims=True)
                O[sl] = (alpha * l[sl] * O[sl] + E @ V[j0:j0 + bj]) / l_new   # normalised, as in Algorithm 1
                l[sl], m[sl] = l_new, m_new
            fm.store(bi * d + 2 * bi)                      # O_i, l_i, m_i back out
            fm.free(bi * bj + 2 * bi * d + 2 * bi)
        fm.free(2 * bj * d)
    return fm, (O if compute else None)


def tiled_io_formula(N, d, M, causal=False):
    """Closed form of :func:`tiled_attention_io`'s count: 2 N d + ceil(N / B_c) N (3 d + 4); with
    ``causal``, key block ``j`` (from ``j B_c``) meets only the ``N - B_r floor(j B_c / B_r)`` queries
    from the block holding its first key: 2 N d + (3 d + 4) sum_j (N - B_r floor(j B_c / B_r))."""
    B_r, B_c = tiled_blocks(d, M)
    T_c = -(-N // B_c)
    if causal:
        return 2 * N * d + (3 * d + 4) * sum(N - B_r * ((j * B_c) // B_r) for j in range(T_c))
    return 2 * N * d + T_c * N * (2 * d + 2) + T_c * N * (d + 2)


class RecomputeAttention(torch.autograd.Function):
    """softmax(Q K^T / sqrt(D)) V for (..., T, D) tensors, storing only Q, K, V, Z and the row log-sum-exp.

    The backward pass recomputes the weights P = exp(S - lse) one block of query rows at a time,
    as FlashAttention does: what is kept between forward and backward is O(T D), not O(T^2).
    """

    @staticmethod
    def forward(ctx, Q, K, V, block_size=64):
        scale = 1.0 / math.sqrt(Q.shape[-1])
        Z = torch.empty(Q.shape[:-1] + V.shape[-1:], dtype=Q.dtype, device=Q.device)
        lse = torch.empty(Q.shape[:-1], dtype=Q.dtype, device=Q.device)
        for i0 in range(0, Q.shape[-2], block_size):
            S = Q[..., i0:i0 + block_size, :] @ K.transpose(-2, -1) * scale
            lse_i = torch.logsumexp(S, dim=-1)
            Z[..., i0:i0 + block_size, :] = torch.exp(S - lse_i[..., None]) @ V
            lse[..., i0:i0 + block_size] = lse_i
        ctx.save_for_backward(Q, K, V, Z, lse)
        ctx.block_size = block_size
        return Z

    @staticmethod
    def backward(ctx, dZ):
        Q, K, V, Z, lse = ctx.saved_tensors
        scale = 1.0 / math.sqrt(Q.shape[-1])
        dQ, dK, dV = torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V)
        Dsum = (dZ * Z).sum(-1)                                        # rowsum(dZ o Z) = rowsum(P o dP)
        for i0 in range(0, Q.shape[-2], ctx.block_size):
            sl = slice(i0, i0 + ctx.block_size)
            P = torch.exp(Q[..., sl, :] @ K.transpose(-2, -1) * scale - lse[..., sl, None])  # recomputed
            dZ_i = dZ[..., sl, :]
            dV += P.transpose(-2, -1) @ dZ_i
            dS = P * (dZ_i @ V.transpose(-2, -1) - Dsum[..., sl, None])
            dQ[..., sl, :] = dS @ K * scale
            dK += dS.transpose(-2, -1) @ Q[..., sl, :] * scale
        return dQ, dK, dV, None


def saved_tensor_bytes(fn, *args):
    """Run ``out = fn(*args)`` and return ``(out, bytes)``: bytes of distinct tensors autograd saves for backward.

    Tensors are counted once per storage (by data pointer), through
    ``torch.autograd.graph.saved_tensors_hooks``; leaves the caller passed in are counted too.
    """
    seen = {}

    def pack(t):
        seen[(t.untyped_storage().data_ptr(), t.dtype)] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, sum(seen.values())


_MATMUL_NODES = ("MmBackward", "AddmmBackward", "BmmBackward", "MvBackward", "AddmvBackward")


def matmul_depth(out: torch.Tensor) -> int:
    """Longest chain of matrix products, each needing the last's result, that produced ``out``.

    Walks the autograd graph from ``out.grad_fn``; a node counts 1 if it is a matrix product.
    """
    depth = {}
    order, stack = [], [(out.grad_fn, False)]
    while stack:                                     # iterative post-order: graphs are T deep
        node, done = stack.pop()
        if node is None or (node in depth and not done):
            continue
        if done:
            own = int(any(type(node).__name__.startswith(n) for n in _MATMUL_NODES))
            depth[node] = own + max((depth.get(p, 0) for p, _ in node.next_functions if p is not None),
                                    default=0)
            continue
        depth[node] = None
        stack.append((node, True))
        for p, _ in node.next_functions:
            if p is not None and p not in depth:
                stack.append((p, False))
    return depth[out.grad_fn] if out.grad_fn is not None else 0


def favor_features(X, W):
    """FAVOR+ positive random features: phi(x) = exp(W x - |x|^2 / 2) / sqrt(m), W (m, D) with N(0, 1) rows.

    E[phi(q) . phi(k)] = exp(q . k) (Choromanski et al. 2021), for q, k already scaled by D^(-1/4).
    """
    m = W.shape[0]
    return np.exp(X @ W.T - 0.5 * (X * X).sum(-1, keepdims=True)) / math.sqrt(m)
