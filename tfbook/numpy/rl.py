"""Reinforcement learning with verifiable rewards, and inference-time compute (chapter 27), in NumPy.

Training signals:

* :func:`group_advantages`: GRPO's advantages, each reward minus its group's mean, divided by
  the group's standard deviation (Bessel-corrected) plus ``eps`` (``scale=False``: not divided);
* :func:`reinforce_loss`: REINFORCE with a baseline, ``-mean_i A_i sum_t log pi(y_it)``;
* :func:`grpo_loss`: the clipped-ratio loss of GRPO, token by token, with the k3 estimate of
  the KL divergence to a reference model weighted by ``beta``; each sequence's tokens are
  averaged, then the sequences (TRL's ``loss_type="grpo"``);
* :func:`kl_k1`, :func:`kl_k3`: per-sample estimators of ``KL(pi || pi_ref)`` from samples of
  ``pi``: ``log pi - log pi_ref`` and ``exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1``.

Inference-time compute:

* :func:`majority_vote`: the most frequent answer of each row (ties: the one seen first);
* :func:`best_of_n`: the answer of the highest-scoring sample of each row (ties: the first);
* :func:`pass_at_n_closed_form`: ``1 - (1 - p)^N``, best-of-N with the verifier as judge when
  the N samples are independent;
* :func:`majority_vote_closed_form`: the exact probability that majority vote over ``N``
  independent samples from an item's answer distribution returns its correct answer;
* :func:`best_likelihood_closed_form`: the same for best-of-N ranked by the answer's probability.

Every function has its twin of the same name in :mod:`tfbook.torch.functional.rl`.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as V

__all__ = ["group_advantages", "reinforce_loss", "grpo_loss", "kl_k1", "kl_k3", "majority_vote", "best_of_n",
           "pass_at_n_closed_form", "majority_vote_closed_form", "best_likelihood_closed_form"]


# ----------------------------------------------------------------------------- checks
def _check_rewards(rewards) -> tuple:
    shape = V.shape_of(rewards)
    if len(shape) != 2 or shape[1] < 2:
        raise ValueError(f"rewards must be (groups, G) with G >= 2 completions per group, got shape {shape}")
    return shape


def _check_same(names_values, ref_name) -> tuple:
    ref = V.shape_of(names_values[ref_name])
    for name, value in names_values.items():
        if value is not None and V.shape_of(value) != ref:
            raise ValueError(f"{name} must have the shape of {ref_name}, got {name}: {V.shape_of(value)}, "
                             f"{ref_name}: {ref}")
    return ref


def _check_tokens(logp, advantages, mask, **others) -> tuple:
    shape = V.shape_of(logp)
    if len(shape) != 2:
        raise ValueError(f"logp must be (B, T) per-token log-probabilities, got shape {shape}")
    _check_same(dict(logp=logp, mask=mask, **others), "logp")
    if V.shape_of(advantages) != shape[:1]:
        raise ValueError(f"advantages must be (B,), one per sequence, got advantages: {V.shape_of(advantages)}, "
                         f"logp: {shape}")
    return shape


def _check_answers(name, answers) -> tuple:
    shape = V.shape_of(answers)
    if len(shape) != 2 or shape[1] < 1:
        raise ValueError(f"{name} must be (items, N) with N >= 1 samples per item, got shape {shape}")
    if not np.issubdtype(np.asarray(answers).dtype, np.integer):
        raise ValueError(f"{name} must hold integer answer ids, got dtype {np.asarray(answers).dtype} ({name}: {shape})")
    return shape


def _check_n(N) -> int:
    if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N < 1:
        raise ValueError(f"N must be an integer >= 1, got {N!r}")
    return int(N)


def _check_probs(probs, correct) -> tuple:
    shape = V.shape_of(probs)
    if len(shape) != 2:
        raise ValueError(f"probs must be (items, A) answer probabilities, got shape {shape}")
    if V.shape_of(correct) != shape[:1]:
        raise ValueError(f"correct must be (items,), one answer index per row of probs, got correct: "
                         f"{V.shape_of(correct)}, probs: {shape}")
    p = np.asarray(probs, dtype=np.float64)
    c = np.asarray(correct)
    if (p < 0).any() or (p.sum(axis=1) > 1 + 1e-9).any():
        raise ValueError(f"probs must be non-negative with rows summing to at most 1 (probs: {shape})")
    if shape[0] and (not np.issubdtype(c.dtype, np.integer) or c.min() < 0 or c.max() >= shape[1]):
        raise ValueError(f"correct must hold integer indices in [0, {shape[1]}) (correct: {V.shape_of(correct)}, "
                         f"probs: {shape})")
    return shape


# ----------------------------------------------------------------------------- training signals
def group_advantages(rewards, scale=True, eps=1e-4):
    """``(groups, G)`` rewards -> ``(groups, G)`` advantages: ``r - mean(group)``, divided by the
    group's Bessel-corrected standard deviation plus ``eps`` when ``scale`` (GRPO; TRL's
    ``scale_rewards="group"``). A group whose rewards are all equal gets advantages 0."""
    _check_rewards(rewards)
    r = np.asarray(rewards, dtype=np.float64)
    a = r - r.mean(axis=1, keepdims=True)
    if scale:
        a = a / (r.std(axis=1, ddof=1, keepdims=True) + eps)
    return a


def reinforce_loss(logp, advantages, mask):
    """REINFORCE with a baseline: ``-mean_i A_i sum_t mask_it logp_it``. ``logp (B, T)`` the
    log-probabilities of the sampled tokens, ``advantages (B,)`` (reward minus baseline),
    ``mask (B, T)`` 1 on completion tokens. Its gradient is minus the policy-gradient estimate."""
    _check_tokens(logp, advantages, mask)
    lp, m = np.asarray(logp, dtype=np.float64), np.asarray(mask, dtype=np.float64)
    return float(-np.mean(np.asarray(advantages, dtype=np.float64) * (lp * m).sum(axis=1)))


def kl_k1(logp, ref_logp):
    """``logp - ref_logp``: unbiased for ``KL(pi || pi_ref)`` on samples of ``pi``, often negative."""
    _check_same(dict(logp=logp, ref_logp=ref_logp), "logp")
    return np.asarray(logp, dtype=np.float64) - np.asarray(ref_logp, dtype=np.float64)


def kl_k3(logp, ref_logp):
    """``exp(ref_logp - logp) - (ref_logp - logp) - 1``: unbiased for ``KL(pi || pi_ref)`` on
    samples of ``pi`` (the mean of ``pi_ref / pi`` under ``pi`` is 1), and never negative. Its
    gradient with the samples held fixed is, in expectation, that of the forward
    ``KL(pi_ref || pi)``, not of ``KL(pi || pi_ref)`` (chapter 27, ``eq-rl-k3-grad``)."""
    _check_same(dict(logp=logp, ref_logp=ref_logp), "logp")
    d = np.asarray(ref_logp, dtype=np.float64) - np.asarray(logp, dtype=np.float64)
    return np.exp(d) - d - 1.0


def grpo_loss(logp, old_logp, advantages, mask, ref_logp=None, epsilon=0.2, beta=0.0, kl_correction=False):
    """GRPO's loss: per token ``-min(rho A, clip(rho, 1 - epsilon, 1 + epsilon) A) + beta k3``
    with ``rho = exp(logp - old_logp)``, averaged over each sequence's ``mask`` tokens, then
    over sequences. ``logp, old_logp, mask, ref_logp (B, T)``, ``advantages (B,)``;
    ``ref_logp`` is needed when ``beta != 0``. This is DeepSeekMath's form, which equals TRL's
    ``GRPOTrainer`` loss with ``loss_type="grpo"`` and ``use_bias_correction_kl=False`` (neither is
    TRL 1.16's default); the k3 term's gradient is the forward KL's (see :func:`kl_k3`).
    ``kl_correction=True`` multiplies the k3 term by ``rho`` (TRL's default
    ``use_bias_correction_kl=True``), which makes its gradient the reverse KL's."""
    _check_tokens(logp, advantages, mask, old_logp=old_logp, ref_logp=ref_logp)
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if beta != 0 and ref_logp is None:
        raise ValueError(f"ref_logp is needed when beta != 0 (beta={beta}; logp: {V.shape_of(logp)})")
    lp, old = np.asarray(logp, dtype=np.float64), np.asarray(old_logp, dtype=np.float64)
    a = np.asarray(advantages, dtype=np.float64)[:, None]
    m = np.asarray(mask, dtype=np.float64)
    rho = np.exp(lp - old)
    per_token = -np.minimum(rho * a, np.clip(rho, 1 - epsilon, 1 + epsilon) * a)
    if beta != 0:
        per_token = per_token + beta * kl_k3(lp, ref_logp) * (rho if kl_correction else 1.0)
    return float(np.mean((per_token * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1.0)))


# ----------------------------------------------------------------------------- inference-time compute
def majority_vote(answers):
    """``(items, N)`` integer answers -> ``(items,)``: each row's most frequent answer; among
    equally frequent answers, the one that occurs first in the row."""
    _check_answers("answers", answers)
    a = np.asarray(answers)
    out = np.empty(a.shape[0], dtype=a.dtype)
    for i, row in enumerate(a):
        values, first, counts = np.unique(row, return_index=True, return_counts=True)
        best = counts == counts.max()
        out[i] = values[best][np.argmin(first[best])]
    return out


def best_of_n(answers, scores):
    """``(items, N)`` answers and their ``(items, N)`` scores -> ``(items,)``: the answer of
    each row's highest score (the first of equal scores)."""
    _check_answers("answers", answers)
    _check_same(dict(answers=answers, scores=scores), "answers")
    a = np.asarray(answers)
    return a[np.arange(a.shape[0]), np.argmax(np.asarray(scores, dtype=np.float64), axis=1)]


def pass_at_n_closed_form(p, N):
    """``1 - (1 - p)^N``: the chance that at least one of ``N`` independent samples is correct
    when each is with probability ``p`` (array of per-item probabilities)."""
    N = _check_n(N)
    p = np.asarray(p, dtype=np.float64)
    if p.size and (p.min() < 0 or p.max() > 1):
        raise ValueError(f"p must be probabilities in [0, 1], got {p.min()}..{p.max()} (p: {p.shape})")
    return 1.0 - (1.0 - p) ** N


def majority_vote_closed_form(probs, correct, N):
    """Per item, the exact probability that :func:`majority_vote` of ``N`` independent samples
    returns the correct answer. ``probs (items, A)``: each item's answer distribution,
    ``correct (items,)``: the index of its correct answer. Mass missing from a row (``1 - sum``)
    is taken to be spread over answers too rare to ever win (exact when rows sum to 1).

    With ``k`` votes for the correct answer, the others' counts ``m_j`` must all be ``<= k``,
    and if ``t`` of them equal ``k`` the correct answer wins with probability ``1 / (t + 1)``
    (the answer seen first among equally frequent ones is uniform, by exchangeability). Summed
    over ``k`` with multinomial weights, by a generating-function recursion over the answers.
    """
    N = _check_n(N)
    shape = _check_probs(probs, correct)
    P = np.asarray(probs, dtype=np.float64)
    n_items = shape[0]
    c = np.asarray(correct, dtype=np.int64)
    pc = P[np.arange(n_items), c]
    others = P.copy()
    others[np.arange(n_items), c] = 0.0
    others = -np.sort(-others, axis=1)  # all items at once: each row's other answers, zeros at the end
    others = others[:, : max(1, int((others > 0).sum(axis=1).max()))]
    A = others.shape[1]
    resid = np.clip(1.0 - pc - others.sum(axis=1), 0.0, None)
    logfact = np.array([math.lgamma(i + 1) for i in range(N + 1)])
    with np.errstate(divide="ignore"):
        logq, logr, logpc = np.log(others), np.log(resid), np.log(pc)
    total = np.zeros(n_items)
    for k in range(1, N + 1):
        rest = N - k
        # poly[i, u, t]: over the answers so far, using u samples with t of them tied at k:
        # the sum of prod q_j^m_j / m_j!   (u <= rest)
        poly = np.zeros((n_items, rest + 1, A + 1))
        poly[:, 0, 0] = 1.0
        for j in range(A):
            new = poly.copy()  # m = 0
            for m in range(1, min(k, rest) + 1):
                w = np.exp(m * logq[:, j] - logfact[m])[:, None, None]
                if m == k:
                    new[:, m:, 1:] += w * poly[:, : rest + 1 - m, :-1]
                else:
                    new[:, m:, :] += w * poly[:, : rest + 1 - m, :]
            poly = new
        # the missing mass takes the samples the listed answers leave, each a distinct answer
        # (seen once: a tie with the correct answer only when k = 1)
        j_left = rest - np.arange(rest + 1)
        with np.errstate(invalid="ignore"):
            wres = np.where(j_left[None, :] == 0, 1.0, np.exp(j_left[None, :] * logr[:, None] - logfact[j_left][None, :]))
        ties = np.arange(A + 1)[None, :] + (j_left[:, None] if k == 1 else 0)
        s = (wres[:, :, None] * poly / (ties[None] + 1)).sum(axis=(1, 2))
        total += np.where(pc > 0, np.exp(logfact[N] - logfact[k] + k * np.where(pc > 0, logpc, 0.0)), 0.0) * s
    return total


def best_likelihood_closed_form(probs, correct, N):
    """Per item, the probability that of ``N`` independent samples the one with the highest
    probability is correct: the correct answer is drawn and no likelier answer is,
    ``(1 - S)^N - (1 - S - p_c)^N`` with ``S`` the mass of the answers likelier than it
    (answers exactly as likely as the correct one count as likelier: a lower bound then)."""
    N = _check_n(N)
    shape = _check_probs(probs, correct)
    P = np.asarray(probs, dtype=np.float64)
    pc = P[np.arange(shape[0]), np.asarray(correct, dtype=np.int64)]
    S = np.where(P >= pc[:, None], P, 0.0).sum(axis=1) - pc
    return np.clip(1.0 - S, 0, 1) ** N - np.clip(1.0 - S - pc, 0, 1) ** N
