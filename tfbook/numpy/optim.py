"""Optimisers in NumPy (chapter 10): SGD with momentum, Adam(W), gradient clipping, checkpoints.

Parameters, gradients and optimiser state are dicts of float arrays with the same keys (as
:func:`tfbook.numpy.backprop.lm_params_from_torch` gives them); every step updates the parameter
arrays **in place**, as ``torch.optim`` does, and returns the state. The arithmetic follows
PyTorch's single-tensor implementations operation by operation, so in float64 the same
gradients give the same parameters to round-off (checked over 100 steps in the tests):

* :func:`sgd_init`, :func:`sgd_step`: ``torch.optim.SGD(momentum=..., weight_decay=...)``;
* :func:`adamw_init`, :func:`adamw_step`: ``torch.optim.AdamW`` (``decoupled=True``) or
  ``torch.optim.Adam`` with L2 weight decay folded into the gradient (``decoupled=False``);
* :func:`newton_schulz`, :func:`muon_lr_ratio`, :func:`muon_init`, :func:`muon_step`:
  ``torch.optim.Muon`` (momentum, Newton-Schulz orthogonalisation of the update, the
  shape-aware learning rate), for 2-D weight matrices only; PyTorch's iterates in bfloat16,
  these in the parameters' dtype;
* :func:`clip_grad_norm`: ``torch.nn.utils.clip_grad_norm_``;
* :func:`save_checkpoint`, :func:`load_checkpoint`: parameters, optimiser state, step and a
  NumPy generator's state in one ``.npz`` file, so that training resumes exactly.

The learning-rate schedule is :func:`tfbook.torch.training.lr_schedule` (a plain list of floats).
The PyTorch twins are the ``torch.optim.Optimizer`` classes of :mod:`tfbook.torch.optim`
(objects holding their state, as PyTorch's optimisers are).
"""

from __future__ import annotations

import json
import math

import numpy as np

__all__ = [
    "sgd_init",
    "sgd_step",
    "adamw_init",
    "adamw_step",
    "MUON_COEFFICIENTS",
    "newton_schulz",
    "muon_lr_ratio",
    "muon_init",
    "muon_step",
    "global_grad_norm",
    "clip_grad_norm",
    "save_checkpoint",
    "load_checkpoint",
]


def _check_pairs(params, grads):
    if not isinstance(params, dict) or not isinstance(grads, dict):
        raise ValueError(f"params and grads must be dicts of arrays, got {type(params).__name__} and "
                         f"{type(grads).__name__}")
    if set(params) != set(grads):
        raise ValueError(f"grads must have the keys of params; missing {sorted(set(params) - set(grads))}, "
                         f"extra {sorted(set(grads) - set(params))}")
    for k in params:
        if np.shape(params[k]) != np.shape(grads[k]):
            raise ValueError(f"grads[{k!r}] must have the shape of params[{k!r}]: "
                             f"{np.shape(grads[k])} vs {np.shape(params[k])}")


def _check_lr(lr):
    if not (isinstance(lr, (int, float)) and lr >= 0):
        raise ValueError(f"lr must be a number >= 0, got {lr!r}")


def sgd_init(params) -> dict:
    """Momentum buffers ``{"step": 0, "buf": {k: zeros}}``."""
    return {"step": 0, "buf": {k: np.zeros_like(v) for k, v in params.items()}}


def sgd_step(params, grads, state, lr, momentum=0.9, weight_decay=0.0):
    """One step of SGD with momentum (PyTorch's form, no dampening)::

        g = grad + weight_decay * p        # L2 penalty folded into the gradient
        buf = momentum * buf + g           # buf = g on the first step
        p = p - lr * buf
    """
    _check_pairs(params, grads)
    _check_lr(lr)
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
    first = state["step"] == 0
    for k, p in params.items():
        g = grads[k] + weight_decay * p if weight_decay else grads[k]
        b = state["buf"][k]
        b[...] = g if first else momentum * b + g
        p -= lr * b
    state["step"] += 1
    return state


def adamw_init(params) -> dict:
    """``{"step": 0, "m": {k: zeros}, "v": {k: zeros}}``: first and second moment estimates."""
    return {"step": 0, "m": {k: np.zeros_like(v) for k, v in params.items()},
            "v": {k: np.zeros_like(v) for k, v in params.items()}}


def adamw_step(params, grads, state, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, decoupled=True):
    """One Adam step with decoupled weight decay (AdamW), or L2 weight decay (Adam).

    With ``t`` the step number (from 1)::

        p = p * (1 - lr * weight_decay)         # decoupled: shrink p, apart from the gradient
        m = beta1 * m + (1 - beta1) * g         # (decoupled=False: g = g + weight_decay * p
        v = beta2 * v + (1 - beta2) * g**2      #  instead, and no shrink)
        m_hat = m / (1 - beta1**t)              # bias correction: m and v start at 0
        v_hat = v / (1 - beta2**t)
        p = p - lr * m_hat / (sqrt(v_hat) + eps)

    The last line is computed as PyTorch computes it, ``(lr / (1 - beta1**t)) * m /
    (sqrt(v) / sqrt(1 - beta2**t) + eps)``, which is the same number up to round-off.
    """
    _check_pairs(params, grads)
    _check_lr(lr)
    b1, b2 = betas
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise ValueError(f"betas must lie in [0, 1), got {betas}")
    state["step"] += 1
    t = state["step"]
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    for k, p in params.items():
        g = grads[k]
        if decoupled:
            p *= 1 - lr * weight_decay
        elif weight_decay:
            g = g + weight_decay * p
        m, v = state["m"][k], state["v"][k]
        m += (1 - b1) * (g - m)  # = beta1 m + (1 - beta1) g, written as PyTorch's lerp
        v *= b2
        v += (1 - b2) * g * g
        p -= (lr / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + eps)
    return state


# Jordan et al.'s quintic (the defaults of torch.optim.Muon): p(s) = a s + b s^3 + c s^5.
MUON_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
MUON_ADJUST_LR = (None, "original", "match_rms_adamw", "none")


def newton_schulz(G, steps=5, coefficients=MUON_COEFFICIENTS, eps=1e-7):
    """Approximately the orthogonal polar factor ``U V^T`` of a matrix ``G = U S V^T``.

    ``X = G / max(||G||_F, eps)`` puts every singular value in [0, 1]; each step applies the
    odd polynomial ``p(s) = a s + b s^3 + c s^5`` to every singular value at once::

        A = X X^T;   X = a X + (b A + c A A) X        # = U p(S) V^T

    computed on the wide orientation (``X`` transposed when it has more rows than columns, so
    ``A`` is the smaller Gram matrix), as ``torch.optim.Muon`` does. The quintic's coefficients
    trade exactness for speed: five steps send every singular value above about 3e-3 into a
    band around 1 (about [0.68, 1.20]), not to 1; one of 1e-3 ends near 0.47.
    """
    G = np.asarray(G)
    if G.ndim != 2:
        raise ValueError(f"G must be a 2-D matrix, got shape {G.shape}")
    if len(coefficients) != 3:
        raise ValueError(f"coefficients must be three numbers (a, b, c), got {coefficients!r}")
    if not (isinstance(steps, int) and 0 <= steps < 100):
        raise ValueError(f"steps must be an integer in [0, 100), got {steps!r}")
    a, b, c = coefficients
    tall = G.shape[0] > G.shape[1]
    X = G.T if tall else G
    X = X / max(float(np.linalg.norm(X)), eps)
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.T if tall else X


def muon_lr_ratio(shape, adjust_lr_fn=None) -> float:
    """The factor Muon multiplies ``lr`` by for a ``(A, B)`` matrix (``torch.optim.Muon``'s
    ``adjust_lr_fn``): ``None``/"original" (Jordan): ``sqrt(max(1, A / B))``;
    "match_rms_adamw" (Moonshot, Liu et al. 2025): ``0.2 sqrt(max(A, B))``, which gives the
    update an RMS of 0.2, as AdamW's typically has, so both can share ``lr``; "none": 1."""
    if len(shape) != 2:
        raise ValueError(f"shape must be a matrix's (A, B), got {tuple(shape)}")
    if adjust_lr_fn not in MUON_ADJUST_LR:
        raise ValueError(f"adjust_lr_fn must be one of {MUON_ADJUST_LR}, got {adjust_lr_fn!r}")
    A, B = shape
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1.0, A / B))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(A, B))
    return 1.0


def muon_init(params) -> dict:
    """Momentum buffers ``{"step": 0, "buf": {k: zeros}}``; every parameter a 2-D matrix."""
    for k, v in params.items():
        if np.ndim(v) != 2:
            raise ValueError(f"params[{k!r}] must be a 2-D matrix for Muon, got shape {np.shape(v)}; "
                             f"give embeddings' rows, biases and norms to AdamW")
    return {"step": 0, "buf": {k: np.zeros_like(v) for k, v in params.items()}}


def muon_step(params, grads, state, lr, momentum=0.95, nesterov=True, weight_decay=0.1,
              coefficients=MUON_COEFFICIENTS, ns_steps=5, eps=1e-7, adjust_lr_fn=None):
    """One Muon step on 2-D weight matrices, as ``torch.optim.Muon`` takes it::

        buf = momentum * buf + (1 - momentum) * g       # PyTorch's lerp
        u = (1 - momentum) * g + momentum * buf         # Nesterov (else u = buf)
        O = newton_schulz(u)                            # ~ U V^T: every direction, one size
        p = p * (1 - lr * weight_decay)                 # decoupled decay, with the plain lr
        p = p - lr * muon_lr_ratio(p.shape) * O
    """
    _check_pairs(params, grads)
    _check_lr(lr)
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
    ratio = {k: muon_lr_ratio(np.shape(p), adjust_lr_fn) if np.ndim(p) == 2 else None
             for k, p in params.items()}
    for k, p in params.items():
        if ratio[k] is None:
            raise ValueError(f"params[{k!r}] must be a 2-D matrix for Muon, got shape {np.shape(p)}")
    for k, p in params.items():
        g, b = grads[k], state["buf"][k]
        b += (1 - momentum) * (g - b)
        u = g + momentum * (b - g) if nesterov else b
        O = newton_schulz(u, ns_steps, coefficients, eps)
        p *= 1 - lr * weight_decay
        p -= lr * ratio[k] * O
    state["step"] += 1
    return state


def global_grad_norm(grads) -> float:
    """``sqrt(sum of every gradient entry squared)``: the norm of all gradients as one vector."""
    return float(np.sqrt(sum(float(np.sum(np.square(g))) for g in grads.values())))


def clip_grad_norm(grads, max_norm):
    """Scale every gradient by ``min(1, max_norm / (norm + 1e-6))`` in place, where ``norm`` is
    :func:`global_grad_norm` (the direction is kept, the length capped at about ``max_norm``).
    Returns the norm before clipping, as ``torch.nn.utils.clip_grad_norm_``."""
    if not (isinstance(max_norm, (int, float)) and max_norm > 0):
        raise ValueError(f"max_norm must be a number > 0, got {max_norm!r}")
    norm = float(np.sqrt(np.sum([np.linalg.norm(g.reshape(-1)) ** 2 for g in grads.values()])))
    coef = min(max_norm / (norm + 1e-6), 1.0)
    for g in grads.values():
        g *= coef
    return norm


def save_checkpoint(path, params, state, step, rng=None):
    """Write parameters, optimiser state, the step and a generator's state to ``path`` (.npz)."""
    arrays = {f"param/{k}": v for k, v in params.items()}
    meta = {"step": int(step), "opt_step": int(state["step"]), "slots": [s for s in state if s != "step"]}
    for slot in meta["slots"]:
        arrays.update({f"{slot}/{k}": v for k, v in state[slot].items()})
    if rng is not None:
        meta["rng"] = rng.bit_generator.state
    np.savez(path, __meta__=np.array(json.dumps(meta)), **arrays)


def load_checkpoint(path, rng=None):
    """``(params, state, step)`` from :func:`save_checkpoint`; with ``rng`` (a
    ``np.random.Generator``), its state is restored too."""
    with np.load(path, allow_pickle=False) as f:
        meta = json.loads(str(f["__meta__"]))
        params = {k[len("param/"):]: f[k].copy() for k in f.files if k.startswith("param/")}
        state = {"step": meta["opt_step"]}
        for slot in meta["slots"]:
            state[slot] = {k[len(slot) + 1:]: f[k].copy() for k in f.files if k.startswith(slot + "/")}
    if rng is not None:
        if "rng" not in meta:
            raise ValueError(f"the checkpoint {path} holds no generator state")
        rng.bit_generator.state = meta["rng"]
    return params, state, meta["step"]
