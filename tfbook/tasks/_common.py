"""What every task module shares: the split container, the weights folder, saving and
loading a model with its history, and the command line that regenerates artifacts."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch

from ..torch.training import History

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"  # tfbook/weights/


class Splits(NamedTuple):
    """A task's data: ``train`` for the optimiser, ``validation`` for every choice
    (early stopping, a setting), ``test`` read once to report the final score."""

    train: Any
    validation: Any
    test: Any


def pick(splits: Splits, split) -> Any:
    """``split`` as a name (``"train"``, ``"validation"``, ``"test"``) or already the data."""
    if isinstance(split, str):
        if split not in Splits._fields:
            raise ValueError(f"split must be one of {Splits._fields} or the data itself, got {split!r}")
        part = getattr(splits, split)
        if part is None:
            raise ValueError(f"this task has no {split!r} split")
        return part
    return split


def shipped(name: str, folder=None):
    """A file shipped in ``tfbook/weights/`` (a ``Traversable``; works from a wheel too), or the
    file of that name in ``folder`` when one is given (a retrained copy, ``--out DIR``)."""
    if folder is not None:
        return Path(folder) / name
    return resources.files("tfbook") / "weights" / name


def load_json(name: str, folder=None) -> dict:
    """The JSON file ``name`` shipped in ``tfbook/weights/`` (or in ``folder``: see :func:`shipped`)."""
    return json.loads(shipped(name, folder).read_text())


def save_model(path, model: torch.nn.Module, history: History, half: bool = True, **meta) -> Path:
    """Write ``{"config", "state_dict", "history", **meta}`` to ``path`` (float16 weights
    by default: half the file; the bars are checked on the rounded weights)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dtype = torch.float16 if half else torch.float32
    state = {k: v.detach().to(dtype).clone() for k, v in model.state_dict().items()}
    torch.save({"config": asdict(model.config), "state_dict": state, "history": history.as_dict(), **meta},
               path)
    return path


def load_blob(path) -> dict:
    with open(path, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=True)


def load_state(model: torch.nn.Module, state: dict) -> torch.nn.Module:
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})
    return model.eval()


def load_model(path, model_cls, config_cls):
    """``(model, History)`` from a saved blob at ``path`` (config, state_dict, history):
    the model built from its config, float32, eval mode."""
    blob = load_blob(path)
    model = load_state(model_cls(config_cls(**blob["config"])), blob["state_dict"])
    return model, History.from_dict(blob["history"])


def load_decoder_lm(name: str, path=None):
    """``(DecoderLM, History)`` from the shipped file ``name`` (or ``path``): float32, eval mode."""
    from ..torch.models import DecoderLM, DecoderLMConfig

    return load_model(shipped(name) if path is None else path, DecoderLM, DecoderLMConfig)


def train_lm(make_model: Callable[[], torch.nn.Module], train_ids, eval_fn: Callable, recipe: dict,
             schedule_steps: int, loss_fn: Callable | None = None, callbacks=(), disable: bool = True,
             desc: str = "training"):
    """The prose-model tasks' call of the one loop: seed ``recipe["seed"]``, build the model, train
    it with AdamW (``lr``, ``weight_decay``) and a warm-up-cosine schedule (``warmup``, ``min_lr``)
    laid over ``schedule_steps``, on random windows (``batch_size``) of ``train_ids``, for
    ``recipe["steps"]`` steps; evaluate ``eval_fn`` every ``eval_every`` steps and keep the best.
    ``callbacks`` run before the stop. Returns ``(model, History)``."""
    from ..torch.models import lm_batch, lm_loss
    from ..torch.training import train as train_loop

    r = recipe
    torch.manual_seed(r["seed"])
    model = make_model()
    block = model.config.block_size

    def batch_fn(generator):
        return lm_batch(train_ids, block, r["batch_size"], generator=generator)

    def stop_at(step, model, history):
        return step >= r["steps"]

    history = train_loop(model, lm_loss if loss_fn is None else loss_fn, batch_fn, schedule_steps, lr=r["lr"],
                         weight_decay=r["weight_decay"], schedule=("warmup_cosine", r["warmup"], r["min_lr"]),
                         callbacks=[*callbacks, stop_at], eval_fn=eval_fn, eval_every=r["eval_every"],
                         keep_best=True, seed=r["seed"], threads=1, deterministic=True, disable=disable, desc=desc)
    return model, history


def write_json(path, obj) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj) + "\n")
    return path


def cli(doc: str, run: Callable[[Path, argparse.Namespace], None],
        add_arguments: Callable[[argparse.ArgumentParser], None] | None = None, argv=None) -> None:
    """``python -m tfbook.tasks.NAME [--out DIR]``: retrain and write the task's artifacts."""
    parser = argparse.ArgumentParser(description=doc.strip().split("\n")[0])
    parser.add_argument("--out", default=str(WEIGHTS),
                        help="folder for the weights and histories (default: tfbook/weights, the shipped ones)")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    run(Path(args.out), args)
