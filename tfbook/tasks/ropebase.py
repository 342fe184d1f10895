"""Chapter 14's RoPE-base runs: chapter 7's copy-3-back length task, trained at several rotary bases.

:mod:`tfbook.tasks.lengths` trains one attention layer to output the token
:data:`~tfbook.tasks.lengths.OFFSET` = 3 back (random tokens from ``V = 10``), on sequences of 16
tokens, and tests it on 500 held-out sequences of 64. Its RoPE model rotates with the default base
10,000. This module trains the same model, recipe and seeds with the rotation's base set to each of
:data:`BASES` (:class:`RopeBaseModel`: chapter 7's :class:`~tfbook.tasks.lengths.PrevToken` of kind
``"rope"``, with ``base`` passed to :func:`tfbook.torch.functional.rope`; at base 10,000 it is that
model, weight for weight). The nine runs take about 10 s of CPU, so the result ships as a measured
record (``ropebase_results.json``: the accuracy at every test position 3..63 of every run) with the
float16 weights of all nine (``ropebase.pt``), which chapter 14 re-evaluates live::

    python -m tfbook.tasks.ropebase            # or --out DIR
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ..torch.functional.positions import rope
from ..torch.training import train as train_loop
from . import lengths as L
from ._common import cli, load_json, shipped, write_json

__all__ = ["BASES", "SEEDS", "FILES", "RopeBaseModel", "train", "run", "load", "load_result", "main"]

#: the rotary bases trained (10,000 is chapter 7's, and most models' until 2023)
BASES: tuple = (10.0, 100.0, 10_000.0)
SEEDS: tuple = L.SEEDS
FILES = ("ropebase_results.json", "ropebase.pt")


class RopeBaseModel(L.PrevToken):
    """Chapter 7's one-layer RoPE model for the copy-``offset``-back task, rotating with ``base``."""

    def __init__(self, base: float, offset: int = L.OFFSET):
        super().__init__("rope", offset)
        if not float(base) > 1:
            raise ValueError(f"base must be > 1, got {base!r}")
        self.base = float(base)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T_ = ids.shape[1]
        e = self.E[ids]  # (B, T, D)
        Q, K = rope(e @ self.W_Q, base=self.base), rope(e @ self.W_K, base=self.base)
        S = Q @ K.transpose(-1, -2) / L.D**0.5  # (B, T, T)
        i, j = torch.arange(T_)[:, None], torch.arange(T_)[None, :]
        S = S.masked_fill(~((j < i) | ((i == 0) & (j == 0))), -math.inf)  # strictly earlier keys
        return torch.softmax(S, -1) @ e @ self.W_O


def train(base: float, seed: int = 0) -> RopeBaseModel:
    """:func:`tfbook.tasks.lengths.train`'s recipe (Adam, 200 steps of 64 fresh sequences of 16
    tokens, the same seeds) for :class:`RopeBaseModel` at ``base``; float64 weights, eval mode."""
    torch.manual_seed(seed)
    model = RopeBaseModel(base)

    def batch_fn(g):
        return torch.randint(0, L.V, (L.RECIPE["batch_size"], L.T_TRAIN), generator=g)

    with torch.enable_grad():
        train_loop(model, L._loss, batch_fn, L.RECIPE["steps"], lr=L.RECIPE["lr"], grad_clip=None, seed=1 + 10 * seed,
                   disable=True, optimizer=lambda m, lr, wd: torch.optim.Adam(m.parameters(), lr=lr))
    return model.eval()


def run(bases=BASES, seeds=SEEDS) -> tuple[dict, dict]:
    """Train every base and seed, round the weights to float16 (what ships), test at positions 3..63;
    ``(result, {"<base>/<seed>": float16 state dict})``."""
    torch.set_num_threads(1)
    ids = L.test_ids()
    acc, states = {}, {}
    for base in bases:
        for seed in seeds:
            model = L.rounded(train(base, seed))
            key = f"{base:g}/{seed}"
            acc[key] = L.accuracy_by_position(model, ids).tolist()
            states[key] = {k: v.detach().to(torch.float16).clone() for k, v in model.state_dict().items()}
    return {"bases": [float(b) for b in bases], "seeds": list(seeds), "offset": L.OFFSET, "t_train": L.T_TRAIN,
            "positions": list(range(L.OFFSET, L.T_TEST)), "accuracy": acc}, states


def load(base: float, seed: int, folder=None) -> RopeBaseModel:
    """The shipped model at ``base`` and ``seed`` (float16 weights, evaluated in float64, eval mode)."""
    if float(base) not in BASES:
        raise ValueError(f"base must be one of {BASES}, got {base!r}")
    if seed not in SEEDS:
        raise ValueError(f"seed must be one of {SEEDS}, got {seed!r}")
    with shipped(FILES[1], folder).open("rb") as f:
        states = torch.load(f, map_location="cpu", weights_only=True)
    model = RopeBaseModel(base)
    model.load_state_dict(states[f"{float(base):g}/{seed}"])
    return model.eval()


def load_result(folder=None) -> dict:
    """The shipped record of :func:`run` (accuracy at test positions 3..63 per ``"<base>/<seed>"``)."""
    return load_json(FILES[0], folder)


def main(argv=None) -> None:  # pragma: no cover - writes the shipped artifacts
    def go(out, args):
        result, states = run()
        Path(out).mkdir(parents=True, exist_ok=True)
        write_json(Path(out) / FILES[0], result)
        torch.save(states, Path(out) / FILES[1])
        for key, a in result["accuracy"].items():
            a = np.asarray(a)
            print(f"base/seed {key}: positions 3-15 {a[:L.T_TRAIN - L.OFFSET].mean():.3f}, "
                  f"16-63 {a[L.T_TRAIN - L.OFFSET:].mean():.3f}")
        print(f"wrote {FILES} to {out}")

    cli(__doc__, go, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
