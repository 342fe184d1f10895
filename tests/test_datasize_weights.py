"""Chapter 15's data-size experiment (tfbook.tasks.datasize): the shipped record and weights."""
import copy

import numpy as np
import pytest
import torch

from tfbook.tasks import datasize as S
from tfbook.tasks import digits as D


def test_record_covers_the_grid_and_the_chapter_claims():
    r = S.load_pretrained()
    runs = r["runs"]
    assert {(x["model"], x["n"], x["seed"]) for x in runs} == {
        (m, n, s) for m in S.MODELS for n in r["sizes"] for s in S.SEEDS}
    # a learning rate per model and size, chosen on validation by the seed-0 runs of every rate
    chosen = {(c["model"], c["n"]): c["lr"] for c in r["chosen"]}
    assert set(chosen) == {(m, n) for m in S.MODELS for n in r["sizes"]}
    for (m, n), lr in chosen.items():
        val = {x["lr"]: x["val_correct"] for x in r["search"] if (x["model"], x["n"], x["seed"]) == (m, n, 0)}
        assert sorted(val) == sorted(S.LRS)
        assert val[lr] == max(val.values()) and lr == S.choose_lr(r["search"], m, n)
        assert {x["lr"] for x in runs if (x["model"], x["n"]) == (m, n)} == {lr}
    assert r["lr_cnn"] == chosen["cnn", max(r["sizes"])]
    acc = {(m, n): np.array([x["test_correct"] for x in runs if x["model"] == m and x["n"] == n])
           for m in S.MODELS for n in r["sizes"]}
    for n in r["sizes"]:
        assert acc["cnn", n].min() > acc["vit", n].max()  # the chapter: CNN wins at every size
    gaps = [acc["cnn", n].mean() - acc["vit", n].mean() for n in r["sizes"]]
    assert gaps[0] > 2 * max(gaps[1:]) > 0


@pytest.mark.parametrize("model", S.MODELS)
def test_shipped_weights_give_the_recorded_counts(model):
    net, rec = S.load_model(model)
    splits = D.data()
    m64 = copy.deepcopy(net).double()
    assert round(D.accuracy(m64, *splits.test) * 450) == rec["test_correct"]


def test_cnn_is_the_vits_size_and_checks_its_input():
    n_cnn = sum(p.numel() for p in S.SmallCNN().parameters())
    n_vit = sum(p.numel() for p in S._build("vit").parameters())
    assert abs(n_cnn / n_vit - 1) < 0.02
    with pytest.raises(ValueError, match="images"):
        S.SmallCNN()(torch.zeros(2, 8, 8))
    with pytest.raises(ValueError, match="model"):
        S.config("mlp")
    with pytest.raises(ValueError, match="n must be"):
        S.subset(5, 0, torch.arange(100) % 10)


def test_choose_lr_takes_the_best_validation_count_and_breaks_ties_towards_the_recipe():
    run = lambda lr, v: {"model": "cnn", "n": 150, "lr": lr, "val_correct": v}
    assert S.choose_lr([run(1e-3, 130), run(3e-3, 131), run(1e-2, 132)], "cnn", 150) == 1e-2
    assert S.choose_lr([run(1e-3, 132), run(3e-3, 132), run(1e-2, 132)], "cnn", 150) == S.RECIPE["lr"]
    assert S.choose_lr([run(1e-3, 132), run(3e-3, 130), run(1e-2, 132)], "cnn", 150) in (1e-3, 1e-2)
    with pytest.raises(ValueError, match="no run"):
        S.choose_lr([run(1e-3, 1)], "vit", 150)


def test_subset_is_stratified_and_seeded():
    y = D.data().train[1]
    a, b = S.subset(150, 0, y), S.subset(150, 1, y)
    assert len(a) == 150 and np.bincount(np.asarray(y[a]), minlength=10).min() == 15
    assert not torch.equal(a, b) and torch.equal(a, S.subset(150, 0, y))
