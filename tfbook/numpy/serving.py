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
