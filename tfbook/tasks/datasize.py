"""Chapter 15's data-size experiment: a small CNN against the ViT on 150, 400 and all training images.

The claim it measures: a ViT, which is told nothing about locality, needs more data than a
convolutional network of about the same size, which is. Two models, both trained with the
recipe of :mod:`tfbook.tasks.digits` (AdamW, one-cycle schedule, the same augmentation,
1,000 steps of 128 images, the weights of the step with the lowest validation cross-entropy
kept):

* ``vit``: the chapter's main model, ``digits.config("cls-1d")``;
* ``cnn``: :class:`SmallCNN`, three 3x3 convolutions (16, 32, 40 channels, ReLU, two 2x2 max
  pools) and a linear read-out, with a parameter count within 2% of the ViT's.

Each is trained on a stratified random subset of ``n`` of the 1,211 fitting images
(:data:`SIZES`: 150, 400 and all of them; the subset is drawn with the run's seed, so the three
seeds see different subsets), three seeds each. Every run is scored on the same 136 validation
images (carved by :func:`tfbook.tasks.digits.data`, never trained on) and on the 450 test
images. Choices are made on validation only: the stopping step of every run, and the CNN's
peak learning rate, picked from :data:`CNN_LRS` by the validation accuracy of its seed-0 run
on all the images (the ViT keeps the recipe chosen for it in chapter 15's task). The test
accuracies are computed once, at the end of each run, and shipped; the chapter reads them.

The 17 runs (the grid less the 3 shipped ViTs, plus the search) take about 25 minutes on a shared 2-core
CPU, so the result ships in ``tfbook/weights/datasize.json`` with the weights of two runs
(both models on 150 images, seed 0) that the chapter re-evaluates live. Regenerate with::

    python -m tfbook.tasks.datasize --processes 2     # or --out DIR

The ViT runs on all the images are the shipped ``digits`` models (the same recipe, data and
seeds); ``--retrain-vit-all`` trains them again instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..torch.models import VisionTransformer
from ..torch.training import train as train_loop
from . import digits as D
from ._common import cli, load_blob, load_state, shipped, write_json

__all__ = ["SIZES", "SEEDS", "MODELS", "CNN_LRS", "RECIPE", "ARTIFACTS", "SmallCNN", "data", "config",
           "subset", "train", "experiment", "load_pretrained", "load_model", "save", "main"]

#: training-set sizes; None is all 1,211 fitting images
SIZES: tuple = (150, 400, None)
SEEDS: tuple = (0, 1, 2)
MODELS: tuple = ("cnn", "vit")
#: the CNN's peak learning rates tried (all images, seed 0); the best validation accuracy is kept
CNN_LRS: tuple = (1e-3, 3e-3, 1e-2)
#: the recipe shared with tfbook.tasks.digits (the learning rate of the CNN is chosen on validation)
RECIPE: dict = dict(D.RECIPE)
RESULT_FILE = "datasize.json"
ARTIFACTS = (RESULT_FILE, "datasize_cnn_150_seed0.pt", "datasize_vit_150_seed0.pt")


class SmallCNN(nn.Module):
    """Three 3x3 convolutions (padding 1, ReLU) with 2x2 max pools after the second and third,
    then a linear read-out of the flattened (C3, 2, 2) map: 8x8 digits -> 10 logits."""

    def __init__(self, channels=(16, 32, 40), num_classes: int = 10):
        super().__init__()
        c1, c2, c3 = channels
        self.channels = tuple(channels)
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 8x8 -> 4x4
            nn.Conv2d(c2, c3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 4x4 -> 2x2
        )
        self.head = nn.Linear(c3 * 4, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or tuple(images.shape[1:]) != (1, 8, 8):
            raise ValueError(f"images must be (B, 1, 8, 8), got {tuple(images.shape)}")
        return self.head(self.features(images).flatten(1))


def config(model: str = "cnn"):
    """The ViT's :class:`ViTConfig`, or the CNN's channel tuple."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    return D.config("cls-1d") if model == "vit" else (16, 32, 40)


def _build(model: str) -> nn.Module:
    return VisionTransformer(config("vit")) if model == "vit" else SmallCNN(config("cnn"))


def data():
    """The splits of :func:`tfbook.tasks.digits.data` (1,211 fitting, 136 validation, 450 test)."""
    return D.data()


def subset(n: int | None, seed: int, labels: torch.Tensor) -> torch.Tensor:
    """Indices of a stratified random subset of ``n`` fitting images (all when ``n`` is None),
    drawn with ``seed``: about ``n / 10`` per class, the remainder to the first classes."""
    labels = np.asarray(labels)
    if n is None:
        return torch.arange(len(labels))
    if not 10 <= n <= len(labels):
        raise ValueError(f"n must be in [10, {len(labels)}] or None, got {n}")
    rng = np.random.default_rng(1000 + seed)
    classes = np.unique(labels)
    per = [n // len(classes) + (k < n % len(classes)) for k in range(len(classes))]
    idx = [rng.permutation(np.flatnonzero(labels == c))[:m] for c, m in zip(classes, per)]
    return torch.from_numpy(np.sort(np.concatenate(idx)))


def train(model: str, n: int | None, seed: int, lr: float | None = None, steps: int | None = None):
    """Train ``model`` on ``n`` fitting images with ``seed``; return ``(net, run)`` where ``run``
    holds the validation and test accuracies and the kept step."""
    r = dict(RECIPE)
    lr = r["lr"] if lr is None else lr
    steps = r["steps"] if steps is None else steps
    splits = data()
    X, y = splits.train
    keep = subset(n, seed, y)
    X, y = X[keep], y[keep]
    Xv, yv = splits.validation

    def batch_fn(generator):
        idx = torch.randint(0, X.shape[0], (r["batch_size"],), generator=generator)
        return D.augment(X[idx], generator, r["max_angle"], r["max_scale"], r["max_shift"]), y[idx]

    torch.manual_seed(seed)
    net = _build(model)
    history = train_loop(net, D._loss, batch_fn, steps, lr=lr, weight_decay=r["weight_decay"],
                         schedule=("one_cycle", r["warmup"]), seed=seed, threads=1, disable=True,
                         eval_fn=lambda m: float(D._loss(m, Xv, yv)), eval_every=r["eval_every"],
                         keep_best=True, desc=f"{model} n={n}")
    return net, _score(net, model, len(y), seed, lr, history.best_step)


def _score(net, model, n, seed, lr, best_step) -> dict:
    import copy

    splits = data()
    m64 = copy.deepcopy(net).double()          # float64: no CPU-dependent round-off in the counts
    Xv, yv = splits.validation
    Xt, yt = splits.test
    return dict(model=model, n=int(n), seed=int(seed), lr=float(lr), best_step=int(best_step),
                params=int(sum(p.numel() for p in net.parameters())),
                val_correct=int(round(D.accuracy(m64, Xv, yv) * len(yv))), val_total=int(len(yv)),
                test_correct=int(round(D.accuracy(m64, Xt, yt) * len(yt))), test_total=int(len(yt)))


def _job(args):
    model, n, seed, lr = args
    torch.set_num_threads(1)
    if model == "vit" and n == "shipped":                 # the digits task's cls-1d models: same recipe
        net, hist = D.load_pretrained("cls-1d", seed)
        run = _score(net, "vit", len(data().train[1]), seed, RECIPE["lr"], hist.best_step)
    else:
        net, run = train(model, n, seed, lr=lr)
    return run, {k: v.detach().clone() for k, v in net.state_dict().items()}


def experiment(out=None, retrain_vit_all: bool = False, processes: int = 1, log=print) -> dict:
    """The whole experiment: the CNN's learning-rate search on validation (all images, seed 0),
    then every model, size and seed (``processes`` runs at a time; each run is one thread and
    does not depend on the others). Writes the two re-checked runs' weights into ``out``."""
    from multiprocessing import get_context

    pool = get_context("spawn").Pool(processes) if processes > 1 else None
    run_all = pool.map if pool is not None else (lambda f, xs: list(map(f, xs)))
    search = [r for r, _ in run_all(_job, [("cnn", None, 0, lr) for lr in CNN_LRS])]
    for r in search:
        log(f"search cnn lr={r['lr']:g} seed 0: val {r['val_correct']}/{r['val_total']}")
    lr_cnn = max(CNN_LRS, key=lambda lr: ([r["val_correct"] for r in search if r["lr"] == lr][0],
                                          -abs(np.log(lr / RECIPE["lr"]))))
    jobs = [("cnn", None, s, lr_cnn) for s in SEEDS if s != 0]
    jobs += [(m, n, s, lr_cnn if m == "cnn" else None) for m in MODELS for n in SIZES if n is not None
             for s in SEEDS]
    jobs += [("vit", None if retrain_vit_all else "shipped", s, None) for s in SEEDS]
    done = run_all(_job, jobs)
    if pool is not None:
        pool.close()
    runs = [r for r in search if r["lr"] == lr_cnn] + [r for r, _ in done]
    for (model, n, seed, _), (run, state) in zip(jobs, done):
        log(f"{model} n={run['n']} seed {seed}: val {run['val_correct']}/{run['val_total']} "
            f"test {run['test_correct']}/{run['test_total']}")
        if out is not None and n == 150 and seed == 0:
            path = Path(out) / f"datasize_{model}_150_seed0.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model, "state_dict": state, "run": run}, path)
    n_all = len(data().train[1])
    return dict(recipe=RECIPE, cnn_lrs=list(CNN_LRS), lr_cnn=lr_cnn, search=search, runs=runs,
                sizes=[n if n is not None else n_all for n in SIZES], seeds=list(SEEDS))


def save(result: dict, folder) -> list:
    return [write_json(Path(folder) / RESULT_FILE, result)]


def load_pretrained(folder=None) -> dict:
    """The shipped result: ``runs`` (one dict per model, size and seed: validation and test
    counts), the CNN's learning-rate ``search`` and the ``lr_cnn`` it chose."""
    path = shipped(RESULT_FILE, folder)
    return json.loads(Path(str(path)).read_text()) if folder is not None else json.loads(path.read_text())


def load_model(model: str, folder=None):
    """The shipped weights (float32, eval mode) of ``model`` trained on 150 images with seed 0,
    and the run record written beside them."""
    config(model)
    name = f"datasize_{model}_150_seed0.pt"
    blob = load_blob(shipped(name, folder))
    return load_state(_build(model), blob["state_dict"]), blob["run"]


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped files
    def add(parser):
        parser.add_argument("--retrain-vit-all", action="store_true",
                            help="train the ViT on all images again instead of loading the digits models")
        parser.add_argument("--processes", type=int, default=1, help="runs trained at a time (one thread each)")

    def run(out, args):
        result = experiment(out, retrain_vit_all=args.retrain_vit_all, processes=args.processes)
        print(f"wrote {save(result, out)}")

    cli(__doc__, run, add_arguments=add, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
