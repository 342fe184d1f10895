"""The shipped artifacts of tfbook.tasks.experts (chapter 19) meet the chapter's bars, and the
seed-0 weights reproduce their recorded scores (float64, any machine)."""

import math

import numpy as np
import pytest
import torch

from tfbook.tasks import experts as task
from tfbook.tasks import modern
from tfbook.torch.experts import merge_lora


def test_every_artifact_is_shipped_with_three_seeds():
    scores = task.load_scores()
    for kind in task.KINDS:
        runs = scores[kind]["runs"]
        assert [r["seed"] for r in runs] == list(task.RECIPE["seeds"])
        assert all(math.isfinite(r["test"]) and r["best_step"] <= task.RECIPE["steps"] for r in runs)
    lora = task.load_lora_scores()
    assert set(lora["runs"]) == set(task.SETTINGS)
    assert lora["chars"] == [int(s.numel()) for s in task.lora_data()]


@pytest.mark.parametrize("kind", task.KINDS)
def test_shipped_weights_reproduce_the_recorded_validation_score(kind):
    torch.set_num_threads(1)
    model, _ = task.load_pretrained(kind)
    recorded = task.load_scores(kind)["runs"][0]
    assert abs(task.evaluate(model, "validation") - recorded["validation"]) < 1e-9  # float64 round-off


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("kind", task.KINDS)
def test_every_seeds_shipped_weights_reproduce_the_recorded_scores(kind, seed):
    """Seeds 1 and 2 ship too: their validation score and (for a mixture) routing loads as recorded."""
    torch.set_num_threads(1)
    model, _ = task.load_pretrained(kind, seed=seed)
    recorded = task.load_scores(kind)["runs"][seed]
    assert recorded["seed"] == seed
    assert abs(task.evaluate(model, "validation") - recorded["validation"]) < 1e-9  # float64 round-off
    assert task.routing_loads(model, task.data().validation) == recorded["loads"]


def test_load_pretrained_and_load_finetuned_refuse_unshipped_seeds():
    with pytest.raises(ValueError, match="seed"):
        task.load_pretrained("moe", seed=3)
    with pytest.raises(ValueError, match="rank 4 and seed 1"):
        task.load_finetuned("lora", seed=1, rank=4)
    with pytest.raises(ValueError, match="seed"):
        task.load_finetuned("full", seed=5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rank_one_adapters_and_full_fine_tuning_of_every_seed_score_as_recorded(seed):
    torch.set_num_threads(1)
    lora = task.load_lora_scores()
    test = task.lora_data().test
    for mode, name, tol in (("lora", "lora-r1", 1e-6), ("full", "full", 1e-9)):  # the adapter merges in float32
        model = merge_lora(task.load_finetuned(mode, seed=seed, rank=1))
        for p in model.parameters():
            p.data = p.data.half().float()
        bits = float(-modern.predictions(model, test)[0].mean())
        assert abs(bits - lora["runs"][name]["runs"][seed]["test"]) < tol, (mode, seed)


def test_the_balance_loss_keeps_every_expert_busy_and_its_absence_does_not():
    scores = task.load_scores()

    def least(kind):
        return [min(min(layer) / sum(layer) for layer in r["loads"]) for r in scores[kind]["runs"]]

    assert min(least("moe")) > 0.07 and max(least("moe-nobal")) < 0.01


def test_lora_adapter_reloads_merges_and_scores_as_recorded():
    torch.set_num_threads(1)
    lora = task.load_lora_scores()
    adapted = task.load_finetuned("lora")
    x = task.lora_data().test[None, :64]
    with torch.no_grad():
        a = adapted.double()(x)
        merged = merge_lora(adapted)
        np.testing.assert_allclose(merged(x).numpy(), a.numpy(), rtol=0, atol=1e-12)
    shipped = merge_lora(task.load_finetuned("lora"))
    for p in shipped.parameters():
        p.data = p.data.half().float()
    bits = float(-modern.predictions(shipped, task.lora_data().test)[0].mean())
    assert abs(bits - lora["runs"]["lora-r4"]["runs"][0]["test"]) < 1e-6  # a float32 merge
    full = task.load_finetuned("full")
    bits_full = float(-modern.predictions(full, task.lora_data().test)[0].mean())
    assert abs(bits_full - lora["runs"]["full"]["runs"][0]["test"]) < 1e-9
    assert lora["none"]["test"] - max(r["test"] for res in lora["runs"].values() for r in res["runs"]) > 0.15


def test_a_short_retrain_is_deterministic():
    torch.set_num_threads(1)
    a = task.train("moe", seed=0, steps=3)[1].loss
    b = task.train("moe", seed=0, steps=3)[1].loss
    assert a == b and len(a) == 3


def test_the_shipped_recipes_are_the_minima_of_the_validation_search():
    search = task.load_search()
    assert len(search["runs"]) == sum(len(task.grid(k)) for k in task.SEARCHED)
    assert all("test" not in r for r in search["runs"])  # the search reads no test character
    best = task.chosen(search["runs"])
    assert best["moe-nobal"] == (best["moe"][0], 0.0)
    scores = task.load_scores()
    for kind in task.KINDS:
        assert (scores[kind]["recipe"]["lr"], scores[kind]["recipe"]["balance"]) == best[kind]
        assert all((r["lr"], r["balance"]) == best[kind] for r in scores[kind]["runs"])
    for kind in task.SEARCHED:
        point = [r for r in search["runs"] if r["kind"] == kind and (r["lr"], r["balance"]) == best[kind]]
        assert len(point) == 1 and point[0]["curve"] == scores[kind]["runs"][0]["curve"]


def test_chosen_refuses_an_incomplete_search():
    runs = [r for r in task.load_search()["runs"] if not (r["kind"] == "dense-total" and r["lr"] == task.LRS[0])]
    with pytest.raises(ValueError, match="2 records of 'dense-total', expected 3"):
        task.chosen(runs)
    with pytest.raises(ValueError, match="kind must be one of"):
        task.grid("moe-nobal")


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("variant", task.VARIANTS)
def test_balancing_variants_reproduce_their_recorded_scores(variant, seed):
    """The bias and z-loss mixtures: every seed's weights (bias buffer included) score and route as recorded."""
    torch.set_num_threads(1)
    model, _ = task.load_pretrained(variant, seed=seed)
    assert all((layer.bias is not None) == (variant == "moe-bias") for layer in model.moe_layers())
    recorded = task.load_balancing()["runs"][variant][seed]
    assert recorded["seed"] == seed
    assert abs(task.evaluate(model, "validation") - recorded["validation"]) < 1e-9  # float64 round-off
    stats = task.router_stats(model, task.data().validation)
    assert stats["loads"] == recorded["loads"]
    assert np.allclose(stats["z"], recorded["z"], rtol=0, atol=1e-9)


def test_balancing_search_is_complete_and_its_minima_are_shipped():
    bal = task.load_balancing()
    assert sorted(r["value"] for r in bal["search"] if r["kind"] == "moe-bias") == sorted(task.BIAS_RATES)
    assert sorted(r["value"] for r in bal["search"] if r["kind"] == "moe-z") == sorted(task.Z_COEFS)
    assert all("test" not in r for r in bal["search"])  # the search reads no test character
    chosen = task.chosen_balancing(bal["search"])
    assert bal["chosen"] == chosen
    assert all(r["value"] == chosen[v] for v, rs in bal["runs"].items() for r in rs)
    best = task.chosen(task.load_search()["runs"])["moe"]
    assert (bal["moe"]["lr"], bal["moe"]["balance"]) == best


def test_a_short_bias_retrain_moves_the_bias_and_is_deterministic():
    torch.set_num_threads(1)
    a, ha = task.train("moe-bias", seed=0, steps=3, bias_rate=0.01)
    b, hb = task.train("moe-bias", seed=0, steps=3, bias_rate=0.01)
    assert ha.loss == hb.loss and len(ha.loss) == 3
    m = task._model(task.config("moe-bias")).train()
    x = task.data().train[:33 * 4].reshape(4, 33)[:, :32]
    m(x)
    m.update_bias(0.01)
    assert all(set(torch.round(layer.bias / 0.01).tolist()) <= {-1.0, 0.0, 1.0} for layer in m.moe_layers())
    assert any(layer.bias.abs().max() > 0 for layer in m.moe_layers())
