"""PyTorch twins of :mod:`tfbook.numpy.incontext` (chapter 22), reached as
:mod:`tfbook.torch.functional.incontext`.

Same names, arguments and semantics: the prompt as interleaved tokens, and the predictions at
every position of the minimum-norm least-squares (or ridge), averaging and nearest-neighbour
estimators. :func:`interleave` supports autograd (the transformer of
:mod:`tfbook.torch.incontext` reads its prompt through it).
"""

from __future__ import annotations

import torch

from ... import _validate as _v
from ...numpy.incontext import _check_prompt_shapes, _check_ridge
from ._common import _common_dtype, _float

__all__ = ["interleave", "least_squares", "averaging", "nearest_neighbours"]


def _check_prompt(X, y) -> tuple:
    X, y = _float(X, "X"), _float(y, "y")
    _check_prompt_shapes(tuple(X.shape), tuple(y.shape))
    dt = _common_dtype(X, y)
    return X.to(dt), y.to(dt)


def interleave(X, y):
    """The prompt as tokens: ``Z (..., 2K, d)`` with ``Z[..., 2i, :] = x_i`` and
    ``Z[..., 2i+1, :] = (y_i, 0, ..., 0)``."""
    X, y = _check_prompt(X, y)
    *lead, K, d = X.shape
    Yt = torch.nn.functional.pad(y[..., None], (0, d - 1))  # (..., K, d): (y_i, 0, ..., 0)
    return torch.stack([X, Yt], dim=-2).reshape(*lead, 2 * K, d)


def least_squares(X, y, ridge=0.0):
    """Predictions ``(..., K)``: entry ``i`` is ``x_i . w_hat_i``, the minimum-norm least-squares
    (``ridge = 0``) or ridge fit of the ``i`` examples before it (see the NumPy twin)."""
    X, y = _check_prompt(X, y)
    lam = _check_ridge(ridge)
    *lead, K, d = X.shape
    cols = [torch.zeros(lead, dtype=X.dtype, device=X.device)]
    for i in range(1, K):
        Xi, yi = X[..., :i, :], y[..., :i]
        Xt = Xi.transpose(-1, -2)
        if i < d:
            G = Xi @ Xt + lam * torch.eye(i, dtype=X.dtype, device=X.device)
            w = (Xt @ torch.linalg.solve(G, yi[..., None]))[..., 0]
        else:
            G = Xt @ Xi + lam * torch.eye(d, dtype=X.dtype, device=X.device)
            w = torch.linalg.solve(G, Xt @ yi[..., None])[..., 0]
        cols.append((w * X[..., i, :]).sum(-1))
    return torch.stack(cols, dim=-1)


def averaging(X, y):
    """Predictions ``(..., K)``: ``x_i . (1/i) sum_{j<i} y_j x_j`` (0 for ``i = 0``)."""
    X, y = _check_prompt(X, y)
    K = X.shape[-2]
    s = torch.cumsum(y[..., None] * X, dim=-2)
    i = torch.arange(1, K, dtype=X.dtype, device=X.device)
    rest = ((s[..., :-1, :] / i[:, None]) * X[..., 1:, :]).sum(-1)
    return torch.cat([torch.zeros_like(y[..., :1]), rest], dim=-1)


def nearest_neighbours(X, y, n_neighbors=3):
    """Predictions ``(..., K)``: the mean ``y_j`` of the ``min(i, n_neighbors)`` examples
    ``j < i`` nearest ``x_i`` (Euclidean; 0 for ``i = 0``)."""
    X, y = _check_prompt(X, y)
    n = _v.check_positive_int("n_neighbors", n_neighbors)
    K = X.shape[-2]
    cols = [torch.zeros_like(y[..., 0])]
    for i in range(1, K):
        dist = ((X[..., :i, :] - X[..., i:i + 1, :]) ** 2).sum(-1)
        idx = torch.argsort(dist, dim=-1, stable=True)[..., :min(i, n)]
        cols.append(torch.gather(y[..., :i], -1, idx).mean(-1))
    return torch.stack(cols, dim=-1)
