"""Chapter 13's count model that learns as it reads, and its mixture with the transformer
(tfbook.tasks.mixing): the vectorised counts against a plain dictionary reference, the
normalisation, the online update, EM's weights, bad input, and the shipped prose_mix.json."""

from collections import defaultdict

import numpy as np
import pytest

from tfbook.tasks import mixing


def reference(train, text, K, D, s, V, online=True):
    """The same model with Python dictionaries, one character at a time: counts of the longest
    context, Kneser-Ney continuation counts below it. Returns p(true) and the sum of each
    distribution."""
    seq = list(train)
    counts = [defaultdict(lambda: defaultdict(int)) for _ in range(K + 1)]
    seen = set()

    def add(i):
        for k in range(min(K, i) + 1):
            h, c = tuple(seq[i - k:i]), seq[i]
            if k == K:
                counts[k][h][c] += 1
            elif i >= k + 1 and (seq[i - k - 1],) + h + (c,) not in seen:
                counts[k][h][c] += 1
        for k in range(min(K, i) + 1):
            if k + 1 <= i:
                seen.add(tuple(seq[i - k - 1:i + 1]))

    for i in range(len(seq)):
        add(i)
    out, sums = [], []
    for c in text:
        p = np.full(V, 1.0 / V)
        for k in range(K + 1):
            cnt = counts[k].get(tuple(seq[len(seq) - k:]) if k else ())
            if cnt:
                a = np.zeros(V)
                a[list(cnt)] = list(cnt.values())
                p = (np.maximum(a - D, 0) + (D * (a > 0).sum() + s) * p) / (a.sum() + s)
        out.append(p[c])
        sums.append(p.sum())
        seq.append(c)
        if online:
            add(len(seq) - 1)
    return np.array(out), np.array(sums)


@pytest.fixture(scope="module")
def text():
    rng = np.random.default_rng(0)
    # a small alphabet with repeats, so that long contexts recur
    words = [rng.integers(0, 7, size=rng.integers(2, 6)) for _ in range(30)]
    seq = np.concatenate([words[i] for i in rng.integers(0, 30, size=900)] )
    return seq[:3000], seq[3000:3400]


@pytest.mark.parametrize("online", [True, False])
@pytest.mark.parametrize("K,D,s", [(0, 0.5, 0.0), (3, 0.8, 2.0), (6, 0.9, 1.0)])
def test_count_probs_equal_the_dictionary_reference(text, online, K, D, s):
    tr, te = text
    want, sums = reference(tr, te, K, D, s, 7, online)
    got, longest = mixing.count_probs(tr, te, K, D, 7, online=online, strength=s)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)     # float64, the same sums
    np.testing.assert_allclose(sums, 1.0, atol=1e-12)              # every distribution sums to 1
    assert longest.min() >= 0 and longest.max() <= K


def test_online_counts_learn_from_the_text(text):
    tr, te = text
    new = np.tile(np.array([6, 5, 4, 3, 2, 1, 0, 0, 1]), 20)      # a pattern the training text lacks
    on, _ = mixing.count_probs(tr, new, 4, 0.8, 7)
    off, _ = mixing.count_probs(tr, new, 4, 0.8, 7, online=False)
    assert -np.log2(on[90:]).mean() < 0.2 < -np.log2(off[90:]).mean()


def test_a_leaked_count_is_caught_by_the_reference(text, monkeypatch):
    tr, te = text
    want, _ = reference(tr, te, 3, 0.8, 1.0, 7)
    inclusive = mixing.earlier_sums
    monkeypatch.setattr(mixing, "earlier_sums", lambda keys, w, order=None: inclusive(keys, w, order) + w)
    got, _ = mixing.count_probs(tr, te, 3, 0.8, 7, strength=1.0)
    assert np.abs(got - want).max() > 1e-3


def test_earlier_sums():
    keys = np.array([5, 3, 5, 5, 3, 7], np.uint64)
    w = np.array([1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(mixing.earlier_sums(keys, w), [0, 0, 1, 4, 2, 0])


def test_em_recovers_the_mixing_weight():
    rng = np.random.default_rng(1)
    n, lam = 20_000, np.array([0.8, 0.3])
    cls = rng.integers(0, 2, n)
    # two models over 4 symbols; the data drawn from the mixture with weight lam[cls]
    pa, pb = np.array([0.7, 0.1, 0.1, 0.1]), np.array([0.1, 0.1, 0.1, 0.7])
    from_a = rng.random(n) < lam[cls]
    x = np.where(from_a, rng.choice(4, n, p=pa), rng.choice(4, n, p=pb))
    got = mixing.fit_weights(pa[x], pb[x], cls, 2, iters=300)
    np.testing.assert_allclose(got, lam, atol=0.03)              # 20,000 draws: about 3 standard errors
    p = mixing.mix(pa[x], pb[x], cls, got)
    assert mixing.bits(p) <= mixing.bits(mixing.mix(pa[x], pb[x], cls, np.array([0.5, 0.5])))


@pytest.mark.parametrize("kwargs,match", [
    (dict(K=-1), "K must be"), (dict(discount=0.0), "discount must be"), (dict(strength=-1.0), "strength must be"),
    (dict(vocab_size=3), "ids must be in"), (dict(ids=np.zeros((2, 2), int)), "ids must be a non-empty 1-D"),
])
def test_bad_input(kwargs, match):
    args = dict(train_ids=np.arange(7).repeat(3), ids=np.arange(7), K=2, discount=0.8, vocab_size=7)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        mixing.count_probs(**args)


def test_shipped_result():
    r = mixing.load_pretrained()
    assert r["K"] in mixing.ORDERS and r["discount"] in mixing.DISCOUNTS and r["strength"] in mixing.STRENGTHS
    assert r["search"][f"{r['K']}:{r['discount']}:{r['strength']}"] == min(r["search"].values())   # chosen on validation
    # inside the grid on all three (D = 1 and s = 0 are the bounds of the model, not of a search)
    assert r["K"] != max(mixing.ORDERS) and r["discount"] not in (min(mixing.DISCOUNTS), max(mixing.DISCOUNTS))
    assert r["strength"] not in (max(mixing.STRENGTHS),) and r["K"] != min(mixing.ORDERS)
    assert r["counts"]["test"] < r["counts"]["test_static"]       # learning from the test text helps
    for name, m in r["mixtures"].items():
        assert m["rule"] == min(m["cross_validation"], key=m["cross_validation"].get)
        assert all(0 <= w <= 1 for w in m["weights"])
        assert m["test"] < min(m["transformer"]["test"], r["counts"]["test"]), name   # the mixture beats both parts
