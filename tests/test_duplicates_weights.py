"""The duplicate-detection experiment of chapters 6 and 9 (``tfbook.tasks.duplicates``).

Fast tests: the data (labels right, splits disjoint, held-out sequences never drawn for
training), the shipped result (three variants x three seeds, every test accuracy above the
chapters' 95% bar), the shipped seed-0 models giving their recorded accuracy in float64, and the
symmetry of the "set" variant (no positions: invariant to reordering). Retraining (minutes of CPU
per variant) is left to ``python -m tfbook.tasks.duplicates``; training is deterministic on one
machine (seed 0 of each variant reproduced its recorded accuracy when rerun).
"""

import numpy as np
import pytest
import torch

from tfbook.tasks import duplicates as dup

BAR = 0.95  # chance is 0.5


def test_data():
    ids, y = dup.sample(500, np.random.default_rng(0))
    repeats = np.array([len(set(r)) < dup.T for r in ids.tolist()])
    assert (repeats == y.astype(bool)).all() and 0.4 < y.mean() < 0.6
    assert all(len(set(r)) >= dup.T - 1 for r in ids.tolist())  # at most one repeated letter
    held, (v_ids, _), (t_ids, _) = dup.data()
    assert not np.isin(dup._codes(t_ids.numpy()), dup._codes(v_ids.numpy())).any()
    batch, _ = dup._batch(held, 2048, torch.Generator().manual_seed(0))
    assert not np.isin(dup._codes(batch.numpy()), held).any()


def test_shipped_result_meets_bar():
    res = dup.load_results()
    for v in dup.VARIANTS:
        assert len(res[v]["test"]) == len(dup.SEEDS) and min(res[v]["test"]) > BAR, (v, res[v])


@pytest.mark.parametrize("variant", list(dup.VARIANTS))
def test_shipped_models_give_recorded_accuracy(variant):
    model, _ = dup.load_pretrained(variant)
    assert abs(dup.evaluate(model, "test") - dup.load_results()[variant]["test"][0]) <= 1 / 2000


def test_set_variant_is_invariant_and_positions_are_not():
    ids, _ = dup.data().test
    perm = np.random.default_rng(1).permutation(dup.T)
    with torch.no_grad():
        m_set = dup.load_pretrained("set")[0].double()
        m_pos = dup.load_pretrained("mean")[0].double()
        assert (m_set(ids[:, perm]) - m_set(ids)).abs().max() < 1e-12
        assert (m_pos(ids[:, perm]) - m_pos(ids)).abs().max() > 1e-2


def test_bad_input():
    with pytest.raises(ValueError, match="variant"):
        dup.load_pretrained("max")
    with pytest.raises(ValueError, match="ids"):
        dup.load_pretrained("cls")[0](torch.zeros(8, dtype=torch.long))


@pytest.mark.parametrize("variant", list(dup.VARIANTS))
def test_shipped_other_seeds_give_recorded_accuracy(variant):
    # the weights of seeds 1 and 2 (duplicates_seeds.pt) reproduce the command's record
    for seed in dup.SEEDS[1:]:
        assert abs(dup.evaluate(dup.load_seed(variant, seed), "test") - dup.load_results()[variant]["test"][seed]) <= 1 / 2000
    with pytest.raises(ValueError, match="seed"):
        dup.load_seed(variant, 3)
