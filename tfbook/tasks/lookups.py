"""How many heads? One head against two and four, trained from scratch: the experiment of chapter 5.

Two key-value retrieval tasks (:mod:`tfbook.tasks.retrieval` is the first, rebuilt here so that
the number of queried keys can change):

* ``"two"``: six slots (a key ``A..H`` and a value ``0..7`` each), then a query naming **two**
  of the keys; the model outputs both values (chapter 4's and chapter 5's task);
* ``"four"``: eight slots (keys ``A..L``), then a query naming **four** keys: four independent
  look-ups per query.

The query position adds one embedding per queried key (a table per query place), the slots add a
key and a value embedding; unused places hold a padding id whose embedding is zero. The model
is the retrieval encoder of chapters 4-5 with ``D = 32``: one Pre-LN
:class:`~tfbook.torch.modules.EncoderBlock` (``D_ff = 64``), a final LayerNorm and a linear
read-out of the query position, one row of 8 logits per queried key. Only the number of heads
``H`` changes (1, 2 or 4, so ``D_K = 32, 16, 8``): the parameter count is the same for every
``H`` (``W_Q, W_K, W_V, W_O`` are ``D x D`` whatever the split).

Splits as in :mod:`tfbook.tasks.retrieval`: fixed validation and test sets of 2,000 sequences
(disjoint), fresh training batches with every held-out sequence rejected, best weights kept on
validation. :func:`run` trains every (task, H) with 3 seeds; a model takes 10 to 15 s of CPU on
an idle core, so the command ships the measured result (``lookups_results.json``: the test
accuracy, every queried value right, of each run; computed in float64 from the float16-rounded
weights), the seed-0 weights of the four-key models (``lookups_four_h*.pt``) and the float16
weights of the other 15 runs (``lookups_seeds.pt``; :func:`load_seed` loads any of the 18)::

    python -m tfbook.tasks.lookups            # or --out DIR
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

__all__ = ["TASKS", "HEADS", "SEEDS", "RECIPE", "ARTIFACTS", "LookupConfig", "LookupEncoder", "sample",
           "data", "make_model", "train", "accuracy", "evaluate", "run", "load_pretrained",
           "load_results", "save", "main", "param_count", "SEEDS_FILE", "load_seed", "save_seeds"]

N_VALUES = 8
#: task -> (slots, distinct keys, queried keys)
TASKS = {"two": (6, 8, 2), "four": (8, 12, 4)}
HEADS = (1, 2, 4)
SEEDS = (0, 1, 2)
RECIPE = dict(steps=1500, batch_size=128, lr=3e-3, hold=0.6, grad_clip=1.0, n_validation=2000,
              n_test=2000)
#: the float16 weights of every run but the three four-key seed-0 ones: ``{"configs": {"<task>/<H>": ...},
#: "state_dicts": {"<task>/<H>/<seed>": ...}}``
SEEDS_FILE = "lookups_seeds.pt"
ARTIFACTS = ("lookups_results.json",) + tuple(f"lookups_four_h{h}.pt" for h in HEADS) + (SEEDS_FILE,)


@dataclass
class LookupConfig:
    task: str = "two"
    num_heads: int = 2
    d_model: int = 32
    d_ff: int = 64


def _layout(task):
    n_slots, n_keys, n_query = TASKS[task]
    key0, val0, q0 = 0, n_keys, n_keys + N_VALUES
    pad = q0 + n_query * n_keys
    return n_slots, n_keys, n_query, key0, val0, q0, pad


class LookupEncoder(nn.Module):
    """``ids (B, T, n_query) -> logits (B, n_query, 8)``."""

    def __init__(self, config: LookupConfig):
        super().__init__()
        self.config = c = config
        n_slots, n_keys, n_query, *_, pad = _layout(c.task)
        self.embed = nn.Embedding(pad + 1, c.d_model, padding_idx=pad)
        self.pos = nn.Parameter(torch.randn(n_slots + 1, c.d_model) * 0.1)
        self.block = EncoderBlock(c.d_model, c.num_heads, c.d_ff, norm_first=True)
        self.norm = LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, n_query * N_VALUES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        X = self.embed(ids).sum(-2) + self.pos[: ids.shape[-2]]
        X = self.block(X)
        return self.head(self.norm(X[..., -1, :])).unflatten(-1, (-1, N_VALUES))


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def sample(task: str, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``n`` sequences of ``task``: ids ``(n, T, n_query)`` and answers ``(n, n_query)``."""
    n_slots, n_keys, n_query, key0, val0, q0, pad = _layout(task)
    keys = np.argsort(rng.random((n, n_keys)), axis=1)[:, :n_slots]
    vals = rng.integers(0, N_VALUES, size=(n, n_slots))
    which = np.argsort(rng.random((n, n_slots)), axis=1)[:, :n_query]  # distinct queried slots
    rows = np.arange(n)[:, None]
    ids = np.full((n, n_slots + 1, n_query), pad, dtype=np.int64)
    ids[:, :-1, 0] = key0 + keys
    ids[:, :-1, 1] = val0 + vals
    ids[:, -1, :] = q0 + np.arange(n_query) * n_keys + keys[rows, which]
    return ids, vals[rows, which]


def _codes(ids):
    flat = ids.reshape(len(ids), -1) % 16
    return (flat * (16 ** np.arange(flat.shape[1], dtype=object))).sum(axis=1).astype(str)


def data(task: str = "two", seed: int = 0) -> Splits:
    if task not in TASKS:
        raise ValueError(f"task must be one of {tuple(TASKS)}, got {task!r}")
    val = sample(task, RECIPE["n_validation"], np.random.default_rng(seed + 1000))
    test = sample(task, RECIPE["n_test"] + 200, np.random.default_rng(seed + 2000))
    keep = ~np.isin(_codes(test[0]), _codes(val[0]))
    test = (test[0][keep][: RECIPE["n_test"]], test[1][keep][: RECIPE["n_test"]])
    held = np.concatenate([_codes(val[0]), _codes(test[0])])
    as_t = lambda p: (torch.from_numpy(p[0]), torch.from_numpy(p[1]))  # noqa: E731
    return Splits(held, as_t(val), as_t(test))


def _batch(task, held, batch_size, generator):
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    ids, ans = sample(task, batch_size + 16, np.random.default_rng(seed))
    keep = ~np.isin(_codes(ids), held)
    return torch.from_numpy(ids[keep][:batch_size]), torch.from_numpy(ans[keep][:batch_size])


def _loss(model, ids, answers):
    logits = model(ids)
    return nn.functional.cross_entropy(logits.flatten(0, 1), answers.flatten()) * answers.shape[-1]


def make_model(task: str = "two", num_heads: int = 2, seed: int = 0) -> LookupEncoder:
    torch.manual_seed(seed)
    return LookupEncoder(LookupConfig(task=task, num_heads=num_heads))


@torch.no_grad()
def accuracy(model, ids, answers) -> float:
    """Fraction of sequences with every queried value right."""
    model.eval()
    return float((model(ids).argmax(-1) == answers).all(-1).double().mean())


def evaluate(model, split="test") -> float:
    """Accuracy on ``split`` in float64 (a float64 copy of the model)."""
    ids, answers = pick(data(model.config.task), split)
    return accuracy(copy.deepcopy(model).double(), ids, answers)


def train(task: str = "two", num_heads: int = 2, seed: int = 0, steps: int | None = None,
          disable: bool = True) -> tuple[LookupEncoder, History]:
    r = dict(RECIPE, steps=RECIPE["steps"] if steps is None else int(steps), seed=int(seed))
    splits = data(task)
    model = make_model(task, num_heads, seed)
    v_ids, v_ans = splits.validation
    history = train_loop(
        model, _loss, lambda g: _batch(task, splits.train, r["batch_size"], g), r["steps"],
        lr=r["lr"], grad_clip=r["grad_clip"], schedule=("hold_linear", int(r["hold"] * r["steps"])),
        eval_fn=lambda m: accuracy(m, v_ids, v_ans), eval_every=100, maximize=True, keep_best=True,
        seed=seed, threads=1, deterministic=True, disable=disable, desc=f"lookups {task} H={num_heads} s{seed}")
    history.extra.update(recipe=r, task=task, num_heads=num_heads)
    return model.eval(), history


def _rounded(model):
    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.half().float())
    return m.eval()


def run(seeds=SEEDS, steps=None, disable=True, partial=None, tasks=("four", "two"),
        all_models: dict | None = None) -> tuple[dict, dict]:
    """Every task, every ``H`` in :data:`HEADS`, every seed. ``result[task][str(H)]`` holds
    per-seed lists ``test``, ``validation`` and ``best_step``; also ``params[str(H)]``.
    ``all_models``, a dict, receives every rounded model under ``(task, H, seed)``."""
    result = {"recipe": dict(RECIPE, steps=steps or RECIPE["steps"]), "seeds": list(seeds), "params": {}}
    models = {}
    for task in tasks:
        result[task] = {}
        for H in HEADS:
            rec = {"test": [], "validation": [], "best_step": []}
            for s in seeds:
                model, hist = train(task, H, s, steps, disable)
                model = _rounded(model)
                rec["test"].append(evaluate(model, "test"))
                rec["validation"].append(evaluate(model, "validation"))
                rec["best_step"].append(hist.best_step)
                result["params"][f"{task}-{H}"] = param_count(model)
                if task == "four" and s == seeds[0]:
                    models[H] = (model, hist)
                if all_models is not None:
                    all_models[(task, H, s)] = model
                print(task, H, s, rec["test"][-1], flush=True)
                result[task][str(H)] = rec
                if partial is not None:  # the runs so far, in case the command is stopped
                    write_json(partial, result)
    return result, models


def load_pretrained(num_heads: int = 1, folder=None) -> tuple[LookupEncoder, History]:
    """The shipped seed-0 model of the four-key task with ``num_heads`` heads."""
    if num_heads not in HEADS:
        raise ValueError(f"num_heads must be one of {HEADS}, got {num_heads!r}")
    name = f"lookups_four_h{num_heads}.pt"
    return load_model(shipped(name, folder), LookupEncoder, LookupConfig)


def load_seed(task: str = "four", num_heads: int = 1, seed: int = 0, folder=None) -> LookupEncoder:
    """The shipped model of ``task`` with ``num_heads`` heads trained with ``seed`` (float32 from
    float16, eval mode): the four-key seed-0 models are :func:`load_pretrained`'s, the others
    come from :data:`SEEDS_FILE`."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {tuple(TASKS)}, got {task!r}")
    if num_heads not in HEADS:
        raise ValueError(f"num_heads must be one of {HEADS}, got {num_heads!r}")
    if seed not in SEEDS:
        raise ValueError(f"seed must be one of {SEEDS}, got {seed!r}")
    if task == "four" and seed == 0:
        return load_pretrained(num_heads, folder)[0]
    blob = load_blob(shipped(SEEDS_FILE, folder))
    model = LookupEncoder(LookupConfig(**blob["configs"][f"{task}/{num_heads}"]))
    return load_state(model, blob["state_dicts"][f"{task}/{num_heads}/{seed}"])


def save_seeds(all_models: dict, folder) -> Path:
    """Write the float16 weights of every ``(task, H, seed) -> model`` but the four-key seed-0
    ones to :data:`SEEDS_FILE` in ``folder``."""
    path = Path(folder) / SEEDS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    keep = {k: m for k, m in all_models.items() if not (k[0] == "four" and k[2] == 0)}
    torch.save({"configs": {f"{t}/{h}": asdict(m.config) for (t, h, _), m in keep.items()},
                "state_dicts": {f"{t}/{h}/{s}": {k: v.detach().half().clone() for k, v in m.state_dict().items()}
                                for (t, h, s), m in keep.items()}}, path)
    return path


def load_results(folder=None) -> dict:
    return load_json(ARTIFACTS[0], folder)


def save(result, models, folder, all_models: dict | None = None) -> list:
    out = [write_json(Path(folder) / ARTIFACTS[0], result)]
    for H, (model, hist) in models.items():
        out.append(save_model(Path(folder) / f"lookups_four_h{H}.pt", model, hist))
    if all_models:
        out.append(save_seeds(all_models, folder))
    return out


def main(argv=None) -> None:  # pragma: no cover - writes the shipped artifacts
    def go(out, args):
        all_models = {}
        result, models = run(disable=True, partial=Path(out) / "lookups_partial.json", all_models=all_models)
        print(save(result, models, out, all_models))

    cli(__doc__, go, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
