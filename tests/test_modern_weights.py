"""The shipped artifacts of chapter 14's comparison (tfbook.tasks.modern): files, parameter
counts, the shipped figures reproduced from the shipped weights (float64), and the recipe
reproducing the start of the shipped training (same machine class: float32 training)."""

import math

import numpy as np
import pytest
import torch

from tfbook.tasks import modern
from tfbook.tasks._common import shipped
from tfbook.torch.models import DecoderLM, num_params
from tfbook.torch.modern import LlamaLM


def test_artifacts_exist_and_stay_small():
    sizes = [shipped(name).stat().st_size if hasattr(shipped(name), "stat") else len(shipped(name).read_bytes())
             for name in modern.ARTIFACTS]
    assert sum(sizes) < 1_000_000, sizes


def test_scores_file_is_complete_and_the_choice_was_made_on_validation():
    s = modern.load_scores()
    assert set(s["runs"]) == set(modern.KINDS) == set(s["params"]) == set(s["lr_search"])
    for kind in modern.KINDS:
        runs = s["runs"][kind]
        assert [r["seed"] for r in runs] == list(modern.RECIPE["seeds"])
        search = s["lr_search"][kind]
        chosen = min(modern.LRS, key=lambda lr: search[str(lr)])
        assert all(r["lr"] == chosen for r in runs)  # the lr with the best seed-0 validation score
        assert runs[0]["curve"][-1] >= min(runs[0]["curve"]) and min(runs[0]["curve"]) == pytest.approx(search[str(chosen)])
        for r in runs:
            assert 1.0 < r["test"] < math.log2(62) and 0.0 < r["test_accuracy"] < 1.0
        assert len(s["tokens_per_second"][kind]) >= 3 and all(t > 0 for t in s["tokens_per_second"][kind])


def test_parameter_counts_match_within_a_fifth_of_a_percent():
    s = modern.load_scores()
    n = {k: num_params(modern._model(modern.config(k))) for k in modern.KINDS}
    assert n == s["params"]
    assert max(n.values()) - min(n.values()) <= 0.002 * n["2017"]


@pytest.mark.parametrize("kind", modern.KINDS)
def test_shipped_weights_reproduce_the_shipped_figures(kind):
    model, history = modern.load_pretrained(kind)
    assert isinstance(model, DecoderLM if kind == "2017" else LlamaLM)
    s = modern.load_scores()["runs"][kind][0]
    lp, ok = modern.predictions(model, modern.data().test)
    assert abs(float(-lp.mean()) - s["test"]) < 1e-9  # float64 evaluation of float16 weights: round-off only
    assert abs(float(ok.double().mean()) - s["test_accuracy"]) < 1e-9
    assert abs(modern.evaluate(model, "validation") - s["validation"]) < 1e-9
    assert history.best_step == s["best_step"] and history.eval == s["curve"]


@pytest.mark.parametrize("kind", modern.KINDS)
def test_the_recipe_reproduces_the_start_of_the_shipped_training(kind, one_thread):
    _, shipped_history = modern.load_pretrained(kind)
    lr = modern.load_scores()["runs"][kind][0]["lr"]
    _, h = modern.train(kind, steps=20, seed=0, lr=lr)
    # float32 training: the same recipe on another CPU rounds differently; 20 steps stay within 1e-3
    np.testing.assert_allclose(h.loss, shipped_history.loss[:20], rtol=0, atol=1e-3)
    assert h.eval[0] == pytest.approx(shipped_history.eval[0], abs=1e-9)  # step 0: the float64 evaluation of the init


def test_short_training_is_deterministic(one_thread):
    a = modern.train("gqa", steps=3)[1].loss
    assert a == modern.train("gqa", steps=3)[1].loss


def test_bad_kind():
    with pytest.raises(ValueError, match=r"kind must be one of"):
        modern.config("gpt")
    with pytest.raises(ValueError, match=r"kind must be one of"):
        modern.load_pretrained("gpt")


@pytest.mark.parametrize("kind", modern.KINDS)
def test_tokens_per_second_trains_the_old_measurement_steps_through_the_one_loop(kind, one_thread, monkeypatch):
    """The throughput runs through tfbook.torch.training.train (issue 39) and takes exactly the steps
    its own loop took before: torch.optim.AdamW's defaults at lr 1e-3 (weight decay 0.01), no clipping,
    seed 0 for the model and the batches. Same float operations in the same order: ``==``."""
    import tfbook.torch.training as training
    from tfbook.torch.models import lm_batch, lm_loss

    seen, real_train, real_model = {}, training.train, modern._model
    monkeypatch.setattr(modern, "_model", lambda cfg: seen.setdefault("model", real_model(cfg)))
    monkeypatch.setattr(training, "train", lambda *a, **k: seen.setdefault("history", real_train(*a, **k)))
    assert modern.tokens_per_second(kind, steps=3, batch_size=2) > 0
    cfg = modern.config(kind)
    torch.manual_seed(0)
    model = real_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(3 + 3):  # 3 warm-up steps, then the 3 measured
        x, y = lm_batch(modern.data().train, cfg.block_size, 2, generator=g)
        loss = lm_loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert seen["history"].loss == losses
    new, old = seen["model"].state_dict(), model.state_dict()
    assert all(torch.equal(new[k], old[k]) for k in old)


def test_tokens_per_second_bad_steps():
    with pytest.raises(ValueError, match=r"steps must be an integer >= 1"):
        modern.tokens_per_second("gqa", steps=0)
