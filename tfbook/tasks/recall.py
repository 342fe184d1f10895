"""Chapter 17's associative-recall experiment: softmax, sliding-window and linear attention, 3 seeds,
a learning rate chosen per model on validation.

A sequence of :data:`N_PAIRS` (key, value) pairs, keys drawn without repetition from
:data:`N_KEYS` symbols and values from :data:`N_VALS`, each pair one token (key embedding + value
embedding + position), then a query key; the answer is the value stored with that key. One
attention layer with a head of size :data:`D_HEAD` reads the pairs, a linear layer reads the value
out of the query's output (:class:`Recall`). Three kinds of attention: ``softmax``, ``window``
(the query sees the last ``W_WIN - 1`` pairs) and ``linear`` (``phi = elu + 1``).

Training: float64, Adam, :data:`STEPS` steps of 128 fresh sequences, one thread. For each kind,
the learning rate is chosen from :data:`LRS` by the mean accuracy of its three seeds on 2,000
validation sequences (drawn with their own seed); the 4,000 test sequences are scored for every
run but read, in the chapter, only at the chosen rate. The 27 runs take a few minutes, so the
result ships in ``tfbook/weights/recall.json``; regenerate with::

    python -m tfbook.tasks.recall            # or --out DIR
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..measure import threads
from ..torch.training import train as train_loop
from ._common import cli, load_json, write_json

__all__ = ["N_KEYS", "N_VALS", "N_PAIRS", "D_MODEL", "D_HEAD", "W_WIN", "KINDS", "LRS", "SEEDS", "STEPS",
           "RECIPE", "ARTIFACTS", "Recall", "recall_batch", "data", "train", "correct", "experiment",
           "load_pretrained", "save", "main"]

N_KEYS, N_VALS, N_PAIRS, D_MODEL, D_HEAD, W_WIN = 32, 8, 12, 32, 8, 4
KINDS: tuple = ("softmax", "window", "linear")
LRS: tuple = (3e-3, 1e-2, 3e-2)
SEEDS: tuple = (0, 1, 2)
STEPS: int = 300
RECIPE: dict = dict(steps=STEPS, batch_size=128, lrs=list(LRS), optimizer="Adam", dtype="float64",
                    n_validation=2000, validation_seed=2023, n_test=4000, test_seed=2024)
RESULT_FILE = "recall.json"
ARTIFACTS = (RESULT_FILE,)


def recall_batch(rng: np.random.Generator, n: int):
    """``(keys (n, N_PAIRS), values (n, N_PAIRS), asked (n,))``: which pair each query asks for."""
    keys = np.stack([rng.choice(N_KEYS, N_PAIRS, replace=False) for _ in range(n)])
    return (torch.from_numpy(keys), torch.from_numpy(rng.integers(0, N_VALS, size=(n, N_PAIRS))),
            torch.from_numpy(rng.integers(0, N_PAIRS, size=n)))


class Recall(torch.nn.Module):
    """One attention layer over the pairs, queried by the asked key; ``kind`` picks the attention."""

    def __init__(self, kind: str):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self.E_key, self.E_val, self.E_query = (torch.nn.Embedding(n, D_MODEL) for n in (N_KEYS, N_VALS, N_KEYS))
        self.pos = torch.nn.Parameter(0.1 * torch.randn(N_PAIRS, D_MODEL))
        self.W_Q, self.W_K, self.W_V = (torch.nn.Linear(D_MODEL, D_HEAD, bias=False) for _ in range(3))
        self.readout = torch.nn.Linear(D_HEAD, N_VALS)

    def forward(self, keys, vals, asked):
        X = self.E_key(keys) + self.E_val(vals) + self.pos                    # (B, 12, D): one token per pair
        q = self.W_Q(self.E_query(keys.gather(1, asked[:, None])))            # (B, 1, D_K)
        k, v = self.W_K(X), self.W_V(X)
        if self.kind == "linear":
            a = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(1, 2)               # eq-ea-linear
            z = (a / a.sum(-1, keepdim=True)) @ v
        else:
            s = q @ k.transpose(1, 2) / math.sqrt(D_HEAD)
            if self.kind == "window":                                        # the query follows the 12th pair
                s = s.masked_fill(torch.arange(N_PAIRS) < N_PAIRS - (W_WIN - 1), float("-inf"))
            z = torch.softmax(s, -1) @ v
        return self.readout(z[:, 0])


def data():
    """``(validation, test)`` sequences, each ``recall_batch`` output, drawn with their own seeds."""
    return (recall_batch(np.random.default_rng(RECIPE["validation_seed"]), RECIPE["n_validation"]),
            recall_batch(np.random.default_rng(RECIPE["test_seed"]), RECIPE["n_test"]))


def _loss(model: Recall, keys, vals, asked) -> torch.Tensor:
    return F.cross_entropy(model(keys, vals, asked), vals.gather(1, asked[:, None])[:, 0])


def train(kind: str, seed: int = 0, lr: float = 1e-2, steps: int = STEPS) -> Recall:
    """Train one :class:`Recall` model in float64 with Adam on fresh batches (one thread), through
    the one loop (:func:`tfbook.torch.training.train`: constant rate, no clipping). The batches
    come from a NumPy generator seeded with ``seed`` (the loop's torch generator is not used)."""
    with threads(1):
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        model = Recall(kind).double()
        train_loop(model, _loss, lambda g: recall_batch(rng, RECIPE["batch_size"]), steps, lr=lr, grad_clip=None,
                   seed=seed, disable=True, optimizer=lambda m, lr_, wd: torch.optim.Adam(m.parameters(), lr=lr_))
    return model.eval()


@torch.no_grad()
def correct(model: Recall, batch) -> torch.Tensor:
    """Boolean (n,): which sequences of ``batch`` the model answers right."""
    keys, vals, asked = batch
    return model(keys, vals, asked).argmax(-1) == vals.gather(1, asked[:, None])[:, 0]


def experiment(log=print) -> dict:
    """Every kind, learning rate and seed: validation and test right answers, and the chosen rates."""
    val, test = data()
    in_window = test[2] >= N_PAIRS - (W_WIN - 1)
    runs = []
    for kind in KINDS:
        for lr in LRS:
            for seed in SEEDS:
                model = train(kind, seed, lr)
                r_val, r_test = correct(model, val), correct(model, test)
                runs.append(dict(kind=kind, lr=lr, seed=seed, val_right=int(r_val.sum()),
                                 test_right=int(r_test.sum()), test_in_window=int(r_test[in_window].sum()),
                                 test_out_window=int(r_test[~in_window].sum())))
                log(f"{kind} lr={lr:g} seed {seed}: validation {runs[-1]['val_right']}/{len(r_val)}")
    chosen = {kind: max(LRS, key=lambda lr: sum(r["val_right"] for r in runs if r["kind"] == kind and r["lr"] == lr))
              for kind in KINDS}
    return dict(recipe=RECIPE, runs=runs, chosen_lr=chosen, n_in_window=int(in_window.sum()),
                n_out_window=int((~in_window).sum()))


def save(result: dict, folder) -> list:
    return [write_json(Path(folder) / RESULT_FILE, result)]


def load_pretrained(folder=None) -> dict:
    """The shipped result (``runs``, ``chosen_lr``)."""
    return load_json(RESULT_FILE, folder)


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped file
    cli(__doc__, lambda out, args: print(f"wrote {save(experiment(), out)}"), argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
