"""Optimisers written out on tensors (chapter 10), and checkpoints that resume exactly.

* :class:`SGDMomentum` and :class:`AdamW` are ``torch.optim.Optimizer`` subclasses whose
  ``step`` spells out the update (the same lines as :mod:`tfbook.numpy.optim`); they equal
  ``torch.optim.SGD`` and ``torch.optim.AdamW`` (and ``torch.optim.Adam`` with
  ``decoupled=False``) to float64 round-off. Being ``Optimizer`` subclasses they have
  ``zero_grad``, ``param_groups`` and ``state_dict``, so schedules and checkpoints work as usual.
* :func:`clip_grad_norm` equals ``torch.nn.utils.clip_grad_norm_``.
* :func:`save_checkpoint` / :func:`load_checkpoint` store the model, the optimiser (its
  moment estimates and step counts), the step, PyTorch's global RNG state and, if given,
  the batch generator's state: resuming from a checkpoint gives exactly the losses of
  training without the interruption.

From chapter 10 on, the book trains with ``torch.optim.AdamW`` through
:func:`tfbook.torch.training.train`, the library optimiser these are shown equal to; the
schedule is :func:`tfbook.torch.training.lr_schedule`.
"""

from __future__ import annotations

import math

import torch

__all__ = ["SGDMomentum", "AdamW", "clip_grad_norm", "save_checkpoint", "load_checkpoint"]


def _check(lr, betas=None, momentum=None):
    if not (isinstance(lr, (int, float)) and lr >= 0):
        raise ValueError(f"lr must be a number >= 0, got {lr!r}")
    if betas is not None and not (len(betas) == 2 and all(0 <= b < 1 for b in betas)):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
    if momentum is not None and not 0 <= momentum < 1:
        raise ValueError(f"momentum must lie in [0, 1), got {momentum}")


class SGDMomentum(torch.optim.Optimizer):
    """``g = grad + weight_decay * p;  buf = momentum * buf + g (buf = g at first);  p -= lr * buf``."""

    def __init__(self, params, lr=1e-2, momentum=0.9, weight_decay=0.0):
        _check(lr, momentum=momentum)
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else torch.enable_grad()(closure)()
        for group in self.param_groups:
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad + wd * p if wd else p.grad
                state = self.state[p]
                if "buf" not in state:
                    state["buf"] = g.clone()
                else:
                    state["buf"].mul_(mu).add_(g)
                p.sub_(lr * state["buf"])
        return loss


class AdamW(torch.optim.Optimizer):
    """Adam with decoupled weight decay (``decoupled=False``: Adam with L2 decay in the gradient).

    Per parameter, at step ``t``: ``p *= 1 - lr * weight_decay``; ``m = beta1 m + (1 - beta1) g``;
    ``v = beta2 v + (1 - beta2) g^2``; ``p -= lr * m_hat / (sqrt(v_hat) + eps)`` with the
    bias-corrected ``m_hat = m / (1 - beta1^t)`` and ``v_hat = v / (1 - beta2^t)``.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, decoupled=True):
        _check(lr, betas=betas)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      decoupled=bool(decoupled)))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else torch.enable_grad()(closure)()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                if group["decoupled"]:
                    p.mul_(1 - lr * wd)
                elif wd:
                    g = g + wd * p
                m, v = state["m"], state["v"]
                m.add_((1 - b1) * (g - m))
                v.mul_(b2).add_((1 - b2) * g * g)
                p.sub_((lr / (1 - b1 ** t)) * m / (v.sqrt() / math.sqrt(1 - b2 ** t) + eps))
        return loss


def clip_grad_norm(parameters, max_norm):
    """Scale every ``.grad`` by ``min(1, max_norm / (norm + 1e-6))`` in place, ``norm`` being the
    norm of all gradients as one vector; returns that norm (a tensor), as ``clip_grad_norm_``."""
    if not (isinstance(max_norm, (int, float)) and max_norm > 0):
        raise ValueError(f"max_norm must be a number > 0, got {max_norm!r}")
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return norm


def save_checkpoint(path, model, optimizer, step, generator=None, extra=None):
    """Save everything training depends on: weights, optimiser state, ``step``, the global RNG
    state (dropout and other ``torch.rand`` calls) and ``generator``'s state (the batches)."""
    if not isinstance(model, torch.nn.Module) or not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"model must be an nn.Module and optimizer a torch.optim.Optimizer, got "
                         f"{type(model).__name__} and {type(optimizer).__name__}")
    blob = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": int(step),
            "rng": torch.get_rng_state(), "extra": extra}
    if generator is not None:
        blob["generator"] = generator.get_state()
    torch.save(blob, path)


def load_checkpoint(path, model, optimizer, generator=None):
    """Restore what :func:`save_checkpoint` saved into ``model``, ``optimizer`` (and
    ``generator``); returns ``(step, extra)``."""
    blob = torch.load(path, weights_only=False)
    model.load_state_dict(blob["model"])
    optimizer.load_state_dict(blob["optimizer"])
    torch.set_rng_state(blob["rng"])
    if generator is not None:
        if "generator" not in blob:
            raise ValueError(f"the checkpoint {path} holds no generator state")
        generator.set_state(blob["generator"])
    return blob["step"], blob["extra"]


# Chapter 10's ablation (warm-up, clipping, weight decay) was an experiment in this module; it is
# the task tfbook.tasks.ablation now. Its names stay reachable here for the chapters that import
# them (``from tfbook.torch.optim import load_ablation``), loaded on first use.
_MOVED = ("ABLATION_RECIPE", "ABLATION_VARIANTS", "ABLATION_FILE", "ABLATION_BLOCK", "ablation_run",
          "ablation_experiment", "compress_ablation", "load_ablation", "main")


def __getattr__(name):
    if name in _MOVED:
        from ..tasks import ablation

        return getattr(ablation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":  # pragma: no cover - ``python -m tfbook.torch.optim``, the ablation's first command
    from ..tasks.ablation import main

    main()
