"""NumPy components of the training chapter, re-exported by :mod:`tfbook.numpy`.

Cross-entropy from the log-softmax, and its gradient written out (chapter 10):

* :func:`log_softmax` ``(..., V) -> (..., V)``, stable for any finite logits (+-1e4 included);
* :func:`cross_entropy` the mean negative log-probability of the targets, skipping the
  positions whose target is ``ignore_index`` (padding);
* :func:`cross_entropy_grad` its gradient with respect to the logits,
  ``(softmax(logits) - one_hot(targets)) / N`` on the ``N`` counted positions, zero on the
  ignored ones.

The backward passes of the other components, the optimizers and the NumPy training step
are NumPy-only machinery and live in :mod:`tfbook.numpy.backprop` and :mod:`tfbook.numpy.optim`.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as _v
from ._common import _as_float

__all__ = [
    "log_softmax",
    "cross_entropy",
    "cross_entropy_grad",
]


def log_softmax(x, axis=-1):
    """``log(softmax(x))`` along ``axis``, computed as ``x - max - log(sum(exp(x - max)))``.

    Subtracting the row maximum first keeps every exponent ``<= 0``, so nothing overflows
    and the largest term of the sum is exactly 1 (the log never sees 0): finite for any
    finite logits, including +-1e4. Same shape and dtype as ``x``.
    """
    x = _as_float(x, "x")
    _v.check_axis("x", x, axis)
    m = np.max(x, axis=axis, keepdims=True)
    y = x - m
    return (y - np.log(np.sum(np.exp(y), axis=axis, keepdims=True))).astype(x.dtype, copy=False)


def _check_ce(logits, targets, ignore_index):
    """Validated ``(logits (..., V) float, targets (...) int, counted (...) bool)``."""
    logits = _as_float(logits, "logits")
    _v.check_ndim("logits", logits, 1, what="(..., V)")
    targets = np.asarray(targets)
    if targets.dtype.kind not in "iu":
        raise ValueError(f"targets must be integers, got dtype {targets.dtype} (targets: {targets.shape})")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must have shape logits.shape[:-1] = {logits.shape[:-1]}, got "
                         f"{targets.shape} (logits: {logits.shape}, targets: {targets.shape})")
    counted = targets != ignore_index
    V = logits.shape[-1]
    bad = counted & ((targets < 0) | (targets >= V))
    if bad.any():
        raise ValueError(f"targets must lie in [0, V={V}) or equal ignore_index={ignore_index}, got "
                         f"{int(targets[bad].flat[0])} (logits: {logits.shape}, targets: {targets.shape})")
    return logits, targets, counted


def cross_entropy(logits, targets, ignore_index=-100):
    """Mean cross-entropy ``-log softmax(logits)[target]`` over the counted positions (nats).

    Parameters
    ----------
    logits : (..., V) ndarray
        Unnormalised scores; the class axis is the last one (``(B, T, V)`` for a language model).
    targets : (...) int ndarray
        The right class at each position, in ``[0, V)``, or ``ignore_index`` (padding: the
        position counts neither in the sum nor in the mean).
    ignore_index : int
        Default -100, as ``torch.nn.functional.cross_entropy``.

    Returns
    -------
    float ndarray of shape ()
        Equals ``F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=...)``
        whenever one position is counted; 0 when none is (PyTorch gives nan there: 0/0).
    """
    logits, targets, counted = _check_ce(logits, targets, ignore_index)
    logp = log_softmax(logits)  # (..., V)
    safe = np.where(counted, targets, 0)  # any valid index; ignored rows are zeroed below
    picked = np.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]  # (...)
    n = max(int(counted.sum()), 1)
    return np.asarray(-np.sum(np.where(counted, picked, 0.0)) / n, dtype=logits.dtype)


def cross_entropy_grad(logits, targets, ignore_index=-100):
    """Gradient of :func:`cross_entropy` with respect to ``logits``: ``(softmax - one_hot) / N``.

    ``N`` is the number of counted positions; rows whose target is ``ignore_index`` get
    zeros. Same shape and dtype as ``logits``.
    """
    logits, targets, counted = _check_ce(logits, targets, ignore_index)
    P = np.exp(log_softmax(logits))  # softmax, (..., V)
    safe = np.where(counted, targets, 0)
    G = P - (safe[..., None] == np.arange(logits.shape[-1]))
    n = max(int(counted.sum()), 1)
    return (G * (counted[..., None] / n)).astype(logits.dtype, copy=False)
