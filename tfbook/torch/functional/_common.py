"""Private helpers shared by the topic modules of :mod:`tfbook.torch.functional`: the input
checks (a tensor, a floating one), dtype promotion and the affine map ``X W + b``.
"""

from __future__ import annotations

import torch

from ... import _validate as _v


def _tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _float(x, name: str) -> torch.Tensor:
    x = _tensor(x, name)
    _v.check_floating(name, x)
    return x


def _common_dtype(*xs):
    dt = xs[0].dtype
    for x in xs[1:]:
        dt = torch.promote_types(dt, x.dtype)
    return dt


def _linear(X, W, b):
    Y = X @ W
    return Y if b is None else Y + b
