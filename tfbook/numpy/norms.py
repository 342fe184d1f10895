"""Norms and the position-wise MLP: LayerNorm, ReLU, GELU, the two-matrix feed-forward.

Part of :mod:`tfbook.numpy` (which re-exports every public name); the twins are in
:mod:`tfbook.torch.functional.norms`.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as _v
from ._common import _as_float, _linear

__all__ = [
    "layer_norm",
    "relu",
    "gelu",
    "feed_forward",
]


# ---------------------------------------------------------------------------
# Norms and the position-wise MLP
# ---------------------------------------------------------------------------


def layer_norm(X, gamma, beta, eps=1e-5):
    """LayerNorm over the last axis with biased variance, as ``nn.LayerNorm``.

    Parameters
    ----------
    X : (..., D) ndarray
    gamma, beta : (D,) ndarray or None
        Gain and shift (``None``: 1 and 0).

    Returns
    -------
    (..., D) ndarray
    """
    X = _as_float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., D)")
    D = X.shape[-1]
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p is not None:
            _v.check_vector(name, np.asarray(p), D, "D")
    mu = X.mean(axis=-1, keepdims=True)
    var = ((X - mu) ** 2).mean(axis=-1, keepdims=True)
    Y = (X - mu) / np.sqrt(var + eps)
    if gamma is not None:
        Y = Y * gamma
    if beta is not None:
        Y = Y + beta
    return Y.astype(X.dtype, copy=False)


def relu(x):
    """``max(x, 0)`` elementwise."""
    x = _as_float(x, "x")
    return np.maximum(x, 0)


try:  # SciPy's erf is vectorised; it comes with scikit-learn
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover - exact but slower
    _erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x):
    """GELU, exact form ``x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))``."""
    x = _as_float(x, "x")
    return (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))).astype(x.dtype, copy=False)


_ACTIVATIONS = {"relu": relu, "gelu": gelu}


def feed_forward(X, params, activation="relu"):
    """Position-wise MLP ``act(X W_1 + b_1) W_2 + b_2``.

    Parameters
    ----------
    X : (..., T, D) ndarray
    params : dict
        ``W_1 (D, D_ff)``, ``b_1 (D_ff,)``, ``W_2 (D_ff, D)``, ``b_2 (D,)`` (biases may be None).
    activation : {"relu", "gelu"}

    Returns
    -------
    (..., T, D) ndarray
    """
    X = _as_float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., D)")
    _v.check_choice("activation", activation, _ACTIVATIONS)
    _v.check_params("params", params, ("W_1", "W_2"))
    D = X.shape[-1]
    _v.check_matrix("params['W_1']", params["W_1"], D, None, "(D, D_ff)")
    D_ff = params["W_1"].shape[1]
    _v.check_matrix("params['W_2']", params["W_2"], D_ff, D, "(D_ff, D)")
    if params.get("b_1") is not None:
        _v.check_vector("params['b_1']", params["b_1"], D_ff, "D_ff")
    if params.get("b_2") is not None:
        _v.check_vector("params['b_2']", params["b_2"], D, "D")
    Hd = _ACTIVATIONS[activation](_linear(X, params["W_1"], params.get("b_1")))  # (..., T, D_ff)
    return _linear(Hd, params["W_2"], params.get("b_2"))
