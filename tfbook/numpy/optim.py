"""Optimisers in NumPy (chapter 10): SGD with momentum, Adam(W), gradient clipping, checkpoints.

Parameters, gradients and optimiser state are dicts of float arrays with the same keys (as
:func:`tfbook.numpy.backprop.lm_params_from_torch` gives them); every step updates the parameter
arrays **in place**, as ``torch.optim`` does, and returns the state. The arithmetic follows
PyTorch's single-tensor implementations operation by operation, so in float64 the same
gradients give the same parameters to round-off (checked over 100 steps in the tests):

* :func:`sgd_init`, :func:`sgd_step`: ``torch.optim.SGD(momentum=..., weight_decay=...)``;
* :func:`adamw_init`, :func:`adamw_step`: ``torch.optim.AdamW`` (``decoupled=True``) or
  ``torch.optim.Adam`` with L2 weight decay folded into the gradient (``decoupled=False``);
* :func:`clip_grad_norm`: ``torch.nn.utils.clip_grad_norm_``;
* :func:`save_checkpoint`, :func:`load_checkpoint`: parameters, optimiser state, step and a
  NumPy generator's state in one ``.npz`` file, so that training resumes exactly.

The learning-rate schedule is :func:`tfbook.torch.training.lr_schedule` (a plain list of floats).
The PyTorch twins are the ``torch.optim.Optimizer`` classes of :mod:`tfbook.torch.optim`
(objects holding their state, as PyTorch's optimisers are). Also importable as ``tfbook.optim``
(its first home, which the chapters use).
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
