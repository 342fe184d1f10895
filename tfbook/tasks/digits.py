"""The Vision Transformer of chapter 15 on scikit-learn's 8x8 digits: six variants, three seeds each.

Training every variant and seed the chapter compares takes about half an hour on a shared
2-core CPU, longer than a chapter may run, so the trained weights ship in ``tfbook/weights/``
(float16, about 50 KB a model) and the chapter loads them (:func:`load_pretrained`).
Regenerate them with::

    python -m tfbook.tasks.digits                                # every variant and seed; or --out DIR
    python -m tfbook.tasks.digits --variant cls-1d --seed 0      # one of them (both repeatable)

:func:`train` is the whole recipe: AdamW with a one-cycle learning-rate schedule, small
random rotations, rescalings and sub-pixel shifts of the training images, one CPU thread
(deterministic, and independent of the thread count), and the weights of the step with the
lowest validation cross-entropy kept at the end. The same variant and seed give the same
losses and weights on the same machine. :func:`evaluate` is the accuracy.

Splits: :func:`tfbook.data.load_digits_images` gives 1,347 training and 450 test images
(stratified). :func:`data` carves a stratified validation split, 10% of each class
(:data:`VALIDATION_FRACTION`, 136 images), from the training images, never from the test
images; the models train on the other 1,211. Every choice (the recipe's stopping step, the
variant) is made on the validation split; the test split is read once, at the end of the
chapter. ``data(validation_fraction=0.0)`` gives the whole training set and no validation.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..torch.models import ViTConfig, VisionTransformer
from ..torch.training import History
from ..torch.training import train as train_loop
from ._common import Splits, cli, load_blob, load_state, pick, shipped

__all__ = ["VARIANTS", "SEEDS", "VALIDATION_FRACTION", "BASE", "RECIPE", "ARTIFACTS", "data", "config", "augment", "train", "accuracy",
           "evaluate", "load_pretrained", "save", "main"]

#: the models the chapter compares: how the image is read out, and how positions enter
VARIANTS: dict[str, dict] = {
    "cls-1d": {"pooling": "cls", "pos": "1d"},  # the ViT paper's choice; the chapter's main model
    "mean-1d": {"pooling": "mean", "pos": "1d"},
    "cls-2d": {"pooling": "cls", "pos": "2d"},
    "mean-2d": {"pooling": "mean", "pos": "2d"},
    "cls-2d-learned": {"pooling": "cls", "pos": "2d-learned"},  # learned row + column tables
    "cls-none": {"pooling": "cls", "pos": "none"},  # no position information at all
}

#: every variant is trained with each of these seeds (initialisation, batches, augmentation)
SEEDS: tuple = (0, 1, 2)

#: share of each class of the 1,347 training images held out for validation (136 images)
VALIDATION_FRACTION: float = 0.1

#: the architecture shared by every variant (8x8 images, 2x2 patches: 16 tokens)
BASE: dict = {"image_size": 8, "patch_size": 2, "d_model": 32, "num_heads": 4,
              "num_layers": 2, "d_ff": 64}

#: the training recipe shared by every variant
RECIPE: dict = {
    "steps": 1000,  # AdamW steps of batch_size images (about 105 passes over the 1211 training images)
    "batch_size": 128,
    "lr": 3e-3,  # peak of the one-cycle schedule
    "warmup": 0.1,  # fraction of the steps spent warming up
    "weight_decay": 0.05,
    "max_angle": 10.0,  # augmentation: rotation in degrees, uniform in [-max_angle, max_angle]
    "max_scale": 0.1,  # zoom factor uniform in [1 - max_scale, 1 + max_scale]
    "max_shift": 0.5,  # shift in pixels, uniform in [-max_shift, max_shift] on each axis
    "eval_every": 50,  # validation cross-entropy every 50 steps; the best step's weights are kept
}

#: the files ``python -m tfbook.tasks.digits`` writes, one per variant
def _file(variant: str, seed: int = 0) -> str:
    config(variant)  # validates the name
    return f"vit_digits_{variant}.pt" if seed == 0 else f"vit_digits_{variant}_seed{seed}.pt"


def data(validation_fraction: float = VALIDATION_FRACTION, seed: int = 0) -> Splits:
    """``Splits(train, validation, test)``, each a pair ``(images (N, 1, 8, 8) float32, labels (N,))``.

    ``validation`` is None unless ``validation_fraction > 0``: then that share of each
    class of the training images (seeded) becomes the validation split.
    """
    from ..data import load_digits_images

    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
    d = load_digits_images()
    X, y = torch.from_numpy(d.X_train), torch.from_numpy(d.y_train)
    test = (torch.from_numpy(d.X_test), torch.from_numpy(d.y_test))
    if validation_fraction == 0.0:
        return Splits((X, y), None, test)
    rng = np.random.default_rng(seed + 1)
    is_val = np.zeros(len(y), dtype=bool)
    for c in np.unique(d.y_train):
        idx = rng.permutation(np.flatnonzero(d.y_train == c))
        is_val[idx[: int(round(validation_fraction * idx.size))]] = True
    is_val = torch.from_numpy(is_val)
    return Splits((X[~is_val], y[~is_val]), (X[is_val], y[is_val]), test)


def config(variant: str = "cls-1d") -> ViTConfig:
    """The :class:`ViTConfig` of ``variant`` (a key of :data:`VARIANTS`)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    return ViTConfig(**BASE, **VARIANTS[variant])


#: the files ``python -m tfbook.tasks.digits`` writes, one per variant and seed
ARTIFACTS = tuple(_file(v, s) for v in VARIANTS for s in SEEDS)


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


def _loss(model, images, labels):
    return nn.functional.cross_entropy(model(images), labels)


def train(variant: str = "cls-1d", seed: int = 0, steps: int | None = None, disable: bool = True,
          validation_fraction: float = VALIDATION_FRACTION) -> tuple[VisionTransformer, History]:
    """Train ``variant`` on the training split of :func:`data`.

    Returns the model (in eval mode, float32) and its history (``loss``: cross-entropy of
    every step; ``eval``: validation cross-entropy every ``RECIPE["eval_every"]`` steps).
    The weights returned are those of the step with the lowest validation cross-entropy
    (``history.best_step``). ``steps`` defaults to ``RECIPE["steps"]``; ``disable=False``
    shows a bar. The test images are never touched.
    """
    r = dict(RECIPE)
    steps = r["steps"] if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an integer >= 2 (a one-cycle schedule), got {steps!r}")
    splits = data(validation_fraction)
    X, y = splits.train
    cfg = config(variant)
    eval_kw = {}
    if splits.validation is not None:
        Xv, yv = splits.validation
        eval_kw = dict(eval_fn=lambda m: float(_loss(m, Xv, yv)), eval_every=min(r["eval_every"], steps),
                       keep_best=True)

    def batch_fn(generator):
        idx = torch.randint(0, X.shape[0], (r["batch_size"],), generator=generator)
        return augment(X[idx], generator, r["max_angle"], r["max_scale"], r["max_shift"]), y[idx]

    torch.manual_seed(seed)
    model = VisionTransformer(cfg)
    history = train_loop(model, _loss, batch_fn, steps, lr=r["lr"], weight_decay=r["weight_decay"],
                         schedule=("one_cycle", r["warmup"]), seed=seed, threads=1,
                         disable=disable, desc=f"ViT {variant}", **eval_kw)
    history.extra.update(recipe=dict(r, steps=steps), variant=variant, seed=seed)
    return model, history


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


def evaluate(model: nn.Module, split="test") -> float:
    """Accuracy on ``split`` (``"train"``, ``"test"``, ``"validation"`` when carved, or
    ``(images, labels)``). Choose on ``"validation"``; read ``"test"`` once, at the end."""
    return accuracy(model, *pick(data(), split))


def load_pretrained(variant: str = "cls-1d", seed: int = 0, folder=None) -> tuple[VisionTransformer, History]:
    """The shipped model of ``variant`` trained with ``seed`` (float32, eval mode) and its
    training history; ``folder``: read a regenerated file from there instead."""
    if seed not in SEEDS:
        raise ValueError(f"seed must be one of {SEEDS}, got {seed!r}")
    path = shipped(_file(variant, seed), folder)
    if not path.is_file():
        raise ValueError(f"no weights for {variant!r} seed {seed} at {path}; run `python -m tfbook.tasks.digits`")
    blob = load_blob(path)
    model = load_state(VisionTransformer(config(variant)), blob["state_dict"])
    history = History(loss=blob["losses"].tolist(), eval_step=blob["eval_step"].tolist(),
                      eval=blob["eval"].tolist(), best_step=blob["best_step"],
                      best_eval=float(blob["eval"][blob["eval_step"].tolist().index(blob["best_step"])]),
                      extra={"recipe": blob["recipe"], "variant": variant, "seed": blob["seed"]})
    return model, history


def save(model: VisionTransformer, history: History, folder, variant: str | None = None) -> list:
    """Write the weights (float16, to keep the package small) and the loss curve of one
    variant into ``folder``."""
    variant = variant or history.extra["variant"]
    seed = history.extra.get("seed", 0)
    path = Path(folder) / _file(variant, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16) for k, v in model.state_dict().items()}
    torch.save({"variant": variant, "seed": seed, "config": asdict(model.config),
                "recipe": history.extra.get("recipe", dict(RECIPE)), "state_dict": state,
                "losses": torch.tensor(history.loss, dtype=torch.float32),
                "eval_step": torch.tensor(history.eval_step, dtype=torch.int64),
                "eval": torch.tensor(history.eval, dtype=torch.float32), "best_step": history.best_step}, path)
    return [path]


def main(argv=None) -> None:  # pragma: no cover - run by hand to regenerate the weights
    def add(parser):
        parser.add_argument("--variant", action="append", choices=list(VARIANTS),
                            help="train only this variant (repeatable; default: all six)")
        parser.add_argument("--seed", action="append", type=int, choices=list(SEEDS),
                            help="train only this seed (repeatable; default: all of SEEDS)")
        parser.add_argument("--steps", type=int, default=None, help="override RECIPE['steps']")

    def run(out, args):
        for variant in args.variant or list(VARIANTS):
            for seed in args.seed or list(SEEDS):
                model, history = train(variant, seed=seed, steps=args.steps, disable=True)
                (path,) = save(model, history, out, variant)
                print(f"{variant} seed {seed}: best validation cross-entropy {history.best_eval:.4f} "
                      f"at step {history.best_step}, validation accuracy {evaluate(model, 'validation'):.4f}, "
                      f"{path.stat().st_size / 1024:.0f} KiB -> {path}", flush=True)

    cli(__doc__, run, add, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
