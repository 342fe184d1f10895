"""The shipped artifacts of tfbook.tasks.induction (chapter 21) meet the chapter's bars; the
shipped weights reproduce the curves recorded while training; retraining seed 0 of the
two-layer model for its first steps reproduces the recorded start of its curve."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tfbook.tasks import _common
from tfbook.tasks import induction as task


def test_artifacts_are_small_and_complete():
    sizes = [(_common.WEIGHTS / name).stat().st_size for name in task.ARTIFACTS]
    assert sum(sizes) < 2_000_000, sizes  # the brief's bound: well under 2 MB in all
    for kind in task.KINDS:
        for s in task.RECIPE["seeds"]:
            _, h = task.load_pretrained(kind, s)
            c = h.extra["curve"]
            assert c["step"][0] == 0 and c["step"][-1] == task.RECIPE["steps"] and len(c["step"]) == 51


@pytest.mark.parametrize("seed", task.RECIPE["seeds"])
def test_two_layers_copy_and_one_layer_does_not(seed):
    torch.set_num_threads(1)
    data = task.eval_set(task.TEST_SEED, 128)
    two = task.load_pretrained("two", seed)[0].double()
    one = task.load_pretrained("one", seed)[0].double()
    f2, s2 = task.span_losses(two, data)
    f1, s1 = task.span_losses(one, data)
    assert f2 - s2 > 3.0 and f1 - s1 < 0.2 * (f2 - s2), (f2, s2, f1, s1)
    c = task.load_pretrained("two", seed)[1].extra["curve"]
    assert 0 < task.phase_change_step(c["step"], c["second"]) < task.RECIPE["steps"]


@pytest.mark.parametrize("kind", task.KINDS)
def test_shipped_weights_reproduce_the_recorded_curve_end(kind):
    model, h = task.load_pretrained(kind, 0)
    c = h.extra["curve"]
    f, s = task.span_losses(model.double(), task.eval_set())
    # recorded with the float32 weights before they were rounded to float16 for shipping
    assert abs(f - c["first"][-1]) < 0.02 and abs(s - c["second"][-1]) < 0.02, (f, s, c["first"][-1], c["second"][-1])


def test_retraining_reproduces_the_start_of_the_recorded_curve():
    torch.set_num_threads(1)
    _, h = task.load_pretrained("two", 0)
    c = h.extra["curve"]
    _, h2, _ = task.train("two", 0, steps=120)  # past the warm-up; the rate is constant after it
    c2 = h2.extra["curve"]
    assert c2["step"] == [0, 60, 120]
    # the same seed and data on the same code: equal up to float32 kernels of another machine
    np.testing.assert_allclose(c2["second"], c["second"][:3], atol=0.02)
    np.testing.assert_allclose(c2["first"], c["first"][:3], atol=0.02)
