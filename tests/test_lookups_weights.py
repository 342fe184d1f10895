"""The heads experiment of chapter 5 (``tfbook.tasks.lookups``).

Fast tests: the data (answers are the values stored under the queried keys, splits disjoint),
equal parameter counts for every number of heads, the shipped result (2 tasks x H in (1, 2, 4) x
3 seeds) meeting the chapter's claims, and the shipped seed-0 four-key models giving their
recorded accuracy in float64. Retraining (about half an hour of CPU for the 18 models) is left to
``python -m tfbook.tasks.lookups``; training is deterministic on one machine (the three seed-0
four-key models, retrained, gave their recorded accuracies exactly).
"""

import numpy as np
import pytest

from tfbook.tasks import lookups as lk


@pytest.mark.parametrize("task", list(lk.TASKS))
def test_data(task):
    n_slots, n_keys, n_query, key0, val0, q0, pad = lk._layout(task)
    ids, answers = lk.sample(task, 300, np.random.default_rng(0))
    assert ids.shape == (300, n_slots + 1, n_query) and answers.shape == (300, n_query)
    for n in range(50):
        keys = ids[n, :-1, 0] - key0
        assert len(set(keys.tolist())) == n_slots
        for j in range(n_query):
            slot = int(np.flatnonzero(keys == ids[n, -1, j] - q0 - j * n_keys)[0])
            assert answers[n, j] == ids[n, slot, 1] - val0
    _, (v_ids, _), (t_ids, _) = lk.data(task)
    assert not np.isin(lk._codes(t_ids.numpy()), lk._codes(v_ids.numpy())).any()


def test_equal_parameters():
    counts = {lk.param_count(lk.make_model(t, H)) for t in ("four",) for H in lk.HEADS}
    assert len(counts) == 1


def test_shipped_result_claims():
    res = lk.load_results()
    acc = {(t, H): np.array(res[t][str(H)]["test"]) for t in lk.TASKS for H in lk.HEADS}
    assert all(len(a) == 3 for a in acc.values())
    assert all(acc["two", H].min() > 0.98 for H in lk.HEADS)
    assert acc["four", 1].max() < 0.2 and acc["four", 4].min() > acc["four", 1].max() + 0.5


@pytest.mark.parametrize("H", lk.HEADS)
def test_shipped_models_give_recorded_accuracy(H):
    model, _ = lk.load_pretrained(H)
    assert abs(lk.evaluate(model, "test") - lk.load_results()["four"][str(H)]["test"][0]) <= 1 / 2000


def test_bad_input():
    with pytest.raises(ValueError, match="num_heads"):
        lk.load_pretrained(3)
    with pytest.raises(ValueError, match="task"):
        lk.data("five")


@pytest.mark.parametrize("task", list(lk.TASKS))
def test_shipped_other_runs_give_recorded_accuracy(task):
    # lookups_seeds.pt: the 15 runs besides the four-key seed-0 models, which chapter 5 evaluates
    res = lk.load_results()
    for H in lk.HEADS:
        for seed in lk.SEEDS:
            assert abs(lk.evaluate(lk.load_seed(task, H, seed)) - res[task][str(H)]["test"][seed]) <= 1 / 2000, (H, seed)
    with pytest.raises(ValueError, match="seed"):
        lk.load_seed(task, 1, 7)
