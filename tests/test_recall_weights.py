"""Chapter 17's recall experiment (tfbook.tasks.recall): the shipped record, and one run reproduced."""
import numpy as np
import pytest

from tfbook.tasks import recall as R


def test_record_and_choice_on_validation():
    r = R.load_pretrained()
    assert len(r["runs"]) == len(R.KINDS) * len(R.LRS) * len(R.SEEDS)
    for kind in R.KINDS:
        val = {lr: sum(x["val_right"] for x in r["runs"] if x["kind"] == kind and x["lr"] == lr) for lr in R.LRS}
        assert r["chosen_lr"][kind] == max(val, key=val.get)


def test_linear_seed0_reproduces_the_record():
    r = R.load_pretrained()
    lr = r["chosen_lr"]["linear"]
    rec = [x for x in r["runs"] if x["kind"] == "linear" and x["lr"] == lr and x["seed"] == 0][0]
    _, test = R.data()
    assert abs(int(R.correct(R.train("linear", 0, lr), test).sum()) - rec["test_right"]) <= 8


def test_bad_kind():
    with pytest.raises(ValueError, match="kind"):
        R.Recall("cosine")
