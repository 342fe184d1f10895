"""Chapter 23's recall experiment: softmax attention, linear attention, DeltaNet, Gated DeltaNet and a
3:1 hybrid (three Gated DeltaNet layers, then one softmax layer), 3 seeds, a learning rate chosen per
model on validation, on two associative-recall tasks.

``base`` is chapter 17's task with its own data generator (:func:`tfbook.tasks.recall.recall_batch`:
12 (key, value) pairs, keys drawn without repetition from 32, values from 8, then a query key) and
its own validation and test sequences (:func:`tfbook.tasks.recall.data`). ``hard`` is the same
task with 32 pairs of 64 keys (:func:`retrieval_batch`): more pairs than a head of size
``D_K = 16`` has dimensions, so a state matrix ``16 x 16`` cannot hold them all apart.

Each model is a :class:`~tfbook.torch.recurrence.RecallStack` of four one-head mixers
(``d_model = 32``, ``D_K = D_V = 16``), trained in float32 through the one loop
(:func:`tfbook.torch.training.train`: AdamW, constant learning rate, clipping at 1) on fresh
batches, one thread. For each model and task, the learning rate is chosen from :data:`LRS` by the
mean validation accuracy of its three seeds; the weights of the chosen runs ship in float16
(``recurrence_<task>.pt``), the validation counts of every run in ``recurrence_<task>.json``. The test
sequences are not read here: the chapter scores the shipped weights on them once. Regenerate with::

    python -m tfbook.tasks.recurrence            # or --out DIR, --task base|hard; about 9 CPU-minutes
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..torch.recurrence import RecallStack, RecurrenceConfig
from ..torch.training import train as train_loop
from . import recall
from ._common import cli, load_blob, load_json, shipped, write_json

__all__ = ["MODELS", "TASKS", "LRS", "SEEDS", "RECIPE", "ARTIFACTS", "retrieval_batch", "batch", "data",
           "config", "train", "correct", "experiment", "load_pretrained", "load_models", "save", "main"]

MODELS: dict = {"softmax": ("softmax",) * 4, "linear": ("linear",) * 4, "delta": ("delta",) * 4,
                "gated_delta": ("gated_delta",) * 4, "hybrid": ("gated_delta",) * 3 + ("softmax",)}
#: the two tasks: (n_keys, n_vals, n_pairs)
TASKS: dict = {"base": (recall.N_KEYS, recall.N_VALS, recall.N_PAIRS), "hard": (64, 8, 32)}
LRS: tuple = (3e-3, 1e-2)
SEEDS: tuple = (0, 1, 2)
RECIPE: dict = dict(steps={"base": 500, "hard": 700}, batch_size=64, lrs=list(LRS), optimizer="AdamW",
                    weight_decay=0.0, grad_clip=1.0, dtype="float32", d_model=32, d_head=16,
                    hard_n_validation=1000, hard_validation_seed=2323, hard_n_test=2000, hard_test_seed=2324)
ARTIFACTS = ("recurrence_base.json", "recurrence_hard.json", "recurrence_base.pt", "recurrence_hard.pt")


def retrieval_batch(rng: np.random.Generator, n: int, n_keys: int, n_vals: int, n_pairs: int):
    """``(keys (n, n_pairs), values (n, n_pairs), asked (n,))``, drawn as
    :func:`tfbook.tasks.recall.recall_batch` draws them (the same draws for its sizes)."""
    keys = np.stack([rng.choice(n_keys, n_pairs, replace=False) for _ in range(n)])
    return (torch.from_numpy(keys), torch.from_numpy(rng.integers(0, n_vals, size=(n, n_pairs))),
            torch.from_numpy(rng.integers(0, n_pairs, size=n)))


def batch(task: str, rng: np.random.Generator, n: int):
    """``n`` sequences of ``task``: chapter 17's generator for ``base``, :func:`retrieval_batch` for ``hard``."""
    if task == "base":
        return recall.recall_batch(rng, n)
    return retrieval_batch(rng, n, *TASKS[task])


def data(task: str):
    """``(validation, test)`` of ``task``: chapter 17's own for ``base``, drawn with their own seeds for ``hard``."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {tuple(TASKS)}, got {task!r}")
    if task == "base":
        return recall.data()
    r = RECIPE
    return (batch(task, np.random.default_rng(r["hard_validation_seed"]), r["hard_n_validation"]),
            batch(task, np.random.default_rng(r["hard_test_seed"]), r["hard_n_test"]))


def config(task: str, model: str) -> RecurrenceConfig:
    n_keys, n_vals, n_pairs = TASKS[task]
    return RecurrenceConfig(n_keys=n_keys, n_vals=n_vals, n_pairs=n_pairs, d_model=RECIPE["d_model"],
                            d_head=RECIPE["d_head"], layout=MODELS[model])


def _loss(model, keys, vals, asked):
    return F.cross_entropy(model(keys, vals, asked), vals.gather(1, asked[:, None])[:, 0])


def train(task: str, model: str, seed: int = 0, lr: float = 3e-3, steps: int | None = None) -> RecallStack:
    """One :class:`RecallStack` trained on fresh batches of ``task`` (float32, one thread)."""
    torch.manual_seed(seed)
    net = RecallStack(config(task, model))

    def batch_fn(generator):
        rng = np.random.default_rng(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
        return batch(task, rng, RECIPE["batch_size"])

    train_loop(net, _loss, batch_fn, RECIPE["steps"][task] if steps is None else steps, lr=lr,
               weight_decay=RECIPE["weight_decay"], grad_clip=RECIPE["grad_clip"], seed=seed, threads=1,
               disable=True)
    return net.eval()


@torch.no_grad()
def correct(model: RecallStack, sequences, recurrent: bool = False) -> torch.Tensor:
    """Boolean (n,): which sequences the model answers right."""
    keys, vals, asked = sequences
    return model(keys, vals, asked, recurrent=recurrent).argmax(-1) == vals.gather(1, asked[:, None])[:, 0]


def experiment(tasks=tuple(TASKS), log=print) -> tuple:
    """Every model, rate and seed of ``tasks``: validation counts, chosen rates, the chosen runs' states."""
    runs, chosen, states = [], {}, {}
    for task in tasks:
        val, _ = data(task)
        states[task] = {}
        for name in MODELS:
            trained = {}
            for lr in LRS:
                for seed in SEEDS:
                    t0 = time.process_time()
                    net = train(task, name, seed, lr)
                    right = int(correct(net, val).sum())
                    runs.append(dict(task=task, model=name, lr=lr, seed=seed, val_right=right,
                                     cpu_s=round(time.process_time() - t0, 1)))
                    trained[lr, seed] = net
                    log(f"{task} {name} lr={lr:g} seed {seed}: validation {right}/{len(val[0])} "
                        f"({runs[-1]['cpu_s']} s CPU)")
            best = max(LRS, key=lambda lr: sum(r["val_right"] for r in runs
                                               if (r["task"], r["model"], r["lr"]) == (task, name, lr)))
            chosen[f"{task}/{name}"] = best
            states[task][name] = [{k: v.detach().to(torch.float16).clone() for k, v in trained[best, s].state_dict().items()}
                                  for s in SEEDS]
    return dict(recipe=RECIPE, models={k: list(v) for k, v in MODELS.items()}, tasks=TASKS, runs=runs,
                chosen_lr=chosen), states


def save(result: tuple, folder) -> list:
    summary, states = result
    folder = Path(folder)
    out = []
    for task, by_model in states.items():
        out.append(write_json(folder / f"recurrence_{task}.json",
                              {**summary, "runs": [r for r in summary["runs"] if r["task"] == task],
                               "chosen_lr": {k: v for k, v in summary["chosen_lr"].items() if k.startswith(task + "/")}}))
        path = folder / f"recurrence_{task}.pt"
        torch.save({"configs": {m: {**config(task, m).__dict__, "layout": list(MODELS[m])} for m in by_model},
                    "states": by_model, "seeds": list(SEEDS)}, path)
        out.append(path)
    return out


def load_pretrained(task: str, folder=None) -> dict:
    """The shipped summary of ``task`` (``runs`` with validation counts, ``chosen_lr``)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {tuple(TASKS)}, got {task!r}")
    return load_json(f"recurrence_{task}.json", folder)


def load_models(task: str, folder=None, dtype=torch.float64) -> dict:
    """``{model name: [RecallStack per seed]}``: the shipped chosen runs of ``task`` in ``dtype``, eval mode."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {tuple(TASKS)}, got {task!r}")
    blob = load_blob(shipped(f"recurrence_{task}.pt", folder))
    models = {}
    for name, states in blob["states"].items():
        cfg = RecurrenceConfig(**blob["configs"][name])
        models[name] = []
        for state in states:
            net = RecallStack(cfg).to(dtype)
            net.load_state_dict({k: v.to(dtype) for k, v in state.items()})
            models[name].append(net.eval())
    return models


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped files
    cli(__doc__, lambda out, args: print(f"wrote {save(experiment(tuple(args.task or TASKS)), out)}"),
        lambda p: p.add_argument("--task", action="append", choices=tuple(TASKS),
                                 help="train this task only (repeatable; default: both)"), argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
