"""Chapter 10's ablation: which of warm-up, gradient clipping and weight decay matters, measured.

Two-digit addition (:mod:`tfbook.tasks.addition` with ``digits=2``), a small Pre-LN
:class:`~tfbook.torch.models.DecoderLM` trained with AdamW through the one loop
:func:`tfbook.torch.training.train`; the ``full`` recipe uses all three knobs, each other variant
(:data:`ABLATION_VARIANTS`) drops one, five seeds each. Every run records its training losses,
its gradient norms before clipping, its validation answer cross-entropy and exact-match rate
and its final weight norm (:func:`ablation_run`). The 20 runs take minutes, so the result ships,
compressed to one point per 10 steps, in ``tfbook/weights/training_ablation.json``, with the
final weights of all 20 runs in float16 (``training_ablation_weights.pt``, :func:`load_ablation_models`),
which the chapter evaluates on the validation split; regenerate both with::

    python -m tfbook.tasks.ablation            # or --out DIR

The task's verbs, as in the other modules of :mod:`tfbook.tasks`: ``RECIPE``, ``ARTIFACTS``,
:func:`data` (the addition splits), :func:`config` (the model), :func:`train` (one variant and
seed), :func:`load_pretrained` (the shipped result), :func:`save` and :func:`main`. The first
home of these functions, ``tfbook.torch.optim``, still gives them.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from ..torch.models import DecoderLM, DecoderLMConfig, lm_loss
from ..torch.training import train as train_loop
from . import addition as A
from ._common import cli

__all__ = ["RECIPE", "ARTIFACTS", "data", "config", "train", "load_pretrained", "save", "main",
           "ABLATION_RECIPE", "ABLATION_VARIANTS", "ABLATION_FILE", "ABLATION_BLOCK", "ablation_run",
           "ablation_experiment", "compress_ablation", "load_ablation", "ABLATION_WEIGHTS", "save_ablation_models",
           "load_ablation_models"]

#: the ablation's recipe: two-digit addition (tfbook.tasks.addition with digits=2), a small
#: Pre-LN DecoderLM, AdamW; ``full`` uses all three knobs, each other variant drops one
ABLATION_RECIPE = dict(digits=2, n_train=8000, n_validation=500, n_test=500, d_model=32, num_heads=2,
                       num_layers=2, d_ff=64, steps=800, batch_size=64, lr=1e-2, warmup=80,
                       grad_clip=1.0, weight_decay=0.1, seeds=(0, 1, 2, 3, 4))
ABLATION_VARIANTS = ("full", "no warm-up", "no clipping", "no weight decay")
ABLATION_FILE = "training_ablation.json"
#: the final weights of every run, float16: ``{"config": ..., "state_dicts": {"<variant>/<seed>": ...}}``
ABLATION_WEIGHTS = "training_ablation_weights.pt"


def _ablation_knobs(variant: str, r: dict) -> dict:
    if variant not in ABLATION_VARIANTS:
        raise ValueError(f"variant must be one of {ABLATION_VARIANTS}, got {variant!r}")
    return dict(schedule=("warmup_cosine", 0 if variant == "no warm-up" else r["warmup"], 0.0),
                grad_clip=None if variant == "no clipping" else r["grad_clip"],
                weight_decay=0.0 if variant == "no weight decay" else r["weight_decay"])


def ablation_run(variant: str, seed: int, recipe: dict | None = None, models: dict | None = None) -> dict:
    """Train one variant with one seed; return its training losses, its gradient norms before
    clipping, and on the validation split its answer cross-entropy and exact-match rate,
    plus the final weight norm. One thread, deterministic algorithms. ``models``, a dict,
    receives the trained model under ``(variant, seed)``."""
    r = dict(ABLATION_RECIPE, **(recipe or {}))
    knobs = _ablation_knobs(variant, r)
    splits = data(r)
    prompt = 2 * r["digits"] + 2
    x_all, y_all = A.answer_targets(splits.train, prompt)
    x_val, y_val = A.answer_targets(splits.validation, prompt)
    cfg = config(r)
    torch.manual_seed(seed)
    model = DecoderLM(cfg)
    squares = []  # per step: the squared norm of each parameter's gradient, before clipping

    def record(p):
        squares[-1] += float((p.grad.double() ** 2).sum())

    hooks = [p.register_post_accumulate_grad_hook(record) for p in model.parameters()]

    def batch_fn(generator):
        rows = torch.randint(0, x_all.shape[0], (r["batch_size"],), generator=generator)
        return x_all[rows], y_all[rows]

    def loss_fn(m, x, y):
        squares.append(0.0)  # this step's backward pass fills it in
        return lm_loss(m, x, y)

    try:
        history = train_loop(model, loss_fn, batch_fn, r["steps"], lr=r["lr"], seed=seed, threads=1,
                        deterministic=True, disable=True, desc=variant, **knobs)
    finally:
        for h in hooks:
            h.remove()
    grad_norms = [s ** 0.5 for s in squares]
    if models is not None:
        models[(variant, seed)] = model.eval()
    with torch.no_grad():
        val_loss = float(lm_loss(model, x_val, y_val))
        em = float(A.exact_match(model, splits.validation, prompt).double().mean())
        w_norm = float(torch.sqrt(sum((p.double() ** 2).sum() for p in model.parameters())))
    return dict(variant=variant, seed=seed, loss=history.loss, grad_norm=grad_norms, val_loss=val_loss,
                val_exact_match=em, weight_norm=w_norm)


def ablation_experiment(recipe: dict | None = None, models: dict | None = None) -> dict:
    """Every variant with every seed: ``{"recipe": ..., "runs": [ablation_run(...), ...]}``;
    ``models``, a dict, receives every trained model under ``(variant, seed)``."""
    r = dict(ABLATION_RECIPE, **(recipe or {}))
    runs = [ablation_run(v, s, r, models) for v in ABLATION_VARIANTS for s in r["seeds"]]
    return {"recipe": {k: list(v) if isinstance(v, tuple) else v for k, v in r.items()}, "runs": runs}


ABLATION_BLOCK = 10  # the shipped curves keep one point per block of this many steps


def compress_ablation(result: dict, block: int = ABLATION_BLOCK) -> dict:
    """Per run, the mean training loss and the largest gradient norm of each block of
    ``block`` steps (what the chapter plots), rounded; the scalar results kept as they are."""
    out = {"recipe": dict(result["recipe"], block=block), "runs": []}
    for run in result["runs"]:
        loss, gn = np.asarray(run["loss"]), np.asarray(run["grad_norm"])
        n = len(loss) // block * block
        out["runs"].append(dict(run, loss=[round(float(v), 5) for v in loss[:n].reshape(-1, block).mean(1)],
                                grad_norm=[round(float(v), 4) for v in gn[:n].reshape(-1, block).max(1)]))
    return out


def load_ablation(path=None) -> dict:
    """The shipped result of :func:`ablation_experiment` (``tfbook/weights/training_ablation.json``)."""
    path = Path(__file__).resolve().parents[1] / "weights" / ABLATION_FILE if path is None else Path(path)
    return json.loads(path.read_text())


def save_ablation_models(models: dict, folder) -> Path:
    """Write the float16 weights of every ``(variant, seed) -> model`` to :data:`ABLATION_WEIGHTS`
    in ``folder`` (one config: every run trains the same model)."""
    path = Path(folder) / ABLATION_WEIGHTS
    path.parent.mkdir(parents=True, exist_ok=True)
    configs = {json.dumps(asdict(m.config), sort_keys=True) for m in models.values()}
    if len(configs) != 1:
        raise ValueError(f"every run must train the same model, got {len(configs)} configs")
    torch.save({"config": json.loads(configs.pop()),
                "state_dicts": {f"{v}/{s}": {k: t.detach().half().clone() for k, t in m.state_dict().items()}
                                for (v, s), m in models.items()}}, path)
    return path


def load_ablation_models(path=None) -> dict:
    """The shipped final weights of every run (:data:`ABLATION_WEIGHTS`): ``(variant, seed) ->``
    :class:`~tfbook.torch.models.DecoderLM`, float32 from float16, eval mode."""
    path = Path(__file__).resolve().parents[1] / "weights" / ABLATION_WEIGHTS if path is None else Path(path)
    blob = torch.load(path, map_location="cpu", weights_only=True)
    out = {}
    for key, state in blob["state_dicts"].items():
        variant, seed = key.rsplit("/", 1)
        model = DecoderLM(DecoderLMConfig(**blob["config"]))
        model.load_state_dict({k: t.float() for k, t in state.items()})
        out[(variant, int(seed))] = model.eval()
    return out


# --------------------------------------------------------------------------------------------
# The task's verbs
# --------------------------------------------------------------------------------------------

RECIPE = ABLATION_RECIPE
ARTIFACTS = (ABLATION_FILE, ABLATION_WEIGHTS)


def data(recipe: dict | None = None):
    """The addition splits the ablation trains and validates on (:func:`tfbook.tasks.addition.data`)."""
    r = dict(ABLATION_RECIPE, **(recipe or {}))
    return A.data(r["n_train"], r["n_validation"], r["n_test"], digits=r["digits"])


def config(recipe: dict | None = None) -> DecoderLMConfig:
    """The model every variant trains."""
    r = dict(ABLATION_RECIPE, **(recipe or {}))
    return DecoderLMConfig(vocab_size=len(A.VOCAB), block_size=3 * r["digits"] + 3, d_model=r["d_model"],
                           num_heads=r["num_heads"], num_layers=r["num_layers"], d_ff=r["d_ff"])


def train(variant: str = "full", seed: int = 0, recipe: dict | None = None) -> dict:
    """One variant with one seed: :func:`ablation_run`."""
    return ablation_run(variant, seed, recipe)


def load_pretrained(path=None) -> dict:
    """The shipped result: :func:`load_ablation`."""
    return load_ablation(path)


def save(result: dict, folder, models: dict | None = None) -> Path:
    """Write a result of :func:`ablation_experiment`, compressed (:func:`compress_ablation`),
    as ``training_ablation.json`` into ``folder``; with ``models`` (``(variant, seed) -> model``)
    also their float16 weights (:func:`save_ablation_models`). Returns the JSON's path."""
    path = Path(folder) / ABLATION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(compress_ablation(result), separators=(",", ":")) + "\n")
    if models:
        save_ablation_models(models, folder)
    return path


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped file
    """``python -m tfbook.tasks.ablation [--out DIR]``: rerun the ablation and write its JSON."""
    def run(out, args):
        models = {}
        print(f"wrote {save(ablation_experiment(models=models), out, models)}")

    cli(__doc__, run, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
