"""Chapter 10's Muon experiment: Muon (with AdamW for the rest) against AdamW alone, at equal steps.

The model and data of chapter 10's ablation (:mod:`tfbook.tasks.ablation`): two-digit addition,
a small Pre-LN :class:`~tfbook.torch.models.DecoderLM`, its ``full`` recipe (warm-up then cosine,
clipping at 1, weight decay 0.1, 800 steps of 64 problems), trained through the one loop
:func:`tfbook.torch.training.train`. Only the optimiser differs:

* ``adamw``: ``torch.optim.AdamW`` on every parameter (the loop's default);
* ``muon``: :class:`tfbook.torch.optim.MuonAdamW`, Muon for the blocks' weight matrices and
  AdamW for the embedding (tied to the output head), the position table, biases and norm gains,
  one learning rate for both (Muon's update scaled to AdamW's RMS, ``adjust_lr_fn="match_rms_adamw"``).

For each optimiser the learning rate is chosen on the validation answer cross-entropy, averaged
over the seeds, from a grid widened until the best rate is not at its edge; the runs at the chosen
rates are the result, and the test split is read once, at the end (:func:`experiment`). The
command ships the measured result (``muon_experiment.json``: the grid, the chosen rates, the
curves, the recorded test figures) and the float16 weights of the chosen runs
(``muon_<optimiser>_<seed>.pt``), which the chapter evaluates::

    python -m tfbook.tasks.muon            # or --out DIR

The verbs of :mod:`tfbook.tasks`: ``RECIPE``, ``ARTIFACTS``, :func:`data`, :func:`config`,
:func:`train` (one optimiser and seed, a variant ``"<optimiser>-<seed>"``), :func:`evaluate`
(exact match), :func:`load_pretrained`, :func:`save`, :func:`main`; beside them
:func:`answer_loss`, :func:`experiment`, :func:`load_experiment`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from ..torch.models import DecoderLM, DecoderLMConfig, lm_loss
from ..torch.optim import MuonAdamW
from ..torch.training import History
from ..torch.training import train as train_loop
from . import ablation as abl
from . import addition as A
from ._common import cli, load_blob, load_state, pick, save_model, shipped

__all__ = ["RECIPE", "ARTIFACTS", "OPTIMISERS", "RESULT_FILE", "data", "config", "train", "answer_loss",
           "evaluate", "experiment", "load_pretrained", "load_experiment", "save", "save_experiment", "main"]

OPTIMISERS = ("adamw", "muon")
#: the ablation's ``full`` recipe; ``lrs``: the starting grid (half decades), widened by one
#: half decade at an edge while the best rate is there (at most ``max_widen`` times per side)
RECIPE = dict({k: v for k, v in abl.ABLATION_RECIPE.items() if k not in ("lr", "seeds")},
              lrs=(1e-3, 3e-3, 1e-2, 3e-2, 1e-1), seeds=(0, 1, 2), max_widen=2, block=10)
RESULT_FILE = "muon_experiment.json"
ARTIFACTS = (RESULT_FILE,) + tuple(f"muon_{o}_{s}.pt" for o in OPTIMISERS for s in RECIPE["seeds"])


def _variant(variant: str) -> tuple[str, int]:
    opt, _, seed = str(variant).partition("-")
    if opt not in OPTIMISERS or not seed.isdigit():
        raise ValueError(f"variant must be '<optimiser>-<seed>' with optimiser in {OPTIMISERS}, got {variant!r}")
    return opt, int(seed)


def _file(variant: str) -> str:
    opt, seed = _variant(variant)
    return f"muon_{opt}_{seed}.pt"


def data(recipe: dict | None = None):
    """The ablation's addition splits (:func:`tfbook.tasks.ablation.data`)."""
    return abl.data(dict(RECIPE, **(recipe or {})))


def config(recipe: dict | None = None) -> DecoderLMConfig:
    """The ablation's model (:func:`tfbook.tasks.ablation.config`)."""
    return abl.config(dict(RECIPE, **(recipe or {})))


def _optimizer(opt: str):
    return None if opt == "adamw" else MuonAdamW.build()


def answer_loss(model: DecoderLM, split="validation") -> float:
    """The mean cross-entropy (nats) of the answer tokens of ``split`` given their prompts, float64."""
    ids = pick(data(), split)
    x, y = A.answer_targets(ids, 2 * RECIPE["digits"] + 2)
    m = model.double() if next(model.parameters()).dtype != torch.float64 else model
    with torch.no_grad():
        out = float(lm_loss(m, x, y))
    model.float()
    return out


def evaluate(model: DecoderLM, split="validation") -> float:
    """Greedy exact-match rate on ``split`` (a name or token ids)."""
    ids = pick(data(), split)
    with torch.no_grad():
        return float(A.exact_match(model, ids, 2 * RECIPE["digits"] + 2).double().mean())


def _chosen_lr(opt: str) -> float:
    try:
        return float(load_experiment()["chosen_lr"][opt])
    except (FileNotFoundError, KeyError):
        return 1e-2


def train(variant: str = "muon-0", lr: float | None = None, steps: int | None = None, disable: bool = True,
          recipe: dict | None = None) -> tuple[DecoderLM, History]:
    """Train one optimiser with one seed (``variant = "<optimiser>-<seed>"``) at ``lr`` (default:
    the shipped chosen rate) through the one loop; one thread, deterministic algorithms. The
    history's ``extra`` holds the variant, the rate and the validation answer cross-entropy."""
    opt, seed = _variant(variant)
    r = dict(RECIPE, **(recipe or {}))
    steps = r["steps"] if steps is None else steps
    lr = _chosen_lr(opt) if lr is None else float(lr)
    splits = data(r)
    x_all, y_all = A.answer_targets(splits.train, 2 * r["digits"] + 2)
    torch.manual_seed(seed)
    model = DecoderLM(config(r))

    def batch_fn(generator):
        rows = torch.randint(0, x_all.shape[0], (r["batch_size"],), generator=generator)
        return x_all[rows], y_all[rows]

    knobs = abl._ablation_knobs("full", dict(r, warmup=min(r["warmup"], steps)))
    history = train_loop(model, lm_loss, batch_fn, steps, lr=lr, seed=seed, threads=1, deterministic=True,
                         disable=disable, desc=variant, optimizer=_optimizer(opt), **knobs)
    history.extra.update(variant=f"{opt}-{seed}", optimiser=opt, seed=seed, lr=lr,
                         val_loss=answer_loss(model, splits.validation))
    return model.eval(), history


def _blocks(values, block):
    v = np.asarray(values, dtype=float)
    n = len(v) // block * block
    return [round(float(x), 5) for x in v[:n].reshape(-1, block).mean(1)]


def experiment(recipe: dict | None = None, models: dict | None = None, log=print) -> dict:
    """The learning-rate grid for each optimiser (every seed), widened until the best mean
    validation answer cross-entropy is not at an edge; then the test split, read once, for the
    runs at the chosen rates. ``models`` receives the chosen runs' models under the variant."""
    r = dict(RECIPE, **(recipe or {}))
    result = {"recipe": {k: list(v) if isinstance(v, tuple) else v for k, v in r.items()},
              "grid": {}, "chosen_lr": {}, "runs": []}
    for opt in OPTIMISERS:
        lrs, grid, kept = list(r["lrs"]), {}, {}

        def run(lr):
            vals = []
            for seed in r["seeds"]:
                try:
                    model, h = train(f"{opt}-{seed}", lr=lr, recipe=r)
                    vals.append(h.extra["val_loss"])
                    kept[(lr, seed)] = (model, h)
                except ValueError:  # the loss diverged: the rate is too high
                    vals.append(math.inf)
            grid[lr] = vals
            log(f"{opt} lr={lr:g}: validation answer loss {[round(v, 4) for v in vals]}")

        for lr in lrs:
            run(lr)
        for _ in range(r["max_widen"]):
            mean = {lr: float(np.mean(v)) for lr, v in grid.items()}
            best = min(mean, key=mean.get)
            order = sorted(grid)
            if best == order[0]:
                run(float(f"{order[1] / 10:.3g}"))      # the half-decade ladder continued
            elif best == order[-1]:
                run(float(f"{order[-2] * 10:.3g}"))
            else:
                break
        mean = {lr: float(np.mean(v)) for lr, v in grid.items()}
        best = min(mean, key=mean.get)
        result["grid"][opt] = {f"{lr:g}": [round(v, 6) if math.isfinite(v) else None for v in grid[lr]]
                               for lr in sorted(grid)}
        result["chosen_lr"][opt] = best
        for seed in r["seeds"]:
            model, h = kept[(best, seed)]
            if models is not None:
                models[h.extra["variant"]] = (model, h)
            result["runs"].append(dict(variant=h.extra["variant"], optimiser=opt, seed=seed, lr=best,
                                       loss=_blocks(h.loss, r["block"]), val_loss=h.extra["val_loss"]))
    for run_ in result["runs"]:  # the test split, once, at the end
        model = models[run_["variant"]][0] if models is not None else None
        if model is not None:
            run_["test_loss"] = answer_loss(model, "test")
            run_["test_exact_match"] = evaluate(model, "test")
    return result


def save(model: DecoderLM, history: History, folder) -> list:
    """Write one run's float16 weights and history to ``muon_<optimiser>_<seed>.pt`` in ``folder``."""
    return [save_model(Path(folder) / _file(history.extra["variant"]), model, history)]


def save_experiment(result: dict, folder) -> Path:
    path = Path(folder) / RESULT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    return path


def load_pretrained(variant: str = "muon-0", folder=None) -> tuple[DecoderLM, History]:
    """A shipped run at its chosen rate: ``(model, History)``, float32 from float16, eval mode."""
    blob = load_blob(shipped(_file(variant), folder))
    model = load_state(DecoderLM(DecoderLMConfig(**blob["config"])), blob["state_dict"])
    return model, History.from_dict(blob["history"])


def load_experiment(folder=None) -> dict:
    """The shipped result of :func:`experiment` (``muon_experiment.json``)."""
    return json.loads(shipped(RESULT_FILE, folder).read_text())


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped files
    """``python -m tfbook.tasks.muon [--out DIR]``: rerun the experiment, write its artifacts."""
    def run(out, args):
        models = {}
        result = experiment(models=models)
        print(f"wrote {save_experiment(result, out)}")
        for model, h in models.values():
            print(f"wrote {save(model, h, out)[0]}")

    cli(__doc__, run, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
