"""Duplicate detection: the classification encoder of chapter 9.

A sequence is ``T = 8`` letters from an alphabet of ``N_LETTERS = 16``; the label is 1 when
some letter occurs twice and 0 when all eight are different. Positives hold exactly one
repeated letter (seven distinct letters, one of them twice, at random places), negatives
eight distinct letters, half and half, so guessing scores 1/2. Every sequence has eight
letters, so a classifier of the letter *counts* that is linear cannot separate the classes
well (the sum of the counts is always 8); a token has to find its twin, which is what
attention between tokens is for.

The model (:class:`PoolingEncoder`) is the book's own parts: a letter embedding and a learned
position vector, ``L = 2`` Pre-LN :class:`~tfbook.torch.modules.EncoderBlock` s (D = 32,
H = 2, D_ff = 64), a final LayerNorm, a **pooling** of the ``T`` output vectors into one, and a
linear layer to two logits. The two poolings (``POOLINGS``):

* ``"cls"``: a learned class token is put in front of the letters (position 0, its own
  embedding row) and its output vector is read, as in BERT and the Vision Transformer;
* ``"mean"``: the mean of the ``T`` letters' output vectors (no extra token).

A third variant, ``"set"`` (chapter 6), is mean pooling with **no position vectors**: every layer
is then permutation-equivariant and the pooled output permutation-invariant, the right symmetry
for a property of the multiset of letters.

Splits (:func:`data`): fixed validation and test sets of 2,000 sequences each (disjoint);
training batches are drawn fresh each step and any held-out sequence is rejected.
:func:`train` validates every 100 steps and keeps the best weights (validation only).

This is an experiment: :func:`run` trains the three variants with 3 seeds each (about a minute of
CPU per model on an idle core, too much for a chapter), and the command ships the measured
result (``duplicates_results.json``: test accuracy of every run, computed in float64 from the
float16 weights), the seed-0 weights of each variant (``duplicates_cls.pt``,
``duplicates_mean.pt``, ``duplicates_set.pt``) and the float16 weights of seeds 1 and 2 of every
variant (``duplicates_seeds.pt``, :func:`load_seed`), which the chapters evaluate live::

    python -m tfbook.tasks.duplicates            # or --out DIR
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..torch.modules import EncoderBlock, LayerNorm
from ..torch.training import History
from ..torch.training import train as train_loop
from ._common import Splits, cli, load_blob, load_json, load_model, load_state, pick, save_model, shipped, write_json

__all__ = ["N_LETTERS", "T", "CLS", "POOLINGS", "VARIANTS", "SEEDS", "RECIPE", "ARTIFACTS", "PoolingConfig",
           "PoolingEncoder", "sample", "data", "config", "make_model", "train", "accuracy", "evaluate",
           "load_pretrained", "load_results", "save", "run", "main", "letters", "SEEDS_FILE", "load_seed"]

N_LETTERS, T = 16, 8
CLS = N_LETTERS  # the class token's id (only the "cls" model uses it)
POOLINGS = ("cls", "mean")
#: the trained variants: name -> (pooling, learned positions?); "set" is chapter 6's model without positions
VARIANTS = {"cls": ("cls", True), "mean": ("mean", True), "set": ("mean", False)}
SEEDS = (0, 1, 2)
RECIPE = dict(steps=1500, batch_size=128, lr=3e-3, hold=0.6, grad_clip=1.0,
              n_validation=2000, n_test=2000)
#: the float16 weights of every run with a seed other than 0: ``{"config": {variant: ...},
#: "state_dicts": {"<variant>/<seed>": ...}}``
SEEDS_FILE = "duplicates_seeds.pt"
ARTIFACTS = ("duplicates_results.json",) + tuple(f"duplicates_{v}.pt" for v in VARIANTS) + (SEEDS_FILE,)


@dataclass
class PoolingConfig:
    pooling: str = "cls"
    positions: bool = True
    d_model: int = 32
    num_heads: int = 2
    d_ff: int = 64
    num_layers: int = 2
    vocab_size: int = N_LETTERS + 1
    max_len: int = T + 1


class PoolingEncoder(nn.Module):
    """``ids (B, T) -> logits (B, 2)``: embeddings plus learned positions, ``num_layers``
    Pre-LN blocks, a final LayerNorm, the pooling of :attr:`config` ``.pooling`` (the class
    token's output, or the mean over the letters), a linear read-out.
    :meth:`encode` returns the final vectors ``(B, T', D)`` before pooling."""

    def __init__(self, config: PoolingConfig):
        super().__init__()
        if config.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {config.pooling!r}")
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Parameter(torch.randn(c.max_len, c.d_model) * 0.1)
        self.blocks = nn.ModuleList(EncoderBlock(c.d_model, c.num_heads, c.d_ff, norm_first=True)
                                    for _ in range(c.num_layers))
        self.norm = LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, 2)

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.ndim != 2:
            raise ValueError(f"ids must be (B, T), got shape {tuple(ids.shape)}")
        if self.config.pooling == "cls":
            ids = torch.cat([torch.full_like(ids[:, :1], CLS), ids], dim=1)
        X = self.embed(ids)
        if self.config.positions:
            X = X + self.pos[: ids.shape[1]]
        for block in self.blocks:
            X = block(X)
        return self.norm(X)

    def pool(self, X: torch.Tensor) -> torch.Tensor:
        return X[:, 0] if self.config.pooling == "cls" else X.mean(dim=1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.encode(ids)))


def sample(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``n`` sequences ``(n, T)`` of letter ids and labels ``(n,)`` (1: a letter repeats)."""
    ids = np.argsort(rng.random((n, N_LETTERS)), axis=1)[:, :T]  # T distinct letters
    labels = (rng.random(n) < 0.5).astype(np.int64)
    where = np.argsort(rng.random((n, T)), axis=1)[:, :2]  # two different places
    rows = np.flatnonzero(labels)
    ids[rows, where[rows, 1]] = ids[rows, where[rows, 0]]  # the second place copies the first
    return ids.astype(np.int64), labels


def _codes(ids: np.ndarray) -> np.ndarray:
    return (ids * (N_LETTERS ** np.arange(T, dtype=np.int64))).sum(axis=1)


def data(seed: int = 0) -> Splits:
    """``Splits(train, validation, test)``: validation and test are ``(ids, labels)`` int64
    tensors of 2,000 sequences each, disjoint; ``train`` holds the codes of every held-out
    sequence (training draws fresh batches and rejects those)."""
    val = sample(RECIPE["n_validation"], np.random.default_rng(seed + 1000))
    test = sample(RECIPE["n_test"] + 200, np.random.default_rng(seed + 2000))
    keep = ~np.isin(_codes(test[0]), _codes(val[0]))
    test = (test[0][keep][: RECIPE["n_test"]], test[1][keep][: RECIPE["n_test"]])
    held = np.concatenate([_codes(val[0]), _codes(test[0])])
    as_t = lambda p: (torch.from_numpy(p[0]), torch.from_numpy(p[1]))  # noqa: E731
    return Splits(held, as_t(val), as_t(test))


def _batch(held, batch_size, generator):
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    ids, y = sample(batch_size + 16, np.random.default_rng(seed))
    keep = ~np.isin(_codes(ids), held)
    return torch.from_numpy(ids[keep][:batch_size]), torch.from_numpy(y[keep][:batch_size])


def _loss(model, ids, y):
    return nn.functional.cross_entropy(model(ids), y)


def config(variant: str = "cls", **overrides) -> PoolingConfig:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {tuple(VARIANTS)}, got {variant!r}")
    pooling, positions = VARIANTS[variant]
    return PoolingConfig(pooling=pooling, positions=positions, **overrides)


def make_model(variant: str = "cls", seed: int = 0) -> PoolingEncoder:
    torch.manual_seed(seed)
    return PoolingEncoder(config(variant))


@torch.no_grad()
def accuracy(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of sequences classified right (computed in the model's dtype)."""
    model.eval()
    return float((model(ids).argmax(-1) == labels).double().mean())


def evaluate(model: nn.Module, split="test") -> float:
    """Accuracy on ``split``, in float64 (a float64 copy of the model), so that the figure
    does not depend on the machine."""
    ids, labels = pick(data(), split)
    return accuracy(copy.deepcopy(model).double(), ids, labels)


def train(variant: str = "cls", seed: int = 0, steps: int | None = None,
          disable: bool = True) -> tuple[PoolingEncoder, History]:
    """Train one model from scratch with :data:`RECIPE`; best weights on validation kept."""
    r = dict(RECIPE, steps=RECIPE["steps"] if steps is None else int(steps), seed=int(seed))
    splits = data()
    model = make_model(variant, seed)
    v_ids, v_y = splits.validation
    history = train_loop(
        model, _loss, lambda g: _batch(splits.train, r["batch_size"], g), r["steps"],
        lr=r["lr"], grad_clip=r["grad_clip"], schedule=("hold_linear", int(r["hold"] * r["steps"])),
        eval_fn=lambda m: accuracy(m, v_ids, v_y), eval_every=100, maximize=True, keep_best=True,
        seed=seed, threads=1, deterministic=True, disable=disable, desc=f"duplicates {variant} s{seed}")
    history.extra.update(recipe=r, variant=variant)
    return model.eval(), history


def _rounded(model: PoolingEncoder) -> PoolingEncoder:
    """The model with its weights rounded to float16 (what ships), back in float32."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.half().float())
    return m.eval()


def run(seeds=SEEDS, steps: int | None = None, disable: bool = True, variants=tuple(VARIANTS),
        result: dict | None = None, all_models: dict | None = None) -> tuple[dict, dict]:
    """Train every variant with every seed. Returns ``(result, models)``: ``result[variant]``
    holds per-seed lists ``test`` (float64 accuracy of the float16-rounded weights),
    ``validation`` (best) and ``best_step``; ``models[variant]`` the seed-0 model and history.
    ``result``: a result to add the variants to; ``all_models``, a dict, receives every rounded
    model under ``(variant, seed)``."""
    if result is None:
        result = {"recipe": dict(RECIPE, steps=steps or RECIPE["steps"]), "seeds": list(seeds)}
    models = {}
    for pooling in variants:
        rec = {"test": [], "validation": [], "best_step": []}
        for s in seeds:
            model, hist = train(pooling, s, steps, disable)
            model = _rounded(model)
            rec["test"].append(evaluate(model, "test"))
            rec["validation"].append(evaluate(model, "validation"))
            rec["best_step"].append(hist.best_step)
            if s == seeds[0]:
                models[pooling] = (model, hist)
            if all_models is not None:
                all_models[(pooling, s)] = model
        result[pooling] = rec
    return result, models


def load_pretrained(variant: str = "cls", folder=None) -> tuple[PoolingEncoder, History]:
    """The shipped seed-0 model of ``variant`` (float32 from float16, eval mode) and its history."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {tuple(VARIANTS)}, got {variant!r}")
    name = f"duplicates_{variant}.pt"
    return load_model(shipped(name, folder), PoolingEncoder, PoolingConfig)


def load_seed(variant: str = "cls", seed: int = 0, folder=None) -> PoolingEncoder:
    """The shipped model of ``variant`` trained with ``seed`` (float32 from float16, eval mode):
    seed 0 is :func:`load_pretrained`'s, seeds 1 and 2 come from :data:`SEEDS_FILE`."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {tuple(VARIANTS)}, got {variant!r}")
    if seed not in SEEDS:
        raise ValueError(f"seed must be one of {SEEDS}, got {seed!r}")
    if seed == 0:
        return load_pretrained(variant, folder)[0]
    blob = load_blob(shipped(SEEDS_FILE, folder))
    return load_state(PoolingEncoder(PoolingConfig(**blob["config"][variant])), blob["state_dicts"][f"{variant}/{seed}"])


def save_seeds(all_models: dict, folder) -> Path:
    """Write the float16 weights of every ``(variant, seed) -> model`` with a seed other than 0
    to :data:`SEEDS_FILE` in ``folder``."""
    path = Path(folder) / SEEDS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": {v: asdict(m.config) for (v, _), m in all_models.items()},
                "state_dicts": {f"{v}/{s}": {k: t.detach().half().clone() for k, t in m.state_dict().items()}
                                for (v, s), m in all_models.items() if s != 0}}, path)
    return path


def load_results(folder=None) -> dict:
    """The shipped result of :func:`run` (``duplicates_results.json``)."""
    return load_json(ARTIFACTS[0], folder)


def save(result: dict, models: dict, folder, all_models: dict | None = None) -> list:
    out = [write_json(Path(folder) / ARTIFACTS[0], result)]
    for pooling, (model, hist) in models.items():
        out.append(save_model(Path(folder) / f"duplicates_{pooling}.pt", model, hist))
    if all_models:
        out.append(save_seeds(all_models, folder))
    return out


def letters(ids) -> str:
    """``'AFCK...'``: one sequence as letters."""
    return "".join(chr(ord("A") + int(i)) for i in ids)


def main(argv=None) -> None:  # pragma: no cover - writes the shipped artifacts
    def go(out, args):
        all_models = {}
        result, models = run(disable=False, all_models=all_models)
        for p in VARIANTS:
            print(p, "test", result[p]["test"], "best step", result[p]["best_step"])
        print(save(result, models, out, all_models))

    cli(__doc__, go, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
