"""Chapter 26's task (tfbook/tasks/preferences.py) and its shipped artifacts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tfbook.tasks import preferences as P
from tfbook.tasks._common import shipped



def test_artifacts_ship_small():
    for name in P.ARTIFACTS:
        path = shipped(name)
        assert path.is_file(), name
        assert path.stat().st_size < 400_000, (name, path.stat().st_size)


def test_results_record_the_choices():
    res = P.load_results()
    assert res["chosen_beta"] == max(P.BETAS, key=lambda b: res["sweep"][f"{b:g}"]["val_exact"])
    assert res["rm_lr"] == max(P.RM_LR_GRID, key=lambda lr: res["rm_grid"][f"{lr:g}"])
    lr = max(P.DPO_LR_GRID, key=lambda lr: res["dpo_lr_grid"][f"{lr:g}"])
    assert lr == res["dpo_lr"] == P.RECIPE["lr"]                      # the sweep's rate is the chosen one
    assert P.DPO_LR_GRID[0] < lr < P.DPO_LR_GRID[-1]                   # bracketed
    assert res["dpo_lr_grid"][f"{lr:g}"] == res["sweep"][f"{res['chosen_beta']:g}"]["val_exact"]
    assert set(res["sweep_seeds"]) == {"0", "1", "2"} and res["sweep_seeds"]["0"] == res["sweep"]
    for s in ("1", "2"):
        assert set(res["sweep_seeds"][s]) == {f"{b:g}" for b in P.BETAS}
    for s in P.SEEDS:
        for split in ("validation", "test"):
            drawn = res["drawn"][str(s)][split]
            assert len(drawn) == 200 and all(len(d) == P.RECIPE["samples"] for d in drawn)
            assert len(P.pairs_from(P.words(split), [[tuple(a) for a in d] for d in drawn])) == res["pairs"][str(s)][split]


def test_splits_are_disjoint():
    tr, va, te = (set(x) for x in P.data())
    assert len(va) == 200 and len(te) == 200
    assert not (tr & va) and not (tr & te) and not (va & te)


def test_models_load_and_the_untrained_dpo_loss_is_log2(one_thread):
    sft = P.sft_model(0).double()
    pol = P.load_pretrained(0)[0].double()
    rm = P.load_reward_model(0)[0].double()
    pairs = P.pairs_from(P.words("test"), [[tuple(a) for a in d] for d in P.load_results()["drawn"]["0"]["test"]])[:20]
    ids_c, doc_c = P.encode([(w, c) for w, c, _ in pairs])
    ids_r, doc_r = P.encode([(w, r) for w, _, r in pairs])
    with torch.no_grad():
        rc, rr = P.sequence_logprobs(sft, ids_c, doc_c), P.sequence_logprobs(sft, ids_r, doc_r)
        pc, pr = P.sequence_logprobs(pol, ids_c, doc_c), P.sequence_logprobs(pol, ids_r, doc_r)
        assert rm(ids_c, doc_c).shape == (20,)
    from tfbook.torch.functional.preferences import dpo_loss
    assert abs(dpo_loss(rc, rr, rc, rr, 1.0).item() - math.log(2)) < 1e-12
    assert dpo_loss(pc, pr, rc, rr, 1.0).item() < math.log(2)


def test_short_training_is_deterministic_and_round_trips(tmp_path, one_thread):
    m, h = P.train(1.0, 0, steps=2)
    assert len(h.loss) == 2 and all(math.isfinite(x) for x in h.loss)
    assert abs(h.loss[0] - math.log(2)) < 1e-5  # the policy starts at the reference
    assert P.train(1.0, 0, steps=2)[1].loss == h.loss
    rm, hr = P.train_reward_model(0, steps=2)
    assert abs(hr.loss[0] - math.log(2)) < 1e-6  # a zero head: every reward 0
    path = P.save(rm, hr, tmp_path, "prefs_rm_seed0.pt")
    back = P.load_reward_model(0, folder=tmp_path)[0]
    ids, doc = P.encode([("abram", "marba"), ("dam", "mad")])
    with torch.no_grad():
        assert torch.allclose(back(ids, doc), rm.half().float()(ids, doc), atol=1e-3)
    assert path.is_file()


def test_bad_input():
    with pytest.raises(ValueError, match="split must be one of"):
        P.words("dev")
    with pytest.raises(ValueError, match="seed must be one of"):
        P.load_reward_model(5)
    with pytest.raises(ValueError, match="the sweep has beta"):
        P.load_pretrained(1, 0.2)
    with pytest.raises(ValueError, match="the learning-rate grid"):
        P.load_pretrained(1, lr=3e-4)                  # the grid is seed 0's
    with pytest.raises(ValueError, match="the learning-rate grid"):
        P.load_pretrained(0, 0.3, lr=3e-4)             # ... at the chosen beta
    with pytest.raises(ValueError, match="the learning-rate grid"):
        P.load_pretrained(0, lr=2e-4)
    assert P.verify("marba", "abram") and not P.verify("marb", "abram")
    assert np.isfinite(P.evaluate(P.sft_model(0), "validation"))
