"""PyTorch twins of :mod:`tfbook.numpy.serving`, re-exported by :mod:`tfbook.torch.functional`.

Same names, arguments and semantics as the NumPy functions (rotary frequencies and their
extensions, multi-head latent attention and its cache, round-to-nearest quantisation, the
speculative-sampling rule). Shape checks and error messages are the NumPy module's.
"""

from __future__ import annotations

import math

import torch

from ... import _validate as _v
from ...numpy.serving import (_LAYOUTS, BlockAllocator, _check_frequency_args, _check_gptq, _check_mla,
                              _check_paged, _check_table_values, _yarn_ramp)
from ._common import _float, _tensor
from .attention import scaled_dot_product_attention, softmax
from .heads import merge_heads, split_heads
from .modern import rms_norm

__all__ = [
    "rope_frequencies",
    "rope_rotate",
    "mla_cache",
    "mla_attention",
    "quantize_int8",
    "quantize_int4",
    "dequantize",
    "speculative_accept",
    "speculative_distribution",
    "paged_write",
    "paged_attention",
    "gptq_quantize",
]


def rope_frequencies(D_K, base=10000.0, scaling=None, factor=1.0, original_length=None, beta_fast=32.0,
                     beta_slow=1.0, device=None):
    """The rotary frequencies of a head of width ``D_K``, stretched by ``factor`` (``None``, ``"pi"``,
    ``"ntk"`` or ``"yarn"``): ``omega (D_K/2,)``, a float64 tensor.
    See :func:`tfbook.numpy.rope_frequencies`."""
    D_K, original_length = _check_frequency_args(D_K, base, scaling, factor, original_length)
    i = torch.arange(D_K // 2, dtype=torch.float64, device=device)
    omega = base ** (-2.0 * i / D_K)
    if scaling == "pi":
        return omega / factor
    if scaling == "ntk":
        return (base * factor ** (D_K / (D_K - 2.0))) ** (-2.0 * i / D_K)
    if scaling == "yarn":
        keep = torch.from_numpy(_yarn_ramp(D_K, base, original_length, beta_fast, beta_slow)).to(omega.device)
        return omega / factor * (1.0 - keep) + omega * keep
    return omega


def _positions(positions, T, X):
    """The positions as float64 of shape (..., T): 0..T-1 when none are given."""
    if positions is None:
        return torch.arange(T, dtype=torch.float64, device=X.device)
    pos = torch.as_tensor(positions, dtype=torch.float64, device=X.device)
    if pos.ndim == 0 or pos.shape[-1] != T:
        raise ValueError(f"positions must have shape (..., T) with T={T}, got {tuple(pos.shape)} "
                         f"(X: {tuple(X.shape)})")
    return pos


def rope_rotate(X, omega, positions=None, layout="half"):
    """Rotate each pair of coordinates of ``X (..., T, D)`` by ``position * omega_i``
    (``layout`` ``"half"``: pairs ``(i, i + D/2)``; ``"interleaved"``: ``(2i, 2i+1)``).
    See :func:`tfbook.numpy.rope_rotate`."""
    X = _float(X, "X")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    _v.check_choice("layout", layout, _LAYOUTS)
    T, D = X.shape[-2:]
    if D % 2:
        raise ValueError(f"X has D={D}, which must be even for rope (X: {tuple(X.shape)})")
    omega = torch.as_tensor(omega, dtype=torch.float64, device=X.device)
    _v.check_vector("omega", omega, D // 2, "D/2")
    pos = _positions(positions, T, X)
    theta = pos[..., :, None] * omega  # (..., T, D/2)
    c, s = torch.cos(theta).to(X.dtype), torch.sin(theta).to(X.dtype)
    if layout == "half":
        x1, x2 = X[..., : D // 2], X[..., D // 2:]
        return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)
    x1, x2 = X[..., 0::2], X[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2)  # pairs back in place


def _mla_check_input(X, params, num_heads, positions, layout, base, eps):
    X = _float(X, "X")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    for k, v in params.items() if isinstance(params, dict) else ():
        _tensor(v, f"params['{k}']")
    dims = _check_mla(X, params, num_heads)
    _v.check_choice("layout", layout, _LAYOUTS)
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r} (X: {tuple(X.shape)})")
    T = X.shape[-2]
    pos = _positions(positions, T, X)
    omega = rope_frequencies(dims[2], base, device=X.device)
    return X, dims, pos, omega


def _mla_cache(X, params, pos, omega, layout, eps):
    C = rms_norm(X @ params["W_DKV"], params["gamma_KV"], eps)  # (..., T, D_c)
    K_R = rope_rotate(X @ params["W_KR"], omega, pos, layout)  # (..., T, D_R)
    return C, K_R


def mla_cache(X, params, positions=None, layout="interleaved", base=10000.0, eps=1e-6):
    """What a multi-head latent attention layer caches per token: ``(C (..., T, D_c), K_R (..., T, D_R))``.
    See :func:`tfbook.numpy.mla_cache`."""
    X, dims, pos, omega = _mla_check_input(X, params, None, positions, layout, base, eps)
    return _mla_cache(X, params, pos, omega, layout, eps)


def mla_attention(X, params, num_heads, mask=None, positions=None, absorb=False, layout="interleaved",
                  base=10000.0, eps=1e-6, scale=None):
    """Multi-head latent attention of ``X (..., T, D)`` on itself; returns ``(Z (..., T, D), P (..., H, T, T))``.
    ``absorb=True`` attends in the latent space. See :func:`tfbook.numpy.mla_attention`."""
    X, (H, D_c, D_R, D_nope, D_V), pos, omega = _mla_check_input(X, params, num_heads, positions, layout,
                                                                  base, eps)
    T = X.shape[-2]
    if mask is not None:
        _tensor(mask, "mask")
        _v.check_mask(mask, T, T, tuple(X.shape[:-2]))
        mask = mask[..., None, :, :]
    scale = 1.0 / math.sqrt(D_nope + D_R) if scale is None else scale
    C, K_R = _mla_cache(X, params, pos, omega, layout, eps)
    if "W_Q" in params:
        Qfull = X @ params["W_Q"]
    else:
        Qfull = rms_norm(X @ params["W_DQ"], params["gamma_Q"], eps) @ params["W_UQ"]
    Qfull = split_heads(Qfull, H)  # (..., H, T, D_nope + D_R)
    Q_nope = Qfull[..., :D_nope]
    Q_R = rope_rotate(Qfull[..., D_nope:], omega, pos[..., None, :], layout)  # positions (..., 1, T): past the heads axis
    K_R = K_R[..., None, :, :]  # (..., 1, T, D_R)
    if not absorb:
        K_nope = split_heads(C @ params["W_UK"], H)
        V = split_heads(C @ params["W_UV"], H)
        K = torch.cat([K_nope, K_R.expand(*K_nope.shape[:-1], D_R)], dim=-1)
        Z, P = scaled_dot_product_attention(torch.cat([Q_nope, Q_R], dim=-1), K, V, mask=mask, scale=scale)
        return merge_heads(Z) @ params["W_O"], P
    W_UK = params["W_UK"].reshape(D_c, H, D_nope).permute(1, 0, 2)  # (H, D_c, D_nope)
    W_UV = params["W_UV"].reshape(D_c, H, D_V).permute(1, 0, 2)  # (H, D_c, D_V)
    Q_lat = Q_nope @ W_UK.transpose(-1, -2)  # (..., H, T, D_c)
    S = (Q_lat @ C.transpose(-1, -2)[..., None, :, :] + Q_R @ K_R.transpose(-1, -2)) * scale
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))
    P = softmax(S, axis=-1)
    P = torch.nan_to_num(P) if mask is not None else P
    Z = (P @ C[..., None, :, :]) @ W_UV  # (..., H, T, D_V)
    return merge_heads(Z) @ params["W_O"], P


def quantize_int8(X, axis=0):
    """Symmetric int8 round-to-nearest with one scale per slice along ``axis``; returns
    ``(q int8, scale)``. See :func:`tfbook.numpy.quantize_int8`."""
    X = _float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., N)")
    _v.check_axis("axis", X, axis)
    amax = X.abs().amax(dim=axis, keepdim=True)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(X / scale), -127, 127).to(torch.int8)
    return q, scale


def quantize_int4(W, group_size=32):
    """Symmetric int4 round-to-nearest in groups of ``group_size`` rows of each column of
    ``W (D_in, D_out)``; returns ``(q (D_in, D_out) int8 in [-7, 7], scale (D_in/group_size, D_out))``.
    See :func:`tfbook.numpy.quantize_int4`."""
    W = _float(W, "W")
    _v.check_ndim("W", W, 2, 2, what="(D_in, D_out)")
    g = _v.check_positive_int("group_size", group_size)
    D_in, D_out = W.shape
    if D_in % g:
        raise ValueError(f"group_size={g} does not divide D_in={D_in} (W: {tuple(W.shape)})")
    Wg = W.reshape(D_in // g, g, D_out)
    amax = Wg.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 7.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(Wg / scale[:, None, :]), -7, 7).to(torch.int8)
    return q.reshape(D_in, D_out), scale


def dequantize(q, scale, group_size=None):
    """``q * scale`` back in floating point (``group_size``: one row of ``scale`` per group of rows).
    See :func:`tfbook.numpy.dequantize`."""
    _tensor(q, "q")
    scale = _float(scale, "scale")
    if q.dtype.is_floating_point or q.dtype == torch.bool:
        raise ValueError(f"q must hold integers, got dtype {q.dtype} (q: {tuple(q.shape)})")
    if group_size is None:
        try:
            torch.broadcast_shapes(q.shape, scale.shape)
        except RuntimeError:
            raise ValueError(f"scale of shape {tuple(scale.shape)} does not broadcast to q's {tuple(q.shape)}") from None
        return q.to(scale.dtype) * scale
    g = _v.check_positive_int("group_size", group_size)
    _v.check_ndim("q", q, 2, 2, what="(D_in, D_out)")
    D_in, D_out = q.shape
    if D_in % g or tuple(scale.shape) != (D_in // g, D_out):
        raise ValueError(f"scale must have shape (D_in / group_size, D_out) = ({D_in / g:g}, {D_out}) "
                         f"for q: {tuple(q.shape)} and group_size={g}, got {tuple(scale.shape)}")
    return (q.reshape(D_in // g, g, D_out).to(scale.dtype) * scale[:, None, :]).reshape(D_in, D_out)


def _check_pq(p, q):
    p, q = _float(p, "p"), _float(q, "q")
    _v.check_ndim("p", p, 1, what="(..., V)")
    _v.check_ndim("q", q, 1, what="(..., V)")
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape (..., V), got p: {tuple(p.shape)}, q: {tuple(q.shape)}")
    for name, x in (("p", p), ("q", q)):
        ok = bool((x >= 0).all()) and torch.allclose(x.sum(-1), torch.ones((), dtype=x.dtype), atol=1e-6)
        if not ok:
            raise ValueError(f"{name} must be probability vectors over its last axis "
                             f"(non-negative, summing to 1) ({name}: {tuple(x.shape)})")
    return p, q


def _residual(p, q):
    r = torch.clamp(p - q, min=0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / torch.where(mass > 0, mass, torch.ones_like(mass)), p)


def speculative_accept(p, q, token, u):
    """Keep the drafted ``token`` when ``u < p(x) / q(x)``; returns ``(accepted (...,) bool,
    residual (..., V))``. See :func:`tfbook.numpy.speculative_accept`."""
    p, q = _check_pq(p, q)
    _tensor(token, "token")
    u = torch.as_tensor(u, dtype=torch.float64, device=p.device)
    if token.dtype.is_floating_point or token.dtype == torch.bool or tuple(token.shape) != tuple(p.shape[:-1]):
        raise ValueError(f"token must be integers of shape (...,) = {tuple(p.shape[:-1])}, got {token.dtype} "
                         f"{tuple(token.shape)} (p: {tuple(p.shape)})")
    if token.numel() and (int(token.min()) < 0 or int(token.max()) >= p.shape[-1]):
        raise ValueError(f"token must lie in [0, V={p.shape[-1]}) (token: {tuple(token.shape)})")
    if tuple(u.shape) != tuple(p.shape[:-1]):
        raise ValueError(f"u must have shape (...,) = {tuple(p.shape[:-1])}, got {tuple(u.shape)} "
                         f"(p: {tuple(p.shape)})")
    px = p.gather(-1, token.long()[..., None])[..., 0]
    qx = q.gather(-1, token.long()[..., None])[..., 0]
    return u * qx < px, _residual(p, q)


def speculative_distribution(p, q):
    """The exact distribution of the token one speculative step emits, ``min(p, q) + (1 - alpha)
    residual``, which is ``p``. See :func:`tfbook.numpy.speculative_distribution`."""
    p, q = _check_pq(p, q)
    accepted = torch.minimum(p, q)
    alpha = accepted.sum(-1, keepdim=True)
    return accepted + (1.0 - alpha) * _residual(p, q)


def paged_write(k_cache, K_new, block_tables, positions):
    """Write one key (or value) row per token into a paged cache ``(num_blocks, block_size, H_kv,
    D_K)``, in place; returns the cache. See :func:`tfbook.numpy.paged_write`."""
    _tensor(k_cache, "k_cache")
    _tensor(K_new, "K_new")
    tables, pos = torch.as_tensor(block_tables), torch.as_tensor(positions)
    _check_paged(tuple(K_new.shape), tuple(k_cache.shape), tuple(tables.shape), tuple(pos.shape), q_name="K_new")
    if K_new.shape[1] != k_cache.shape[2]:
        raise ValueError(f"K_new must have H_kv = {k_cache.shape[2]} heads, got {tuple(K_new.shape)} "
                         f"(k_cache: {tuple(k_cache.shape)})")
    bs = k_cache.shape[1]
    _check_table_values(tables.cpu().numpy(), pos.cpu().numpy() + 1, k_cache.shape[0], bs)
    tables, pos = tables.to(k_cache.device).long(), pos.to(k_cache.device).long()
    blocks = tables[torch.arange(len(pos), device=pos.device), pos // bs]
    k_cache[blocks, pos % bs] = K_new.to(k_cache.dtype)
    return k_cache


def paged_attention(Q, k_cache, v_cache, block_tables, lengths):
    """Attention of one query per row over its sequence's blocks of a paged cache; ``Q (N, H,
    D_K)`` -> ``(N, H, D_V)``. See :func:`tfbook.numpy.paged_attention`."""
    Q = _float(Q, "Q")
    _tensor(k_cache, "k_cache")
    _tensor(v_cache, "v_cache")
    tables, lengths = torch.as_tensor(block_tables), torch.as_tensor(lengths)
    _check_paged(tuple(Q.shape), tuple(k_cache.shape), tuple(tables.shape), tuple(lengths.shape))
    if v_cache.ndim != 4 or tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):
        raise ValueError(f"v_cache must have shape (num_blocks, block_size, H_kv, D_V) = {tuple(k_cache.shape[:3])} "
                         f"+ (D_V,), got {tuple(v_cache.shape)} (k_cache: {tuple(k_cache.shape)})")
    N, H, D_K = Q.shape
    nblk, bs, H_kv, _ = k_cache.shape
    if H % H_kv:
        raise ValueError(f"Q's H = {H} heads must be a multiple of the cache's H_kv = {H_kv} "
                         f"(Q: {tuple(Q.shape)}, k_cache: {tuple(k_cache.shape)})")
    _check_table_values(tables.cpu().numpy(), lengths.cpu().numpy(), nblk, bs)
    tables, lengths = tables.to(Q.device).long(), lengths.to(Q.device).long()
    safe = torch.where(tables < 0, torch.zeros_like(tables), tables)
    K = k_cache[safe].reshape(N, -1, H_kv, D_K)
    V = v_cache[safe].reshape(N, K.shape[1], H_kv, -1)
    K, V = (M.movedim(2, 1).repeat_interleave(H // H_kv, dim=1) for M in (K, V))
    S = (Q[:, :, None, :] @ K.transpose(-1, -2))[:, :, 0] / math.sqrt(D_K)
    valid = torch.arange(K.shape[2], device=Q.device)[None, None, :] < lengths[:, None, None]
    P = softmax(torch.where(valid, S, torch.full_like(S, -math.inf)), axis=-1)
    return (P[:, :, None, :] @ V)[:, :, 0]


def gptq_quantize(W, H, bits=4, group_size=32, damp=0.01):
    """GPTQ: ``W (D_in, D_out)`` quantised one input row at a time, each rounding error spread
    over the later rows through the upper Cholesky factor of ``H⁻¹``; returns ``(q int8, scale
    (D_in / group_size, D_out))``. See :func:`tfbook.numpy.gptq_quantize`."""
    W, H = _float(W, "W"), _float(H, "H")
    maxq, g = _check_gptq(tuple(W.shape), tuple(H.shape), bits, group_size, damp)
    W = W.clone()
    D_in, D_out = W.shape
    H = H + damp * torch.diagonal(H).mean() * torch.eye(D_in, dtype=H.dtype, device=H.device)
    U = torch.linalg.cholesky(torch.linalg.inv(H)).T  # H⁻¹ = Uᵀ U
    q = torch.zeros((D_in, D_out), dtype=torch.int8, device=W.device)
    scale = torch.zeros((D_in // g, D_out), dtype=W.dtype, device=W.device)
    for i in range(D_in):
        if i % g == 0:
            amax = W[i: i + g].abs().amax(dim=0)
            scale[i // g] = torch.where(amax > 0, amax / maxq, torch.ones_like(amax))
        s = scale[i // g]
        qi = torch.clamp(torch.round(W[i] / s), -maxq, maxq)
        q[i] = qi.to(torch.int8)
        err = (W[i] - qi * s) / U[i, i]
        W[i + 1:] -= torch.outer(U[i, i + 1:], err)
    return q, scale
