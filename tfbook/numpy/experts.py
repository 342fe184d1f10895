"""NumPy components of mixture-of-experts layers and low-rank adaptation (chapter 19),
re-exported by :mod:`tfbook.numpy`.

A mixture-of-experts (MoE) layer replaces the MLP of a block by ``E`` MLPs (the *experts*,
here SwiGLU MLPs as in Mixtral) and a *router* ``W_router (D, E)`` that sends each token to
``k`` of them:

* :func:`top_k_router`: ``probs = softmax(X W_router)`` over the experts, the ``k`` largest
  kept and renormalised to sum to one (Mixtral's rule);
* :func:`moe`: the sparse layer, each expert applied only to the tokens sent to it, with an
  optional capacity (at most ``C`` tokens per expert, :func:`expert_capacity`; the rest are
  *dropped* and counted) and an optional shared expert that every token passes (DeepSeek);
* :func:`moe_dense`: the same layer computed densely, every expert on every token, the
  unchosen ones multiplied by a zero gate: the reference the sparse layer is checked against;
* :func:`load_balancing_loss`: the auxiliary loss of Switch / GShard (as Hugging Face's
  Mixtral computes it), ``E * sum_e f_e * pbar_e``;
* :func:`router_z_loss`: ST-MoE's router z-loss, the mean over tokens of the squared
  log-sum-exp of the router logits, which keeps the logits small;
* :func:`biased_top_k_router` and :func:`balance_bias_update`: DeepSeek-V3's balancing without
  an auxiliary loss, a per-expert bias added to the scores for the choice only (the gates stay
  the unbiased probabilities), nudged after each batch towards the experts that got too little.

Low-rank adaptation (LoRA) adds a trainable product of two thin matrices to a frozen weight:
:func:`lora_linear` computes ``X W + (alpha / r) (X A) B`` with ``A (D_in, r)``,
``B (r, D_out)``; :func:`lora_merge` folds the product into the weight,
``W + (alpha / r) A B``. (In the LoRA paper's column-vector notation the update is ``B A``;
with the book's row vectors it is its transpose, ``A B``: ``A`` goes down to rank ``r``,
``B`` comes back up, and ``B`` starts at zero.)

Conventions of :mod:`tfbook.numpy`: row vectors, dtypes preserved, bad input raises
``ValueError`` naming the argument and showing the shapes.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as _v
from ._common import _as_float
from .attention import softmax
from .modern import _check_swiglu_params, swiglu

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


# ---------------------------------------------------------------------------
# Checks shared with the PyTorch twins
# ---------------------------------------------------------------------------


def _check_router(X, W_router, k):
    _v.check_ndim("X", X, 1, what="(..., D)")
    _v.check_ndim("W_router", W_router, 2, 2, what="(D, E)")
    D, E = int(W_router.shape[0]), int(W_router.shape[1])
    if X.shape[-1] != D:
        raise ValueError(f"X has D={int(X.shape[-1])} but W_router has D={D} "
                         f"(X: {_v.shape_of(X)}, W_router: {_v.shape_of(W_router)})")
    k = _v.check_positive_int("k", k)
    if k > E:
        raise ValueError(f"k={k} exceeds the number of experts E={E} (W_router: {_v.shape_of(W_router)})")
    return k, E


def _check_moe_params(X, params, k):
    """``params``: ``W_router (D, E)``, ``experts`` (E SwiGLU dicts), optional ``shared`` (a SwiGLU dict or None)."""
    _v.check_params("params", params, ("W_router", "experts"))
    k, E = _check_router(X, params["W_router"], k)
    experts = params["experts"]
    if not isinstance(experts, (list, tuple)) or len(experts) != E:
        n = len(experts) if isinstance(experts, (list, tuple)) else type(experts).__name__
        raise ValueError(f"params['experts'] must be a list of E={E} SwiGLU dicts (one per column of "
                         f"W_router {_v.shape_of(params['W_router'])}), got {n}")
    for e, p in enumerate(experts):
        _check_swiglu_params(p, X.shape[-1], f"params['experts'][{e}]")
    if params.get("shared") is not None:
        _check_swiglu_params(params["shared"], X.shape[-1], "params['shared']")
    return k, E


def _check_capacity_factor(capacity_factor):
    if capacity_factor is None:
        return None
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float)) or not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be a number > 0 or None, got {capacity_factor!r}")
    return float(capacity_factor)


def _check_balance(probs, experts):
    _v.check_ndim("probs", probs, 1, what="(..., E)")
    _v.check_ndim("experts", experts, 1, what="(..., k)")
    if _v.shape_of(probs)[:-1] != _v.shape_of(experts)[:-1]:
        raise ValueError(f"probs and experts must have the same leading (token) axes "
                         f"(probs: {_v.shape_of(probs)}, experts: {_v.shape_of(experts)})")
    E = int(probs.shape[-1])
    if experts.shape[-1] > E:
        raise ValueError(f"experts has k={int(experts.shape[-1])} choices per token but probs has only E={E} "
                         f"experts (probs: {_v.shape_of(probs)}, experts: {_v.shape_of(experts)})")
    return E


def _check_lora(X, W, A, B, alpha, x_name="X"):
    if X is not None:
        _v.check_ndim(x_name, X, 1, what="(..., D_in)")
    _v.check_ndim("W", W, 2, 2, what="(D_in, D_out)")
    D_in, D_out = int(W.shape[0]), int(W.shape[1])
    _v.check_ndim("A", A, 2, 2, what="(D_in, r)")
    _v.check_ndim("B", B, 2, 2, what="(r, D_out)")
    shapes = f"(W: {_v.shape_of(W)}, A: {_v.shape_of(A)}, B: {_v.shape_of(B)})"
    if int(A.shape[0]) != D_in:
        raise ValueError(f"A must have shape (D_in, r) with D_in={D_in} rows, like W {shapes}")
    r = int(A.shape[1])
    if r < 1 or _v.shape_of(B) != (r, D_out):
        raise ValueError(f"B must have shape (r, D_out) = ({r}, {D_out}) {shapes}")
    if X is not None and int(X.shape[-1]) != D_in:
        raise ValueError(f"{x_name} has last axis {int(X.shape[-1])} but W has D_in={D_in} "
                         f"({x_name}: {_v.shape_of(X)}, W: {_v.shape_of(W)})")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ValueError(f"alpha must be a finite number, got {alpha!r}")
    return r


# ---------------------------------------------------------------------------
# The router and its auxiliary loss
# ---------------------------------------------------------------------------


def top_k_router(X, W_router, k):
    """Mixtral's router: a softmax over the ``E`` experts, the ``k`` most probable kept and
    their probabilities renormalised to sum to one.

    Parameters
    ----------
    X : (..., D) ndarray
        Tokens (any leading axes).
    W_router : (D, E) ndarray
        One column of router weights per expert.
    k : int
        Experts per token, ``1 <= k <= E``.

    Returns
    -------
    weights : (..., k) ndarray
        The gates of the chosen experts, ``probs[e_j] / sum_j' probs[e_j']``; each row sums to one.
    experts : (..., k) int64 ndarray
        The chosen experts, most probable first.
    probs : (..., E) ndarray
        ``softmax(X W_router)``, the full distribution (the balance loss needs it).
    """
    X = _as_float(X, "X")
    W_router = _as_float(W_router, "W_router")
    k, _ = _check_router(X, W_router, k)
    probs = softmax(X @ W_router, axis=-1)  # (..., E)
    experts = np.argsort(-probs, axis=-1, kind="stable")[..., :k]  # (..., k), most probable first
    top = np.take_along_axis(probs, experts, axis=-1)  # (..., k)
    weights = top / top.sum(axis=-1, keepdims=True)
    return weights.astype(probs.dtype, copy=False), experts.astype(np.int64), probs


def load_balancing_loss(probs, experts):
    """The auxiliary balance loss of Switch Transformer / GShard, in Mixtral's form:
    ``E * sum_e f_e * pbar_e``.

    ``f_e`` is the fraction of tokens that send one of their ``k`` choices to expert ``e``
    (so ``sum_e f_e = k``) and ``pbar_e`` the mean router probability of ``e``. Uniform
    routing gives ``k``, its minimum over routings whose ``pbar`` follows ``f``; sending
    every token to the same experts gives up to ``E`` times more. ``f`` is a count and has no
    gradient; the loss trains the router through ``pbar``.

    Parameters
    ----------
    probs : (..., E) ndarray
        The router's softmax (:func:`top_k_router`'s third output).
    experts : (..., k) int ndarray
        The chosen experts.

    Returns
    -------
    float ndarray of shape ()
    """
    probs = _as_float(probs, "probs")
    experts = np.asarray(experts)
    E = _check_balance(probs, experts)
    if experts.dtype.kind not in "iu":
        raise ValueError(f"experts must be integer expert ids, got dtype {experts.dtype} (shape {experts.shape})")
    P2 = probs.reshape(-1, E)  # (N, E)
    N = P2.shape[0]
    f = np.bincount(experts.reshape(-1), minlength=E)[:E] / N  # (E,), sums to k
    pbar = P2.mean(axis=0)  # (E,)
    return np.asarray(E * np.sum(f * pbar), dtype=probs.dtype)


def _check_bias(bias, E, what):
    _v.check_ndim("bias", bias, 1, 1, what="(E,)")
    if int(bias.shape[0]) != E:
        raise ValueError(f"bias must have one entry per expert, E={E}, got shape {_v.shape_of(bias)} ({what})")


def _check_rate(rate):
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate >= 0 or not math.isfinite(rate):
        raise ValueError(f"rate must be a finite number >= 0, got {rate!r}")
    return float(rate)


def router_z_loss(logits):
    """ST-MoE's router z-loss (Zoph et al. 2022): ``mean over tokens of (log sum_e exp(logit_e))^2``.

    It penalises large router logits (a softmax that saturates, and round-off in low precision)
    without preferring any expert. Logits all equal to ``c`` give ``(c + ln E)^2``.

    Parameters
    ----------
    logits : (..., E) ndarray
        The router's logits ``X W_router`` (before the softmax).

    Returns
    -------
    float ndarray of shape ()
    """
    logits = _as_float(logits, "logits")
    _v.check_ndim("logits", logits, 1, what="(..., E)")
    m = logits.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))[..., 0]  # stable log-sum-exp
    return np.asarray(np.mean(lse ** 2), dtype=logits.dtype)


def _check_score(score):
    if score not in ("softmax", "sigmoid"):
        raise ValueError(f"score must be 'softmax' or 'sigmoid', got {score!r}")
    return score


def biased_top_k_router(X, W_router, k, bias, score="softmax"):
    """DeepSeek-V3's router without an auxiliary loss: the experts are chosen by ``probs + bias``,
    the gates are the *unbiased* ``probs`` of the chosen experts, renormalised.

    ``bias`` (one number per expert, not trained by gradients: :func:`balance_bias_update`)
    only moves tokens between experts; it never enters the layer's output except through the
    choice. ``bias = 0`` is :func:`top_k_router`. DeepSeek-V3 scores with a sigmoid
    (``score="sigmoid"``: ``probs = sigmoid(X W_router)``, one independent score per expert);
    the book's router keeps Mixtral's softmax (the default).

    Parameters
    ----------
    X : (..., D) ndarray
    W_router : (D, E) ndarray
    k : int
    bias : (E,) ndarray
    score : {"softmax", "sigmoid"}

    Returns
    -------
    weights, experts, probs
        As :func:`top_k_router`'s (``probs``: the unbiased scores).
    """
    X = _as_float(X, "X")
    W_router = _as_float(W_router, "W_router")
    k, E = _check_router(X, W_router, k)
    bias = np.asarray(bias, dtype=X.dtype)
    _check_bias(bias, E, f"W_router: {_v.shape_of(W_router)}")
    logits = X @ W_router
    if _check_score(score) == "softmax":
        probs = softmax(logits, axis=-1)  # (..., E)
    else:
        probs = 0.5 * (1.0 + np.tanh(0.5 * logits))  # sigmoid, without overflow
    experts = np.argsort(-(probs + bias), axis=-1, kind="stable")[..., :k]  # chosen by the biased score
    top = np.take_along_axis(probs, experts, axis=-1)  # gated by the unbiased probability
    weights = top / top.sum(axis=-1, keepdims=True)
    return weights.astype(probs.dtype, copy=False), experts.astype(np.int64), probs


def balance_bias_update(bias, experts, rate):
    """One step of DeepSeek-V3's bias update: ``bias_e += rate * sign(mean load - load_e)``,
    where ``load_e`` counts the choices of expert ``e`` in ``experts`` (one batch).

    Under-used experts gain ``rate``, over-used ones lose it, an expert exactly at the mean
    keeps its bias.

    Parameters
    ----------
    bias : (E,) ndarray
    experts : (..., k) int ndarray
        The batch's choices (:func:`biased_top_k_router`'s second output).
    rate : float
        The update speed ``gamma`` (>= 0).

    Returns
    -------
    (E,) ndarray
        The new bias.
    """
    bias = _as_float(bias, "bias")
    experts = np.asarray(experts)
    _v.check_ndim("experts", experts, 1, what="(..., k)")
    if experts.dtype.kind not in "iu":
        raise ValueError(f"experts must be integer expert ids, got dtype {experts.dtype} (shape {experts.shape})")
    E = int(bias.shape[0]) if bias.ndim == 1 else -1
    _check_bias(bias, E, f"experts: {experts.shape}")
    if experts.size and (experts.min() < 0 or experts.max() >= E):
        raise ValueError(f"experts must be ids in [0, E={E}), got values in [{experts.min()}, {experts.max()}]")
    rate = _check_rate(rate)
    load = np.bincount(experts.reshape(-1), minlength=E).astype(bias.dtype)
    return bias + rate * np.sign(load.mean() - load)


def expert_capacity(num_tokens, num_experts, k, capacity_factor):
    """The most tokens one expert accepts: ``ceil(capacity_factor * k * N / E)``.

    ``k N / E`` is each expert's share if routing were perfectly even; the capacity factor
    (1.0 to 1.25 in Switch Transformer) leaves room for unevenness. Assignments beyond it are
    dropped: the token skips that expert (the residual connection carries it on).
    """
    N = _v.check_positive_int("num_tokens", num_tokens)
    E = _v.check_positive_int("num_experts", num_experts)
    k = _v.check_positive_int("k", k)
    if k > E:
        raise ValueError(f"k={k} exceeds num_experts={E}")
    cf = _check_capacity_factor(capacity_factor)
    if cf is None:
        raise ValueError("capacity_factor must be a number > 0, got None")
    return int(math.ceil(cf * k * N / E - 1e-9))  # the tolerance keeps 1.25 * 2 * 64 / 8 = 20 an exact 20


def _keep(experts2, E, C):
    """Which assignments of ``experts2 (N, k)`` fit within capacity ``C``: choices of rank 0
    first (in token order), then rank 1, ..., as in GShard (a token's second expert has lower
    priority than any token's first)."""
    N, k = experts2.shape
    flat = experts2.T.reshape(-1)  # (k N,): rank-major order
    onehot = np.zeros((flat.size, E), dtype=np.int64)
    onehot[np.arange(flat.size), flat] = 1
    position = (np.cumsum(onehot, axis=0) - 1)[np.arange(flat.size), flat]  # place in its expert's queue
    return (position < C).reshape(k, N).T  # (N, k)


# ---------------------------------------------------------------------------
# The layer, sparse and dense
# ---------------------------------------------------------------------------


def moe(X, params, k, capacity_factor=None, bias=None):
    """A mixture-of-experts layer: each token goes to the ``k`` experts its router chooses,
    with gate weights summing to one; optional capacity and shared expert.

    ``Y[n] = sum_j kept[n, j] * weights[n, j] * expert_{experts[n, j]}(X[n]) + shared(X[n])``.
    Each expert is applied only to its tokens (a gather, the SwiGLU, a scatter-add).

    Parameters
    ----------
    X : (..., D) ndarray
    params : dict
        ``W_router (D, E)``; ``experts``: a list of ``E`` SwiGLU dicts
        (``W_gate (D, D_ff)``, ``W_up (D, D_ff)``, ``W_down (D_ff, D)``); optionally
        ``shared``: a SwiGLU dict applied to every token with weight one (or None).
    k : int
        Experts per token.
    capacity_factor : float or None
        None: no capacity (every assignment is computed, "dropless", as Mixtral). Otherwise
        each expert takes at most :func:`expert_capacity` ``(N, E, k, capacity_factor)``
        assignments of the ``N`` tokens of ``X`` (all leading axes together), the first
        choices first; the others are dropped.
    bias : (E,) ndarray or None
        None: the router is :func:`top_k_router`. Otherwise :func:`biased_top_k_router`
        (DeepSeek-V3's balancing: the bias chooses the experts, the gates stay the unbiased
        probabilities).

    Returns
    -------
    Y : (..., D) ndarray
    routing : dict
        ``weights (..., k)``, ``experts (..., k)``, ``probs (..., E)`` (from
        :func:`top_k_router`), ``kept (..., k)`` bool, ``load (E,)`` assignments each expert
        computed, ``dropped`` the number of assignments dropped.
    """
    X = _as_float(X, "X")
    k, E = _check_moe_params(X, params, k)
    cf = _check_capacity_factor(capacity_factor)
    if bias is None:
        weights, experts, probs = top_k_router(X, params["W_router"], k)
    else:
        weights, experts, probs = biased_top_k_router(X, params["W_router"], k, bias)
    D = X.shape[-1]
    X2, w2, e2 = X.reshape(-1, D), weights.reshape(-1, k), experts.reshape(-1, k)  # (N, D), (N, k), (N, k)
    N = X2.shape[0]
    kept = np.ones((N, k), dtype=bool) if cf is None else _keep(e2, E, expert_capacity(N, E, k, cf))
    Y = np.zeros_like(X2)
    for e in range(E):
        rows, slot = np.nonzero((e2 == e) & kept)  # tokens sent to e, and which of their k choices
        if rows.size:
            out = swiglu(X2[rows], params["experts"][e])  # (n_e, D)
            np.add.at(Y, rows, w2[rows, slot][:, None] * out)
    if params.get("shared") is not None:
        Y = Y + swiglu(X2, params["shared"])
    load = np.bincount(e2[kept], minlength=E)
    routing = dict(weights=weights, experts=experts, probs=probs, kept=kept.reshape(experts.shape),
                   load=load, dropped=int(N * k - kept.sum()))
    return Y.reshape(X.shape).astype(X.dtype, copy=False), routing


def moe_dense(X, params, k):
    """The mixture-of-experts layer computed densely: every expert on every token, then
    ``Y = sum_e gates[:, e] * expert_e(X)`` with the gate matrix ``gates (..., E)`` that holds the
    renormalised weight of each chosen expert and zero elsewhere (plus the shared expert).

    ``E / k`` times the expert FLOPs of :func:`moe` and the same output (without capacity):
    the reference the sparse layer is checked against.
    """
    X = _as_float(X, "X")
    k, E = _check_moe_params(X, params, k)
    weights, experts, _ = top_k_router(X, params["W_router"], k)
    gates = np.zeros(X.shape[:-1] + (E,), dtype=X.dtype)  # (..., E) gates, zero for unchosen experts
    np.put_along_axis(gates, experts, weights, axis=-1)
    Y = sum(gates[..., e:e + 1] * swiglu(X, params["experts"][e]) for e in range(E))
    if params.get("shared") is not None:
        Y = Y + swiglu(X, params["shared"])
    return np.asarray(Y).astype(X.dtype, copy=False)


# ---------------------------------------------------------------------------
# Low-rank adaptation
# ---------------------------------------------------------------------------


def lora_linear(X, W, A, B, alpha):
    """A LoRA-adapted linear map: ``X W + (alpha / r) (X A) B``.

    ``W (D_in, D_out)`` is frozen; only ``A (D_in, r)`` and ``B (r, D_out)`` are trained:
    ``r (D_in + D_out)`` numbers instead of ``D_in D_out``. ``(X A) B`` costs
    ``2 r (D_in + D_out)`` FLOPs per token and never forms the ``D_in x D_out`` product.
    """
    X = _as_float(X, "X")
    W, A, B = _as_float(W, "W"), _as_float(A, "A"), _as_float(B, "B")
    r = _check_lora(X, W, A, B, alpha)
    return (X @ W + (alpha / r) * ((X @ A) @ B)).astype(X.dtype, copy=False)


def lora_merge(W, A, B, alpha):
    """The merged weight ``W + (alpha / r) A B``: after merging, the adapted layer costs what
    the original did, and ``X @ lora_merge(W, A, B, alpha)`` equals :func:`lora_linear`."""
    W, A, B = _as_float(W, "W"), _as_float(A, "A"), _as_float(B, "B")
    r = _check_lora(None, W, A, B, alpha)
    return (W + (alpha / r) * (A @ B)).astype(W.dtype, copy=False)
