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
images. Choices are made on validation only: the stopping step of every run, and each model's
peak learning rate **for each size**, picked from :data:`LRS` by the validation count of its
seed-0 run (a tie goes to the rate closer to the recipe's, :func:`choose_lr`); the two other
seeds train at the chosen rate. The test accuracies are computed once, at the end of each run,
and shipped; the chapter reads them.

The grid is 18 seed-0 runs (2 models x 3 sizes x 3 rates) and 12 more seeds, 30 runs of a few
CPU minutes each (over an hour on a shared 2-core CPU), so the result ships in ``tfbook/weights/datasize.json``
(``search``: every seed-0 run; ``chosen``; ``runs``: the grid at the chosen rates) with the weights
of two runs (both models on 150 images, seed 0) that the chapter re-evaluates live. Every finished
run is appended to ``datasize_runs.jsonl`` in the output folder, so an interrupted command resumes
(the file is removed when the command completes).
Regenerate with::

    python -m tfbook.tasks.datasize --processes 2     # or --out DIR; --reuse shipped keeps equal runs

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
from ._common import cli, load_blob, load_json, load_state, shipped, write_json

__all__ = ["SIZES", "SEEDS", "MODELS", "LRS", "CNN_LRS", "choose_lr", "RECIPE", "ARTIFACTS", "SmallCNN", "data", "config",
           "subset", "train", "experiment", "load_pretrained", "load_model", "save", "main"]

#: training-set sizes; None is all 1,211 fitting images
SIZES: tuple = (150, 400, None)
SEEDS: tuple = (0, 1, 2)
MODELS: tuple = ("cnn", "vit")
#: the peak learning rates tried for each model and each size (seed 0); the best validation count is kept
LRS: tuple = (1e-3, 3e-3, 1e-2)
#: the former name (the CNN's rates), kept for old code
CNN_LRS: tuple = LRS
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


def choose_lr(search: list, model: str, n: int) -> float:
    """The peak learning rate of ``model`` on ``n`` images: the highest validation count among
    its seed-0 runs in ``search``; a tie goes to the rate closest (in log) to the recipe's."""
    cands = [r for r in search if r["model"] == model and r["n"] == n]
    if not cands:
        raise ValueError(f"search has no run of model {model!r} on n={n} images")
    best = max(cands, key=lambda r: (r["val_correct"], -abs(np.log(r["lr"] / RECIPE["lr"]))))
    return float(best["lr"])


def experiment(out=None, retrain_vit_all: bool = False, processes: int = 1, reuse=None, log=print) -> dict:
    """The whole experiment. For each model and each training-set size, a learning-rate search
    on validation (seed 0, every rate of :data:`LRS`), then the two other seeds at the chosen rate
    (``processes`` runs at a time; each run is one thread and does not depend on the others).
    ``reuse``: a former result (and its folder's weights) whose runs with the same model, size,
    seed and rate are taken instead of trained again (a run is deterministic: one thread,
    seeded). Writes the weights of both models' seed-0 runs on 150 images into ``out``."""
    from multiprocessing import get_context

    n_all = len(data().train[1])
    size = {n: (n_all if n is None else n) for n in SIZES}
    cache = {}
    if reuse is not None:
        prev = reuse if isinstance(reuse, dict) else load_pretrained(reuse if reuse != "shipped" else None)
        for r in prev.get("search", []) + prev["runs"]:
            cache[(r["model"], r["n"], r["seed"], float(r["lr"]))] = r
    pool = get_context("spawn").Pool(processes) if processes > 1 else None
    states = {}

    journal = None if out is None else Path(out) / "datasize_runs.jsonl"   # every finished run, as it ends
    if journal is not None and journal.is_file():                        # an interrupted command resumes
        for line in journal.read_text().splitlines():
            r = json.loads(line)
            cache[(r["model"], r["n"], r["seed"], float(r["lr"]))] = r

    def run_all(jobs):
        todo = [j for j in jobs if (j[0], size[j[1]], j[2], float(j[3])) not in cache]
        real = [("vit", "shipped", s, lr) if (m == "vit" and n is None and lr == RECIPE["lr"]
                                              and not retrain_vit_all) else (m, n, s, lr)
                for m, n, s, lr in todo]
        done = (pool.imap(_job, real) if pool is not None else map(_job, real))
        for (m, n, s, lr), (run, state) in zip(todo, done):
            cache[(m, size[n], s, float(lr))] = run
            states[(m, size[n], s, float(lr))] = state
            if journal is not None:
                journal.parent.mkdir(parents=True, exist_ok=True)
                with journal.open("a") as f:
                    f.write(json.dumps(run) + "\n")
            log(f"{m} n={size[n]} seed {s} lr={lr:g}: val {run['val_correct']}/{run['val_total']} "
                f"test {run['test_correct']}/{run['test_total']}")
        return [cache[(m, size[n], s, float(lr))] for m, n, s, lr in jobs]

    search = run_all([(m, n, 0, lr) for n in SIZES for m in MODELS for lr in LRS])   # the smallest size first
    chosen = {(m, size[n]): choose_lr(search, m, size[n]) for m in MODELS for n in SIZES}
    for (m, n), lr in chosen.items():
        log(f"chosen on validation: {m} on {n} images: lr={lr:g}")
    runs = run_all([(m, n, s, chosen[m, size[n]]) for m in MODELS for n in SIZES for s in SEEDS])
    if pool is not None:
        pool.close()
    if out is not None:
        for m in MODELS:
            key = (m, 150, 0, chosen[m, 150])
            path = Path(out) / f"datasize_{m}_150_seed0.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            if key in states:
                torch.save({"model": m, "state_dict": states[key], "run": cache[key]}, path)
            else:                                          # reused: the former weights must be that run's
                _, rec = load_model(m)
                if rec == cache[key]:
                    if Path(out).resolve() != shipped(path.name, None).parent.resolve():
                        path.write_bytes(shipped(path.name, None).read_bytes())
                else:                                      # train that run again (deterministic) for its weights
                    run, state = _job((m, 150, 0, chosen[m, 150]))
                    if run != cache[key]:
                        raise ValueError(f"retraining {key} gave {run}, the record holds {cache[key]}")
                    torch.save({"model": m, "state_dict": state, "run": run}, path)
    if journal is not None and journal.is_file():        # complete: the result holds every run
        journal.unlink()
    return dict(recipe=RECIPE, lrs=list(LRS), cnn_lrs=list(LRS), lr_cnn=chosen["cnn", n_all],
                chosen=[dict(model=m, n=n, lr=lr) for (m, n), lr in chosen.items()],
                search=search, runs=runs, sizes=[size[n] for n in SIZES], seeds=list(SEEDS))


def save(result: dict, folder) -> list:
    return [write_json(Path(folder) / RESULT_FILE, result)]


def load_pretrained(folder=None) -> dict:
    """The shipped result: ``runs`` (one dict per model, size and seed: validation and test
    counts), the CNN's learning-rate ``search`` and the ``lr_cnn`` it chose."""
    return load_json(RESULT_FILE, folder)


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
        parser.add_argument("--reuse", default=None,
                            help="'shipped' or a folder: take its runs of the same model, size, seed and rate")

    def run(out, args):
        result = experiment(out, retrain_vit_all=args.retrain_vit_all, processes=args.processes,
                            reuse=args.reuse)
        print(f"wrote {save(result, out)}")

    cli(__doc__, run, add_arguments=add, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
