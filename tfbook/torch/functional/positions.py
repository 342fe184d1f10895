"""Tokens and positions: one-hot rows, the embedding lookup, the sinusoidal and learned
position tables, rotary positions (interleaved layout).

Part of :mod:`tfbook.torch.functional` (which re-exports every public name); the twins are in
:mod:`tfbook.numpy.positions`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import _validate as _v
from ._common import _float, _tensor

__all__ = [
    "one_hot",
    "embedding_lookup",
    "sinusoidal_positional_encoding",
    "sinusoidal_shift_matrix",
    "sinusoidal_positional_encoding_2d",
    "learned_positional_embedding",
    "rope",
]


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
