"""The functions of :mod:`tfbook.numpy.rl` for ``torch.Tensor`` (chapter 27).

Same names, arguments and messages. The losses support autograd (the chapter differentiates
them); the inference-time functions are written with tensor operations (majority vote by a
one-hot count, the majority-vote closed form by polynomial products), so the two are independent
computations of the same definitions.
"""

from __future__ import annotations

import math

import torch

from ... import _validate as V

__all__ = ["group_advantages", "reinforce_loss", "grpo_loss", "kl_k1", "kl_k3", "majority_vote", "best_of_n",
           "pass_at_n_closed_form", "majority_vote_closed_form", "best_likelihood_closed_form"]

_INT = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _t(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def _f(x) -> torch.Tensor:
    x = _t(x)
    return x if x.is_floating_point() else x.double()


def _dt(x) -> str:
    return str(x.dtype).replace("torch.", "")


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
    if _t(answers).dtype not in _INT:
        raise ValueError(f"{name} must hold integer answer ids, got dtype {_dt(_t(answers))} ({name}: {shape})")
    return shape


def _check_n(N) -> int:
    if isinstance(N, bool) or not isinstance(N, int) or N < 1:
        raise ValueError(f"N must be an integer >= 1, got {N!r}")
    return int(N)


def _check_probs(probs, correct) -> tuple:
    shape = V.shape_of(probs)
    if len(shape) != 2:
        raise ValueError(f"probs must be (items, A) answer probabilities, got shape {shape}")
    if V.shape_of(correct) != shape[:1]:
        raise ValueError(f"correct must be (items,), one answer index per row of probs, got correct: "
                         f"{V.shape_of(correct)}, probs: {shape}")
    p, c = _t(probs).double(), _t(correct)
    if (p < 0).any() or (p.sum(dim=1) > 1 + 1e-9).any():
        raise ValueError(f"probs must be non-negative with rows summing to at most 1 (probs: {shape})")
    if shape[0] and (c.dtype not in _INT or c.min() < 0 or c.max() >= shape[1]):
        raise ValueError(f"correct must hold integer indices in [0, {shape[1]}) (correct: {V.shape_of(correct)}, "
                         f"probs: {shape})")
    return shape


# ----------------------------------------------------------------------------- training signals
def group_advantages(rewards, scale=True, eps=1e-4):
    """See :func:`tfbook.numpy.rl.group_advantages`."""
    _check_rewards(rewards)
    r = _f(rewards)
    a = r - r.mean(dim=1, keepdim=True)
    if scale:
        a = a / (r.std(dim=1, correction=1, keepdim=True) + eps)
    return a


def reinforce_loss(logp, advantages, mask):
    """See :func:`tfbook.numpy.rl.reinforce_loss`."""
    _check_tokens(logp, advantages, mask)
    lp = _f(logp)
    return -(_t(advantages).to(lp.dtype) * (lp * _t(mask).to(lp.dtype)).sum(dim=1)).mean()


def kl_k1(logp, ref_logp):
    """See :func:`tfbook.numpy.rl.kl_k1`."""
    _check_same(dict(logp=logp, ref_logp=ref_logp), "logp")
    return _f(logp) - _f(ref_logp)


def kl_k3(logp, ref_logp):
    """See :func:`tfbook.numpy.rl.kl_k3`."""
    _check_same(dict(logp=logp, ref_logp=ref_logp), "logp")
    d = _f(ref_logp) - _f(logp)
    return torch.exp(d) - d - 1.0


def grpo_loss(logp, old_logp, advantages, mask, ref_logp=None, epsilon=0.2, beta=0.0, kl_correction=False):
    """See :func:`tfbook.numpy.rl.grpo_loss`; differentiable in ``logp``."""
    _check_tokens(logp, advantages, mask, old_logp=old_logp, ref_logp=ref_logp)
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if beta != 0 and ref_logp is None:
        raise ValueError(f"ref_logp is needed when beta != 0 (beta={beta}; logp: {V.shape_of(logp)})")
    lp = _f(logp)
    a = _t(advantages).to(lp.dtype)[:, None]
    m = _t(mask).to(lp.dtype)
    rho = torch.exp(lp - _t(old_logp).to(lp.dtype))
    per_token = -torch.minimum(rho * a, torch.clamp(rho, 1 - epsilon, 1 + epsilon) * a)
    if beta != 0:
        per_token = per_token + beta * kl_k3(lp, _t(ref_logp).to(lp.dtype)) * (rho if kl_correction else 1.0)
    return ((per_token * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)).mean()


# ----------------------------------------------------------------------------- inference-time compute
def majority_vote(answers):
    """See :func:`tfbook.numpy.rl.majority_vote` (counts by comparing every pair of samples)."""
    _check_answers("answers", answers)
    a = _t(answers)
    n = a.shape[1]
    counts = (a[:, :, None] == a[:, None, :]).sum(dim=2)  # (items, N): how often each sample's answer occurs
    first = torch.arange(n).expand_as(a)
    # the first sample of the most frequent answers: highest count, then smallest position
    key = counts * (n + 1) - first
    return a.gather(1, key.argmax(dim=1, keepdim=True))[:, 0]


def best_of_n(answers, scores):
    """See :func:`tfbook.numpy.rl.best_of_n`."""
    _check_answers("answers", answers)
    _check_same(dict(answers=answers, scores=scores), "answers")
    a = _t(answers)
    return a.gather(1, _f(scores).argmax(dim=1, keepdim=True))[:, 0]


def pass_at_n_closed_form(p, N):
    """See :func:`tfbook.numpy.rl.pass_at_n_closed_form`."""
    N = _check_n(N)
    p = _f(p).double()
    if p.numel() and (p.min() < 0 or p.max() > 1):
        raise ValueError(f"p must be probabilities in [0, 1], got {p.min().item()}..{p.max().item()} "
                         f"(p: {tuple(p.shape)})")
    return 1.0 - (1.0 - p) ** N


def majority_vote_closed_form(probs, correct, N):
    """See :func:`tfbook.numpy.rl.majority_vote_closed_form`: here one bivariate polynomial
    product per ``k`` (samples used, ties), as a tensor of coefficients."""
    N = _check_n(N)
    shape = _check_probs(probs, correct)
    P = _t(probs).double()
    corr = _t(correct)
    out = torch.zeros(shape[0], dtype=torch.float64)
    lf = torch.lgamma(torch.arange(N + 1, dtype=torch.float64) + 1)
    for i in range(shape[0]):
        c = int(corr[i])
        pc = float(P[i, c])
        if pc <= 0:
            continue
        keep = torch.ones(shape[1], dtype=torch.bool)
        keep[c] = False
        q = P[i][keep]
        q = q[q > 0]
        resid = max(0.0, 1.0 - pc - float(q.sum()))
        total = torch.zeros((), dtype=torch.float64)
        for k in range(1, N + 1):
            rest = N - k
            m = torch.arange(min(k, rest) + 1, dtype=torch.float64)
            # each answer's factor sum_m q^m / m! x^m (y when m = k): coefficients (answers, m)
            w = torch.exp(m[None, :] * torch.log(q)[:, None] - lf[: m.numel()][None, :])
            poly = torch.zeros(rest + 1, q.numel() + 1, dtype=torch.float64)
            poly[0, 0] = 1.0
            for j in range(q.numel()):
                new = torch.zeros_like(poly)
                for mm in range(m.numel()):
                    if mm == k:
                        new[mm:, 1:] += w[j, mm] * poly[: rest + 1 - mm, :-1]
                    else:
                        new[mm:, :] += w[j, mm] * poly[: rest + 1 - mm, :]
                poly = new
            u = torch.arange(rest + 1)
            j_left = rest - u  # samples left for the missing mass
            if resid > 0:
                wres = torch.exp(j_left.double() * math.log(resid) - lf[j_left])
            else:
                wres = (j_left == 0).double()
            ties = torch.arange(q.numel() + 1, dtype=torch.float64)[None, :] + (j_left[:, None] if k == 1 else 0)
            s = (wres[:, None] * poly / (ties + 1)).sum()
            total = total + torch.exp(lf[N] - lf[k] + k * math.log(pc)) * s
        out[i] = total
    return out


def best_likelihood_closed_form(probs, correct, N):
    """See :func:`tfbook.numpy.rl.best_likelihood_closed_form`."""
    N = _check_n(N)
    shape = _check_probs(probs, correct)
    P = _t(probs).double()
    pc = P[torch.arange(shape[0]), _t(correct).long()]
    S = torch.where(P >= pc[:, None], P, torch.zeros_like(P)).sum(dim=1) - pc
    return (1.0 - S).clamp(0, 1) ** N - (1.0 - S - pc).clamp(0, 1) ** N
