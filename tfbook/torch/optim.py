"""Optimisers written out on tensors (chapter 10), and checkpoints that resume exactly.

* :class:`SGDMomentum` and :class:`AdamW` are ``torch.optim.Optimizer`` subclasses whose
  ``step`` spells out the update (the same lines as :mod:`tfbook.numpy.optim`); they equal
  ``torch.optim.SGD`` and ``torch.optim.AdamW`` (and ``torch.optim.Adam`` with
  ``decoupled=False``) to float64 round-off. Being ``Optimizer`` subclasses they have
  ``zero_grad``, ``param_groups`` and ``state_dict``, so schedules and checkpoints work as usual.
* :func:`newton_schulz` and :class:`Muon` equal ``torch.optim.Muon`` (bit for bit with
  ``ns_dtype=torch.bfloat16``, PyTorch's choice; in the parameters' dtype by default, the twin
  of :func:`tfbook.numpy.optim.muon_step`); :class:`MuonAdamW` is one optimiser holding Muon
  for the hidden weight matrices and AdamW for the rest (:func:`muon_groups` splits a model),
  for :func:`tfbook.torch.training.train`'s ``optimizer=``.
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

__all__ = ["SGDMomentum", "AdamW", "MUON_COEFFICIENTS", "newton_schulz", "muon_lr_ratio", "Muon",
           "muon_groups", "MuonAdamW", "clip_grad_norm", "save_checkpoint", "load_checkpoint"]


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


MUON_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan et al.'s quintic, torch.optim.Muon's default
MUON_ADJUST_LR = (None, "original", "match_rms_adamw", "none")


def newton_schulz(G, steps=5, coefficients=MUON_COEFFICIENTS, eps=1e-7, dtype=None):
    """``X = G / max(||G||_F, eps)``, then ``steps`` times ``A = X X^T; X = a X + (b A + c A A) X``
    on the wide orientation: approximately ``U V^T`` (:func:`tfbook.numpy.optim.newton_schulz`).
    ``dtype``: iterate in it (``torch.bfloat16`` is what ``torch.optim.Muon`` does) and return it."""
    if not isinstance(G, torch.Tensor) or G.ndim != 2:
        raise ValueError(f"G must be a 2-D matrix, got shape {tuple(getattr(G, 'shape', ()))}")
    if len(coefficients) != 3:
        raise ValueError(f"coefficients must be three numbers (a, b, c), got {coefficients!r}")
    if not (isinstance(steps, int) and 0 <= steps < 100):
        raise ValueError(f"steps must be an integer in [0, 100), got {steps!r}")
    a, b, c = coefficients
    X = G if dtype is None else G.to(dtype)
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.T
    X = X / X.norm().clamp(min=eps)
    for _ in range(steps):
        A = X @ X.T
        B = torch.addmm(A, A, A, beta=b, alpha=c)        # b A + c A A
        X = torch.addmm(X, B, X, beta=a)                 # a X + B X
    return X.T if tall else X


def muon_lr_ratio(shape, adjust_lr_fn=None) -> float:
    """``lr``'s factor for an ``(A, B)`` matrix: ``None``/"original" ``sqrt(max(1, A / B))``,
    "match_rms_adamw" ``0.2 sqrt(max(A, B))`` (these three as ``torch.optim.Muon``, which
    accepts no other); "none" 1, the book's own addition."""
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


def _muon_update(p, state, group):
    """One Muon step of the 2-D parameter ``p`` (its ``.grad`` set), in place."""
    lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
    g = p.grad
    if "buf" not in state:
        state["buf"] = torch.zeros_like(p)
    buf = state["buf"]
    buf.add_((1 - mu) * (g - buf))                     # = mu buf + (1 - mu) g, PyTorch's lerp
    u = g + mu * (buf - g) if group["nesterov"] else buf
    O = newton_schulz(u, group["ns_steps"], group["ns_coefficients"], group["eps"], group["ns_dtype"])
    p.mul_(1 - lr * wd)
    p.add_(O, alpha=-lr * muon_lr_ratio(p.shape, group["adjust_lr_fn"]))


def _check_muon(params, momentum, adjust_lr_fn):
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
    if adjust_lr_fn not in MUON_ADJUST_LR:
        raise ValueError(f"adjust_lr_fn must be one of {MUON_ADJUST_LR}, got {adjust_lr_fn!r}")
    for i, p in enumerate(params):
        if p.ndim != 2:
            raise ValueError(f"params[{i}] must be a 2-D matrix for Muon, got shape {tuple(p.shape)}; "
                             f"give embeddings' rows, biases and norms to AdamW")


class Muon(torch.optim.Optimizer):
    """Momentum, then the update orthogonalised by :func:`newton_schulz`, for 2-D matrices::

        buf = mu buf + (1 - mu) g;  u = (1 - mu) g + mu buf (Nesterov) or buf;  O = NS(u)
        p *= 1 - lr * weight_decay;  p -= lr * muon_lr_ratio(p.shape, adjust_lr_fn) * O

    ``torch.optim.Muon``'s defaults and arithmetic; ``ns_dtype=torch.bfloat16`` iterates in
    bfloat16 as it does (default: the parameters' dtype)."""

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=MUON_COEFFICIENTS, eps=1e-7, ns_steps=5, adjust_lr_fn=None, ns_dtype=None):
        _check(lr)
        params = list(params)
        _check_muon([p for p in params if isinstance(p, torch.Tensor)], momentum, adjust_lr_fn)
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                                      ns_coefficients=tuple(ns_coefficients), eps=eps, ns_steps=ns_steps,
                                      adjust_lr_fn=adjust_lr_fn, ns_dtype=ns_dtype))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else torch.enable_grad()(closure)()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    _muon_update(p, self.state[p], group)
        return loss


def muon_groups(model):
    """``(matrices, rest)``: the 2-D weights inside the blocks (attention's W_Q, W_K, W_V, W_O,
    the MLP's W_1, W_2), which Muon takes, and every other parameter (the token embedding, which
    is also the tied output head, the position table, biases, norm gains), which AdamW takes:
    an embedding's rows are looked up one token at a time, not multiplied as one map, and
    vectors have no directions to orthogonalise."""
    matrices, rest = [], []
    for name, p in model.named_parameters():
        (matrices if p.ndim == 2 and name.startswith("blocks.") else rest).append(p)
    return matrices, rest


class MuonAdamW(torch.optim.Optimizer):
    """One optimiser: :class:`Muon`'s step for ``matrices``, ``torch.optim.AdamW``'s for ``rest``.

    Both groups share ``lr`` and ``weight_decay`` (set by a schedule in every group), so the
    default ``adjust_lr_fn="match_rms_adamw"``, which scales Muon's update to AdamW's typical
    RMS of 0.2, is the natural one. ``MuonAdamW.build`` is the ``optimizer=`` of
    :func:`tfbook.torch.training.train`."""

    def __init__(self, matrices, rest, lr=1e-3, weight_decay=0.0, momentum=0.95, nesterov=True,
                 betas=(0.9, 0.999), eps=1e-8, adjust_lr_fn="match_rms_adamw", ns_steps=5, ns_dtype=None):
        _check(lr, betas=betas)
        matrices, rest = list(matrices), list(rest)
        _check_muon(matrices, momentum, adjust_lr_fn)
        super().__init__([dict(params=matrices, muon=True), dict(params=rest, muon=False)],
                         dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                              ns_coefficients=MUON_COEFFICIENTS, eps=1e-7, ns_steps=ns_steps,
                              adjust_lr_fn=adjust_lr_fn, ns_dtype=ns_dtype, betas=tuple(betas),
                              adam_eps=eps))
        self._adamw = torch.optim.AdamW(rest, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay) \
            if rest else None

    def state_dict(self):
        """Muon's momentum buffers and, under ``"adamw"``, the inner AdamW's state (for checkpoints)."""
        out = super().state_dict()
        out["adamw"] = None if self._adamw is None else self._adamw.state_dict()
        return out

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        inner = state_dict.pop("adamw", None)
        super().load_state_dict(state_dict)
        if inner is not None and self._adamw is not None:
            self._adamw.load_state_dict(inner)

    @classmethod
    def build(cls, **kwargs):
        """``optimizer(model, lr, weight_decay)`` for :func:`tfbook.torch.training.train`."""
        def make(model, lr, weight_decay):
            return cls(*muon_groups(model), lr=lr, weight_decay=weight_decay, **kwargs)
        return make

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else torch.enable_grad()(closure)()
        for group in self.param_groups:
            if group["muon"]:
                for p in group["params"]:
                    if p.grad is not None:
                        _muon_update(p, self.state[p], group)
            elif self._adamw is not None:
                self._adamw.param_groups[0]["lr"] = group["lr"]
                self._adamw.param_groups[0]["weight_decay"] = group["weight_decay"]
                self._adamw.step()
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
