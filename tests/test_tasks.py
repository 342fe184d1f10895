"""tfbook.tasks: every task module has the same shape (fast: no full training here).

The same verbs in each module: ``data`` -> Splits(train, validation, test), ``config``,
``train`` -> (model, History) through the one loop, ``evaluate(model, split)``,
``load_pretrained`` -> (model, History), ``save`` / ``main`` writing ``ARTIFACTS``. The
slow retraining tests, and the bars of the shipped models, are in tests/test_ch1*_weights.py.
"""

import importlib
import inspect
import math

import numpy as np
import pytest
import torch

import tfbook.tasks as tasks
from tfbook.tasks import Splits
from tfbook.torch.training import History

VERBS = ("data", "config", "train", "evaluate", "load_pretrained", "save", "main")
SHORT = {"number_words": 3, "addition": 3, "corpus": 3, "digits": 3, "muon": 3}  # steps for the quick runs


def task(name):
    return importlib.import_module(f"tfbook.tasks.{name}")


@pytest.mark.parametrize("name", tasks.TASKS)
def test_every_task_has_the_same_verbs(name):
    mod = task(name)
    assert getattr(tasks, name) is mod
    for verb in VERBS:
        assert callable(getattr(mod, verb)), (name, verb)
        assert verb in mod.__all__, (name, verb)
    assert isinstance(mod.RECIPE, dict) and mod.ARTIFACTS
    assert list(inspect.signature(mod.evaluate).parameters)[:2] == ["model", "split"]
    assert list(inspect.signature(mod.save).parameters)[:3] == ["model", "history", "folder"]


def _rows(part):
    """A split as a set of hashable items (numbers, token rows, or images)."""
    if isinstance(part, tuple):  # (images, labels)
        part = part[0].reshape(part[0].shape[0], -1)
    if isinstance(part, torch.Tensor):
        part = part.numpy()
    part = np.asarray(part)
    return {r.tobytes() if part.ndim > 1 else int(r) for r in part}


@pytest.mark.parametrize("name", ["number_words", "addition"])
def test_splits_are_disjoint(name):
    s = task(name).data()
    assert isinstance(s, Splits) and all(p is not None for p in s)
    tr, va, te = (_rows(p) for p in s)
    assert va and te and not tr & va and not tr & te and not va & te


def test_corpus_splits_are_ordered_slices():
    s = task("corpus").data()
    assert isinstance(s, Splits)
    assert s.train.numel() > 8 * s.validation.numel() / 2 and s.validation.numel() == s.test.numel()


def test_digits_splits():
    s = task("digits").data()  # the default carves a validation split from the training images
    tr, va, te = (_rows(p) for p in s)
    assert va and not va & te and not tr & te and not tr & va  # images, compared pixel for pixel
    assert task("digits").data(validation_fraction=0.0).validation is None


@pytest.mark.parametrize("name", tasks.TASKS)
def test_short_training_and_save_load_round_trip(name, tmp_path, one_thread):
    mod = task(name)
    model, history = mod.train(steps=SHORT[name])
    assert isinstance(history, History) and len(history.loss) == SHORT[name] == len(history.lr)
    assert all(math.isfinite(x) for x in history.loss)
    assert not model.training
    # the same seed gives the same losses (one thread, same machine)
    assert mod.train(steps=SHORT[name])[1].loss == history.loss
    paths = mod.save(model, history, tmp_path)
    assert sorted(p.name for p in paths) == sorted(a for a in mod.ARTIFACTS if a in {p.name for p in paths})
    assert all(p.is_file() for p in paths)
    loaded, loaded_history = (mod.load_pretrained(paths[0]) if name in ("addition", "corpus")
                              else mod.load_pretrained(folder=tmp_path) if name == "number_words"
                              else mod.load_pretrained(history.extra["variant"], folder=tmp_path))
    assert np.allclose(loaded_history.loss, history.loss, rtol=1e-6, atol=0)  # JSON keeps 7 digits
    for k, v in model.state_dict().items():  # float16 files keep float16-rounded weights
        ref = v if name == "number_words" else v.half().float()
        assert torch.equal(loaded.state_dict()[k], ref), (name, k)


@pytest.mark.parametrize("name", tasks.TASKS)
def test_evaluate_takes_a_split_name_and_refuses_others(name, one_thread):
    mod = task(name)
    model = (mod.load_pretrained("cls-1d") if name == "digits" else mod.load_pretrained())[0]
    with pytest.raises(ValueError, match="split must be one of"):
        mod.evaluate(model, "dev")
    split = "validation"
    value = mod.evaluate(model, split)
    assert math.isfinite(value)
    if name != "corpus":  # a rate
        assert 0.0 <= value <= 1.0


def test_cli_writes_into_out(tmp_path, monkeypatch):
    """``python -m tfbook.tasks.NAME --out DIR``: main() trains and saves into DIR (train
    replaced by a 2-step run, to keep this fast)."""
    mod = task("addition")
    real = mod.train
    monkeypatch.setattr(mod, "train", lambda disable=False: real(steps=2))
    mod.main(["--out", str(tmp_path)])
    assert (tmp_path / "lm_addition.pt").is_file()
    _, h = mod.load_pretrained(tmp_path / "lm_addition.pt")
    assert len(h.loss) == 2
