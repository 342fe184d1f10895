"""tfbook.tasks.dynamics: the experiments of chapters 3 and 8, and the shipped warm-up curves.

Everything here is fast (seconds) except ``test_warmup_regeneration_meets_the_bar``, which
retrains the thirteen warm-up runs of chapter 8 (about 1 minute on an idle 2-core CPU, several
on a busy one) and checks that a regeneration meets the same bar as the shipped curves and
weights. The curves
were trained in float32, so bitwise equality is not expected across machines; the bar is the
chapter's assertion: Post-LN without warm-up ends above 1.5 nats (chance is log 10 = 2.30; the
shipped seeds end at 1.9-2.3), the three other settings below 1.0 (shipped: 0.10-0.67).
"""

import math

import numpy as np
import pytest
import torch

from tfbook.tasks import dynamics


meets_warmup_bar = dynamics.meets_warmup_bar


def test_shipped_warmup_curves_meet_the_bar():
    data = dynamics.load_warmup_curves()
    assert data["recipe"]["steps"] == 200 and data["recipe"]["seeds"] == [0, 1, 2]
    assert all(len(runs) == 3 and all(len(c) == 200 for c in runs) for runs in data["curves"].values())
    assert meets_warmup_bar(data["curves"])


def test_warmup_bar_can_fail():
    data = dynamics.load_warmup_curves()
    swapped = dict(data["curves"])
    swapped["Post-LN, no warm-up"], swapped["Pre-LN, no warm-up"] = swapped["Pre-LN, no warm-up"], swapped["Post-LN, no warm-up"]
    assert not meets_warmup_bar(swapped)
    assert dynamics.final_loss([1.0] * 19 + [float("nan")]) == math.inf


def test_shipped_warmup_models_end_their_curves_and_meet_the_bar():
    data = dynamics.load_warmup_curves()
    assert data["recipe"]["small_lr"] == 3e-3 and len(data["small_lr_curve"]) == 200
    ends = {"no warm-up, 1e-2": data["curves"]["Post-LN, no warm-up"][0],
            "50-step warm-up, 1e-2": data["curves"]["Post-LN, 50-step warm-up"][0],
            "no warm-up, 3e-3": data["small_lr_curve"]}
    models = dynamics.load_warmup_models()
    assert set(models) == set(dynamics.WARMUP_SLICE) == set(ends)
    held = {name: dynamics.heldout_sort_loss(m) for name, m in models.items()}
    for name, loss in held.items():
        assert abs(loss - dynamics.final_loss(ends[name])) < 0.2, (name, loss)
    assert held["no warm-up, 1e-2"] > dynamics.WARMUP_FAILED_ABOVE
    assert max(held["50-step warm-up, 1e-2"], held["no warm-up, 3e-3"]) < dynamics.WARMUP_LEARNED_BELOW
    # the check can fail: the model without warm-up does not end the warm-up curve
    assert abs(held["no warm-up, 1e-2"] - dynamics.final_loss(ends["50-step warm-up, 1e-2"])) > 0.2


def test_warmup_run_stop_after_gives_the_first_losses_of_the_run():
    torch.set_num_threads(1)
    data = dynamics.load_warmup_curves()
    first = dynamics.warmup_run(False, 50, 0, stop_after=5)       # the 200-step schedule, cut after 5 steps
    assert len(first) == 5
    assert np.abs(np.array(first) - np.array(data["curves"]["Post-LN, 50-step warm-up"][0][:5])).max() < 1e-3
    with pytest.raises(ValueError, match="stop_after"):
        dynamics.warmup_run(False, 0, 0, steps=10, stop_after=11)


def test_warmup_regeneration_meets_the_bar(tmp_path):
    from tfbook.tasks import dynamics as task
    task.main(["--out", str(tmp_path)])
    regenerated = dynamics.load_warmup_curves(tmp_path / dynamics.WARMUP_CURVES.name)
    assert meets_warmup_bar(regenerated["curves"])
    assert dynamics.final_loss(regenerated["small_lr_curve"]) < dynamics.WARMUP_LEARNED_BELOW
    held = {name: dynamics.heldout_sort_loss(m)
            for name, m in dynamics.load_warmup_models(tmp_path / dynamics.WARMUP_MODELS.name).items()}
    assert held["no warm-up, 1e-2"] > dynamics.WARMUP_FAILED_ABOVE
    assert max(held["50-step warm-up, 1e-2"], held["no warm-up, 3e-3"]) < dynamics.WARMUP_LEARNED_BELOW


def test_steps_to_threshold():
    losses = [1.0] * 20 + [0.0] * 20
    # running mean of 10 first below 0.5 when 6 zeros are in the window: window ending at step 26
    assert dynamics.steps_to_threshold(losses, 0.5, window=10) == 26
    assert dynamics.steps_to_threshold([1.0] * 30, 0.5) == 31          # never: len + 1


def test_retrieval_scale_ordering():
    torch.set_num_threads(1)
    hits = {k: dynamics.steps_to_threshold(dynamics.retrieval_run(k, seed=0), 0.1) for k in dynamics.SCALES}
    assert hits["1/sqrt(D_K)"] < 40 and 1.5 * hits["1/sqrt(D_K)"] < hits["none"] <= 150 < hits["1/D_K"], hits


def test_rank_one_residual_is_the_minimum():
    rng = np.random.default_rng(1)
    X, d = rng.normal(size=(8, 5)), rng.normal(size=5)
    shifted = np.linalg.norm(X - (X.mean(0) + d))
    assert abs(shifted**2 - dynamics.rank_one_residual(X) ** 2 - 8 * d @ d) < 1e-10
    assert dynamics.rank_one_residual(np.tile(rng.normal(size=5), (8, 1))) < 1e-12


def test_rank_collapse_directions():
    a_att, _ = dynamics.rank_collapse("attention", depth=6, seed=1)
    a_skip, r_skip = dynamics.rank_collapse("skip", depth=6, seed=1)
    assert a_att[0] == 1.0 and a_att[-1] < 1e-12 and (a_skip > 0.9).all()
    assert 0 < r_skip[-1] < r_skip[0] <= 1
    with pytest.raises(ValueError):
        dynamics.rank_collapse("mlp")


def test_w2_gradients_shapes_and_pre_ln_profile():
    w2, whole = dynamics.ffn_w2_gradients(True, L=3, seeds=range(2), D=16, H=2, T=4, B=2)
    assert w2.shape == whole.shape == (3,) and (w2 > 0).all() and (whole > w2).all()
    with pytest.raises(ValueError):
        dynamics.ffn_w2_gradients(False, L=2, init="he", seeds=range(1))
