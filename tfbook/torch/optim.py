"""Optimisers written out on tensors (chapter 10), and checkpoints that resume exactly.

* :class:`SGDMomentum` and :class:`AdamW` are ``torch.optim.Optimizer`` subclasses whose
  ``step`` spells out the update (the same lines as :mod:`tfbook.optim` in NumPy); they equal
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


# ---------------------------------------------------------------------------------------
# Chapter 10's measured lesson: what warm-up, clipping and weight decay each change
# ---------------------------------------------------------------------------------------

#: the ablation's recipe: two-digit addition (tfbook.tasks.addition with digits=2), a small
#: Pre-LN DecoderLM, AdamW; ``full`` uses all three knobs, each other variant drops one
ABLATION_RECIPE = dict(digits=2, n_train=8000, n_validation=500, n_test=500, d_model=32, num_heads=2,
                       num_layers=2, d_ff=64, steps=800, batch_size=64, lr=1e-2, warmup=80,
                       grad_clip=1.0, weight_decay=0.1, seeds=(0, 1, 2, 3, 4))
ABLATION_VARIANTS = ("full", "no warm-up", "no clipping", "no weight decay")
ABLATION_FILE = "training_ablation.json"


def _ablation_knobs(variant: str, r: dict) -> dict:
    if variant not in ABLATION_VARIANTS:
        raise ValueError(f"variant must be one of {ABLATION_VARIANTS}, got {variant!r}")
    return dict(schedule=("warmup_cosine", 0 if variant == "no warm-up" else r["warmup"], 0.0),
                grad_clip=None if variant == "no clipping" else r["grad_clip"],
                weight_decay=0.0 if variant == "no weight decay" else r["weight_decay"])


def ablation_run(variant: str, seed: int, recipe: dict | None = None) -> dict:
    """Train one variant with one seed; return its training losses, its gradient norms before
    clipping, and on the validation split its answer cross-entropy and exact-match rate,
    plus the final weight norm. One thread, deterministic algorithms."""
    from ..tasks import addition as A
    from .models import DecoderLM, DecoderLMConfig, lm_loss
    from .training import train

    r = dict(ABLATION_RECIPE, **(recipe or {}))
    knobs = _ablation_knobs(variant, r)
    splits = A.data(r["n_train"], r["n_validation"], r["n_test"], digits=r["digits"])
    prompt = 2 * r["digits"] + 2
    x_all, y_all = A.answer_targets(splits.train, prompt)
    x_val, y_val = A.answer_targets(splits.validation, prompt)
    cfg = DecoderLMConfig(vocab_size=len(A.VOCAB), block_size=3 * r["digits"] + 3, d_model=r["d_model"],
                          num_heads=r["num_heads"], num_layers=r["num_layers"], d_ff=r["d_ff"])
    torch.manual_seed(seed)
    model = DecoderLM(cfg)
    squares = []  # per step: the squared norm of each parameter's gradient, before clipping

    def record(p):
        squares[-1] += float((p.grad.double() ** 2).sum())

    hooks = [p.register_post_accumulate_grad_hook(record) for p in model.parameters()]

    def batch_fn(generator):
        rows = torch.randint(0, x_all.shape[0], (r["batch_size"],), generator=generator)
        return x_all[rows], y_all[rows]

    def loss_fn(m, x, y):
        squares.append(0.0)  # this step's backward pass fills it in
        return lm_loss(m, x, y)

    try:
        history = train(model, loss_fn, batch_fn, r["steps"], lr=r["lr"], seed=seed, threads=1,
                        deterministic=True, disable=True, desc=variant, **knobs)
    finally:
        for h in hooks:
            h.remove()
    grad_norms = [s ** 0.5 for s in squares]
    with torch.no_grad():
        val_loss = float(lm_loss(model, x_val, y_val))
        em = float(A.exact_match(model, splits.validation, prompt).double().mean())
        w_norm = float(torch.sqrt(sum((p.double() ** 2).sum() for p in model.parameters())))
    return dict(variant=variant, seed=seed, loss=history.loss, grad_norm=grad_norms, val_loss=val_loss,
                val_exact_match=em, weight_norm=w_norm)


def ablation_experiment(recipe: dict | None = None) -> dict:
    """Every variant with every seed: ``{"recipe": ..., "runs": [ablation_run(...), ...]}``."""
    r = dict(ABLATION_RECIPE, **(recipe or {}))
    runs = [ablation_run(v, s, r) for v in ABLATION_VARIANTS for s in r["seeds"]]
    return {"recipe": {k: list(v) if isinstance(v, tuple) else v for k, v in r.items()}, "runs": runs}


ABLATION_BLOCK = 10  # the shipped curves keep one point per block of this many steps


def compress_ablation(result: dict, block: int = ABLATION_BLOCK) -> dict:
    """Per run, the mean training loss and the largest gradient norm of each block of
    ``block`` steps (what the chapter plots), rounded; the scalar results kept as they are."""
    import numpy as np

    out = {"recipe": dict(result["recipe"], block=block), "runs": []}
    for run in result["runs"]:
        loss, gn = np.asarray(run["loss"]), np.asarray(run["grad_norm"])
        n = len(loss) // block * block
        out["runs"].append(dict(run, loss=[round(float(v), 5) for v in loss[:n].reshape(-1, block).mean(1)],
                                grad_norm=[round(float(v), 4) for v in gn[:n].reshape(-1, block).max(1)]))
    return out


def load_ablation(path=None) -> dict:
    """The shipped result of :func:`ablation_experiment` (``tfbook/weights/training_ablation.json``)."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "weights" / ABLATION_FILE if path is None else Path(path)
    return json.loads(path.read_text())


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped file
    """``python -m tfbook.torch.optim [--out DIR]``: rerun the ablation and write its JSON."""
    import argparse
    import json
    from pathlib import Path

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "weights"))
    args = ap.parse_args(argv)
    result = compress_ablation(ablation_experiment())
    path = Path(args.out) / ABLATION_FILE
    path.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":  # pragma: no cover
    main()
