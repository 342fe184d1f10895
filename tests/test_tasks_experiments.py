"""The experiments in tfbook.tasks (chapter 10's ablation, chapters 3 and 8's dynamics) have the
tasks' verbs: RECIPE, ARTIFACTS, train, load_pretrained, save, main (``python -m
tfbook.tasks.NAME [--out DIR]``). Fast: the shipped results are read and written back, nothing
is trained (tests/test_training_lesson.py and tests/test_dynamics.py rerun the experiments).
"""

from __future__ import annotations

import inspect
import json

import pytest

from tfbook.tasks import ablation, dynamics

VERBS = ("RECIPE", "ARTIFACTS", "train", "load_pretrained", "save", "main")


@pytest.mark.parametrize("mod", [ablation, dynamics], ids=["ablation", "dynamics"])
def test_the_verbs(mod):
    for verb in VERBS:
        assert verb in mod.__all__ and hasattr(mod, verb), verb
    assert isinstance(mod.RECIPE, dict) and mod.ARTIFACTS
    assert list(inspect.signature(mod.save).parameters)[:2] == ["result", "folder"]
    assert "--out" in inspect.getsource(mod.main) or "cli(" in inspect.getsource(mod.main)


def test_ablation_shipped_result_saves_and_loads(tmp_path):
    shipped = ablation.load_pretrained()
    assert shipped == ablation.load_ablation() and shipped["recipe"]["block"] == ablation.ABLATION_BLOCK
    # a raw result (one loss per step) is saved compressed: the mean loss and the largest
    # gradient norm of each block of 10 steps
    run = dict(variant="full", seed=0, loss=[float(i) for i in range(25)], grad_norm=[float(i % 7) for i in range(25)],
               val_loss=0.5, val_exact_match=0.9, weight_norm=3.0)
    path = ablation.save({"recipe": dict(ablation.RECIPE, seeds=[0]), "runs": [run]}, tmp_path)
    assert path.name == ablation.ARTIFACTS[0]
    back = ablation.load_pretrained(path)
    assert back["runs"][0]["loss"] == [4.5, 14.5] and back["runs"][0]["grad_norm"] == [6.0, 6.0]
    assert back["runs"][0]["weight_norm"] == 3.0


def test_ablation_data_and_config_are_what_a_run_trains():
    splits = ablation.data()
    r = ablation.RECIPE
    # two-digit addition has 10,000 problems: the training draw keeps those not held out
    assert (len(splits.validation), len(splits.test)) == (r["n_validation"], r["n_test"])
    assert 0.9 * r["n_train"] < len(splits.train) <= r["n_train"]
    cfg = ablation.config()
    assert (cfg.d_model, cfg.num_layers, cfg.block_size) == (r["d_model"], r["num_layers"], 3 * r["digits"] + 3)


def test_dynamics_shipped_result_meets_the_bar_and_round_trips(tmp_path):
    shipped = dynamics.load_pretrained()
    assert dynamics.evaluate(shipped)
    path = dynamics.save(shipped, tmp_path)
    assert path.name == dynamics.ARTIFACTS[0] and dynamics.load_pretrained(path) == json.loads(path.read_text())
    assert dynamics.load_pretrained(path) == shipped
    # the bar fails when Post-LN without warm-up is given a curve that learned
    broken = json.loads(json.dumps(shipped))
    broken["curves"]["Post-LN, no warm-up"][0] = broken["curves"]["Pre-LN, no warm-up"][0]
    assert not dynamics.evaluate(broken)
