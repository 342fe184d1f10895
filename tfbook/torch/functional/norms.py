"""Norms and the position-wise MLP: LayerNorm, ReLU, GELU, the two-matrix feed-forward.

Part of :mod:`tfbook.torch.functional` (which re-exports every public name); the twins are in
:mod:`tfbook.numpy.norms`.
"""

from __future__ import annotations

import torch

from ... import _validate as _v
from ._common import _float, _linear, _tensor

__all__ = [
    "layer_norm",
    "relu",
    "gelu",
    "feed_forward",
]


# ---------------------------------------------------------------------------
# Norms and the MLP
# ---------------------------------------------------------------------------


def layer_norm(X, gamma, beta, eps=1e-5):
    """LayerNorm over the last axis, biased variance (as ``nn.LayerNorm``); ``gamma, beta (D,)`` or None."""
    X = _float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., D)")
    D = X.shape[-1]
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p is not None:
            _tensor(p, name)
            _v.check_vector(name, p, D, "D")
    mu = X.mean(dim=-1, keepdim=True)
    var = ((X - mu) ** 2).mean(dim=-1, keepdim=True)
    Y = (X - mu) / torch.sqrt(var + eps)
    if gamma is not None:
        Y = Y * gamma
    if beta is not None:
        Y = Y + beta
    return Y


def relu(x):
    """``max(x, 0)`` elementwise."""
    return torch.relu(_float(x, "x"))


def gelu(x):
    """Exact GELU ``0.5 x (1 + erf(x / sqrt 2))`` (PyTorch's fused kernel computes exactly this;
    ``tfbook.numpy.gelu`` spells the formula out, and the two are tested equal)."""
    x = _float(x, "x")
    return torch.nn.functional.gelu(x)


_ACTIVATIONS = {"relu": relu, "gelu": gelu}


def feed_forward(X, params, activation="relu"):
    """Position-wise MLP ``act(X W_1 + b_1) W_2 + b_2``; ``W_1 (D, D_ff)``, ``W_2 (D_ff, D)``."""
    X = _float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., D)")
    _v.check_choice("activation", activation, _ACTIVATIONS)
    _v.check_params("params", params, ("W_1", "W_2"))
    for k in ("W_1", "b_1", "W_2", "b_2"):
        if params.get(k) is not None:
            _tensor(params[k], f"params['{k}']")
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
