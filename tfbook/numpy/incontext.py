"""NumPy components of in-context regression (chapter 22), reached as :mod:`tfbook.numpy.incontext`.

A *prompt* holds ``K`` examples ``(x_i, y_i)`` of one function, ``X (..., K, d)`` and
``y (..., K)``. A model that learns in context predicts ``y_i`` from ``x_i`` and the ``i``
examples before it, for every ``i = 0 .. K-1`` (``i`` examples in context). Every function
here returns those ``K`` predictions, ``(..., K)``, so that a transformer's outputs and the
baselines' are compared position by position:

* :func:`interleave`: the token sequence a transformer reads, ``x_1, (y_1, 0, ..., 0), x_2,
  ...``: ``Z (..., 2K, d)`` (Garg et al. 2022 write ``y`` into the first coordinate of a
  ``d``-vector so that one linear read-in serves both kinds of token);
* :func:`least_squares`: the minimum-norm least-squares fit ``w_hat`` of the ``i`` examples
  (ridge regression with ``ridge > 0``), evaluated at ``x_i``;
* :func:`averaging`: ``w_hat = (1/i) sum_j y_j x_j``, evaluated at ``x_i``;
* :func:`nearest_neighbours`: the mean ``y`` of the ``n_neighbors`` examples whose ``x`` is
  nearest ``x_i`` (all of them while there are fewer).

With no example in context every estimator predicts 0 (the prior mean of ``y``).

Conventions of :mod:`tfbook.numpy`: float64 in (other float dtypes are kept), bad input
raises ``ValueError`` naming the argument and showing the shapes.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as _v
from ._common import _as_float

__all__ = ["interleave", "least_squares", "averaging", "nearest_neighbours"]


def _check_prompt_shapes(x_shape: tuple, y_shape: tuple) -> None:
    """``X (..., K, d)`` and ``y (..., K)``, checked on their shapes (both twins call this)."""
    if len(x_shape) < 2:
        raise ValueError(f"X must be (..., K, d), got shape {x_shape}")
    if y_shape != x_shape[:-1]:
        raise ValueError(f"y must be (..., K) = {x_shape[:-1]} to match X {x_shape}, got y {y_shape}")
    if x_shape[-1] < 1:
        raise ValueError(f"X must have d >= 1 features, got shape {x_shape}")


def _check_prompt(X, y) -> tuple:
    """``(X, y)`` as float arrays after checking ``X (..., K, d)`` and ``y (..., K)``."""
    X, y = _as_float(X, "X"), _as_float(y, "y")
    _check_prompt_shapes(X.shape, y.shape)
    return X, y


def _check_ridge(ridge) -> float:
    if isinstance(ridge, bool) or not isinstance(ridge, (int, float, np.floating, np.integer)) or not ridge >= 0:
        raise ValueError(f"ridge must be a number >= 0, got {ridge!r}")
    return float(ridge)


def interleave(X, y):
    """The prompt as tokens: ``Z (..., 2K, d)`` with ``Z[..., 2i, :] = x_i`` and
    ``Z[..., 2i+1, :] = (y_i, 0, ..., 0)``."""
    X, y = _check_prompt(X, y)
    *lead, K, d = X.shape
    Z = np.zeros((*lead, K, 2, d), dtype=np.result_type(X, y))
    Z[..., 0, :] = X
    Z[..., 1, 0] = y
    return Z.reshape(*lead, 2 * K, d)


def least_squares(X, y, ridge=0.0):
    """Predictions ``(..., K)``: entry ``i`` is ``x_i . w_hat_i`` with ``w_hat_i`` fitted to the
    ``i`` examples before it.

    ``ridge = 0``: the minimum-norm least-squares solution, ``X_i^T (X_i X_i^T)^{-1} y_i`` while
    ``i < d`` (the examples fit exactly; of all such ``w`` the shortest) and
    ``(X_i^T X_i)^{-1} X_i^T y_i`` from ``i = d`` on (the examples in general position, as
    Gaussian ones are with probability one). ``ridge = lam > 0``: ridge regression,
    ``(X_i^T X_i + lam I)^{-1} X_i^T y_i``, computed in the smaller of the two equal forms
    (``X_i^T (X_i X_i^T + lam I)^{-1} y_i`` while ``i < d``). With a prior ``w ~ N(0, I)`` and
    label noise of variance ``sigma^2``, ``ridge = sigma^2`` is the posterior mean (Bayes-optimal
    for squared error); without noise it tends to the minimum-norm solution.
    """
    X, y = _check_prompt(X, y)
    lam = _check_ridge(ridge)
    *lead, K, d = X.shape
    out = np.zeros((*lead, K), dtype=np.result_type(X, y))
    for i in range(1, K):
        Xi, yi = X[..., :i, :], y[..., :i]
        Xt = np.swapaxes(Xi, -1, -2)  # (..., d, i)
        if i < d:  # w = X^T (X X^T + lam I)^{-1} y
            G = Xi @ Xt + lam * np.eye(i)
            w = (Xt @ np.linalg.solve(G, yi[..., None]))[..., 0]
        else:  # w = (X^T X + lam I)^{-1} X^T y
            G = Xt @ Xi + lam * np.eye(d)
            w = np.linalg.solve(G, Xt @ yi[..., None])[..., 0]
        out[..., i] = np.sum(w * X[..., i, :], axis=-1)
    return out


def averaging(X, y):
    """Predictions ``(..., K)``: entry ``i`` is ``x_i . w_hat_i`` with
    ``w_hat_i = (1/i) sum_{j<i} y_j x_j`` (0 for ``i = 0``): unbiased for ``w`` when
    ``x ~ N(0, I)``, since ``E[y x] = E[x x^T] w = w``."""
    X, y = _check_prompt(X, y)
    K = X.shape[-2]
    s = np.cumsum(y[..., None] * X, axis=-2)  # (..., K, d): sum_{j<=i} y_j x_j
    out = np.zeros(y.shape, dtype=np.result_type(X, y))
    if K > 1:
        i = np.arange(1, K, dtype=out.dtype)
        w = s[..., :-1, :] / i[:, None]  # (..., K-1, d): w_hat_i for i = 1..K-1
        out[..., 1:] = np.sum(w * X[..., 1:, :], axis=-1)
    return out


def nearest_neighbours(X, y, n_neighbors=3):
    """Predictions ``(..., K)``: entry ``i`` is the mean ``y_j`` of the ``min(i, n_neighbors)``
    examples ``j < i`` whose ``x_j`` is nearest ``x_i`` (Euclidean; 0 for ``i = 0``)."""
    X, y = _check_prompt(X, y)
    n = _v.check_positive_int("n_neighbors", n_neighbors)
    K = X.shape[-2]
    out = np.zeros(y.shape, dtype=np.result_type(X, y))
    for i in range(1, K):
        dist = np.sum((X[..., :i, :] - X[..., i:i + 1, :]) ** 2, axis=-1)  # (..., i)
        m = min(i, n)
        idx = np.argsort(dist, axis=-1, kind="stable")[..., :m]
        out[..., i] = np.mean(np.take_along_axis(y[..., :i], idx, axis=-1), axis=-1)
    return out
