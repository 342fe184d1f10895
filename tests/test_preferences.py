"""Chapter 26's functions: the NumPy and PyTorch twins against each other, against closed
forms and brute force, and on bad input (same ValueError, same words, in both)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tfbook.numpy.preferences as N
import tfbook.torch.functional.preferences as TF


def rng(seed=0):
    return np.random.default_rng(seed)


def test_sequence_logprob_twins_and_brute_force():
    r = rng(1)
    logits = r.normal(size=(3, 5, 7))
    targets = r.integers(0, 7, size=(3, 5))
    targets[0, :2] = -100
    targets[2, :] = -100  # nothing scored: log-probability 0
    got = N.sequence_logprob(logits, targets)
    brute = np.zeros(3)
    for b in range(3):
        for t in range(5):
            if targets[b, t] != -100:
                brute[b] += logits[b, t, targets[b, t]] - math.log(np.exp(logits[b, t]).sum())
    assert np.allclose(got, brute, atol=1e-12) and got[2] == 0.0
    tt = TF.sequence_logprob(torch.from_numpy(logits), torch.from_numpy(targets))
    assert np.allclose(tt.numpy(), got, atol=1e-12)
    # against PyTorch's cross-entropy, summed
    ce = torch.nn.functional.cross_entropy(torch.from_numpy(logits).transpose(1, 2), torch.from_numpy(targets),
                                           ignore_index=-100, reduction="none").sum(dim=1)
    assert np.allclose(-ce.numpy(), got, atol=1e-12)


def test_bradley_terry_twins_closed_form_and_extremes():
    r = rng(2)
    a, b = r.normal(size=20) * 3, r.normal(size=20) * 3
    want = np.mean([-math.log(1 / (1 + math.exp(-(x - y)))) for x, y in zip(a, b)])
    assert abs(N.bradley_terry_loss(a, b) - want) < 1e-12
    assert abs(TF.bradley_terry_loss(torch.from_numpy(a), torch.from_numpy(b)).item() - want) < 1e-12
    # no overflow at large margins: -log sigmoid(-1000) = 1000, -log sigmoid(1000) = 0
    assert N.bradley_terry_loss([0.0], [1000.0]) == pytest.approx(1000.0)
    assert TF.bradley_terry_loss(torch.tensor([0.0], dtype=torch.float64), torch.tensor([1000.0], dtype=torch.float64)).item() == pytest.approx(1000.0)
    assert N.bradley_terry_loss([1000.0], [0.0]) == 0.0
    # equal rewards: log 2
    assert N.bradley_terry_loss(np.ones(4), np.ones(4)) == pytest.approx(math.log(2), abs=1e-15)


def test_dpo_loss_is_bradley_terry_of_implicit_reward_and_gradient():
    r = rng(3)
    lc, lr, rc, rr = (r.normal(size=16) - 5 for _ in range(4))
    beta = 0.3
    want = N.bradley_terry_loss(beta * (lc - rc), beta * (lr - rr))
    assert abs(N.dpo_loss(lc, lr, rc, rr, beta) - want) < 1e-14
    t = [torch.tensor(x, requires_grad=True) for x in (lc, lr, rc, rr)]
    loss = TF.dpo_loss(*t, beta)
    assert abs(loss.item() - want) < 1e-12
    loss.backward()
    # d/d logp_chosen = -beta sigmoid(-beta * margin) / n
    m = beta * ((lc - rc) - (lr - rr))
    g = -beta / (1 + np.exp(m)) / len(lc)
    assert np.allclose(t[0].grad.numpy(), g, atol=1e-14) and np.allclose(t[1].grad.numpy(), -g, atol=1e-14)
    assert np.allclose(N.dpo_implicit_reward(lc, rc, beta), TF.dpo_implicit_reward(lc, rc, beta).numpy())


def test_optimal_policy_closed_form_beats_perturbations_and_gradient_ascent():
    r = rng(4)
    K = 6
    ref = r.dirichlet(np.ones(K))
    rew = r.normal(size=K)
    beta = 0.5
    star = N.kl_optimal_policy(ref, rew, beta)
    assert np.allclose(TF.kl_optimal_policy(torch.from_numpy(ref), torch.from_numpy(rew), beta).numpy(), star,
                       atol=1e-15)
    # the maximum of the objective is beta * log Z
    logZ = math.log(np.sum(ref * np.exp(rew / beta)))
    assert abs(N.kl_objective(star, ref, rew, beta) - beta * logZ) < 1e-12
    best = N.kl_objective(star, ref, rew, beta)
    for _ in range(100):
        p = star * np.exp(0.1 * r.normal(size=K))
        p /= p.sum()
        assert N.kl_objective(p, ref, rew, beta) < best
    # gradient ascent on softmax logits converges to it
    theta = torch.zeros(K, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([theta], lr=5.0)
    for _ in range(3000):
        opt.zero_grad()
        (-TF.kl_objective(torch.softmax(theta, 0), torch.from_numpy(ref), torch.from_numpy(rew), beta)).backward()
        opt.step()
    assert np.abs(torch.softmax(theta, 0).detach().numpy() - star).max() < 1e-8


def test_partition_function_cancels_in_the_pairwise_difference():
    r = rng(5)
    K = 5
    ref = r.dirichlet(np.ones(K))
    rew = r.normal(size=K)
    beta = 0.7
    star = N.kl_optimal_policy(ref, rew, beta)
    implied = N.dpo_implicit_reward(np.log(star), np.log(ref), beta)  # = r - beta log Z
    assert np.allclose(implied[:, None] - implied[None, :], rew[:, None] - rew[None, :], atol=1e-12)
    assert not np.allclose(implied, rew)


def test_sequence_kl_is_monte_carlo_of_exact_kl():
    r = rng(6)
    p, q = r.dirichlet(np.ones(4)), r.dirichlet(np.ones(4))
    exact = float(np.sum(p * np.log(p / q)))
    y = r.choice(4, size=200_000, p=p)
    est = N.sequence_kl(np.log(p[y]), np.log(q[y]))
    assert abs(est - exact) < 0.02
    assert abs(TF.sequence_kl(torch.from_numpy(np.log(p[y])), torch.from_numpy(np.log(q[y]))).item() - est) < 1e-12


def test_twins_keep_float32():
    x = torch.randn(2, 3, 5)
    assert TF.sequence_logprob(x, torch.zeros(2, 3, dtype=torch.long)).dtype == torch.float32


BAD = [
    ("sequence_logprob", (np.zeros((2, 3, 4)), np.zeros((2, 4), dtype=int)), "targets must have the shape of logits"),
    ("sequence_logprob", (np.zeros((2, 3, 4)), np.full((2, 3), 4)), "targets must be in [0, 4)"),
    ("sequence_logprob", (np.zeros(4), np.zeros((), dtype=int)), "targets must have the shape of logits"),
    ("bradley_terry_loss", (np.zeros(3), np.zeros(4)), "r_chosen and r_rejected must have one shape"),
    ("bradley_terry_loss", (np.zeros(0), np.zeros(0)), "at least one pair"),
    ("dpo_loss", (np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(2), 0.1), "ref_logp_rejected: (2,)"),
    ("dpo_loss", (np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(3), 0.0), "beta must be a positive number"),
    ("dpo_loss", (np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(3), -1.0), "beta must be a positive number"),
    ("dpo_implicit_reward", (np.zeros(3), np.zeros(3), float("nan")), "beta must be a positive number"),
    ("dpo_implicit_reward", (np.zeros(3), np.zeros((3, 1)), 0.1), "logp and ref_logp must have one shape"),
    ("kl_optimal_policy", (np.array([0.5, 0.6]), np.zeros(2), 1.0), "ref_probs must be probabilities"),
    ("kl_optimal_policy", (np.array([1.5, -0.5]), np.zeros(2), 1.0), "ref_probs must be probabilities"),
    ("kl_optimal_policy", (np.full(3, 1 / 3), np.zeros(2), 1.0), "ref_probs and rewards must have one shape"),
    ("kl_objective", (np.array([0.2, 0.2]), np.full(2, 0.5), np.zeros(2), 1.0), "probs must be probabilities"),
    ("sequence_kl", (np.zeros((2, 0)), np.zeros((2, 0))), "logp must be (..., N)"),
    ("sequence_kl", (np.zeros(3), np.zeros(4)), "logp and ref_logp must have one shape"),
]


@pytest.mark.parametrize("name,args,words", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_same_message_in_both_twins(name, args, words):
    with pytest.raises(ValueError) as e_np:
        getattr(N, name)(*args)
    targs = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args]
    with pytest.raises(ValueError) as e_t:
        getattr(TF, name)(*targs)
    assert words in str(e_np.value), str(e_np.value)
    assert str(e_np.value) == str(e_t.value)
