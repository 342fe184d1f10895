"""Chapter 27's functions (tfbook.numpy.rl and its torch twin): the twins agree, the losses and
estimators match their definitions and closed forms, the inference-time closed forms match
brute-force enumeration over every sequence of samples, and bad input is refused with the same
message by both twins."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import tfbook.numpy.rl as N
import tfbook.torch.functional.rl as T


def _tokens(seed=0, B=6, L=5):
    rng = np.random.default_rng(seed)
    logp = np.log(rng.uniform(0.05, 1.0, (B, L)))
    old = logp + rng.normal(0, 0.3, (B, L))
    ref = logp + rng.normal(0, 0.5, (B, L))
    adv = rng.normal(0, 1, B)
    mask = (rng.uniform(size=(B, L)) < 0.8).astype(np.float64)
    mask[:, 0] = 1
    return logp, old, ref, adv, mask


def test_group_advantages_twins_and_definition():
    r = np.random.default_rng(1).integers(0, 2, (7, 8)).astype(np.float64)
    a = N.group_advantages(r)
    assert np.allclose(a, T.group_advantages(torch.tensor(r)).numpy(), atol=1e-15)
    for g in range(7):
        s = r[g].std(ddof=1)
        assert np.allclose(a[g], (r[g] - r[g].mean()) / (s + 1e-4), atol=1e-15)
    assert np.allclose(N.group_advantages(r, scale=False), r - r.mean(axis=1, keepdims=True))
    assert np.all(N.group_advantages(np.ones((2, 4))) == 0)  # no signal from a unanimous group


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_grpo_loss_twins_and_token_loop(beta):
    logp, old, ref, adv, mask = _tokens()
    n = N.grpo_loss(logp, old, adv, mask, ref_logp=ref, epsilon=0.2, beta=beta)
    t = T.grpo_loss(*(torch.tensor(x) for x in (logp, old, adv, mask)), ref_logp=torch.tensor(ref), beta=beta)
    assert abs(n - t.item()) < 1e-14
    total = 0.0  # the definition, one token at a time
    for i in range(logp.shape[0]):
        s, cnt = 0.0, 0
        for j in range(logp.shape[1]):
            if mask[i, j]:
                rho = np.exp(logp[i, j] - old[i, j])
                term = -min(rho * adv[i], min(max(rho, 0.8), 1.2) * adv[i])
                d = ref[i, j] - logp[i, j]
                s += term + beta * (np.exp(d) - d - 1)
                cnt += 1
        total += s / cnt
    assert abs(n - total / logp.shape[0]) < 1e-13


def test_on_policy_grpo_gradient_is_the_reinforce_gradient_per_token():
    """With old = logp (one step per batch) the ratio is 1 and the clipped loss's gradient is
    -A / |o_i| / B per token: REINFORCE with a baseline, each sequence's tokens averaged."""
    logp, _, _, adv, mask = _tokens(2)
    x = torch.tensor(logp, requires_grad=True)
    T.grpo_loss(x, x.detach(), torch.tensor(adv), torch.tensor(mask)).backward()
    expected = -adv[:, None] * mask / mask.sum(axis=1, keepdims=True) / logp.shape[0]
    assert np.allclose(x.grad.numpy(), expected, atol=1e-15)
    y = torch.tensor(logp, requires_grad=True)
    T.reinforce_loss(y, torch.tensor(adv), torch.tensor(mask)).backward()
    assert np.allclose(y.grad.numpy(), -adv[:, None] * mask / logp.shape[0], atol=1e-15)
    assert abs(N.reinforce_loss(logp, adv, mask) - T.reinforce_loss(*(torch.tensor(v) for v in (logp, adv, mask))).item()) < 1e-13


def test_clipped_ratio_has_zero_gradient_outside_the_trust_region():
    old = torch.zeros(1, 4, dtype=torch.float64)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]], dtype=torch.float64)).requires_grad_()
    for a, zero in ((1.0, [True, False, False, False]), (-1.0, [False, True, False, False])):
        lp = logp[:, :2].detach().clone().requires_grad_()
        T.grpo_loss(lp, old[:, :2], torch.tensor([a], dtype=torch.float64), torch.ones(1, 2)).backward()
        assert [(g == 0).item() for g in lp.grad[0]] == zero[:2]


def test_k1_k3_unbiased_by_enumeration_and_k3_smaller_variance():
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    kl = float(np.sum(p * np.log(p / q)))
    lp, lq = np.log(p), np.log(q)
    for f in (N.kl_k1, N.kl_k3):
        assert abs(float(np.sum(p * f(lp, lq))) - kl) < 1e-15
    var = lambda f: float(np.sum(p * (f(lp, lq) - kl) ** 2))
    assert var(N.kl_k3) < var(N.kl_k1)
    assert np.allclose(N.kl_k3(lp, lq), T.kl_k3(torch.tensor(lp), torch.tensor(lq)).numpy(), atol=1e-15)
    assert np.allclose(N.kl_k1(lp, lq), T.kl_k1(torch.tensor(lp), torch.tensor(lq)).numpy(), atol=1e-15)
    assert (N.kl_k3(lp, lq) >= 0).all()


def test_majority_vote_and_best_of_n_twins():
    rng = np.random.default_rng(4)
    a = rng.integers(0, 4, (200, 7))
    s = rng.normal(size=(200, 7))
    mv = N.majority_vote(a)
    assert np.array_equal(mv, T.majority_vote(torch.tensor(a)).numpy())
    for row, w in zip(a, mv):
        counts = {v: list(row).count(v) for v in row}
        top = max(counts.values())
        assert w == next(v for v in row if counts[v] == top)
    assert np.array_equal(N.best_of_n(a, s), T.best_of_n(torch.tensor(a), torch.tensor(s)).numpy())
    assert np.array_equal(N.best_of_n(a, s), a[np.arange(200), s.argmax(axis=1)])


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_closed_forms_against_enumeration(n):
    rng = np.random.default_rng(n)
    P = np.concatenate([rng.dirichlet(np.ones(4), 3), np.array([[0.5, 0.3, 0.0, 0.0]])])  # last row: missing mass
    corr = np.array([0, 2, 1, 0])
    mv = N.majority_vote_closed_form(P, corr, n)
    bl = N.best_likelihood_closed_form(P, corr, n)
    for i in range(len(P)):
        p = np.append(P[i], 1 - P[i].sum())  # index 4: the missing mass, a new answer at every draw
        exp_mv = exp_bl = exp_pass = 0.0
        for seq in itertools.product(range(5), repeat=n):
            pr = np.prod(p[list(seq)])
            if pr == 0:
                continue
            ans = np.array([v if v < 4 else 100 + j for j, v in enumerate(seq)])
            exp_mv += pr * (N.majority_vote(ans[None])[0] == corr[i])
            exp_pass += pr * (corr[i] in seq)
            sc = np.array([p[v] if v < 4 else -1.0 for v in seq])
            exp_bl += pr * (N.best_of_n(ans[None], sc[None])[0] == corr[i])
        assert abs(mv[i] - exp_mv) < 1e-12
        assert abs(bl[i] - exp_bl) < 1e-12
        assert abs(N.pass_at_n_closed_form(P[i, corr[i]], n) - exp_pass) < 1e-12
    Pt, ct = torch.tensor(P), torch.tensor(corr)
    assert np.allclose(T.majority_vote_closed_form(Pt, ct, n).numpy(), mv, atol=1e-13)
    assert np.allclose(T.best_likelihood_closed_form(Pt, ct, n).numpy(), bl, atol=1e-15)
    assert np.allclose(T.pass_at_n_closed_form(Pt[:, 0], n).numpy(), N.pass_at_n_closed_form(P[:, 0], n))


def test_majority_vote_closed_form_at_large_n_sums_to_one_over_answers():
    """Summed over which answer is called correct, the win probabilities of all answers are 1."""
    p = np.array([[0.4, 0.35, 0.25]])
    for n in (1, 4, 9, 30):
        total = sum(N.majority_vote_closed_form(p, np.array([c]), n)[0] for c in range(3))
        assert abs(total - 1) < 1e-12


BAD = [
    ("group_advantages", lambda: (np.zeros(4),), {}),
    ("group_advantages", lambda: (np.zeros((3, 1)),), {}),
    ("grpo_loss", lambda: (np.zeros((2, 3)), np.zeros((2, 4)), np.zeros(2), np.ones((2, 3))), {}),
    ("grpo_loss", lambda: (np.zeros((2, 3)), np.zeros((2, 3)), np.zeros(3), np.ones((2, 3))), {}),
    ("grpo_loss", lambda: (np.zeros((2, 3)), np.zeros((2, 3)), np.zeros(2), np.ones((2, 3))), {"beta": 0.1}),
    ("grpo_loss", lambda: (np.zeros(3), np.zeros(3), np.zeros(1), np.ones(3)), {}),
    ("reinforce_loss", lambda: (np.zeros((2, 3)), np.zeros(2), np.ones((3, 2))), {}),
    ("kl_k3", lambda: (np.zeros(3), np.zeros(4)), {}),
    ("majority_vote", lambda: (np.zeros((2, 3)),), {}),
    ("majority_vote", lambda: (np.zeros(3, dtype=np.int64),), {}),
    ("best_of_n", lambda: (np.zeros((2, 3), dtype=np.int64), np.zeros((2, 2))), {}),
    ("pass_at_n_closed_form", lambda: (np.array([0.5]), 0), {}),
    ("pass_at_n_closed_form", lambda: (np.array([1.5]), 2), {}),
    ("majority_vote_closed_form", lambda: (np.full((2, 3), 0.5), np.zeros(2, dtype=np.int64), 3), {}),
    ("majority_vote_closed_form", lambda: (np.full((2, 3), 0.2), np.zeros(3, dtype=np.int64), 3), {}),
    ("best_likelihood_closed_form", lambda: (np.full((2, 3), 0.2), np.array([0, 3]), 3), {}),
]


@pytest.mark.parametrize("name, make, kw", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_same_message_in_both_twins(name, make, kw):
    args = make()
    with pytest.raises(ValueError) as en:
        getattr(N, name)(*args, **kw)
    targs = [torch.as_tensor(a) if isinstance(a, np.ndarray) else a for a in args]
    with pytest.raises(ValueError) as et:
        getattr(T, name)(*targs, **kw)
    assert str(en.value) == str(et.value)
