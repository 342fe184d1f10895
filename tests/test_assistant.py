"""Chapters 24 and 25's components: the NumPy twins against the PyTorch twins, closed forms,
brute force and SciPy; the packed forward pass against the model run on each conversation
alone; the answer-only loss's zero gradient off the answers; bad input answered the same way
by both twins."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

import tfbook.numpy.assistant as N
import tfbook.torch.functional.assistant as T
from tfbook.torch import assistant as A
from tfbook.torch.models import DecoderLM, DecoderLMConfig

U, AS, E = 10, 11, 12  # user, assistant, end ids of the toy vocabulary


def toy_rows(seed=0, B=4, T_=24):
    """Random packed rows: conversations of 5..9 tokens (U prompt AS answer E), padding at the end."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((B, T_), dtype=np.int64)
    doc = np.full((B, T_), -1, dtype=np.int64)
    for b in range(B):
        t, d = 0, 0
        while True:
            p, a = int(rng.integers(1, 4)), int(rng.integers(1, 4))
            conv = [U, *rng.integers(0, 10, p), AS, *rng.integers(0, 10, a), E]
            if t + len(conv) > T_:
                break
            ids[b, t:t + len(conv)] = conv
            doc[b, t:t + len(conv)] = d
            t, d = t + len(conv), d + 1
    return ids, doc


def answer_targets_loop(ids, doc):
    """Straight from the definition, one token at a time."""
    y = np.full(ids.shape, -100)
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1] - 1):
            if doc[b, t + 1] < 0 or doc[b, t + 1] != doc[b, t]:
                continue
            # inside an answer: the last template token of this conversation before t + 1 is AS
            s = t
            while s >= 0 and doc[b, s] == doc[b, t + 1] and ids[b, s] not in (AS, E):
                s -= 1
            if s >= 0 and doc[b, s] == doc[b, t + 1] and ids[b, s] == AS:
                y[b, t] = ids[b, t + 1]
    return y


@pytest.mark.parametrize("seed", range(5))
def test_answer_targets_twins_and_definition(seed):
    ids, doc = toy_rows(seed)
    y = N.answer_targets(ids, doc, AS, E)
    assert np.array_equal(y, answer_targets_loop(ids, doc))
    assert np.array_equal(y, T.answer_targets(torch.from_numpy(ids), torch.from_numpy(doc), AS, E).numpy())
    # every scored target is an answer token or END, and every END of a conversation is scored once
    assert set(np.unique(y[y >= 0])) <= set(range(10)) | {E}
    assert (y == E).sum() == (ids == E).sum()


def test_document_mask_and_positions():
    ids, doc = toy_rows(1)
    M = N.document_mask(doc)
    assert np.array_equal(M, T.document_mask(torch.from_numpy(doc)).numpy())
    B, T_ = doc.shape
    for b in range(B):
        for t in range(T_):
            for s in range(T_):
                assert M[b, t, s] == (s <= t and doc[b, t] == doc[b, s] and doc[b, t] >= 0)
    P = N.document_positions(doc)
    assert np.array_equal(P, T.document_positions(torch.from_numpy(doc)).numpy())
    for b in range(B):
        for t in range(T_):
            first = t
            while first > 0 and doc[b, first - 1] == doc[b, t]:
                first -= 1
            assert P[b, t] == t - first


def test_masked_mean_nll_equals_cross_entropy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 7, 13)) * 3
    y = rng.integers(0, 13, (3, 7))
    y[:, :2] = -100
    ref = torch.nn.functional.cross_entropy(torch.from_numpy(logits).reshape(-1, 13), torch.from_numpy(y).reshape(-1))
    assert abs(N.masked_mean_nll(logits, y) - ref.item()) < 1e-12
    assert abs(T.masked_mean_nll(torch.from_numpy(logits), torch.from_numpy(y)).item() - ref.item()) < 1e-12


def tiny_lm(V=13, seed=0):
    torch.manual_seed(seed)
    return DecoderLM(DecoderLMConfig(vocab_size=V, block_size=24, d_model=16, num_heads=2, num_layers=2,
                                     d_ff=32)).double().eval()


def test_packed_logits_equal_each_conversation_alone():
    model = tiny_lm()
    ids, doc = toy_rows(2)
    packed = A.packed_logits(model, torch.from_numpy(ids), torch.from_numpy(doc))
    for b in range(ids.shape[0]):
        for d in range(doc[b].max() + 1):
            cols = np.flatnonzero(doc[b] == d)
            alone = model(torch.from_numpy(ids[b, cols])[None])[0]
            torch.testing.assert_close(packed[b, cols], alone, atol=1e-12, rtol=0)  # float64 round-off
    # padding rows (attending to nothing) stay finite
    assert torch.isfinite(packed).all()


def test_answer_loss_gradient_is_zero_off_the_answers():
    model = tiny_lm()
    ids, doc = map(torch.from_numpy, toy_rows(3))
    logits = A.packed_logits(model, ids, doc).detach().requires_grad_(True)
    y = T.answer_targets(ids, doc, AS, E)
    T.masked_mean_nll(logits, y).backward()
    off = y == -100
    assert off.any() and (logits.grad[off] == 0).all()  # exactly zero, not small
    assert (logits.grad[~off].abs().sum(-1) > 0).all()
    # and the loss equals the model-level loss
    assert abs(A.answer_loss(model, ids, doc, AS, E).item() - T.masked_mean_nll(logits, y).item()) < 1e-12


def test_extend_vocab_and_freeze_rows():
    model = tiny_lm(V=10)
    big = A.extend_vocab(model, 3)
    assert big.config.vocab_size == 13
    x = torch.randint(0, 10, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(big(x)[..., :10], model(x), atol=1e-14, rtol=0)  # float64; the product V x D is blocked differently
    torch.testing.assert_close(big.W_E[10:], model.W_E.mean(0, keepdim=True).expand(3, -1), atol=1e-15, rtol=0)
    big.train()
    before = big.W_E.detach().clone()
    h = A.freeze_rows(big.W_E, 10)
    opt = torch.optim.AdamW([big.W_E], lr=1e-2, weight_decay=0.0)
    for _ in range(3):
        opt.zero_grad()
        big(torch.randint(0, 13, (2, 9))).logsumexp(-1).mean().backward()
        opt.step()
    h.remove()
    assert torch.equal(big.W_E[:10], before[:10]) and not torch.equal(big.W_E[10:], before[10:])


def test_complete_greedy_matches_argmax_loop():
    model = tiny_lm()
    prompts = [[U, 1, 2, AS], [U, 3, AS], [U, 4, 5, 6, 7, AS]]
    got = A.complete(model, prompts, E, max_new=5)
    for p, g in zip(prompts, got):
        seq = list(p)
        want = []
        for _ in range(5):
            nxt = int(model(torch.tensor([seq]))[0, -1].argmax())
            if nxt == E:
                break
            want.append(nxt)
            seq.append(nxt)
        assert g == want


# ----------------------------------------------------------------------------- chapter 25
@pytest.mark.parametrize("n", [1, 4, 7, 10])
def test_pass_at_k_equals_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            brute = np.mean([any(s) for s in itertools.combinations([1] * c + [0] * (n - c), k)])
            assert abs(N.pass_at_k(n, c, k) - brute) < 1e-12
            assert abs(float(T.pass_at_k(torch.tensor(n), torch.tensor(c), k)) - brute) < 1e-12
            assert abs(N.pass_at_k(n, c, k) - (1 - math.comb(n - c, k) / math.comb(n, k))) < 1e-12


@pytest.mark.parametrize("n", [5, 20, 100])
def test_intervals_equal_scipy(n):
    c = np.arange(n + 1)
    lo, hi = N.wilson_interval(c, np.full_like(c, n))
    lo_t, hi_t = T.wilson_interval(torch.from_numpy(c), torch.full((n + 1,), n))
    cp_lo, cp_hi = N.clopper_pearson_interval(c, np.full_like(c, n))
    cpt_lo, cpt_hi = T.clopper_pearson_interval(torch.from_numpy(c), torch.full((n + 1,), n))
    for i, ci in enumerate(c):
        r = stats.binomtest(int(ci), n)
        w = r.proportion_ci(0.95, method="wilson")
        e = r.proportion_ci(0.95, method="exact")
        assert abs(lo[i] - w.low) < 1e-12 and abs(hi[i] - w.high) < 1e-12
        assert abs(cp_lo[i] - e.low) < 1e-9 and abs(cp_hi[i] - e.high) < 1e-9  # 60 bisection steps, tails summed
    np.testing.assert_allclose(lo_t.numpy(), lo, atol=1e-12)
    np.testing.assert_allclose(hi_t.numpy(), hi, atol=1e-12)
    np.testing.assert_allclose(cpt_lo.numpy(), cp_lo, atol=1e-9)
    np.testing.assert_allclose(cpt_hi.numpy(), cp_hi, atol=1e-9)


def test_bootstrap_and_ngram_overlap_twins():
    rng = np.random.default_rng(0)
    values = rng.integers(0, 2, 50).astype(float)
    idx = rng.integers(0, 50, (400, 50))
    a = N.bootstrap_interval(values, idx)
    b = T.bootstrap_interval(torch.from_numpy(values), torch.from_numpy(idx))
    assert abs(a[0] - b[0]) < 1e-12 and abs(a[1] - b[1]) < 1e-12
    means = values[idx].mean(1)
    assert a == (np.quantile(means, 0.025), np.quantile(means, 0.975))
    train = rng.integers(0, 5, 300)
    items = [rng.integers(0, 5, L) for L in (2, 3, 8, 20)] + [train[10:30].copy()]
    ov = N.ngram_overlap(items, train, 4, 5)
    grams = {tuple(train[i:i + 4]) for i in range(len(train) - 3)}
    naive = [np.mean([tuple(it[i:i + 4]) in grams for i in range(len(it) - 3)]) if len(it) >= 4 else 0.0
             for it in items]
    assert np.allclose(ov, naive) and ov[-1] == 1.0
    assert np.array_equal(ov, T.ngram_overlap([torch.from_numpy(i) for i in items], torch.from_numpy(train), 4, 5).numpy())


# ----------------------------------------------------------------------------- bad input
def _both(fn_name, *args, **kw):
    msgs = []
    for mod, conv in ((N, lambda x: x), (T, lambda x: torch.as_tensor(x) if isinstance(x, np.ndarray) else x)):
        with pytest.raises(ValueError) as e:
            getattr(mod, fn_name)(*[conv(a) for a in args], **kw)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1], msgs
    return msgs[0]


def test_bad_input_same_message_in_both_twins():
    ids, doc = toy_rows(0)
    assert "(4, 24)" in _both("answer_targets", ids, doc[:, :5], AS, E)
    assert "(B, T)" in _both("answer_targets", ids[0], doc[0], AS, E)
    assert "float" in _both("answer_targets", ids.astype(float), doc, AS, E)
    assert "(3,)" in _both("document_mask", np.zeros(3))  # float document ids
    assert "(2, 5, 3)" in _both("masked_mean_nll", np.zeros((2, 5, 3)), np.zeros((2, 4), dtype=np.int64))
    assert "no scored" in _both("masked_mean_nll", np.zeros((2, 5, 3)), np.full((2, 5), -100))
    assert "k=6" in _both("pass_at_k", np.array([5]), np.array([2]), 6)
    assert "0 <= c <= n" in _both("pass_at_k", np.array([5]), np.array([7]), 1)
    assert "confidence" in _both("wilson_interval", np.array([1]), np.array([5]), confidence=1.5)
    assert "(R, N)" in _both("bootstrap_interval", np.zeros(5), np.zeros((3, 4), dtype=np.int64))
    assert "int64" in _both("ngram_overlap", [np.zeros(3, dtype=np.int64)], np.zeros(9, dtype=np.int64), 20, 65)
    with pytest.raises(ValueError, match="block_size"):
        A.packed_logits(tiny_lm(), torch.zeros(1, 30, dtype=torch.long), torch.zeros(1, 30, dtype=torch.long))
