"""Efficient attention: the KV cache, tiled attention (online softmax) and linear attention.

Part of :mod:`tfbook.torch.functional` (which re-exports every public name); the twins are in
:mod:`tfbook.numpy.efficient`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ... import _validate as _v
from ...numpy.efficient import _check_kv_cache
from ._common import _float, _tensor

__all__ = [
    "kv_cache_append",
    "tiled_attention",
    "linear_attention",
]


# ---------------------------------------------------------------------------
# Efficient attention
# ---------------------------------------------------------------------------


def kv_cache_append(cache, K_new, V_new):
    """Append ``K_new (..., T_new, D_K)``, ``V_new (..., T_new, D_V)`` to ``cache`` (None or ``(K, V)``)
    along axis -2; returns the new ``(K, V)``."""
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
