"""Learning from preferences (chapter 26), in NumPy.

* :func:`sequence_logprob`: ``log pi(y | x)`` of a completion, the sum of the log-probabilities
  of its scored target tokens (the answer tokens only: the targets of
  :func:`tfbook.numpy.assistant.answer_targets`);
* :func:`bradley_terry_loss`: the negative log-likelihood of preferences under the
  Bradley-Terry model, ``P(chosen > rejected) = sigmoid(r_chosen - r_rejected)``;
* :func:`dpo_implicit_reward` and :func:`dpo_loss`: direct preference optimisation
  (Rafailov et al. 2023), the Bradley-Terry loss of the implicit reward
  ``beta * log(pi / pi_ref)``;
* :func:`kl_optimal_policy`: the maximiser of the KL-regularised objective,
  ``pi*(y) = pi_ref(y) exp(r(y) / beta) / Z``, and :func:`kl_objective`, the objective
  ``E_pi[r] - beta KL(pi || pi_ref)`` of a policy over a finite set of answers;
* :func:`sequence_kl`: the Monte-Carlo estimate of ``KL(pi || pi_ref)`` between two sequence
  models from answers sampled from ``pi``: the mean of ``log pi(y) - log pi_ref(y)``.

Every function has its twin of the same name in :mod:`tfbook.torch.functional.preferences`,
with the same messages for bad input.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["sequence_logprob", "bradley_terry_loss", "dpo_implicit_reward", "dpo_loss", "kl_optimal_policy",
           "kl_objective", "sequence_kl"]


def _check_beta(beta) -> float:
    try:
        b = float(beta)
    except (TypeError, ValueError):
        raise ValueError(f"beta must be a positive number, got {beta!r}") from None
    if not (b > 0 and math.isfinite(b)):
        raise ValueError(f"beta must be a positive number, got {b}")
    return b


def _check_same(**named) -> tuple:
    """Every named array has the shape of the first; returns that shape."""
    shapes = {k: tuple(int(d) for d in np.shape(v)) for k, v in named.items()}
    first = next(iter(shapes.values()))
    if any(s != first for s in shapes.values()):
        got = ", ".join(f"{k}: {s}" for k, s in shapes.items())
        raise ValueError(f"{' and '.join(shapes)} must have one shape, got {got}")
    return first


def _check_probs(name: str, p: np.ndarray, shape: tuple) -> None:
    if len(shape) < 1 or shape[-1] < 1:
        raise ValueError(f"{name} must be (..., K) probabilities over K answers, got shape {shape}")
    if (p < 0).any() or not np.allclose(p.sum(axis=-1), 1.0, atol=1e-6):
        raise ValueError(f"{name} must be probabilities over its last axis (non-negative, summing to 1), "
                         f"got sums {p.sum(axis=-1).min():.6g}..{p.sum(axis=-1).max():.6g} ({name}: {shape})")


def sequence_logprob(logits, targets, ignore_index=-100):
    """``log pi(y | x)`` per sequence: the sum over ``t`` of ``log softmax(logits[..., t, :])``
    at ``targets[..., t]``, over the targets not equal to ``ignore_index`` (the prompt and the
    padding are not scored). ``logits (..., T, V)``, ``targets (..., T)``; returns ``(...)``
    float64 (a sequence with no scored target gets 0, the log-probability of nothing)."""
    ls, ts = tuple(np.shape(logits)), tuple(np.shape(targets))
    if len(ls) < 2 or ls[:-1] != ts:
        raise ValueError(f"targets must have the shape of logits without its last axis, got "
                         f"logits: {ls}, targets: {ts}")
    logits = np.asarray(logits, dtype=np.float64)
    targets = np.asarray(targets)
    keep = targets != ignore_index
    if keep.any() and (targets[keep].min() < 0 or targets[keep].max() >= ls[-1]):
        raise ValueError(f"targets must be in [0, {ls[-1]}) or ignore_index, got "
                         f"{targets[keep].min()}..{targets[keep].max()} (logits: {ls})")
    m = logits.max(axis=-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))
    tgt = np.where(keep, targets, 0)
    picked = np.take_along_axis(logp, tgt[..., None], axis=-1)[..., 0]
    return np.where(keep, picked, 0.0).sum(axis=-1)


def bradley_terry_loss(r_chosen, r_rejected):
    """Mean of ``-log sigmoid(r_chosen - r_rejected)`` over the pairs (nats): the negative
    log-likelihood of "chosen is preferred" under the Bradley-Terry model, computed as
    ``log(1 + exp(-(r_chosen - r_rejected)))`` without overflow."""
    shape = _check_same(r_chosen=r_chosen, r_rejected=r_rejected)
    if math.prod(shape) == 0:
        raise ValueError(f"r_chosen must hold at least one pair, got shape {shape}")
    d = np.asarray(r_chosen, dtype=np.float64) - np.asarray(r_rejected, dtype=np.float64)
    return float(np.mean(np.logaddexp(0.0, -d)))


def dpo_implicit_reward(logp, ref_logp, beta):
    """DPO's implicit reward of a completion, ``beta * (log pi(y|x) - log pi_ref(y|x))``: the
    reward for which ``pi`` is the KL-regularised optimum, up to a term of the prompt alone."""
    beta = _check_beta(beta)
    _check_same(logp=logp, ref_logp=ref_logp)
    return beta * (np.asarray(logp, dtype=np.float64) - np.asarray(ref_logp, dtype=np.float64))


def dpo_loss(logp_chosen, logp_rejected, ref_logp_chosen, ref_logp_rejected, beta):
    """The DPO loss: the Bradley-Terry loss of the implicit rewards,
    ``mean(-log sigmoid(beta * ((logp_chosen - ref_logp_chosen) - (logp_rejected - ref_logp_rejected))))``."""
    beta = _check_beta(beta)
    _check_same(logp_chosen=logp_chosen, logp_rejected=logp_rejected, ref_logp_chosen=ref_logp_chosen,
                ref_logp_rejected=ref_logp_rejected)
    return bradley_terry_loss(dpo_implicit_reward(logp_chosen, ref_logp_chosen, beta),
                              dpo_implicit_reward(logp_rejected, ref_logp_rejected, beta))


def kl_optimal_policy(ref_probs, rewards, beta):
    """The policy that maximises ``E_pi[r] - beta KL(pi || pi_ref)`` over ``K`` answers:
    ``pi*(y) = pi_ref(y) exp(r(y) / beta) / Z`` with ``Z = sum_y pi_ref(y) exp(r(y) / beta)``,
    computed as a softmax of ``log pi_ref + r / beta`` over the last axis. ``ref_probs (..., K)``,
    ``rewards (..., K)``."""
    beta = _check_beta(beta)
    shape = _check_same(ref_probs=ref_probs, rewards=rewards)
    ref = np.asarray(ref_probs, dtype=np.float64)
    _check_probs("ref_probs", ref, shape)
    with np.errstate(divide="ignore"):
        s = np.log(ref) + np.asarray(rewards, dtype=np.float64) / beta
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def kl_objective(probs, ref_probs, rewards, beta):
    """``E_pi[r] - beta KL(pi || pi_ref)`` of a policy ``probs (..., K)`` over ``K`` answers
    (``0 log 0 = 0``; an answer that ``pi`` gives mass and ``pi_ref`` does not makes it ``-inf``).
    Returns ``(...)`` float64."""
    beta = _check_beta(beta)
    shape = _check_same(probs=probs, ref_probs=ref_probs, rewards=rewards)
    p, ref = np.asarray(probs, dtype=np.float64), np.asarray(ref_probs, dtype=np.float64)
    _check_probs("probs", p, shape)
    _check_probs("ref_probs", ref, shape)
    r = np.asarray(rewards, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - np.log(ref)), 0.0)
    return (p * r).sum(axis=-1) - beta * terms.sum(axis=-1)


def sequence_kl(logp, ref_logp):
    """The Monte-Carlo estimate of ``KL(pi || pi_ref)`` from ``N`` answers sampled from ``pi``:
    ``mean_n(logp[..., n] - ref_logp[..., n])`` (unbiased when the answers are drawn from
    ``pi``; one sample can be negative). ``logp, ref_logp (..., N)``; returns ``(...)``."""
    shape = _check_same(logp=logp, ref_logp=ref_logp)
    if len(shape) < 1 or shape[-1] < 1:
        raise ValueError(f"logp must be (..., N) log-probabilities of N samples, got shape {shape}")
    return (np.asarray(logp, dtype=np.float64) - np.asarray(ref_logp, dtype=np.float64)).mean(axis=-1)
