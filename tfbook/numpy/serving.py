"""NumPy components of serving a model (chapter 20), re-exported by :mod:`tfbook.numpy`.

What a model needs at inference time that training did not: a smaller KV cache
(multi-head latent attention, DeepSeek-V2/V3), rotary positions stretched past the trained
length (position interpolation, NTK-aware scaling, YaRN), weights and caches in 8 or 4 bits
(round-to-nearest quantisation), and the accept/reject rule of speculative decoding.

The conventions of :mod:`tfbook.numpy` hold: row vectors, boolean masks with ``True``
meaning "may attend", dtypes are preserved, and bad input raises ``ValueError`` naming the
argument and showing the shapes.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as _v
from ._common import _as_float
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

_SCALINGS = (None, "pi", "ntk", "yarn")
_LAYOUTS = ("interleaved", "half")


# ---------------------------------------------------------------------------
# Rotary frequencies and their extensions
# ---------------------------------------------------------------------------


def _check_frequency_args(D_K, base, scaling, factor, original_length):
    D_K = _v.check_positive_int("D_K", D_K, minimum=2)
    if D_K % 2:
        raise ValueError(f"D_K={D_K} must be even (rope rotates pairs of coordinates)")
    if not base > 1:
        raise ValueError(f"base must be > 1, got {base!r} (D_K={D_K})")
    _v.check_choice("scaling", scaling, _SCALINGS)
    if not factor >= 1:
        raise ValueError(f"factor must be >= 1 (the new length over the trained one), got {factor!r}")
    if scaling == "yarn":
        original_length = _v.check_positive_int("original_length", original_length)
    return D_K, original_length


def _yarn_ramp(D_K, base, original_length, beta_fast, beta_slow):
    """YaRN's weight of the original (extrapolated) frequency of each pair, ``(D_K/2,)``: 1 for pairs
    that turn more than ``beta_fast`` times over the trained length, 0 below ``beta_slow`` turns,
    linear in the pair index between (the ``truncate=True`` form of the paper's code)."""
    def pair_of(turns):  # the (fractional) pair index whose wavelength fits ``turns`` times in the length
        return D_K * math.log(original_length / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(pair_of(beta_fast)), 0), min(math.ceil(pair_of(beta_slow)), D_K - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(D_K // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    return 1.0 - ramp


def rope_frequencies(D_K, base=10000.0, scaling=None, factor=1.0, original_length=None, beta_fast=32.0,
                     beta_slow=1.0):
    """The rotary frequencies ``omega_i`` of a head of width ``D_K``, stretched by ``factor``.

    ``omega_i = base ** (-2i / D_K)`` for pair ``i = 0 .. D_K/2 - 1`` (the angles of
    :func:`tfbook.numpy.rope` are ``position * omega_i``). To run a model trained at length
    ``T_train`` on ``factor * T_train`` tokens:

    * ``"pi"``, position interpolation (Chen et al. 2023): every frequency divided by ``factor``,
      so the longest position turns no further than the trained ones did;
    * ``"ntk"``, NTK-aware scaling: a larger base ``base * factor ** (D_K / (D_K - 2))``, which
      keeps the fastest pair as it was and divides the slowest by exactly ``factor``;
    * ``"yarn"`` (Peng et al. 2023): pairs that turn more than ``beta_fast`` times over
      ``original_length`` keep their frequency, pairs below ``beta_slow`` turns are divided by
      ``factor``, linearly in between; and the scores are multiplied by the square of the
      returned ``attention_factor = 0.1 ln(factor) + 1`` (each of ``q`` and ``k`` by it).

    Parameters
    ----------
    D_K : int
        Even head width.
    base : float
    scaling : {None, "pi", "ntk", "yarn"}
    factor : float
        ``>= 1``; the extension of the context (1: the trained frequencies).
    original_length : int
        The trained context length (needed by ``"yarn"`` only).
    beta_fast, beta_slow : float
        YaRN's turn counts bounding the ramp.

    Returns
    -------
    omega : (D_K/2,) float64 ndarray
    """
    D_K, original_length = _check_frequency_args(D_K, base, scaling, factor, original_length)
    i = np.arange(D_K // 2, dtype=np.float64)
    omega = base ** (-2.0 * i / D_K)
    if scaling == "pi":
        return omega / factor
    if scaling == "ntk":
        return (base * factor ** (D_K / (D_K - 2.0))) ** (-2.0 * i / D_K)
    if scaling == "yarn":
        keep = _yarn_ramp(D_K, base, original_length, beta_fast, beta_slow)
        return omega / factor * (1.0 - keep) + omega * keep
    return omega


def _positions(positions, T, X):
    """The positions as float64 of shape (..., T): 0..T-1 when none are given."""
    pos = np.arange(T, dtype=np.float64) if positions is None else np.asarray(positions, dtype=np.float64)
    if pos.ndim == 0 or pos.shape[-1] != T:
        raise ValueError(f"positions must have shape (..., T) with T={T}, got {pos.shape} (X: {X.shape})")
    return pos


def rope_rotate(X, omega, positions=None, layout="half"):
    """Rotate each pair of coordinates of ``X`` by ``position * omega_i``.

    :func:`tfbook.numpy.rope` (``layout="interleaved"``, pairs ``(2i, 2i+1)``) and
    :func:`tfbook.numpy.rope_rotate_half` (``"half"``, pairs ``(i, i + D/2)``) with the
    frequencies given rather than computed from a base: the frequencies of
    :func:`rope_frequencies` give the extended rotations.

    Parameters
    ----------
    X : (..., T, D) ndarray
    omega : (D/2,) array
    positions : (..., T) array, optional
        Defaults to ``0 .. T-1``.
    layout : {"half", "interleaved"}

    Returns
    -------
    (..., T, D) ndarray
    """
    X = _as_float(X, "X")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    _v.check_choice("layout", layout, _LAYOUTS)
    T, D = X.shape[-2:]
    if D % 2:
        raise ValueError(f"X has D={D}, which must be even for rope (X: {X.shape})")
    omega = np.asarray(omega, dtype=np.float64)
    _v.check_vector("omega", omega, D // 2, "D/2")
    pos = _positions(positions, T, X)
    theta = pos[..., :, None] * omega  # (..., T, D/2)
    c, s = np.cos(theta).astype(X.dtype), np.sin(theta).astype(X.dtype)
    if layout == "half":
        x1, x2 = X[..., : D // 2], X[..., D // 2:]
        return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)
    x1, x2 = X[..., 0::2], X[..., 1::2]
    out = np.empty(np.broadcast_shapes(X.shape, theta.shape[:-1] + (D,)), dtype=X.dtype)
    out[..., 0::2], out[..., 1::2] = x1 * c - x2 * s, x1 * s + x2 * c
    return out


# ---------------------------------------------------------------------------
# Multi-head latent attention
# ---------------------------------------------------------------------------

_MLA_KEYS = ("W_DKV", "gamma_KV", "W_KR", "W_UK", "W_UV", "W_O")


def _check_mla(X, params, num_heads):
    """Shapes of the MLA parameters; returns ``(H, D_c, D_R, D_nope, D_V)``."""
    _v.check_params("params", params, _MLA_KEYS if num_heads is not None else ("W_DKV", "gamma_KV", "W_KR"))
    D = X.shape[-1]
    _v.check_matrix("params['W_DKV']", params["W_DKV"], D, None, "(D, D_c)")
    D_c = _v.shape_of(params["W_DKV"])[1]
    _v.check_vector("params['gamma_KV']", params["gamma_KV"], D_c, "D_c")
    _v.check_matrix("params['W_KR']", params["W_KR"], D, None, "(D, D_R)")
    D_R = _v.shape_of(params["W_KR"])[1]
    if D_R % 2:
        raise ValueError(f"params['W_KR'] has D_R={D_R} columns, which must be even for rope (X: {_v.shape_of(X)})")
    if num_heads is None:  # the cache alone
        return None, D_c, D_R, None, None
    H = _v.check_positive_int("num_heads", num_heads)
    _v.check_matrix("params['W_UK']", params["W_UK"], D_c, None, "(D_c, H * D_nope)")
    _v.check_matrix("params['W_UV']", params["W_UV"], D_c, None, "(D_c, H * D_V)")
    for k in ("W_UK", "W_UV"):
        if _v.shape_of(params[k])[1] % H:
            raise ValueError(f"num_heads={H} does not divide the {_v.shape_of(params[k])[1]} columns of "
                             f"params['{k}'] (shape {_v.shape_of(params[k])})")
    D_nope, D_V = _v.shape_of(params["W_UK"])[1] // H, _v.shape_of(params["W_UV"])[1] // H
    D_qk = D_nope + D_R
    if "W_Q" in params:
        _v.check_matrix("params['W_Q']", params["W_Q"], D, H * D_qk, "(D, H * (D_nope + D_R))")
    else:
        _v.check_params("params", params, ("W_DQ", "gamma_Q", "W_UQ"))
        _v.check_matrix("params['W_DQ']", params["W_DQ"], D, None, "(D, D_cq)")
        D_cq = _v.shape_of(params["W_DQ"])[1]
        _v.check_vector("params['gamma_Q']", params["gamma_Q"], D_cq, "D_cq")
        _v.check_matrix("params['W_UQ']", params["W_UQ"], D_cq, H * D_qk, "(D_cq, H * (D_nope + D_R))")
    _v.check_matrix("params['W_O']", params["W_O"], H * D_V, D, "(H * D_V, D)")
    return H, D_c, D_R, D_nope, D_V


def _mla_check_input(X, params, num_heads, positions, layout, base, eps):
    X = _as_float(X, "X")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    dims = _check_mla(X, params, num_heads)
    _v.check_choice("layout", layout, _LAYOUTS)
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r} (X: {X.shape})")
    T = X.shape[-2]
    pos = _positions(positions, T, X)
    omega = rope_frequencies(dims[2], base)
    return X, dims, pos, omega


def _mla_cache(X, params, pos, omega, layout, eps):
    C = rms_norm(X @ params["W_DKV"], params["gamma_KV"], eps)  # (..., T, D_c) the latent
    K_R = rope_rotate(X @ params["W_KR"], omega, pos, layout)  # (..., T, D_R) one rotary key for all heads
    return C, K_R


def mla_cache(X, params, positions=None, layout="interleaved", base=10000.0, eps=1e-6):
    """What a multi-head latent attention layer caches per token: ``(C, K_R)``.

    ``C = rms_norm(X W_DKV) * gamma_KV`` is the compressed key-value latent (``D_c`` numbers),
    ``K_R = rope(X W_KR)`` the one rotary key shared by all heads (``D_R`` numbers): ``D_c + D_R``
    numbers a token and layer, against ``2 H D_K`` for multi-head attention.

    Parameters
    ----------
    X : (..., T, D) ndarray
    params : dict
        As in :func:`mla_attention`.
    positions : (..., T) array, optional
    layout : {"interleaved", "half"}
    base, eps : float

    Returns
    -------
    C : (..., T, D_c) ndarray
    K_R : (..., T, D_R) ndarray
    """
    X, dims, pos, omega = _mla_check_input(X, params, None, positions, layout, base, eps)  # no heads in the cache
    return _mla_cache(X, params, pos, omega, layout, eps)


def mla_attention(X, params, num_heads, mask=None, positions=None, absorb=False, layout="interleaved",
                  base=10000.0, eps=1e-6, scale=None):
    """Multi-head latent attention (DeepSeek-V2/V3) of a sequence on itself.

    Keys and values are rebuilt from the cached latent ``C`` (:func:`mla_cache`): head ``h``'s
    key is ``[C W_UK_h, K_R]`` (a no-position part from the latent, and the shared rotary part),
    its value ``C W_UV_h``. Queries are ``[Q_nope_h, rope(Q_R_h)]`` from ``X W_Q`` (or, with a
    compressed query, ``rms_norm(X W_DQ) W_UQ``), each head's ``D_nope + D_R`` columns in that
    order. ``absorb=True`` never rebuilds keys or values: it scores ``(Q_nope_h W_UK_h^T) . C``
    and applies ``W_UV_h`` after averaging the latents, which is the same number computed in
    another order.

    Parameters
    ----------
    X : (..., T, D) ndarray
    params : dict
        ``W_DKV (D, D_c)``, ``gamma_KV (D_c,)``, ``W_KR (D, D_R)``, ``W_UK (D_c, H * D_nope)``,
        ``W_UV (D_c, H * D_V)``, ``W_O (H * D_V, D)``, and either ``W_Q (D, H * (D_nope + D_R))``
        or ``W_DQ (D, D_cq)``, ``gamma_Q (D_cq,)``, ``W_UQ (D_cq, H * (D_nope + D_R))``.
    num_heads : int
        ``H``.
    mask : bool ndarray, optional
        Broadcastable to ``(..., T, T)``; True = may attend.
    positions : (..., T) array, optional
        Defaults to ``0 .. T-1``.
    absorb : bool
        Attend in the latent space (the inference path) instead of rebuilding keys and values.
    layout : {"interleaved", "half"}
        The rotary layout of the ``D_R`` rotary coordinates.
    base : float
        The rope base.
    eps : float
        The RMSNorm epsilon.
    scale : float, optional
        Defaults to ``1 / sqrt(D_nope + D_R)``.

    Returns
    -------
    Z : (..., T, D) ndarray
    P : (..., H, T, T) ndarray
    """
    X, (H, D_c, D_R, D_nope, D_V), pos, omega = _mla_check_input(X, params, num_heads, positions, layout,
                                                                  base, eps)
    T = X.shape[-2]
    if mask is not None:
        mask = np.asarray(mask)
        _v.check_mask(mask, T, T, X.shape[:-2])
        mask = mask[..., None, :, :]  # shared by the heads
    scale = 1.0 / math.sqrt(D_nope + D_R) if scale is None else scale
    C, K_R = _mla_cache(X, params, pos, omega, layout, eps)  # (..., T, D_c), (..., T, D_R)
    if "W_Q" in params:
        Qfull = X @ params["W_Q"]
    else:
        Qfull = rms_norm(X @ params["W_DQ"], params["gamma_Q"], eps) @ params["W_UQ"]
    Qfull = split_heads(Qfull, H)  # (..., H, T, D_nope + D_R)
    Q_nope = Qfull[..., :D_nope]
    Q_R = rope_rotate(Qfull[..., D_nope:], omega, pos[..., None, :], layout)  # (..., H, T, D_R); pos past the heads
    K_R = K_R[..., None, :, :]  # (..., 1, T, D_R): the same rotary key for every head
    if not absorb:
        K_nope = split_heads(C @ params["W_UK"], H)  # (..., H, T, D_nope)
        V = split_heads(C @ params["W_UV"], H)  # (..., H, T, D_V)
        K = np.concatenate([K_nope, np.broadcast_to(K_R, K_nope.shape[:-1] + (D_R,))], axis=-1)
        Z, P = scaled_dot_product_attention(np.concatenate([Q_nope, Q_R], axis=-1), K, V, mask=mask, scale=scale)
        return merge_heads(Z) @ params["W_O"], P
    W_UK = params["W_UK"].reshape(D_c, H, D_nope).transpose(1, 0, 2)  # (H, D_c, D_nope)
    W_UV = params["W_UV"].reshape(D_c, H, D_V).transpose(1, 0, 2)  # (H, D_c, D_V)
    Q_lat = Q_nope @ W_UK.transpose(0, 2, 1)  # (..., H, T, D_c): the query moved into the latent space
    S = (Q_lat @ np.swapaxes(C, -1, -2)[..., None, :, :] + Q_R @ np.swapaxes(K_R, -1, -2)) * scale  # (..., H, T, T)
    if mask is not None:
        S = np.where(mask, S, -np.inf)
    P = softmax(S, axis=-1)
    P = np.nan_to_num(P) if mask is not None else P
    Z_lat = P @ C[..., None, :, :]  # (..., H, T, D_c): average the latents, then decompress
    Z = Z_lat @ W_UV  # (..., H, T, D_V)
    return merge_heads(Z) @ params["W_O"], P


# ---------------------------------------------------------------------------
# Round-to-nearest quantisation
# ---------------------------------------------------------------------------


def quantize_int8(X, axis=0):
    """Symmetric int8 round-to-nearest: one scale per slice along ``axis``.

    ``scale = max |X| / 127`` over ``axis`` (kept as a length-1 axis), ``q = round(X / scale)``
    in ``[-127, 127]``. ``axis=0`` on a weight ``W (D_in, D_out)`` gives one scale per output
    channel (column); ``axis=-1`` on keys ``K (..., T, D_K)`` one per token and head (an int8
    KV cache). ``q * scale`` is within ``scale / 2`` of ``X`` everywhere.

    Returns
    -------
    q : int8 ndarray, the shape of ``X``
    scale : ndarray of ``X``'s dtype, ``X``'s shape with ``axis`` of length 1
    """
    X = _as_float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., N)")
    _v.check_axis("axis", X, axis)
    amax = np.max(np.abs(X), axis=axis, keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(X.dtype)  # an all-zero slice keeps scale 1
    q = np.clip(np.rint(X / scale), -127, 127).astype(np.int8)
    return q, scale


def quantize_int4(W, group_size=32):
    """Symmetric int4 round-to-nearest in groups of ``group_size`` rows of each column.

    ``W (D_in, D_out)`` is cut along ``D_in`` into ``D_in / group_size`` groups; each group of
    each column has ``scale = max |W| / 7`` and ``q = round(W / scale)`` in ``[-7, 7]`` (held
    in an int8 array; two of them pack into a byte). ``dequantize(q, scale, group_size)`` is
    within ``scale / 2`` of ``W``.

    Returns
    -------
    q : (D_in, D_out) int8 ndarray with values in [-7, 7]
    scale : (D_in / group_size, D_out) ndarray of ``W``'s dtype
    """
    W = _as_float(W, "W")
    _v.check_ndim("W", W, 2, 2, what="(D_in, D_out)")
    g = _v.check_positive_int("group_size", group_size)
    D_in, D_out = W.shape
    if D_in % g:
        raise ValueError(f"group_size={g} does not divide D_in={D_in} (W: {W.shape})")
    Wg = W.reshape(D_in // g, g, D_out)  # (groups, group_size, D_out)
    amax = np.max(np.abs(Wg), axis=1)  # (groups, D_out)
    scale = np.where(amax > 0, amax / 7.0, 1.0).astype(W.dtype)
    q = np.clip(np.rint(Wg / scale[:, None, :]), -7, 7).astype(np.int8)
    return q.reshape(D_in, D_out), scale


def dequantize(q, scale, group_size=None):
    """``q * scale`` back in floating point: ``scale`` broadcast (from :func:`quantize_int8`), or
    with ``group_size``, one row of ``scale`` per group of ``group_size`` rows of ``q``
    (from :func:`quantize_int4`). The result has ``scale``'s dtype."""
    q = np.asarray(q)
    scale = _as_float(scale, "scale")
    if q.dtype.kind not in "iu":
        raise ValueError(f"q must hold integers, got dtype {q.dtype} (q: {q.shape})")
    if group_size is None:
        try:
            np.broadcast_shapes(q.shape, scale.shape)
        except ValueError:
            raise ValueError(f"scale of shape {scale.shape} does not broadcast to q's {q.shape}") from None
        return q.astype(scale.dtype) * scale
    g = _v.check_positive_int("group_size", group_size)
    _v.check_ndim("q", q, 2, 2, what="(D_in, D_out)")
    D_in, D_out = q.shape
    if D_in % g or scale.shape != (D_in // g, D_out):
        raise ValueError(f"scale must have shape (D_in / group_size, D_out) = ({D_in / g:g}, {D_out}) "
                         f"for q: {q.shape} and group_size={g}, got {scale.shape}")
    out = q.reshape(D_in // g, g, D_out).astype(scale.dtype) * scale[:, None, :]
    return out.reshape(D_in, D_out)


# ---------------------------------------------------------------------------
# Speculative decoding
# ---------------------------------------------------------------------------


def _check_pq(p, q):
    p, q = _as_float(p, "p"), _as_float(q, "q")
    _v.check_ndim("p", p, 1, what="(..., V)")
    _v.check_ndim("q", q, 1, what="(..., V)")
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape (..., V), got p: {p.shape}, q: {q.shape}")
    for name, x in (("p", p), ("q", q)):
        if np.any(x < 0) or not np.allclose(x.sum(-1), 1.0, atol=1e-6):
            raise ValueError(f"{name} must be probability vectors over its last axis "
                             f"(non-negative, summing to 1) ({name}: {x.shape})")
    return p, q


def _residual(p, q):
    r = np.maximum(p - q, 0.0)
    mass = r.sum(-1, keepdims=True)
    # where p == q nothing is ever rejected; any distribution would do, p is the natural one
    return np.where(mass > 0, r / np.where(mass > 0, mass, 1.0), p)


def speculative_accept(p, q, token, u):
    """The accept/reject rule of speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    A token ``x`` drawn from the draft's ``q`` is kept when ``u < p(x) / q(x)`` (``u`` uniform in
    ``[0, 1)``), so with probability ``min(1, p(x) / q(x))``; a rejected token is replaced by a
    draw from the residual ``max(0, p - q) / sum(max(0, p - q))``. The token emitted is then
    distributed exactly as ``p`` (:func:`speculative_distribution`).

    Parameters
    ----------
    p, q : (..., V) ndarray
        The target's and the draft's next-token probabilities.
    token : (...,) int array
        The drafted token, in ``[0, V)``.
    u : (...,) array
        Uniform draws in ``[0, 1)``.

    Returns
    -------
    accepted : (...,) bool ndarray
    residual : (..., V) ndarray
    """
    p, q = _check_pq(p, q)
    token, u = np.asarray(token), np.asarray(u, dtype=np.float64)
    if token.dtype.kind not in "iu" or token.shape != p.shape[:-1]:
        raise ValueError(f"token must be integers of shape (...,) = {p.shape[:-1]}, got {token.dtype} {token.shape} "
                         f"(p: {p.shape})")
    if token.size and (token.min() < 0 or token.max() >= p.shape[-1]):
        raise ValueError(f"token must lie in [0, V={p.shape[-1]}) (token: {token.shape})")
    if u.shape != p.shape[:-1]:
        raise ValueError(f"u must have shape (...,) = {p.shape[:-1]}, got {u.shape} (p: {p.shape})")
    px = np.take_along_axis(p, token[..., None], -1)[..., 0]
    qx = np.take_along_axis(q, token[..., None], -1)[..., 0]
    accepted = u * qx < px  # u < p(x) / q(x) without dividing by q(x)
    return accepted, _residual(p, q)


def speculative_distribution(p, q):
    """The exact distribution of the token one speculative step emits:
    ``min(p, q) + (1 - sum(min(p, q))) * residual`` (accepted draft, or a residual draw after a
    rejection), which is ``p``. ``sum(min(p, q))`` is the acceptance rate ``alpha``.

    Parameters
    ----------
    p, q : (..., V) ndarray

    Returns
    -------
    (..., V) ndarray
    """
    p, q = _check_pq(p, q)
    accepted = np.minimum(p, q)  # q(x) min(1, p(x)/q(x))
    alpha = accepted.sum(-1, keepdims=True)
    return accepted + (1.0 - alpha) * _residual(p, q)


# ---------------------------------------------------------------------------
# A paged KV cache (vLLM's PagedAttention, Kwon et al. 2023)
# ---------------------------------------------------------------------------


class BlockAllocator:
    """The bookkeeping of a paged KV cache: ``num_blocks`` blocks of ``block_size`` token slots,
    a free list, and one block table per sequence (its blocks, in order).

    A sequence holds ``ceil(tokens / block_size)`` blocks, so at most one partly filled block:
    the memory in use exceeds the tokens stored by less than one block per sequence. Token ``t``
    of a sequence lives in block ``table[t // block_size]``, slot ``t % block_size``. Plain
    Python, shared by both backends (the cache tensors are the backend's).
    """

    def __init__(self, num_blocks, block_size):
        self.num_blocks = _v.check_positive_int("num_blocks", num_blocks)
        self.block_size = _v.check_positive_int("block_size", block_size)
        self.free = list(range(self.num_blocks))[::-1]  # pop() hands out block 0 first
        self.tables, self.lengths = {}, {}

    def can_hold(self, tokens):
        """Whether a new sequence of ``tokens`` tokens fits in the free blocks."""
        return -(-int(tokens) // self.block_size) <= len(self.free)

    def append(self, seq, tokens=1):
        """Make room for ``tokens`` more tokens of sequence ``seq`` (a new one if unseen), taking
        blocks from the free list as needed; returns the positions the new tokens will occupy."""
        tokens = _v.check_positive_int("tokens", tokens)
        table, n = self.tables.setdefault(seq, []), self.lengths.get(seq, 0)
        need = -(-(n + tokens) // self.block_size) - len(table)
        if need > len(self.free):
            raise ValueError(f"out of blocks: sequence {seq!r} needs {need} more, {len(self.free)} free "
                             f"(num_blocks={self.num_blocks}, block_size={self.block_size})")
        table.extend(self.free.pop() for _ in range(need))
        self.lengths[seq] = n + tokens
        return list(range(n, n + tokens))

    def release(self, seq):
        """Return sequence ``seq``'s blocks to the free list."""
        if seq not in self.tables:
            raise ValueError(f"unknown sequence {seq!r} (held: {sorted(self.tables, key=str)})")
        self.free.extend(reversed(self.tables.pop(seq)))
        del self.lengths[seq]

    def blocks_in_use(self):
        return self.num_blocks - len(self.free)

    def tokens_stored(self):
        return sum(self.lengths.values())

    def block_tables(self, seqs, width=None):
        """The block tables of ``seqs`` as a ``(len(seqs), width)`` int array padded with -1."""
        width = max([len(self.tables[s]) for s in seqs] + [width or 0, 1])
        out = np.full((len(seqs), width), -1, dtype=np.int64)
        for i, s in enumerate(seqs):
            out[i, : len(self.tables[s])] = self.tables[s]
        return out


def _check_paged(q_shape, cache_shape, table_shape, len_shape, cache_name="k_cache", q_name="Q"):
    """Shapes of a paged attention or write call (shared by both backends)."""
    if len(cache_shape) != 4:
        raise ValueError(f"{cache_name} must have shape (num_blocks, block_size, H_kv, D_K), got {cache_shape}")
    if len(q_shape) != 3 or q_shape[-1] != cache_shape[-1]:
        raise ValueError(f"{q_name} must have shape (N, H, D_K) with D_K = {cache_shape[-1]} of {cache_name}, "
                         f"got {q_shape} ({cache_name}: {cache_shape})")
    if len(table_shape) != 2 or table_shape[0] != q_shape[0]:
        raise ValueError(f"block_tables must have shape (N, max_blocks) with N = {q_shape[0]}, got {table_shape} "
                         f"({q_name}: {q_shape})")
    if tuple(len_shape) != (q_shape[0],):
        raise ValueError(f"lengths (or positions) must have shape (N,) = ({q_shape[0]},), got {len_shape} "
                         f"({q_name}: {q_shape})")


def _check_table_values(tables, lengths, num_blocks, block_size):
    nb = -(-lengths // block_size)  # blocks each row needs
    if lengths.size and (lengths.min() < 1 or nb.max() > tables.shape[1]):
        raise ValueError(f"lengths must lie in [1, max_blocks * block_size = {tables.shape[1] * block_size}] "
                         f"(lengths: {lengths.shape}, block_tables: {tables.shape})")
    used = np.arange(tables.shape[1])[None, :] < nb[:, None]
    if np.any(used & ((tables < 0) | (tables >= num_blocks))):
        raise ValueError(f"block_tables must name blocks in [0, num_blocks={num_blocks}) for every block a "
                         f"sequence uses (block_tables: {tables.shape})")


def paged_write(k_cache, K_new, block_tables, positions):
    """Write one key (or value) row per token into a paged cache, in place; returns the cache.

    Parameters
    ----------
    k_cache : (num_blocks, block_size, H_kv, D_K) ndarray
    K_new : (N, H_kv, D_K) ndarray
        The rows of N tokens, each of some sequence.
    block_tables : (N, max_blocks) int array
        Row ``i``: the block table of token ``i``'s sequence (padded with -1).
    positions : (N,) int array
        Token ``i``'s position in its sequence: it goes to block ``block_tables[i, p // block_size]``,
        slot ``p % block_size``.
    """
    tables, pos = np.asarray(block_tables), np.asarray(positions)
    _check_paged(K_new.shape, k_cache.shape, tables.shape, pos.shape, q_name="K_new")
    if K_new.shape[1] != k_cache.shape[2]:
        raise ValueError(f"K_new must have H_kv = {k_cache.shape[2]} heads, got {K_new.shape} (k_cache: {k_cache.shape})")
    bs = k_cache.shape[1]
    _check_table_values(tables, pos + 1, k_cache.shape[0], bs)
    blocks = tables[np.arange(len(pos)), pos // bs]
    k_cache[blocks, pos % bs] = K_new
    return k_cache


def paged_attention(Q, k_cache, v_cache, block_tables, lengths):
    """Attention of one query per row over that row's sequence in a paged cache.

    Row ``i`` attends to the first ``lengths[i]`` tokens of its sequence, whose keys and values
    lie in the blocks ``block_tables[i]`` (token ``t`` in block ``t // block_size``, slot
    ``t % block_size``). The blocks are gathered, padded slots masked: the result equals
    :func:`tfbook.numpy.scaled_dot_product_attention` over the contiguous keys and values.
    With ``H_kv < H`` heads in the cache, each serves ``H / H_kv`` query heads (grouped-query).

    Parameters
    ----------
    Q : (N, H, D_K) ndarray
    k_cache : (num_blocks, block_size, H_kv, D_K) ndarray
    v_cache : (num_blocks, block_size, H_kv, D_V) ndarray
    block_tables : (N, max_blocks) int array, padded with -1
    lengths : (N,) int array, in [1, max_blocks * block_size]

    Returns
    -------
    (N, H, D_V) ndarray
    """
    Q = _as_float(Q, "Q")
    tables, lengths = np.asarray(block_tables), np.asarray(lengths)
    _check_paged(Q.shape, k_cache.shape, tables.shape, lengths.shape)
    if v_cache.ndim != 4 or v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"v_cache must have shape (num_blocks, block_size, H_kv, D_V) = {k_cache.shape[:3]} + (D_V,), "
                         f"got {v_cache.shape} (k_cache: {k_cache.shape})")
    N, H, D_K = Q.shape
    nblk, bs, H_kv, _ = k_cache.shape
    if H % H_kv:
        raise ValueError(f"Q's H = {H} heads must be a multiple of the cache's H_kv = {H_kv} "
                         f"(Q: {Q.shape}, k_cache: {k_cache.shape})")
    _check_table_values(tables, lengths, nblk, bs)
    safe = np.where(tables < 0, 0, tables)  # padded entries read block 0 and are masked below
    K = k_cache[safe].reshape(N, -1, H_kv, D_K)  # (N, max_blocks * block_size, H_kv, D_K)
    V = v_cache[safe].reshape(N, K.shape[1], H_kv, -1)
    K, V = (np.repeat(np.moveaxis(M, 2, 1), H // H_kv, axis=1) for M in (K, V))  # (N, H, S, D)
    S = (Q[:, :, None, :] @ np.swapaxes(K, -1, -2))[:, :, 0] / math.sqrt(D_K)  # (N, H, S)
    valid = np.arange(K.shape[2])[None, None, :] < lengths[:, None, None]
    P = softmax(np.where(valid, S, -np.inf), axis=-1)
    return (P[:, :, None, :] @ V)[:, :, 0]


# ---------------------------------------------------------------------------
# GPTQ (Frantar et al. 2023)
# ---------------------------------------------------------------------------


def _check_gptq(W_shape, H_shape, bits, group_size, damp):
    if len(W_shape) != 2:
        raise ValueError(f"W must have shape (D_in, D_out), got {W_shape}")
    if tuple(H_shape) != (W_shape[0], W_shape[0]):
        raise ValueError(f"H must have shape (D_in, D_in) = ({W_shape[0]}, {W_shape[0]}), got {H_shape} (W: {W_shape})")
    b = _v.check_positive_int("bits", bits, minimum=2)
    g = _v.check_positive_int("group_size", group_size)
    if W_shape[0] % g:
        raise ValueError(f"group_size={g} does not divide D_in={W_shape[0]} (W: {W_shape})")
    if not (isinstance(damp, (int, float)) and damp >= 0):
        raise ValueError(f"damp must be a number >= 0, got {damp!r} (W: {W_shape})")
    return 2 ** (b - 1) - 1, g


def gptq_quantize(W, H, bits=4, group_size=32, damp=0.01):
    """GPTQ (Frantar et al. 2023): quantise ``W (D_in, D_out)`` one input row at a time, each
    rounding error spread over the rows not yet quantised so as to minimise ``||X W - X Ŵ||²``.

    ``H = XᵀX`` (``D_in × D_in``) of calibration inputs ``X (n, D_in)``; ``damp · mean(diag H)`` is
    added to its diagonal. With ``U`` the upper Cholesky factor of ``H⁻¹`` (``H⁻¹ = UᵀU``), row
    ``i`` is rounded (symmetric, ``bits`` bits, the scale of its group of ``group_size`` rows taken
    from the updated weights when the group starts), and the rows after it take
    ``-U[i, i+1:]ᵀ (w_i - ŵ_i) / U[i, i]``. With ``H`` diagonal nothing is spread and the result is
    round-to-nearest (:func:`quantize_int4` at ``bits=4``).

    Returns
    -------
    q : (D_in, D_out) int8 ndarray, values in ``[-(2^(bits-1) - 1), 2^(bits-1) - 1]``
    scale : (D_in / group_size, D_out) ndarray (``dequantize(q, scale, group_size)`` gives Ŵ)
    """
    W, H = _as_float(W, "W"), _as_float(H, "H")
    maxq, g = _check_gptq(W.shape, H.shape, bits, group_size, damp)
    W = W.copy()
    D_in, D_out = W.shape
    H = H + damp * np.mean(np.diag(H)) * np.eye(D_in, dtype=H.dtype)
    U = np.linalg.cholesky(np.linalg.inv(H)).T  # upper: H⁻¹ = Uᵀ U
    q = np.zeros((D_in, D_out), dtype=np.int8)
    scale = np.zeros((D_in // g, D_out), dtype=W.dtype)
    for i in range(D_in):
        if i % g == 0:
            amax = np.max(np.abs(W[i: i + g]), axis=0)
            scale[i // g] = np.where(amax > 0, amax / maxq, 1.0)
        s = scale[i // g]
        q[i] = np.clip(np.rint(W[i] / s), -maxq, maxq)
        err = (W[i] - q[i] * s) / U[i, i]
        W[i + 1:] -= np.outer(U[i, i + 1:], err)
    return q, scale
