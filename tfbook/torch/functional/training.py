"""PyTorch twins of :mod:`tfbook.numpy.training`, re-exported by :mod:`tfbook.torch.functional`.

Written out on tensors (not calling ``F.cross_entropy``), so that the chapter can compare
them with PyTorch's built-in; autograd differentiates them like any other function.
"""

from __future__ import annotations

import torch

from ... import _validate as _v
from ._common import _float

__all__ = [
    "log_softmax",
    "cross_entropy",
    "cross_entropy_grad",
]


def log_softmax(x, axis=-1):
    """``log(softmax(x))`` along ``axis``: ``x - max - log(sum(exp(x - max)))``; see the NumPy twin."""
    x = _float(x, "x")
    _v.check_axis("x", x, axis)
    y = x - x.amax(dim=axis, keepdim=True).detach()  # the shift does not change the value
    return y - torch.log(torch.exp(y).sum(dim=axis, keepdim=True))


def _check_ce(logits, targets, ignore_index):
    logits = _float(logits, "logits")
    _v.check_ndim("logits", logits, 1, what="(..., V)")
    if not isinstance(targets, torch.Tensor):
        raise ValueError(f"targets must be a torch.Tensor, got {type(targets).__name__}")
    ls, ts = tuple(logits.shape), tuple(targets.shape)
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integers, got dtype {targets.dtype} (targets: {ts})")
    if ts != ls[:-1]:
        raise ValueError(f"targets must have shape logits.shape[:-1] = {ls[:-1]}, got {ts} "
                         f"(logits: {ls}, targets: {ts})")
    counted = targets != ignore_index
    V = ls[-1]
    bad = counted & ((targets < 0) | (targets >= V))
    if bool(bad.any()):
        raise ValueError(f"targets must lie in [0, V={V}) or equal ignore_index={ignore_index}, got "
                         f"{int(targets[bad][0])} (logits: {ls}, targets: {ts})")
    return logits, targets, counted


def cross_entropy(logits, targets, ignore_index=-100):
    """Mean ``-log softmax(logits)[target]`` over positions whose target is not ``ignore_index``
    (0 when none is counted); see the NumPy twin."""
    logits, targets, counted = _check_ce(logits, targets, ignore_index)
    logp = log_softmax(logits)
    safe = torch.where(counted, targets, torch.zeros_like(targets))
    picked = logp.gather(-1, safe[..., None])[..., 0]
    n = max(int(counted.sum()), 1)
    return -torch.where(counted, picked, torch.zeros_like(picked)).sum() / n


def cross_entropy_grad(logits, targets, ignore_index=-100):
    """``(softmax(logits) - one_hot(targets)) / N`` on counted rows, zero on ignored ones."""
    logits, targets, counted = _check_ce(logits, targets, ignore_index)
    P = torch.exp(log_softmax(logits))
    safe = torch.where(counted, targets, torch.zeros_like(targets))
    onehot = safe[..., None] == torch.arange(logits.shape[-1], device=logits.device)
    n = max(int(counted.sum()), 1)
    return (P - onehot.to(P.dtype)) * (counted[..., None].to(P.dtype) / n)
