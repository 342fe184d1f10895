"""The length test of chapter 7 (``tfbook.tasks.lengths``): four position schemes x 3 seeds.

The shipped result must meet the chapter's claims, and seed 0 of RoPE (the scheme with the widest
spread) retrained here must give the shipped accuracies within 2 points per position (float64
training; about 5 s of CPU).
"""

import numpy as np
import pytest

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


def test_bad_kind():
    with pytest.raises(ValueError, match="kind"):
        L.PrevToken("relative")
