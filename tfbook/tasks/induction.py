"""Induction heads: attention-only transformers trained on repeated random spans (chapter 21).

**Data.** A sequence is ``T + 1 = 65`` tokens drawn uniformly from a vocabulary of ``V = 64``,
in which a random span of ``L`` tokens (``L`` uniform in ``SPAN``, 16 to 24) occurs twice: at
``a`` and again at ``b >= a + L`` (``a`` uniform in ``[0, T + 1 - 2L]``, then ``b`` uniform in
``[a + L, T + 1 - L]``). Outside the span nothing is predictable (the loss of any model is at
least ``ln V`` there); inside the second occurrence every token after the first is predictable
from the first occurrence, and only from it. :func:`batch` draws sequences from a
``torch.Generator``; the training stream, the validation set (seed :data:`VALIDATION_SEED`) and
the test set (seed :data:`TEST_SEED`, read once, by the chapter) never share a generator.

**Models.** :class:`tfbook.torch.induction.AttnOnlyLM`: width 64, 2 heads per layer (``D_K = 32``),
learned positions in the queries and keys only, no MLP, no LayerNorm; two layers (``"two"``) and one layer (``"one"``), three
seeds each, the same :data:`RECIPE` (AdamW, a constant rate after a short warm-up; chosen from a
handful of short development runs by their validation curves: GPT-2's 0.02 initialisation stayed on
the plateau for 1,500 steps, and positions added to the residual stream gave a circuit without a
previous-token head, hence positions in the queries and keys only). Every ``eval_every`` steps the callback records, on the
validation set, the loss on the first and on the second occurrence of the span (targets 2..L of
each) and every head's previous-token and prefix-matching score; the final weights are kept.

**Artifacts** (``tfbook/weights/``): ``induction_{kind}_seed{s}.pt`` (float16 weights, config,
history with the recorded curves in ``extra``), ``induction_two_seed0_early.pt`` (seed 0 of the
two-layer model at the last evaluation before its in-context loss drops, to check the shipped
curve live), written by::

    python -m tfbook.tasks.induction                 # all six runs; or --runs two:0,one:1

in a few CPU-minutes per run (the shipped six ran in parallel on a busy two-core machine in 25 minutes).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from ..torch.induction import AttnOnlyConfig, AttnOnlyLM
from ..torch.functional import induction as FI
from ..torch.training import History
from ..torch.training import train as train_loop
from ._common import cli, load_model, save_model, shipped

__all__ = ["RECIPE", "KINDS", "SHAPE", "SPAN", "VALIDATION_SEED", "TEST_SEED", "ARTIFACTS", "config", "batch",
           "eval_set", "span_losses", "head_scores", "phase_change_step", "train", "load_pretrained",
           "load_early", "main"]

KINDS = ("two", "one")
SHAPE = dict(vocab_size=64, block_size=64, d_model=64, num_heads=2)
SPAN = (16, 24)
VALIDATION_SEED, TEST_SEED = 10_000, 20_000
RECIPE = dict(steps=3000, batch_size=32, lr=3e-3, weight_decay=0.01, warmup=100, eval_every=60, eval_n=256,
              seeds=(0, 1, 2))
ARTIFACTS = tuple(f"induction_{k}_seed{s}.pt" for k in KINDS for s in RECIPE["seeds"]) + ("induction_two_seed0_early.pt",)


def config(kind: str = "two") -> AttnOnlyConfig:
    """The model of ``kind``: ``"two"`` layers or ``"one"``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return AttnOnlyConfig(num_layers=2 if kind == "two" else 1, **SHAPE)


def batch(n: int, generator: torch.Generator, T: int = SHAPE["block_size"], V: int = SHAPE["vocab_size"],
          span=SPAN):
    """``(ids (n, T + 1), a (n,), b (n,), L (n,))``: uniform random tokens with the span
    ``ids[a:a+L]`` repeated at ``ids[b:b+L]``."""
    lo, hi = span
    if not (1 <= lo <= hi and 2 * hi <= T + 1):
        raise ValueError(f"span must be (lo, hi) with 1 <= lo <= hi and 2 hi <= T + 1 (span: {span}, T: {T})")
    ids = torch.randint(0, V, (n, T + 1), generator=generator)
    L = torch.randint(lo, hi + 1, (n,), generator=generator)
    u, w = torch.rand(n, generator=generator), torch.rand(n, generator=generator)
    a = (u * (T + 2 - 2 * L)).long()  # uniform in [0, T + 1 - 2L]
    b = a + L + (w * (T + 2 - L - (a + L))).long()  # uniform in [a + L, T + 1 - L]
    rows = torch.arange(n)
    for i in range(hi):
        keep = i < L
        src = ids[rows[keep], (a + i)[keep]]
        ids[rows[keep], (b + i)[keep]] = src
    return ids, a, b, L


def eval_set(seed: int = VALIDATION_SEED, n: int = RECIPE["eval_n"]):
    """A fixed set of :func:`batch` sequences: the validation set by default, the test set with ``TEST_SEED``."""
    return batch(n, torch.Generator().manual_seed(int(seed)))


def span_masks(a, b, L, T: int = SHAPE["block_size"]):
    """Boolean ``(n, T)`` masks over the input positions whose next token is token 2..L of
    the first (``first``) or the second (``second``) occurrence of the span."""
    t = torch.arange(T)[None, :]
    first = (t >= a[:, None]) & (t < (a + L - 1)[:, None])
    second = (t >= b[:, None]) & (t < (b + L - 1)[:, None])
    return first, second


@torch.no_grad()
def span_losses(model, data, ablate=None) -> tuple:
    """``(first, second)``: mean cross-entropy (nats) on the targets 2..L of each occurrence,
    in the model's dtype."""
    ids, a, b, L = data
    logits = model(ids[:, :-1], ablate=ablate)
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    first, second = span_masks(a, b, L, ids.shape[1] - 1)
    return float(nll[first].mean()), float(nll[second].mean())


@torch.no_grad()
def head_scores(model, data) -> dict:
    """Every head's previous-token and prefix-matching score on ``data`` (lists, layer by head)."""
    ids = data[0][:, :-1]
    _, patterns = model(ids, return_attention=True)
    return dict(prev=[FI.previous_token_score(P).mean(0).tolist() for P in patterns],
                prefix=[FI.prefix_matching_score(P, ids).nanmean(0).tolist() for P in patterns])


def phase_change_step(steps, second, head: int = 3, tail: int = 3) -> int:
    """The first evaluation step at which the second-occurrence loss is below half-way between its
    plateau (the mean of evaluations ``1..head``, after the first drop from initialisation) and
    its end value (the mean of the last ``tail`` evaluations)."""
    steps, second = np.asarray(steps), np.asarray(second, dtype=np.float64)
    if steps.shape != second.shape or steps.ndim != 1 or len(steps) < head + tail + 1:
        raise ValueError(f"steps and second must be 1-D of the same length > head + tail "
                         f"(steps: {steps.shape}, second: {second.shape})")
    plateau, end = second[1:head + 1].mean(), second[-tail:].mean()
    below = np.nonzero(second < (plateau + end) / 2)[0]
    below = below[below > head]
    if len(below) == 0:
        return -1
    return int(steps[below[0]])


def train(kind: str = "two", seed: int = 0, steps: int | None = None, log_every: int = 0):
    """Train ``kind`` for ``RECIPE['steps']`` steps; returns ``(model, History, snapshots)``.

    ``history.extra["curve"]`` holds, per evaluation step, the validation losses on the first
    and second occurrence and every head's scores; ``snapshots`` maps each evaluation step to
    a float16 copy of the weights (to ship the one before the phase change)."""
    cfg = config(kind)
    r = dict(RECIPE, kind=kind, seed=int(seed), steps=RECIPE["steps"] if steps is None else int(steps))
    r.pop("seeds")
    val = eval_set()
    curve = dict(step=[], first=[], second=[], prev=[], prefix=[])
    snapshots = {}

    def record(step, model):
        model.eval()
        f, s = span_losses(model, val)
        sc = head_scores(model, val)
        for k, v in (("step", step), ("first", f), ("second", s), ("prev", sc["prev"]), ("prefix", sc["prefix"])):
            curve[k].append(v)
        snapshots[step] = {k: v.detach().half().clone() for k, v in model.state_dict().items()}
        model.train()

    def watch(step, model, history):
        if step % r["eval_every"] == 0:
            record(step, model)
            if log_every and step % log_every == 0:
                print(f"{kind}:{seed} step {step} first {curve['first'][-1]:.3f} second {curve['second'][-1]:.3f} "
                      f"prev {np.round(curve['prev'][-1][0], 2).tolist()} prefix {np.round(curve['prefix'][-1][-1], 2).tolist()}",
                      flush=True)
        return False

    def loss_fn(model, ids):
        logits = model(ids[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    def batch_fn(generator):
        return batch(r["batch_size"], generator)[0]

    torch.manual_seed(r["seed"])
    model = AttnOnlyLM(cfg)
    record(0, model)
    history = train_loop(model, loss_fn, batch_fn, r["steps"], lr=r["lr"], weight_decay=r["weight_decay"],
                         schedule=("warmup_cosine", r["warmup"], r["lr"]), callbacks=[watch],
                         seed=r["seed"] + 1, threads=1, deterministic=True, disable=True,
                         desc=f"induction-{kind}")
    history.extra["recipe"] = r
    history.extra["curve"] = curve
    return model.eval(), history, snapshots


def load_pretrained(kind: str = "two", seed: int = 0, folder=None):
    """The shipped model of ``kind`` and ``seed`` (float32, eval mode) and its :class:`History`."""
    if kind not in KINDS or seed not in RECIPE["seeds"]:
        raise ValueError(f"kind must be one of {KINDS} and seed one of {RECIPE['seeds']}, got {kind!r}, {seed!r}")
    return load_model(shipped(f"induction_{kind}_seed{seed}.pt", folder), AttnOnlyLM, AttnOnlyConfig)


def load_early(folder=None):
    """Seed 0 of the two-layer model at its last evaluation before the phase change, and its History
    (``extra["step"]`` is that step)."""
    return load_model(shipped("induction_two_seed0_early.pt", folder), AttnOnlyLM, AttnOnlyConfig)


def _run(kind, seed, out, log=print):
    t0 = time.time()
    model, history, snaps = train(kind, seed, log_every=300)
    for p in model.parameters():  # what is shipped: float16
        p.data = p.data.half().float()
    save_model(Path(out) / f"induction_{kind}_seed{seed}.pt", model, history)
    c = history.extra["curve"]
    if kind == "two" and seed == 0:
        step = phase_change_step(c["step"], c["second"])
        before = max(s for s in c["step"] if s < step) if step > 0 else 0
        early = AttnOnlyLM(config(kind))
        early.load_state_dict({k: v.float() for k, v in snaps[before].items()})
        h = History()
        h.extra["step"] = before
        save_model(Path(out) / "induction_two_seed0_early.pt", early, h)
    log(f"{kind} seed {seed}: first {c['first'][-1]:.3f} second {c['second'][-1]:.3f} "
        f"phase change {phase_change_step(c['step'], c['second'])} prefix {np.round(c['prefix'][-1], 2).tolist()} "
        f"prev {np.round(c['prev'][-1], 2).tolist()} ({time.time() - t0:.0f} s)")


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped artifacts
    def add(parser):
        parser.add_argument("--runs", default=",".join(f"{k}:{s}" for k in KINDS for s in RECIPE["seeds"]),
                            help="comma-separated kind:seed pairs")

    def run(out, args):
        Path(out).mkdir(parents=True, exist_ok=True)
        for item in args.runs.split(","):
            kind, seed = item.split(":")
            _run(kind, int(seed), out, log=lambda s: print(s, flush=True))

    cli(__doc__, run, add, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
