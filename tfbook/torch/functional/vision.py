"""Images: cutting them into patches and back, attention rollout, and video tubelets.

Part of :mod:`tfbook.torch.functional` (which re-exports every public name); the twins are in
:mod:`tfbook.numpy.vision`.
"""

from __future__ import annotations

import torch

from ... import _validate as _v
from ...numpy.vision import _check_unpatchify, _check_video
from ._common import _float, _tensor

__all__ = [
    "patchify",
    "unpatchify",
    "attention_rollout",
    "tubelets",  # chapter 1's video patches (not re-exported by tfbook.torch.functional)
]


# ---------------------------------------------------------------------------
# Image patches and attention rollout
# ---------------------------------------------------------------------------


def patchify(images, patch_size):
    """``(B, C, H, W) -> (B, N, C*p*p)``: row-major patches, each flattened in ``(C, p, p)`` order."""
    _tensor(images, "images")
    _v.check_ndim("images", images, 4, 4, what="(B, C, H, W)")
    p = _v.check_positive_int("patch_size", patch_size)
    B, C, H, W = images.shape
    if H % p or W % p:
        raise ValueError(f"images of shape {tuple(images.shape)} has H={H}, W={W}, "
                         f"not divisible into patches of patch_size={p}")
    x = images.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)  # (B, H/p, W/p, C, p, p)
    return x.reshape(B, (H // p) * (W // p), C * p * p)


def unpatchify(patches, patch_size, image_shape):
    """Inverse of :func:`patchify`: ``(B, N, C*p*p) -> (B, C, H, W)`` with ``image_shape = (C, H, W)``."""
    _tensor(patches, "patches")
    p, (C, H, W) = _check_unpatchify(patches, patch_size, image_shape)
    B = patches.shape[0]
    x = patches.reshape(B, H // p, W // p, C, p, p).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(B, C, H, W)


def attention_rollout(attentions, residual=True):
    """Attention rollout (Abnar and Zuidema, 2020): average heads, add ``I`` and renormalise
    when ``residual``, multiply through the layers (first layer first). Returns ``(..., T, T)``."""
    attentions = list(attentions)
    if not attentions:
        raise ValueError("attentions must hold at least one layer, got an empty sequence")
    shape0 = None
    R = None
    for layer, P in enumerate(attentions):
        P = _float(P, f"attentions[{layer}]")
        _v.check_ndim(f"attentions[{layer}]", P, 3, what="(..., H, T, T)")
        if P.shape[-1] != P.shape[-2]:
            raise ValueError(f"attentions[{layer}] must be square in its last two axes (..., H, T, T), "
                             f"got {tuple(P.shape)}")
        if shape0 is None:
            shape0 = tuple(P.shape)
        elif tuple(P.shape) != shape0:
            raise ValueError(f"attentions[{layer}] has shape {tuple(P.shape)} but attentions[0] has {shape0}")
        A = P.mean(dim=-3)
        if residual:
            A = A + torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
            A = A / A.sum(dim=-1, keepdim=True)
        R = A if R is None else A @ R
    return R


def tubelets(video, t, p):
    """:func:`tfbook.numpy.vision.tubelets` for a torch tensor (same shapes and order), with
    ``Tensor.unfold``."""
    B, C, F, H, W = _check_video(video, t, p)
    x = video.unfold(2, t, t).unfold(3, p, p).unfold(4, p, p)  # (B, C, F/t, H/p, W/p, t, p, p)
    x = x.permute(0, 2, 3, 4, 1, 5, 6, 7)                       # (B, F/t, H/p, W/p, C, t, p, p)
    return x.reshape(B, -1, C * t * p * p)
