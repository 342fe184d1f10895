"""Images: cutting them into patches and back, attention rollout, and video tubelets.

Part of :mod:`tfbook.numpy` (which re-exports every public name); the twins are in
:mod:`tfbook.torch.functional.vision`.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as _v
from ._common import _as_float

__all__ = [
    "patchify",
    "unpatchify",
    "attention_rollout",
    "tubelets",  # chapter 1's video patches (not re-exported by tfbook.numpy)
]


# ---------------------------------------------------------------------------
# Image patches and attention rollout
# ---------------------------------------------------------------------------


def _check_images(images, patch_size, name="images"):
    _v.check_ndim(name, images, 4, 4, what="(B, C, H, W)")
    p = _v.check_positive_int("patch_size", patch_size)
    B, C, H, W = images.shape
    if H % p or W % p:
        raise ValueError(f"{name} of shape {tuple(images.shape)} has H={H}, W={W}, "
                         f"not divisible into patches of patch_size={p}")
    return p


def patchify(images, patch_size):
    """Cut images into non-overlapping square patches and flatten each.

    Parameters
    ----------
    images : (B, C, H, W) ndarray
        ``H`` and ``W`` divisible by ``patch_size = p``.

    Returns
    -------
    (B, N, C*p*p) ndarray
        ``N = (H/p) (W/p)`` patches in row-major order, each flattened in
        ``(C, p, p)`` order, so that ``patchify(x) @ W.reshape(D, -1).T`` equals a
        convolution with kernel ``W (D, C, p, p)`` and stride ``p``.
    """
    images = np.asarray(images)
    p = _check_images(images, patch_size)
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // p, p, W // p, p)
    x = x.transpose(0, 2, 4, 1, 3, 5)  # (B, H/p, W/p, C, p, p)
    return x.reshape(B, (H // p) * (W // p), C * p * p)


def unpatchify(patches, patch_size, image_shape):
    """Inverse of :func:`patchify`.

    Parameters
    ----------
    patches : (B, N, C*p*p) ndarray
    image_shape : (C, H, W) tuple

    Returns
    -------
    (B, C, H, W) ndarray
    """
    patches = np.asarray(patches)
    p, (C, H, W) = _check_unpatchify(patches, patch_size, image_shape)
    B = patches.shape[0]
    x = patches.reshape(B, H // p, W // p, C, p, p)
    return x.transpose(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)


def _check_unpatchify(patches, patch_size, image_shape):
    _v.check_ndim("patches", patches, 3, 3, what="(B, N, C*p*p)")
    p = _v.check_positive_int("patch_size", patch_size)
    try:
        C, H, W = (int(s) for s in image_shape)
    except (TypeError, ValueError):
        raise ValueError(f"image_shape must be (C, H, W), got {image_shape!r}") from None
    if H % p or W % p:
        raise ValueError(f"image_shape={(C, H, W)} has H={H}, W={W}, not divisible into patches of patch_size={p}")
    want = ((H // p) * (W // p), C * p * p)
    if tuple(patches.shape[1:]) != want:
        raise ValueError(f"patches of shape {tuple(patches.shape)} do not match image_shape={(C, H, W)} "
                         f"with patch_size={p}: expected (B, N, C*p*p) = (B, {want[0]}, {want[1]})")
    return p, (C, H, W)


def attention_rollout(attentions, residual=True):
    """Attention rollout (Abnar and Zuidema, 2020): how much each input token feeds each output.

    For each layer the heads are averaged; with ``residual`` the identity is
    added (the skip connection) and rows renormalised, ``A = (P + I) / 2``. The
    layers are then chained: ``R = A_L ... A_2 A_1``.

    Parameters
    ----------
    attentions : sequence of (..., H, T, T) ndarray
        Attention weights of each layer, first layer first.

    Returns
    -------
    (..., T, T) ndarray
        Rows sum to one.
    """
    attentions = list(attentions)
    if not attentions:
        raise ValueError("attentions must hold at least one layer, got an empty sequence")
    shape0 = None
    R = None
    for layer, P in enumerate(attentions):
        P = _as_float(P, f"attentions[{layer}]")
        _v.check_ndim(f"attentions[{layer}]", P, 3, what="(..., H, T, T)")
        if P.shape[-1] != P.shape[-2]:
            raise ValueError(f"attentions[{layer}] must be square in its last two axes (..., H, T, T), got {P.shape}")
        if shape0 is None:
            shape0 = P.shape
        elif P.shape != shape0:
            raise ValueError(f"attentions[{layer}] has shape {P.shape} but attentions[0] has {shape0}")
        A = P.mean(axis=-3)  # (..., T, T)
        if residual:
            A = A + np.eye(A.shape[-1], dtype=A.dtype)
            A = A / A.sum(axis=-1, keepdims=True)
        R = A if R is None else A @ R
    return R


def _check_video(video, t, p):
    if video.ndim != 5:
        raise ValueError(f"video must be (B, C, F, H, W), got shape {tuple(video.shape)}")
    B, C, F, H, W = video.shape
    if F % t or H % p or W % p:
        raise ValueError(f"(F, H, W) = {(F, H, W)} must be divisible by (t, p, p) = {(t, p, p)}")
    return B, C, F, H, W


def tubelets(video, t, p):
    """Cut videos into non-overlapping ``t x p x p`` tubelets and flatten each (NumPy).

    Parameters
    ----------
    video : (B, C, F, H, W) ndarray
        ``F`` frames, divisible by ``t``; ``H``, ``W`` divisible by ``p``.

    Returns
    -------
    (B, N, C*t*p*p) ndarray
        ``N = (F/t)(H/p)(W/p)`` tubelets, time-major then row-major, each flattened in
        ``(C, t, p, p)`` order, so that ``tubelets(v) @ W.reshape(D, -1).T`` equals
        ``nn.Conv3d(C, D, kernel_size=(t, p, p), stride=(t, p, p))`` with weight ``W``.
    """
    video = np.asarray(video)
    B, C, F, H, W = _check_video(video, t, p)
    x = video.reshape(B, C, F // t, t, H // p, p, W // p, p)
    x = x.transpose(0, 2, 4, 6, 1, 3, 5, 7)              # (B, F/t, H/p, W/p, C, t, p, p)
    return x.reshape(B, (F // t) * (H // p) * (W // p), C * t * p * p)
