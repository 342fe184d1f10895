"""The order task of chapter 6's contrast run (``tfbook.tasks.ends``: are the first and last
letters the same?).

Fast tests: the data (pairs share one multiset and carry both labels, the label is "first ==
last", validation and test share no multiset, training never draws a held-out multiset), the
exact bound (a permutation-invariant model scores exactly 1/2 on whole pairs, whatever its
weights), the shipped result (the model without positions at exactly 1/2 on every seed, the one
with learned positions above 90%) and the shipped weights giving their recorded accuracy in
float64. Retraining (about 15 CPU-seconds per model) is left to ``python -m tfbook.tasks.ends``;
training is deterministic on one machine (seed 0 with learned positions, rerun, reproduced its
shipped float16 weights exactly).
"""

import math

import numpy as np
import pytest
import torch

from tfbook.tasks import ends


def test_pairs_share_a_multiset_and_carry_both_labels():
    ids, y = ends.sample(300, np.random.default_rng(0))
    assert ids.shape == (600, ends.T) and (y[0::2] == 1).all() and (y[1::2] == 0).all()
    assert (np.sort(ids[0::2], 1) == np.sort(ids[1::2], 1)).all()
    assert ((ids[:, 0] == ids[:, -1]).astype(int) == y).all()
    assert all(len(set(r)) == ends.T - 1 for r in ids.tolist())  # exactly one letter twice


def test_splits_disjoint_and_held_out_never_drawn():
    held, (v_ids, v_y), (t_ids, t_y) = ends.data()
    assert len(t_ids) == len(v_ids) == 2000 and float(t_y.double().mean()) == 0.5
    assert not np.isin(ends._keys(t_ids.numpy()), ends._keys(v_ids.numpy())).any()
    batch, by = ends._batch(held, 128, torch.Generator().manual_seed(0))
    assert len(batch) == 128 and float(by.double().mean()) == 0.5
    assert not np.isin(ends._keys(batch.numpy()), held).any()


def test_any_invariant_model_scores_exactly_one_half():
    ids, y = ends.data().test
    for seed in (0, 1):
        m = ends.make_model("set", seed).double()  # untrained: the bound needs no training
        assert ends.accuracy(m, ids, y) == 0.5
        assert ends.cross_entropy(m, ids, y) >= math.log(2) - 1e-12


def test_shipped_result():
    res = ends.load_results()
    assert ends.load_pretrained() == res
    assert res["set"]["test"] == [0.5, 0.5, 0.5]
    assert min(res["mean"]["test"]) > 0.9


@pytest.mark.parametrize("variant", list(ends.VARIANTS))
def test_shipped_weights_give_recorded_accuracy(variant):
    for seed in ends.SEEDS:
        acc = ends.evaluate(ends.load_seed(variant, seed), "test")
        assert abs(acc - ends.load_results()[variant]["test"][seed]) <= 1 / 2000


def test_bad_input():
    with pytest.raises(ValueError, match="variant"):
        ends.load_seed("cls")
    with pytest.raises(ValueError, match="seed"):
        ends.load_seed("set", 3)
    with pytest.raises(ValueError, match="variant"):
        ends.config("max")
