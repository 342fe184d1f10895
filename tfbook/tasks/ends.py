"""Do the ends match? Chapter 6's contrast run: an ORDER task with the set task's recipe.

A sequence is ``T = 8`` letters from an alphabet of ``N_LETTERS = 16``, seven different letters
one of which occurs twice (the positives of :mod:`tfbook.tasks.duplicates`). The label is 1
when the twin sits at both ends (first letter == last letter) and 0 when it does not. The
sequences come in **pairs**: one multiset of letters, arranged once with the twin at both ends
(label 1) and once in a random order whose ends differ (label 0). Both classes therefore hold
exactly the same multisets, and the label is a property of the *order*, never of the set.

Consequence, exact: a model whose output is a function of the multiset alone (chapter 6's
mean-pooled encoder with no positions is permutation-invariant) gives both members of a pair
the same logits, hence the same answer, which is right on exactly one of them. On a test set
made of whole pairs its accuracy is exactly 1/2, whatever its weights, and its mean
cross-entropy is at least ln 2 (a pair given probability ``p`` of label 1 costs
``-ln p - ln(1 - p) >= 2 ln 2``). The model with learned
positions has no such bound.

The models are those of :mod:`tfbook.tasks.duplicates` (:class:`~tfbook.tasks.duplicates.PoolingEncoder`,
mean pooling, L = 2, D = 32, H = 2, D_ff = 64), trained with its ``RECIPE`` (1,500 steps of
128, learning rate 3e-3, best validation accuracy kept, every 100 steps; ties broken by the
lower validation cross-entropy, see :func:`_score`). Two variants
(``VARIANTS``): ``"set"`` (no positions) and ``"mean"`` (learned positions), 3 seeds each.
Validation and test: 1,000 pairs each (2,000 sequences), disjoint, and training rejects every
held-out multiset.

:func:`run` trains the six models (about 15 CPU-seconds each, 80 for all six, measured when they
were shipped); the command ships the result
(``ends_results.json``: accuracy of every run, in float64 from the float16 weights) and the
float16 weights of all six (``ends_weights.pt``, :func:`load_seed`)::

    python -m tfbook.tasks.ends            # or --out DIR
"""

from __future__ import annotations

import copy
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..torch.training import History
from ..torch.training import train as train_loop
from ._common import Splits, cli, load_blob, load_json, load_state, pick, shipped, write_json
from .duplicates import N_LETTERS, RECIPE, T, PoolingConfig, PoolingEncoder, _rounded, accuracy

__all__ = ["N_LETTERS", "T", "VARIANTS", "SEEDS", "RECIPE", "ARTIFACTS", "sample", "data", "config",
           "make_model", "train", "evaluate", "cross_entropy", "run", "save", "load_seed", "load_results", "load_pretrained", "main"]

#: name -> (pooling, learned positions?), as in :data:`tfbook.tasks.duplicates.VARIANTS`
VARIANTS = {"set": ("mean", False), "mean": ("mean", True)}
SEEDS = (0, 1, 2)
ARTIFACTS = ("ends_results.json", "ends_weights.pt")


def sample(n_pairs: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``2 n_pairs`` sequences ``(2 n_pairs, T)`` and labels: rows ``2i`` (label 1, the twin at
    both ends) and ``2i + 1`` (label 0, the same letters, ends different) share one multiset."""
    letters = np.argsort(rng.random((n_pairs, N_LETTERS)), axis=1)[:, : T - 1]  # 7 distinct letters
    twin, rest = letters[:, :1], letters[:, 1:]                                 # the first one repeats
    pos = np.concatenate([twin, rest, twin], axis=1)                             # twin ... twin
    neg = np.take_along_axis(pos, np.argsort(rng.random((n_pairs, T)), axis=1), axis=1)
    same = neg[:, 0] == neg[:, -1]                                               # ends equal: move one
    neg[same, 0], neg[same, 1] = neg[same, 1], neg[same, 0].copy()
    ids = np.empty((2 * n_pairs, T), dtype=np.int64)
    ids[0::2], ids[1::2] = pos, neg
    labels = np.tile(np.array([1, 0], dtype=np.int64), n_pairs)
    return ids, labels


def _keys(ids: np.ndarray) -> np.ndarray:
    """One integer per multiset (the sorted letters' code)."""
    return (np.sort(ids, axis=1) * (N_LETTERS ** np.arange(T, dtype=np.int64))).sum(axis=1)


def data(seed: int = 0) -> Splits:
    """``Splits(train, validation, test)``: validation and test are ``(ids, labels)`` tensors of
    1,000 pairs each (disjoint multisets); ``train`` holds the keys of every held-out multiset."""
    n_val, n_test = RECIPE["n_validation"] // 2, RECIPE["n_test"] // 2
    val = sample(n_val, np.random.default_rng(seed + 3000))
    test = sample(n_test + 200, np.random.default_rng(seed + 4000))
    keep = np.repeat(~np.isin(_keys(test[0][0::2]), _keys(val[0])), 2)  # whole pairs
    test = (test[0][keep][: 2 * n_test], test[1][keep][: 2 * n_test])
    held = np.concatenate([_keys(val[0]), _keys(test[0])])
    as_t = lambda p: (torch.from_numpy(p[0]), torch.from_numpy(p[1]))  # noqa: E731
    return Splits(held, as_t(val), as_t(test))


def _batch(held, batch_size, generator):
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    ids, y = sample(batch_size // 2 + 8, np.random.default_rng(seed))
    keep = np.repeat(~np.isin(_keys(ids[0::2]), held), 2)
    return torch.from_numpy(ids[keep][:batch_size]), torch.from_numpy(y[keep][:batch_size])


def _loss(model, ids, y):
    return nn.functional.cross_entropy(model(ids), y)


@torch.no_grad()
def cross_entropy(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean cross-entropy (nats) of ``model`` on ``(ids, labels)``, in the model's dtype."""
    model.eval()
    return float(nn.functional.cross_entropy(model(ids), labels))


def _score(model, ids, y) -> float:
    """Validation accuracy, ties broken by the lower cross-entropy (accuracies are multiples of
    1/2000 and the loss is below 10, so ``1e-6 * loss`` never reorders two accuracies). Without
    the tie-break a model held at exactly 1/2 (the one without positions) would keep its
    step-0 weights."""
    return accuracy(model, ids, y) - 1e-6 * cross_entropy(model, ids, y)


def config(variant: str = "set", **overrides) -> PoolingConfig:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {tuple(VARIANTS)}, got {variant!r}")
    pooling, positions = VARIANTS[variant]
    return PoolingConfig(pooling=pooling, positions=positions, **overrides)


def make_model(variant: str = "set", seed: int = 0) -> PoolingEncoder:
    torch.manual_seed(seed)
    return PoolingEncoder(config(variant))


def evaluate(model: nn.Module, split="test") -> float:
    """Accuracy on ``split``, in float64 (a float64 copy of the model)."""
    ids, labels = pick(data(), split)
    return accuracy(copy.deepcopy(model).double(), ids, labels)


def train(variant: str = "set", seed: int = 0, steps: int | None = None,
          disable: bool = True) -> tuple[PoolingEncoder, History]:
    """Train one model from scratch with :data:`RECIPE` (chapter 6's set-task recipe); best
    weights on validation kept."""
    r = dict(RECIPE, steps=RECIPE["steps"] if steps is None else int(steps), seed=int(seed))
    splits = data()
    model = make_model(variant, seed)
    v_ids, v_y = splits.validation
    history = train_loop(
        model, _loss, lambda g: _batch(splits.train, r["batch_size"], g), r["steps"],
        lr=r["lr"], grad_clip=r["grad_clip"], schedule=("hold_linear", int(r["hold"] * r["steps"])),
        eval_fn=lambda m: _score(m, v_ids, v_y), eval_every=100, maximize=True, keep_best=True,
        seed=seed, threads=1, deterministic=True, disable=disable, desc=f"ends {variant} s{seed}")
    history.extra.update(recipe=r, variant=variant)
    return model.eval(), history


def run(seeds=SEEDS, steps: int | None = None, disable: bool = True,
        variants=tuple(VARIANTS)) -> tuple[dict, dict]:
    """Train every variant with every seed. Returns ``(result, models)``: ``result[variant]``
    holds per-seed lists ``test`` and ``validation`` (float64 accuracy of the float16-rounded
    weights), ``best_step`` and ``test_cross_entropy`` (float64, nats); ``models[(variant, seed)]`` the rounded model."""
    result = {"recipe": dict(RECIPE, steps=steps or RECIPE["steps"]), "seeds": list(seeds)}
    models = {}
    for v in variants:
        rec = {"test": [], "validation": [], "best_step": []}
        for s in seeds:
            model, hist = train(v, s, steps, disable)
            model = _rounded(model)
            rec["test"].append(evaluate(model, "test"))
            rec["validation"].append(evaluate(model, "validation"))
            rec["best_step"].append(hist.best_step)
            rec.setdefault("test_cross_entropy", []).append(
                cross_entropy(copy.deepcopy(model).double(), *data().test))
            models[(v, s)] = model
            print(v, s, "test", rec["test"][-1], "best step", hist.best_step, flush=True)
        result[v] = rec
    return result, models


def save(result: dict, models: dict, folder) -> list:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ARTIFACTS[1]
    torch.save({"config": {v: asdict(m.config) for (v, _), m in models.items()},
                "state_dicts": {f"{v}/{s}": {k: t.detach().half().clone() for k, t in m.state_dict().items()}
                                for (v, s), m in models.items()}}, path)
    return [write_json(folder / ARTIFACTS[0], result), path]


def load_seed(variant: str = "set", seed: int = 0, folder=None) -> PoolingEncoder:
    """The shipped model of ``variant`` trained with ``seed`` (float32 from float16, eval mode)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {tuple(VARIANTS)}, got {variant!r}")
    if seed not in SEEDS:
        raise ValueError(f"seed must be one of {SEEDS}, got {seed!r}")
    blob = load_blob(shipped(ARTIFACTS[1], folder))
    return load_state(PoolingEncoder(PoolingConfig(**blob["config"][variant])), blob["state_dicts"][f"{variant}/{seed}"])


def load_results(folder=None) -> dict:
    """The shipped result of :func:`run` (``ends_results.json``)."""
    return load_json(ARTIFACTS[0], folder)


def load_pretrained(folder=None) -> dict:
    """The shipped result (an experiment's verb; the same as :func:`load_results`)."""
    return load_results(folder)


def main(argv=None) -> None:  # pragma: no cover - writes the shipped artifacts
    def go(out, args):
        result, models = run(disable=True)
        print(save(result, models, out))

    cli(__doc__, go, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
