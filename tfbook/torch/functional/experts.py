"""PyTorch twins of :mod:`tfbook.numpy.experts`, re-exported by :mod:`tfbook.torch.functional`.

Same names, arguments and semantics as the NumPy functions: the top-k router, the Switch /
GShard balance loss, the expert capacity, the sparse and the dense mixture-of-experts layer,
and the LoRA-adapted linear map with its merge. Everything supports autograd (the balance
loss trains the router through the mean router probabilities; the gate weights train it
through the layer's output).
"""

from __future__ import annotations

import torch

from ... import _validate as _v
from ...numpy.experts import (
    _check_balance,
    _check_bias,
    _check_score,
    _check_rate,
    _check_capacity_factor,
    _check_lora,
    _check_moe_params,
    _check_router,
)
from ...numpy.experts import expert_capacity as _expert_capacity
from ._common import _float, _tensor
from .modern import swiglu

__all__ = [
    "top_k_router",
    "load_balancing_loss",
    "router_z_loss",
    "biased_top_k_router",
    "balance_bias_update",
    "expert_capacity",
    "moe",
    "moe_dense",
    "lora_linear",
    "lora_merge",
]


def top_k_router(X, W_router, k):
    """``(weights (..., k), experts (..., k), probs (..., E))``: ``probs = softmax(X W_router)``,
    the ``k`` most probable experts (most probable first) and their renormalised weights."""
    X, W_router = _float(X, "X"), _float(W_router, "W_router")
    k, _ = _check_router(X, W_router, k)
    probs = torch.softmax(X @ W_router, dim=-1)  # (..., E)
    top, experts = torch.topk(probs, k, dim=-1)  # (..., k), sorted, most probable first
    return top / top.sum(dim=-1, keepdim=True), experts, probs


def load_balancing_loss(probs, experts):
    """``E * sum_e f_e * pbar_e`` (Switch / GShard, Mixtral's form): ``f_e`` the fraction of
    tokens sending one of their ``k`` choices to ``e`` (a count, no gradient), ``pbar_e`` the
    mean router probability (differentiable)."""
    probs = _float(probs, "probs")
    experts = _tensor(experts, "experts")
    E = _check_balance(probs, experts)
    if experts.dtype.is_floating_point or experts.dtype == torch.bool or experts.is_complex():
        raise ValueError(f"experts must be integer expert ids, got dtype {experts.dtype} "
                         f"(shape {tuple(experts.shape)})")
    P2 = probs.reshape(-1, E)  # (N, E)
    N = P2.shape[0]
    f = torch.bincount(experts.reshape(-1), minlength=E)[:E].to(probs.dtype) / N  # (E,), sums to k
    return E * (f * P2.mean(dim=0)).sum()


def router_z_loss(logits):
    """ST-MoE's router z-loss: the mean over tokens of ``logsumexp(logits)^2``
    (differentiable). See :func:`tfbook.numpy.router_z_loss`."""
    logits = _float(logits, "logits")
    _v.check_ndim("logits", logits, 1, what="(..., E)")
    return (torch.logsumexp(logits, dim=-1) ** 2).mean()


def biased_top_k_router(X, W_router, k, bias, score="softmax"):
    """DeepSeek-V3's choice by ``probs + bias`` with the unbiased ``probs`` as gates;
    ``(weights, experts, probs)`` as :func:`top_k_router`; ``score="sigmoid"`` scores as DeepSeek-V3.
    See :func:`tfbook.numpy.biased_top_k_router`."""
    X, W_router = _float(X, "X"), _float(W_router, "W_router")
    k, E = _check_router(X, W_router, k)
    bias = torch.as_tensor(bias, dtype=X.dtype, device=X.device)
    _check_bias(bias, E, f"W_router: {tuple(W_router.shape)}")
    logits = X @ W_router
    probs = torch.softmax(logits, dim=-1) if _check_score(score) == "softmax" else torch.sigmoid(logits)
    _, experts = torch.topk(probs + bias.detach(), k, dim=-1)  # the bias chooses, it never gates
    top = probs.gather(-1, experts)
    return top / top.sum(dim=-1, keepdim=True), experts, probs


def balance_bias_update(bias, experts, rate):
    """``bias + rate * sign(mean load - load)``, the load counted over ``experts``.
    See :func:`tfbook.numpy.balance_bias_update`."""
    bias = _float(bias, "bias")
    experts = _tensor(experts, "experts")
    _v.check_ndim("experts", experts, 1, what="(..., k)")
    if experts.dtype.is_floating_point or experts.dtype == torch.bool or experts.is_complex():
        raise ValueError(f"experts must be integer expert ids, got dtype {experts.dtype} "
                         f"(shape {tuple(experts.shape)})")
    E = int(bias.shape[0]) if bias.ndim == 1 else -1
    _check_bias(bias, E, f"experts: {tuple(experts.shape)}")
    if experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= E):
        raise ValueError(f"experts must be ids in [0, E={E}), got values in [{int(experts.min())}, {int(experts.max())}]")
    rate = _check_rate(rate)
    load = torch.bincount(experts.reshape(-1), minlength=E).to(bias.dtype)
    return bias + rate * torch.sign(load.mean() - load)


def expert_capacity(num_tokens, num_experts, k, capacity_factor):
    """``ceil(capacity_factor * k * N / E)``, the most assignments one expert accepts (a plain
    integer: the NumPy function's formula)."""
    return _expert_capacity(num_tokens, num_experts, k, capacity_factor)


def _keep(experts2, E, C):
    """Which assignments of ``experts2 (N, k)`` fit within capacity ``C`` (rank-0 choices
    first, in token order; then rank 1; ...)."""
    N, k = experts2.shape
    flat = experts2.T.reshape(-1)  # (k N,)
    onehot = torch.nn.functional.one_hot(flat, E)  # (k N, E)
    position = (onehot.cumsum(0) - 1).gather(1, flat[:, None])[:, 0]  # place in its expert's queue
    return (position < C).reshape(k, N).T  # (N, k)


def moe(X, params, k, capacity_factor=None, bias=None):
    """Sparse mixture of experts: ``Y[n] = sum_j kept[n, j] weights[n, j] expert_{experts[n, j]}(X[n])
    + shared(X[n])``; returns ``(Y (..., D), routing)`` as :func:`tfbook.numpy.moe`
    (``routing``: ``weights``, ``experts``, ``probs``, ``kept``, ``load (E,)``, ``dropped``).
    ``bias (E,)``: route with :func:`biased_top_k_router` (None: :func:`top_k_router`)."""
    X = _float(X, "X")
    k, E = _check_moe_params(X, params, k)
    cf = _check_capacity_factor(capacity_factor)
    if bias is None:
        weights, experts, probs = top_k_router(X, params["W_router"], k)
    else:
        weights, experts, probs = biased_top_k_router(X, params["W_router"], k, bias)
    D = X.shape[-1]
    X2, w2, e2 = X.reshape(-1, D), weights.reshape(-1, k), experts.reshape(-1, k)  # (N, D), (N, k), (N, k)
    N = X2.shape[0]
    if cf is None:
        kept = torch.ones((N, k), dtype=torch.bool, device=X.device)
    else:
        kept = _keep(e2, E, expert_capacity(N, E, k, cf))
    Y = torch.zeros_like(X2)
    for e in range(E):
        rows, slot = torch.nonzero((e2 == e) & kept, as_tuple=True)  # tokens sent to e, which choice
        if rows.numel():
            out = swiglu(X2[rows], params["experts"][e])  # (n_e, D)
            Y = Y.index_add(0, rows, w2[rows, slot][:, None] * out)
    if params.get("shared") is not None:
        Y = Y + swiglu(X2, params["shared"])
    load = torch.bincount(e2[kept], minlength=E)
    routing = dict(weights=weights, experts=experts, probs=probs, kept=kept.reshape(experts.shape),
                   load=load, dropped=int(N * k - int(kept.sum())))
    return Y.reshape(X.shape), routing


def moe_dense(X, params, k):
    """The same layer computed densely: every expert on every token, weighted by the gate
    matrix ``gates (..., E)`` (the renormalised weights of the chosen experts, zero elsewhere)."""
    X = _float(X, "X")
    k, E = _check_moe_params(X, params, k)
    weights, experts, _ = top_k_router(X, params["W_router"], k)
    gates = torch.zeros(X.shape[:-1] + (E,), dtype=X.dtype, device=X.device).scatter(-1, experts, weights)  # (..., E)
    Y = sum(gates[..., e:e + 1] * swiglu(X, params["experts"][e]) for e in range(E))
    if params.get("shared") is not None:
        Y = Y + swiglu(X, params["shared"])
    return Y


def lora_linear(X, W, A, B, alpha):
    """``X W + (alpha / r) (X A) B`` with frozen ``W (D_in, D_out)``, ``A (D_in, r)``, ``B (r, D_out)``."""
    X, W, A, B = _float(X, "X"), _float(W, "W"), _float(A, "A"), _float(B, "B")
    r = _check_lora(X, W, A, B, alpha)
    return X @ W + (alpha / r) * ((X @ A) @ B)


def lora_merge(W, A, B, alpha):
    """The merged weight ``W + (alpha / r) A B``."""
    W, A, B = _float(W, "W"), _float(A, "A"), _float(B, "B")
    r = _check_lora(None, W, A, B, alpha)
    return W + (alpha / r) * (A @ B)

