"""Chapter 23's shipped recall experiment (tfbook.tasks.recurrence): the files are there and whole,
the chosen rates are the validation winners, the shipped float16 weights reproduce the validation
counts that chose them, they meet the bars the chapter states, and a retrained run reproduces its
shipped validation count."""

import numpy as np
import pytest
import torch

from tfbook.tasks import recurrence as task


@pytest.fixture(scope="module")
def shipped():
    return {t: (task.load_pretrained(t), task.load_models(t)) for t in task.TASKS}


def test_every_run_is_recorded_and_the_chosen_rate_wins_validation(shipped):
    for t, (summary, models) in shipped.items():
        runs = summary["runs"]
        assert len(runs) == len(task.MODELS) * len(task.LRS) * len(task.SEEDS)
        assert summary["recipe"]["steps"][t] == task.RECIPE["steps"][t]
        for m in task.MODELS:
            by_lr = {lr: sum(r["val_right"] for r in runs if r["model"] == m and r["lr"] == lr) for lr in task.LRS}
            assert by_lr[summary["chosen_lr"][f"{t}/{m}"]] == max(by_lr.values())
            assert len(models[m]) == len(task.SEEDS)
            assert models[m][0].config.layout == task.MODELS[m]


def test_shipped_weights_reproduce_their_validation_counts(shipped):
    for t, (summary, models) in shipped.items():
        val, _ = task.data(t)
        for m in task.MODELS:
            lr = summary["chosen_lr"][f"{t}/{m}"]
            for seed, net in zip(task.SEEDS, models[m]):
                want = next(r["val_right"] for r in summary["runs"] if (r["model"], r["lr"], r["seed"]) == (m, lr, seed))
                got = int(task.correct(net, val).sum())
                assert abs(got - want) <= 0.01 * len(val[0]), (t, m, seed, got, want)  # float16 weights


def test_load_models_rejects_an_unknown_task():
    with pytest.raises(ValueError, match=r"task must be one of \('base', 'hard'\), got 'easy'"):
        task.load_models("easy")
    with pytest.raises(ValueError, match=r"task must be one of"):
        task.data("easy")


def test_retraining_one_run_reproduces_its_validation_count(shipped):
    summary, _ = shipped["base"]
    lr = summary["chosen_lr"]["base/softmax"]
    want = next(r["val_right"] for r in summary["runs"] if (r["model"], r["lr"], r["seed"]) == ("softmax", lr, 0))
    net = task.train("base", "softmax", seed=0, lr=lr)
    got = int(task.correct(net, task.data("base")[0]).sum())
    assert abs(got - want) <= 0.01 * len(task.data("base")[0][0])  # float32 on another CPU may differ slightly


def test_shipped_models_meet_the_chapters_bars(shipped):
    acc = {t: {m: np.array([task.correct(net, task.data(t)[1]).double().mean().item() for net in models[m]])
               for m in task.MODELS} for t, (_, models) in shipped.items()}
    recurrent = ("linear", "delta", "gated_delta")
    assert min(acc["base"]["softmax"].min(), acc["base"]["hybrid"].min(), acc["hard"]["softmax"].min()) >= 0.99
    assert all(acc["base"][m].min() >= 0.95 and acc["base"][m].max() < acc["base"]["softmax"].min() for m in recurrent)
    assert all(acc["hard"][m].max() <= 0.75 for m in recurrent)
    assert acc["hard"]["delta"].mean() > acc["hard"]["linear"].mean() + 0.1
    assert acc["hard"]["gated_delta"].mean() < acc["hard"]["delta"].mean() + 0.05
    assert acc["hard"]["hybrid"].min() >= 0.99
