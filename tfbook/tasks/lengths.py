"""Beyond the training length: the length test of chapter 7, four position schemes x 3 seeds.

The task: "output the previous token" (random tokens from ``V = 10``), one attention layer whose
values are the token embeddings and whose keys are strictly in the past, trained on sequences of
``T_TRAIN = 16`` tokens and tested on 500 held-out sequences of ``T_TEST = 64``, in float64. Only
the position scheme differs (``KINDS``):

* ``"table"``: a learned absolute table with rows for 64 positions, added to the embeddings
  (rows 16 to 63 never receive a gradient);
* ``"sinusoidal"``: the fixed sinusoidal table of the 2017 paper, added to the embeddings;
* ``"rope"``: rotary embeddings applied to the queries and keys (:func:`tfbook.torch.functional.rope`);
* ``"alibi"``: no table; a bias ``-m (i - j)`` on the scores with one learned slope ``m > 0``.

Every run's weights are rounded to float16 (what is shipped) before it is tested. The 12 runs take
well under a minute of CPU (about 15 s on one core), so :func:`run` is shipped as a measured result (``lengths_results.json``:
the accuracy at every test position 1..63 of every run), with the float16 weights of the four
seed-0 runs (``lengths_<kind>.pt``, 10 to 19 kB each) and of the eight others
(``lengths_seeds.pt``), which chapter 7 evaluates (:func:`load_seed0`, :func:`load_seed`)
instead of training them live::

    python -m tfbook.tasks.lengths            # or --out DIR

A second task with the same recipe, schemes and seeds asks for a fixed offset that is not the most
recent: "output the token :data:`OFFSET` = 3 back" (:func:`run` with ``offset=OFFSET``, the
model's ``offset``; positions 0-2 have no target). ALiBi's bias ``-m (i - j)`` can only favour the
nearest key, so this task measures what its recency prior costs. Its result and the float16
weights of its 12 runs ship as ``lengths_copy3_results.json`` and ``lengths_copy3.pt``
(:func:`load_copy`, :func:`load_copy_result`)::

    python -m tfbook.tasks.lengths --offset 3
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..numpy.positions import sinusoidal_positional_encoding
from ..torch.functional.positions import rope
from ..torch.training import History
from ..torch.training import train as train_loop
from ._common import cli, load_json, load_model, save_model, shipped, write_json

__all__ = ["V", "D", "T_TRAIN", "T_TEST", "KINDS", "SEEDS", "RECIPE", "ARTIFACTS", "PrevToken",
           "PrevTokenConfig", "accuracy_by_position", "test_ids", "train", "rounded", "run", "load_pretrained",
           "load_seed0", "load_seed", "SEEDS_FILE", "save", "main", "OFFSET", "COPY_ARTIFACTS",
           "load_copy", "load_copy_result"]

V, D, T_TRAIN, T_TEST = 10, 32, 16, 64
KINDS = ("table", "sinusoidal", "rope", "alibi")
SEEDS = (0, 1, 2)
RECIPE = dict(steps=200, batch_size=64, lr=0.05, n_test=500, test_seed=2)
#: the float16 weights of every run with a seed other than 0 (``"<kind>/<seed>"`` -> state dict)
SEEDS_FILE = "lengths_seeds.pt"
ARTIFACTS = ("lengths_results.json",) + tuple(f"lengths_{kind}.pt" for kind in KINDS) + (SEEDS_FILE,)
#: the second task: copy the token ``OFFSET`` back (a fixed offset that is not the nearest key)
OFFSET = 3
#: its result and the float16 weights of all its runs (``"<kind>/<seed>"`` -> state dict)
COPY_ARTIFACTS = ("lengths_copy3_results.json", "lengths_copy3.pt")


@dataclass
class PrevTokenConfig:
    """What builds a :class:`PrevToken` (saved with its weights)."""

    kind: str
    offset: int = 1  # the target is the token ``offset`` back


class PrevToken(nn.Module):
    """One attention layer, float64: ``ids (B, T) -> logits (B, T, V)``; ``kind`` in :data:`KINDS`
    (or a :class:`PrevTokenConfig`)."""

    def __init__(self, kind, offset: int = 1):
        super().__init__()
        if isinstance(kind, PrevTokenConfig):
            kind, offset = kind.kind, kind.offset
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if not 1 <= int(offset) < T_TRAIN:
            raise ValueError(f"offset must lie in [1, {T_TRAIN - 1}], got {offset!r}")
        self.kind, self.offset, self.config = kind, int(offset), PrevTokenConfig(kind, int(offset))
        f64 = dict(dtype=torch.float64)
        self.E = nn.Parameter(torch.randn(V, D, **f64) / D**0.5)
        self.W_Q = nn.Parameter(torch.randn(D, D, **f64) / D**0.5)
        self.W_K = nn.Parameter(torch.randn(D, D, **f64) / D**0.5)
        self.W_O = nn.Parameter(torch.randn(D, V, **f64) / D**0.5)
        if kind == "table":
            self.table = nn.Parameter(torch.randn(T_TEST, D, **f64) / D**0.5)
        elif kind == "sinusoidal":
            # fixed, so not saved with the weights (nor rounded to float16)
            self.register_buffer("table", torch.from_numpy(sinusoidal_positional_encoding(T_TEST, D)),
                                 persistent=False)
        elif kind == "alibi":
            self.m = nn.Parameter(torch.zeros((), **f64))  # slope = softplus(m) > 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T_ = ids.shape[1]
        e = self.E[ids]  # (B, T, D)
        h = e + self.table[:T_] if self.kind in ("table", "sinusoidal") else e
        Q, K = h @ self.W_Q, h @ self.W_K
        if self.kind == "rope":
            Q, K = rope(Q), rope(K)
        S = Q @ K.transpose(-1, -2) / D**0.5  # (B, T, T)
        i, j = torch.arange(T_)[:, None], torch.arange(T_)[None, :]
        if self.kind == "alibi":
            S = S - F.softplus(self.m) * (i - j)
        S = S.masked_fill(~((j < i) | ((i == 0) & (j == 0))), -math.inf)  # strictly earlier keys
        return torch.softmax(S, -1) @ e @ self.W_O


def accuracy_by_position(model, ids) -> np.ndarray:
    """``(T - o,)``: accuracy at positions o..T-1, ``o = model.offset`` (the target is the token
    ``o`` back: the previous token for the first task)."""
    o = getattr(model, "offset", 1)
    with torch.no_grad():
        return (model(ids).argmax(-1)[:, o:] == ids[:, :-o]).double().mean(0).numpy()


def test_ids() -> torch.Tensor:
    return torch.randint(0, V, (RECIPE["n_test"], T_TEST), generator=torch.Generator().manual_seed(RECIPE["test_seed"]))


def _loss(model: PrevToken, ids: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of predicting, at every position from ``o = model.offset`` on, the token
    ``o`` back (the previous token for ``o = 1``)."""
    o = model.offset
    return F.cross_entropy(model(ids)[:, o:].reshape(-1, V), ids[:, :-o].reshape(-1))


def train(kind: str, seed: int = 0, t_train: int = T_TRAIN, offset: int = 1) -> PrevToken:
    """Adam, 200 steps of 64 fresh sequences of ``t_train`` tokens (16: the recipe of every shipped
    run), through the one loop (:func:`tfbook.torch.training.train`: constant rate, no clipping);
    full float64 weights, its losses in ``model.history`` (a :class:`History`)."""
    if not 2 <= int(t_train) <= T_TEST:
        raise ValueError(f"t_train must lie in [2, {T_TEST}], got {t_train!r}")
    torch.manual_seed(seed)
    model = PrevToken(kind, offset)

    def batch_fn(g):
        return torch.randint(0, V, (RECIPE["batch_size"], int(t_train)), generator=g)

    with torch.enable_grad():
        h = train_loop(model, _loss, batch_fn, RECIPE["steps"], lr=RECIPE["lr"], grad_clip=None, seed=1 + 10 * seed,
                       disable=True, optimizer=lambda m, lr, wd: torch.optim.Adam(m.parameters(), lr=lr))
    model.history = History(loss=h.loss, extra={"recipe": RECIPE, "kind": kind, "seed": seed, "t_train": int(t_train),
                                                     "offset": int(offset)})
    return model.eval()


def rounded(model: PrevToken) -> PrevToken:
    """The model with its weights rounded to float16 (what is shipped), kept in float64."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().double())
    return model


def run(kinds=KINDS, seeds=SEEDS, models: dict | None = None, all_models: dict | None = None,
        offset: int = 1) -> dict:
    """``result[kind]``: a list (one per seed) of accuracies at test positions offset..63, each
    run's weights rounded to float16 first; ``models``, a dict, receives the seed-0 models, and
    ``all_models`` every model, under ``(kind, seed)``."""
    ids = test_ids()
    result = {"recipe": RECIPE, "seeds": list(seeds), "weights": "float16", "offset": int(offset)}
    for kind in kinds:
        result[kind] = []
        for s in seeds:
            model = rounded(train(kind, s, offset=offset))
            if models is not None and s == 0:
                models[kind] = model
            if all_models is not None:
                all_models[(kind, s)] = model
            result[kind].append(accuracy_by_position(model, ids).tolist())
    return result


def load_pretrained(folder=None) -> dict:
    """The shipped result of :func:`run`."""
    return load_json(ARTIFACTS[0], folder)


def load_seed0(kind: str, folder=None) -> PrevToken:
    """The shipped seed-0 model of ``kind`` (float16 weights, evaluated in float64, eval mode), its
    training losses in ``model.history``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    model, history = load_model(shipped(f"lengths_{kind}.pt", folder), PrevToken, PrevTokenConfig)
    model.history = history
    return model


def load_seed(kind: str, seed: int, folder=None) -> PrevToken:
    """The shipped model of ``kind`` trained with ``seed`` (float16 weights, evaluated in float64,
    eval mode): seed 0 is :func:`load_seed0`, the others come from :data:`SEEDS_FILE`."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if seed not in SEEDS:
        raise ValueError(f"seed must be one of {SEEDS}, got {seed!r}")
    if seed == 0:
        return load_seed0(kind, folder)
    with shipped(SEEDS_FILE, folder).open("rb") as f:
        states = torch.load(f, map_location="cpu", weights_only=True)
    model = PrevToken(kind)
    model.load_state_dict(states[f"{kind}/{seed}"])  # float16 values into the float64 parameters
    return model.eval()


def load_copy_result(folder=None) -> dict:
    """The shipped result of ``run(offset=OFFSET)`` (accuracies at test positions 3..63)."""
    return load_json(COPY_ARTIFACTS[0], folder)


def load_copy(kind: str, seed: int, folder=None) -> PrevToken:
    """The shipped model of the copy-:data:`OFFSET`-back task, ``kind`` and ``seed`` (float16
    weights, evaluated in float64, eval mode)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if seed not in SEEDS:
        raise ValueError(f"seed must be one of {SEEDS}, got {seed!r}")
    with shipped(COPY_ARTIFACTS[1], folder).open("rb") as f:
        states = torch.load(f, map_location="cpu", weights_only=True)
    model = PrevToken(kind, OFFSET)
    model.load_state_dict(states[f"{kind}/{seed}"])  # float16 values into the float64 parameters
    return model.eval()


def save_copy(result: dict, folder, all_models: dict) -> list:
    """Write the copy task's result and the float16 weights of every run (``(kind, seed) -> model``)."""
    paths = [write_json(Path(folder) / COPY_ARTIFACTS[0], result), Path(folder) / COPY_ARTIFACTS[1]]
    torch.save({f"{kind}/{s}": {k: v.detach().half().clone() for k, v in m.state_dict().items()}
                for (kind, s), m in all_models.items()}, paths[1])
    return paths


def save(result: dict, folder, models: dict | None = None, all_models: dict | None = None) -> list:
    """Write the result and, for each ``kind -> model`` in ``models``, its float16 weights; with
    ``all_models`` (``(kind, seed) -> model``), the float16 weights of every seed other than 0
    in one file, :data:`SEEDS_FILE`."""
    paths = [write_json(Path(folder) / ARTIFACTS[0], result)]
    for kind, model in (models or {}).items():
        paths.append(save_model(Path(folder) / f"lengths_{kind}.pt", model, model.history))
    if all_models:
        states = {f"{kind}/{s}": {k: v.detach().half().clone() for k, v in m.state_dict().items()}
                  for (kind, s), m in all_models.items() if s != 0}
        paths.append(Path(folder) / SEEDS_FILE)
        torch.save(states, paths[-1])
    return paths


def main(argv=None) -> None:  # pragma: no cover - writes the shipped artifacts
    def go(out, args):
        torch.set_num_threads(1)
        models, all_models = {}, {}
        o = args.offset
        result = run(models=models, all_models=all_models, offset=o)
        for k in KINDS:  # mean accuracy at trained positions (o..15), then beyond (16..63)
            print(k, [(round(float(np.mean(a[:T_TRAIN - o])), 3), round(float(np.mean(a[T_TRAIN - o:])), 3))
                      for a in result[k]], flush=True)
        if o == 1:
            print(save(result, out, models, all_models))
        elif o == OFFSET:
            print(save_copy(result, out, all_models))
        else:
            print("offset", o, "is not shipped: nothing written")

    cli(__doc__, go, add_arguments=lambda p: p.add_argument("--offset", type=int, default=1,
                                                            help=f"1: the previous token; {OFFSET}: the copy task"),
        argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
