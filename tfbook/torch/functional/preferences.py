"""The functions of :mod:`tfbook.numpy.preferences` for ``torch.Tensor`` (chapter 26).

Same names, arguments and messages; written with PyTorch's own pieces
(``torch.log_softmax``, ``torch.nn.functional.logsigmoid``, ``torch.softmax``), so the two are
independent computations of the same definitions. The losses return 0-d tensors that
autograd differentiates.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["sequence_logprob", "bradley_terry_loss", "dpo_implicit_reward", "dpo_loss", "kl_optimal_policy",
           "kl_objective", "sequence_kl"]


def _t(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def _f(x) -> torch.Tensor:
    """A floating tensor (integers and booleans become float64; a floating dtype is kept)."""
    x = _t(x)
    return x if x.is_floating_point() else x.double()


def _check_beta(beta) -> float:
    try:
        b = float(beta)
    except (TypeError, ValueError):
        raise ValueError(f"beta must be a positive number, got {beta!r}") from None
    if not (b > 0 and math.isfinite(b)):
        raise ValueError(f"beta must be a positive number, got {b}")
    return b


def _check_same(**named) -> tuple:
    shapes = {k: tuple(int(d) for d in _t(v).shape) for k, v in named.items()}
    first = next(iter(shapes.values()))
    if any(s != first for s in shapes.values()):
        got = ", ".join(f"{k}: {s}" for k, s in shapes.items())
        raise ValueError(f"{' and '.join(shapes)} must have one shape, got {got}")
    return first


def _check_probs(name: str, p: torch.Tensor, shape: tuple) -> None:
    if len(shape) < 1 or shape[-1] < 1:
        raise ValueError(f"{name} must be (..., K) probabilities over K answers, got shape {shape}")
    s = p.double().sum(dim=-1)
    if bool((p < 0).any()) or not bool(torch.all((s - 1.0).abs() <= 1e-6 + 1e-5)):
        raise ValueError(f"{name} must be probabilities over its last axis (non-negative, summing to 1), "
                         f"got sums {float(s.min()):.6g}..{float(s.max()):.6g} ({name}: {shape})")


def sequence_logprob(logits, targets, ignore_index=-100):
    """See :func:`tfbook.numpy.preferences.sequence_logprob` (differentiable; the logits' dtype)."""
    logits, targets = _f(logits), _t(targets)
    ls, ts = tuple(logits.shape), tuple(targets.shape)
    if len(ls) < 2 or ls[:-1] != ts:
        raise ValueError(f"targets must have the shape of logits without its last axis, got "
                         f"logits: {ls}, targets: {ts}")
    targets = targets.long()
    keep = targets != ignore_index
    if bool(keep.any()):
        lo, hi = int(targets[keep].min()), int(targets[keep].max())
        if lo < 0 or hi >= ls[-1]:
            raise ValueError(f"targets must be in [0, {ls[-1]}) or ignore_index, got {lo}..{hi} (logits: {ls})")
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return torch.where(keep, picked, torch.zeros_like(picked)).sum(dim=-1)


def bradley_terry_loss(r_chosen, r_rejected):
    """See :func:`tfbook.numpy.preferences.bradley_terry_loss` (``-logsigmoid``, a 0-d tensor)."""
    shape = _check_same(r_chosen=r_chosen, r_rejected=r_rejected)
    if math.prod(shape) == 0:
        raise ValueError(f"r_chosen must hold at least one pair, got shape {shape}")
    return -F.logsigmoid(_f(r_chosen) - _f(r_rejected)).mean()


def dpo_implicit_reward(logp, ref_logp, beta):
    """See :func:`tfbook.numpy.preferences.dpo_implicit_reward`."""
    beta = _check_beta(beta)
    _check_same(logp=logp, ref_logp=ref_logp)
    return beta * (_f(logp) - _f(ref_logp))


def dpo_loss(logp_chosen, logp_rejected, ref_logp_chosen, ref_logp_rejected, beta):
    """See :func:`tfbook.numpy.preferences.dpo_loss` (a 0-d tensor)."""
    beta = _check_beta(beta)
    _check_same(logp_chosen=logp_chosen, logp_rejected=logp_rejected, ref_logp_chosen=ref_logp_chosen,
                ref_logp_rejected=ref_logp_rejected)
    margin = (_f(logp_chosen) - _f(ref_logp_chosen)) - (_f(logp_rejected) - _f(ref_logp_rejected))
    return -F.logsigmoid(beta * margin).mean()


def kl_optimal_policy(ref_probs, rewards, beta):
    """See :func:`tfbook.numpy.preferences.kl_optimal_policy` (``torch.softmax``)."""
    beta = _check_beta(beta)
    shape = _check_same(ref_probs=ref_probs, rewards=rewards)
    ref = _f(ref_probs)
    _check_probs("ref_probs", ref, shape)
    return torch.softmax(torch.log(ref) + _f(rewards) / beta, dim=-1)


def kl_objective(probs, ref_probs, rewards, beta):
    """See :func:`tfbook.numpy.preferences.kl_objective` (``torch.xlogy`` for ``0 log 0 = 0``)."""
    beta = _check_beta(beta)
    shape = _check_same(probs=probs, ref_probs=ref_probs, rewards=rewards)
    p, ref = _f(probs), _f(ref_probs)
    _check_probs("probs", p, shape)
    _check_probs("ref_probs", ref, shape)
    kl = (torch.xlogy(p, p) - torch.xlogy(p, ref)).sum(dim=-1)
    return (p * _f(rewards)).sum(dim=-1) - beta * kl


def sequence_kl(logp, ref_logp):
    """See :func:`tfbook.numpy.preferences.sequence_kl`."""
    shape = _check_same(logp=logp, ref_logp=ref_logp)
    if len(shape) < 1 or shape[-1] < 1:
        raise ValueError(f"logp must be (..., N) log-probabilities of N samples, got shape {shape}")
    return (_f(logp) - _f(ref_logp)).mean(dim=-1)
