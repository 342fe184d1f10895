"""Chapter 27's shipped artifacts (tfbook.tasks.rlvr): the pretrained model half-solves the task,
every final model reproduces the end of its logged curve and gains over it, the supervised reference
and the edge probes are recorded, a short run is
deterministic, and the answer-distribution walk agrees with the model's own probabilities."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from tfbook.tasks import addition, rlvr


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(1)
    return rlvr.load_models(), rlvr.load_results()


def test_results_shape_and_choices(shipped):
    _, res = shipped
    assert set(res["runs"]) == {*rlvr.METHODS, "rs_matched"}
    assert all(len(res["runs"][m]) == len(rlvr.SEEDS) for m in res["runs"])
    c = res["chosen"]
    assert c["lr"] in rlvr.SEARCH["lr"] and c["group"] in rlvr.SEARCH["group"]
    assert c["beta"] in rlvr.SEARCH["beta"] and c["rs_lr"] in rlvr.SEARCH["rs_lr"]
    # rejection sampling at GRPO's prompts x group: its rate is the best of its seed-0 validation search,
    # and seed 0 of its final runs is that search run
    matched = [s for s in res["search"] if s["method"] == "rs" and s.get("group") == c["group"]]
    assert [s["lr"] for s in matched] == list(rlvr.RS_MATCHED_LR)
    assert c["rs_matched_lr"] == max(matched, key=lambda s: s["score"])["lr"]
    run0 = res["runs"]["rs_matched"][0]
    assert abs(float(np.mean(run0["eval"][-3:])) - max(s["score"] for s in matched)) < 1e-12
    steps = res["runs"]["grpo"][0]["eval_step"]
    assert steps[0] == 0 and steps[-1] == rlvr.RECIPE["steps"]


def test_base_half_solves_and_final_models_match_their_curves(shipped):
    models, res = shipped
    val = rlvr.data().validation
    base = addition.exact_match(models["base"], val).double().mean().item()
    assert abs(base - res["base_validation"]) <= 0.001 + 1e-12 and 0.6 < base < 0.8   # one item: float32 near-ties may flip on another CPU
    for m in (*rlvr.METHODS, "rs_matched"):
        for model, run in zip(models[m], res["runs"][m]):
            em = addition.exact_match(model, val).double().mean().item()
            assert abs(em - run["eval"][-1]) <= 0.004, (m, em, run["eval"][-1])  # float16 differences
            assert em > base + 0.05


def test_short_run_is_deterministic(shipped):
    models, _ = shipped
    a = rlvr.train("grpo_kl", seed=1, base=models["base"], steps=3)[1]
    b = rlvr.train("grpo_kl", seed=1, base=models["base"], steps=3)[1]
    assert a.loss == b.loss and len(a.loss) == 3 and all(math.isfinite(x) for x in a.loss)
    with pytest.raises(ValueError, match="method must be one of"):
        rlvr.train("ppo", base=models["base"], steps=1)


def test_answer_distribution_matches_teacher_forced_probabilities(shipped):
    models, _ = shipped
    m64 = copy.deepcopy(models["base"]).double()
    items = rlvr.data().test[:5]
    dist = rlvr.answer_distribution(m64, items[:, :rlvr.PROMPT_LEN], min_prob=1e-4)
    for d, row in zip(dist, items):
        assert 0.99 < sum(d.values()) <= 1 + 1e-12
        ids = torch.tensor([list(row[:rlvr.PROMPT_LEN].tolist()) + list(a) for a in d])
        with torch.no_grad():
            lp = rlvr.completion_logp(m64, ids).sum(1).exp().numpy()
        assert np.allclose(lp, np.array(list(d.values())), atol=1e-12, rtol=0)


def test_supervised_reference_and_probes_are_recorded(shipped):
    models, res = shipped
    assert len(models["sft"]) == 1 and res["sft"]["steps"] == rlvr.SFT_STEPS
    em = addition.exact_match(models["sft"][0], rlvr.data().validation).double().mean().item()
    assert abs(em - res["sft"]["validation"]) <= 0.002   # float16 differences: two items
    assert [(p["method"], {k: v for k, v in p.items() if k not in ("method", "score")}) for p in res["probes"]] == \
        [(m, kw) for m, kw in rlvr.PROBES]


def test_supervised_reference_continues_the_pretraining_run():
    # constant rate and one seed: 300 steps of the 500-step run are pretrain()'s, step for step
    _, short = addition.train(steps=5, seed=0, reverse=False)
    _, long = addition.train(steps=8, seed=0, reverse=False)
    assert long.loss[:5] == short.loss
