"""The shipped artifacts of tfbook.tasks.incontext (chapter 22): three seeds, small, reloading to
their recorded validation error (float64, any machine), meeting the chapter's validation bars,
and a short retrain that repeats the shipped run's first steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tfbook.numpy import incontext as nic
from tfbook.tasks import incontext as task
from tfbook.tasks._common import shipped


def test_three_small_float16_artifacts():
    sizes = [shipped(name).stat().st_size for name in task.ARTIFACTS]
    assert len(sizes) == 3 and sum(sizes) < 2_000_000
    for s in task.RECIPE["seeds"]:
        blob = torch.load(shipped(f"incontext_seed{s}.pt"), weights_only=True)
        assert all(v.dtype == torch.float16 for v in blob["state_dict"].values())
        assert blob["config"] == dict(task.config().__dict__)


@pytest.mark.parametrize("seed", task.RECIPE["seeds"])
def test_shipped_weights_reproduce_the_recorded_validation_error(seed):
    torch.set_num_threads(1)
    model, history = task.load_pretrained(seed)
    assert abs(task.evaluate(model) - history.extra["validation_after_rounding"]) < 1e-9  # float64 round-off
    assert history.best_step is not None and history.best_step <= task.RECIPE["steps"]


def test_every_seed_learns_in_context_on_validation():
    torch.set_num_threads(1)
    X, y, _ = task.data().validation
    d = task.D
    ls = ((nic.least_squares(X, y) - y) ** 2).mean(0) / d
    avg = ((nic.averaging(X, y) - y) ** 2).mean(0) / d
    for s in task.RECIPE["seeds"]:
        err = task.errors(task.load_pretrained(s)[0], X, y)
        assert np.all(err[d:] < avg[d:]), s  # below averaging from k = d on
        assert np.all(err - ls > -0.02), s  # no better than the optimum (beyond noise)
        assert err[2 * d] < 0.5 * avg[2 * d], s


def test_splits_are_fixed_and_distinct():
    v, t = task.data().validation, task.data().test
    assert v[0].shape == (task.SPLIT_SIZES["validation"], task.K, task.D)
    assert t[0].shape == (task.SPLIT_SIZES["test"], task.K, task.D)
    np.testing.assert_array_equal(task.data().test[0], t[0])
    assert not np.isin(v[2], t[2]).any()  # no function shared


def test_a_short_retrain_repeats_the_shipped_runs_first_steps():
    torch.set_num_threads(1)
    _, history = task.train(0, stop_after=20)
    _, shipped_history = task.load_pretrained(0)
    # float32 training: the first 20 losses agree to 1e-4 across machines and thread counts
    np.testing.assert_allclose(history.loss[:20], shipped_history.loss[:20], rtol=1e-4)


def test_load_pretrained_rejects_unknown_seeds():
    with pytest.raises(ValueError, match="seed must be one of"):
        task.load_pretrained(7)
