"""The Vision Transformer of chapter 13, trained on scikit-learn's 8x8 digits.

Training every variant the chapter compares takes minutes on a shared 2-core CPU, longer
than a chapter may run, so the trained weights ship in ``tfbook/weights/`` and the
chapter loads them. This module is how they were made and how to make them again::

    python -m tfbook.vit_digits            # retrain every variant, rewrite the weight files

:func:`train` is the whole recipe: AdamW with a one-cycle learning-rate schedule,
small random rotations, rescalings and sub-pixel shifts of the training images, one
CPU thread (so the run is deterministic and does not depend on the thread count).
The same variant and seed give the same losses and weights on the same machine.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .torch.models import ViTConfig, VisionTransformer

__all__ = [
    "VARIANTS",
    "BASE",
    "RECIPE",
    "config",
    "augment",
    "train",
    "accuracy",
    "weights_path",
    "save",
    "load",
]

#: the models the chapter compares: how the image is read out, and how positions enter
VARIANTS: dict[str, dict] = {
    "cls-1d": {"pooling": "cls", "pos": "1d"},  # the ViT paper's choice; the chapter's main model
    "mean-1d": {"pooling": "mean", "pos": "1d"},
    "cls-2d": {"pooling": "cls", "pos": "2d"},
    "mean-2d": {"pooling": "mean", "pos": "2d"},
    "cls-none": {"pooling": "cls", "pos": "none"},  # no position information at all
}

#: the architecture shared by every variant (8x8 images, 2x2 patches: 16 tokens)
BASE: dict = {"image_size": 8, "patch_size": 2, "d_model": 32, "num_heads": 4,
              "num_layers": 2, "d_ff": 64}

#: the training recipe shared by every variant
RECIPE: dict = {
    "steps": 1000,  # AdamW steps of batch_size images (about 95 passes over the 1347 images)
    "batch_size": 128,
    "lr": 3e-3,  # peak of the one-cycle schedule
    "warmup": 0.1,  # fraction of the steps spent warming up
    "weight_decay": 0.05,
    "max_angle": 10.0,  # augmentation: rotation in degrees, uniform in [-max_angle, max_angle]
    "max_scale": 0.1,  # zoom factor uniform in [1 - max_scale, 1 + max_scale]
    "max_shift": 0.5,  # shift in pixels, uniform in [-max_shift, max_shift] on each axis
}

_WEIGHTS = Path(__file__).resolve().parent / "weights"


def config(variant: str = "cls-1d") -> ViTConfig:
    """The :class:`ViTConfig` of ``variant`` (a key of :data:`VARIANTS`)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    return ViTConfig(**BASE, **VARIANTS[variant])


def augment(images: torch.Tensor, generator: torch.Generator, max_angle: float = 10.0,
            max_scale: float = 0.1, max_shift: float = 0.5) -> torch.Tensor:
    """Rotate, rescale and shift each image of ``images (B, C, H, W)`` by a small random amount.

    Bilinear resampling, zeros outside the image. The digits are centred and size-normalised,
    so the changes are kept small: whole-pixel shifts of an 8x8 digit already move it by an
    eighth of its width.
    """
    if images.ndim != 4:
        raise ValueError(f"images must be (B, C, H, W), got {tuple(images.shape)}")
    B, _, H, W = images.shape

    def uniform(scale):  # (B,), uniform in [-scale, scale]
        return (torch.rand(B, generator=generator, dtype=images.dtype) * 2 - 1) * scale

    angle = uniform(max_angle * math.pi / 180)
    zoom = 1 + uniform(max_scale)
    # affine_grid works in [-1, 1] coordinates: one pixel is 2 / W wide
    tx, ty = uniform(max_shift * 2 / W), uniform(max_shift * 2 / H)
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)  # (B, 2, 3)
    grid = nn.functional.affine_grid(theta, list(images.shape), align_corners=False)
    return nn.functional.grid_sample(images, grid, mode="bilinear", padding_mode="zeros",
                                     align_corners=False)


def train(variant: str = "cls-1d", seed: int = 0, steps: int | None = None,
          disable: bool = True) -> tuple[VisionTransformer, list[float]]:
    """Train ``variant`` on the training split of :func:`tfbook.data.load_digits_images`.

    Returns the model (in eval mode, float32) and the training loss of every step.
    ``steps`` defaults to ``RECIPE["steps"]``; ``disable=False`` shows a tqdm bar.
    """
    from tqdm.auto import tqdm

    from .data import load_digits_images

    r = dict(RECIPE)
    steps = r["steps"] if steps is None else int(steps)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    data = load_digits_images()
    X, y = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)  # (N, 1, 8, 8), (N,)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic, and faster for a model this small
    try:
        torch.manual_seed(seed)
        model = VisionTransformer(config(variant))
        generator = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=r["lr"], weight_decay=r["weight_decay"])
        schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=r["lr"], total_steps=steps,
                                                       pct_start=r["warmup"])
        model.train()
        losses: list[float] = []
        for _ in tqdm(range(steps), disable=disable, desc=f"ViT {variant}"):
            idx = torch.randint(0, X.shape[0], (r["batch_size"],), generator=generator)
            images = augment(X[idx], generator, r["max_angle"], r["max_scale"], r["max_shift"])
            loss = nn.functional.cross_entropy(model(images), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            schedule.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return model, losses


@torch.no_grad()
def accuracy(model: nn.Module, images, labels, batch_size: int = 512) -> float:
    """Fraction of ``images (N, C, H, W)`` whose arg-max logit is the label."""
    images = torch.as_tensor(images)
    labels = torch.as_tensor(labels)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {labels.shape[0]} labels")
    dtype = next(model.parameters()).dtype
    correct = 0
    for i in range(0, images.shape[0], batch_size):
        logits = model(images[i:i + batch_size].to(dtype))
        correct += int((logits.argmax(dim=-1) == labels[i:i + batch_size]).sum())
    return correct / images.shape[0]


def weights_path(variant: str) -> Path:
    """Where the weights of ``variant`` ship: ``tfbook/weights/vit_digits_<variant>.pt``."""
    config(variant)  # validates the name
    return _WEIGHTS / f"vit_digits_{variant}.pt"


def save(model: VisionTransformer, losses: list[float], variant: str, seed: int = 0) -> Path:
    """Write the weights (as float16, to keep the package small) and the loss curve."""
    path = weights_path(variant)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16) for k, v in model.state_dict().items()}
    torch.save({"variant": variant, "seed": seed, "config": asdict(model.config),
                "recipe": dict(RECIPE), "state_dict": state,
                "losses": torch.tensor(losses, dtype=torch.float32)}, path)
    return path


def load(variant: str = "cls-1d") -> tuple[VisionTransformer, list[float]]:
    """The shipped model of ``variant`` (float32, eval mode) and its training losses."""
    path = weights_path(variant)
    if not path.is_file():
        raise ValueError(f"no weights for {variant!r} at {path}; run `python -m tfbook.vit_digits`")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    model = VisionTransformer(config(variant))
    model.load_state_dict({k: v.to(torch.float32) for k, v in blob["state_dict"].items()})
    model.eval()
    return model, blob["losses"].tolist()


def main() -> None:  # pragma: no cover - run by hand to regenerate the weights
    from .data import load_digits_images

    data = load_digits_images()
    for variant in VARIANTS:
        model, losses = train(variant, disable=False)
        path = save(model, losses, variant)
        loaded, _ = load(variant)
        acc = accuracy(loaded, data.X_test, data.y_test)
        print(f"{variant}: test accuracy {acc:.4f} (float16 weights), final loss "
              f"{np.mean(losses[-50:]):.4f}, {path.stat().st_size / 1024:.0f} KiB -> {path}")


if __name__ == "__main__":  # pragma: no cover
    main()
