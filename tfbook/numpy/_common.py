"""Private helpers shared by the topic modules of :mod:`tfbook.numpy`: input conversion
(integer and boolean input becomes float64) and the affine map ``X W + b``.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as _v


def _as_float(x, name: str) -> np.ndarray:
    """``x`` as an ndarray; integer and boolean input becomes float64."""
    x = np.asarray(x)
    if x.dtype.kind in "biu":
        x = x.astype(np.float64)
    _v.check_floating(name, x)
    return x


def _linear(X, W, b):
    Y = X @ W
    return Y if b is None else Y + b
