"""The length test of chapter 7 (``tfbook.tasks.lengths``): four position schemes x 3 seeds.

The shipped result must meet the chapter's claims, and seed 0 of RoPE (the scheme with the widest
spread) retrained here must give the shipped accuracies within 2 points per position (float64
training; about 5 s of CPU). The four shipped seed-0 models (float16 weights, which chapter 7
evaluates instead of training) must give the recorded accuracies, and ALiBi's retrained here must
round to the shipped weights. The second task (copy the token 3 back, ``L.OFFSET``) ships the float16
weights of all 12 runs, which must give its record and meet the chapter's claims.
"""

import numpy as np
import pytest
import torch

from tfbook.tasks import lengths as L


def test_shipped_claims():
    res = L.load_pretrained()
    seen = {k: np.array([np.mean(a[:L.T_TRAIN - 1]) for a in res[k]]) for k in L.KINDS}
    unseen = {k: np.array([np.mean(a[L.T_TRAIN - 1:]) for a in res[k]]) for k in L.KINDS}
    assert all(len(res[k]) == 3 and seen[k].min() > 0.95 for k in L.KINDS)
    assert max(unseen["table"].max(), unseen["sinusoidal"].max()) < 0.2 and unseen["alibi"].min() > 0.95
    assert unseen["sinusoidal"].max() + 0.1 < unseen["rope"].min() and unseen["rope"].max() < 0.95


def test_rope_seed0_reproduces():
    acc = L.accuracy_by_position(L.train("rope", 0), L.test_ids())
    assert np.abs(acc - np.array(L.load_pretrained()["rope"][0])).max() <= 0.02


@pytest.mark.parametrize("kind", L.KINDS)
def test_shipped_seed0_models_give_the_record(kind):
    model = L.load_seed0(kind)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert all(torch.equal(p, p.half().double()) for p in model.parameters())  # float16 values
    acc = L.accuracy_by_position(model, L.test_ids())
    # float64 evaluation of the same weights: one sequence of 500 at most, for a near tie of two logits
    assert np.abs(acc - np.array(L.load_pretrained()[kind][0])).max() <= 0.002
    assert len(model.history["loss"]) == L.RECIPE["steps"] and model.history["t_train"] == L.T_TRAIN


def test_alibi_seed0_retrains_to_the_shipped_weights():
    shipped = L.load_seed0("alibi").state_dict()
    retrained = L.rounded(L.train("alibi", 0)).state_dict()
    assert shipped.keys() == retrained.keys()
    for k in shipped:  # float64 training, rounded to float16: equal but for a last-bit flip of float16
        assert torch.allclose(retrained[k], shipped[k], rtol=2 ** -9, atol=1e-4), k


def test_bad_kind():
    with pytest.raises(ValueError, match="kind"):
        L.PrevToken("relative")
    with pytest.raises(ValueError, match="kind"):
        L.load_seed0("relative")
    with pytest.raises(ValueError, match="t_train"):
        L.train("alibi", 0, t_train=65)


@pytest.mark.parametrize("kind", L.KINDS)
def test_shipped_other_seeds_give_the_record(kind):
    # seeds 1 and 2 ship too (lengths_seeds.pt, float16), and chapter 7 evaluates all twelve runs
    ids, res = L.test_ids(), L.load_pretrained()
    for seed in L.SEEDS[1:]:
        acc = L.accuracy_by_position(L.load_seed(kind, seed), ids)
        assert np.abs(acc - np.array(res[kind][seed])).max() <= 0.002, (kind, seed)
    with pytest.raises(ValueError, match="seed"):
        L.load_seed(kind, 5)


# The second task: copy the token OFFSET = 3 back (same recipe, schemes and seeds), which ALiBi's
# recency prior cannot single out in one head.
def test_copy_shipped_claims_and_weights():
    res, ids = L.load_copy_result(), L.test_ids()
    assert res["offset"] == L.OFFSET == 3 and res["recipe"] == L.RECIPE
    n_seen = L.T_TRAIN - L.OFFSET  # positions 3..15
    for kind in L.KINDS:
        for seed in L.SEEDS:
            m = L.load_copy(kind, seed)
            assert m.offset == L.OFFSET and all(torch.equal(p, p.half().double()) for p in m.parameters())
            acc = L.accuracy_by_position(m, ids)
            assert acc.shape == (L.T_TEST - L.OFFSET,)
            assert np.abs(acc - np.array(res[kind][seed])).max() <= 0.002, (kind, seed)
    seen = {k: np.array([np.mean(a[:n_seen]) for a in res[k]]) for k in L.KINDS}
    unseen = {k: np.array([np.mean(a[n_seen:]) for a in res[k]]) for k in L.KINDS}
    assert min(seen[k].min() for k in ("table", "sinusoidal", "rope")) > 0.995  # the page: "over 99.5%", averaged over positions 3-15
    assert seen["alibi"].max() < 0.5 and unseen["alibi"].max() < 0.5
    assert unseen["table"].max() < 0.2 and unseen["rope"].min() > 0.8


def test_copy_alibi_seed0_retrains_to_the_shipped_weights():
    shipped = L.load_copy("alibi", 0).state_dict()
    retrained = L.rounded(L.train("alibi", 0, offset=L.OFFSET)).state_dict()
    for k in shipped:  # float64 training, rounded to float16: equal but for a last-bit flip of float16
        assert torch.allclose(retrained[k], shipped[k], rtol=2 ** -9, atol=1e-4), k


def test_copy_bad_arguments():
    with pytest.raises(ValueError, match="offset"):
        L.PrevToken("rope", offset=0)
    with pytest.raises(ValueError, match="seed"):
        L.load_copy("rope", 7)
    with pytest.raises(ValueError, match="kind"):
        L.load_copy("relative", 0)
