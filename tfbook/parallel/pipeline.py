"""Pipeline parallelism: the model cut into stages, one per rank, fed microbatch by microbatch.

One job: run chapter 18's model as a 2-stage pipeline with ``torch.distributed.pipelining``
(GPipe and 1F1B schedules), record the order in which each stage ran its forward and backward
passes, and turn those orders into the time-step grid of the schedule (:func:`timeline`), from
which the bubble is counted.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import DPConfig, make_batches, make_model

__all__ = ["PIPELINE_SCHEDULES", "split_stages", "timeline", "bubble_fraction", "in_flight"]

PIPELINE_SCHEDULES = ("gpipe", "1f1b")


class _FirstStage(nn.Module):
    """Token embedding, positions and the first ``k`` blocks of a :class:`~tfbook.torch.models.DecoderLM`."""

    def __init__(self, model, k: int):
        super().__init__()
        self.W_E, self.pos, self.blocks = model.W_E, model.pos, nn.ModuleList(model.blocks[:k])

    def forward(self, idx):
        from ..torch import functional as F
        from ..torch.models import _causal_block

        X = self.pos(F.embedding_lookup(idx, self.W_E), offset=0)  # (B, T, D)
        for block in self.blocks:
            X = _causal_block(block, X)
        return X


class _LastStage(nn.Module):
    """The remaining blocks, the final norm and the head; the head is tied to ``W_E``, so this
    stage holds its own copy of it (as Megatron-LM does) and the two copies' gradients are summed."""

    def __init__(self, model, k: int):
        super().__init__()
        self.blocks, self.norm = nn.ModuleList(model.blocks[k:]), model.norm
        self.W_U = nn.Parameter(model.W_E.detach().clone())  # (V, D), the tied head's copy

    def forward(self, X):
        from ..torch.models import _causal_block

        for block in self.blocks:
            X = _causal_block(block, X)
        return self.norm(X) @ self.W_U.T  # (B, T, V)


def split_stages(model, k: int | None = None):
    """``model`` (a tied-weight DecoderLM) as two modules, blocks ``0..k-1`` and ``k..``; ``k`` defaults to half."""
    L = len(model.blocks)
    k = L // 2 if k is None else k
    if not (isinstance(k, int) and 1 <= k <= L - 1):
        raise ValueError(f"k must be an int in 1..{L - 1} (the model has {L} blocks), got {k!r}")
    if getattr(model, "W_U", None) is not None:
        raise ValueError("split_stages expects a model whose head is tied to W_E (W_U is None)")
    return _FirstStage(model, k), _LastStage(model, k)


class _Mark(torch.autograd.Function):
    """Identity that logs ("B", i) when the gradient of microbatch ``i`` reaches it."""

    @staticmethod
    def forward(ctx, X, log, i):
        ctx.log, ctx.i = log, i
        return X.view_as(X)

    @staticmethod
    def backward(ctx, G):
        ctx.log.append(("B", ctx.i))
        return G, None, None


class _Logged(nn.Module):
    """A stage that appends ("F", i) to ``log`` when it runs microbatch ``i``'s forward pass, and
    ("B", i) when that microbatch's gradient arrives at its output (microbatches counted per step)."""

    def __init__(self, stage, n_microbatches: int):
        super().__init__()
        self.stage, self.m, self.log, self.on = stage, n_microbatches, [], True

    def forward(self, X):
        if not self.on:
            return self.stage(X)
        i = sum(1 for a in self.log if a[0] == "F") % self.m
        self.log.append(("F", i))
        return _Mark.apply(self.stage(X), self.log, i)


def timeline(logs):
    """The time-step grid of a pipeline step, from each stage's order of actions.

    ``logs[s]`` lists stage ``s``'s actions in the order it ran them, ``("F", i)`` or ``("B", i)``.
    Every action takes one time step; a stage runs its actions in its order, each as soon as its
    inputs exist: ``F i`` on stage ``s`` after ``F i`` on stage ``s - 1``; ``B i`` after ``B i``
    on stage ``s + 1`` (on the last stage, after its own ``F i``). Returns ``grid[s][t]``, the
    action stage ``s`` runs at step ``t`` or ``None`` (idle).
    """
    p = len(logs)
    done, pos, t, grid = {}, [0] * p, 0, [[] for _ in range(p)]
    total = sum(len(log) for log in logs)
    while len(done) < total:
        started = []
        for s in range(p):
            if pos[s] == len(logs[s]):
                grid[s].append(None)
                continue
            kind, i = logs[s][pos[s]]
            need = (s - 1, "F", i) if kind == "F" else ((s + 1, "B", i) if s < p - 1 else (s, "F", i))
            ready = (kind == "F" and s == 0) or done.get(need, t) < t
            grid[s].append((kind, i) if ready else None)
            if ready:
                started.append((s, kind, i))
        if not started:
            raise ValueError(f"the logs deadlock at step {t}: {logs}")
        for s, kind, i in started:
            done[(s, kind, i)] = t
            pos[s] += 1
        t += 1
    return grid


def bubble_fraction(grid) -> float:
    """Idle stage-steps over all stage-steps of a :func:`timeline` grid."""
    cells = [a for row in grid for a in row]
    return sum(a is None for a in cells) / len(cells)


def in_flight(log) -> int:
    """The most microbatches whose forward pass a stage has run and whose backward pass it has not:
    the activations it holds at its peak (``m`` for GPipe, at most the number of stages for 1F1B)."""
    held = peak = 0
    for kind, _ in log:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def _pipeline_scheme(cfg: DPConfig, rank: int, world: int, device) -> dict:
    """Pipeline parallelism on 2 ranks: rank 0 holds the embedding and the first half of the
    blocks, rank 1 the rest and the tied head; one training batch through GPipe and 1F1B with
    ``m = 4`` microbatches each; the loss, the gradients and each stage's order of actions."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    if world != 2:
        raise ValueError(f"the pipeline scheme runs on 2 ranks, got world={world}")
    m = 4
    x, y = make_batches(cfg)[0]  # the first global batch, (B, T) each
    x, y = x.to(device), y.to(device)

    def loss_fn(logits, target):  # mean cross-entropy of one microbatch
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    out = {"m": m, "stages": world}
    for name, cls in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        model = make_model(cfg).to(device)
        stage_mod = split_stages(model)[rank]
        logged = _Logged(stage_mod, m)
        stage = PipelineStage(logged, rank, world, device)
        sched = cls(stage, n_microbatches=m, loss_fn=loss_fn)  # the loss of the batch: mean over microbatches
        # a first step unlogged: the stages work out the shapes they send on the first microbatch
        # (an extra forward, and backward, pass), which the schedule's own order would not show
        for logged.on in (False, True):
            stage_mod.zero_grad(set_to_none=True)
            losses = []
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=y, losses=losses)
        names = {id(p): n for n, p in model.named_parameters()}  # the whole model's names; the head's copy is W_E's
        grads = {names.get(id(p), "W_E"): p.grad.detach().clone() for p in stage_mod.parameters()}
        tied = grads["W_E"]
        dist.all_reduce(tied)  # the tied embedding: sum the two stages' gradients (both ranks get it)
        out[name] = {"grads": {n: g.cpu() for n, g in grads.items()}, "log": list(logged.log),
                     "loss": (sum(l.item() for l in losses) / m) if rank == 1 else None,
                     "num_params": sum(p.numel() for p in stage_mod.parameters())}
    return out
