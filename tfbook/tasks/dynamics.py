"""Training-dynamics experiments of chapters 3 and 8, small enough to run in a notebook.

* :func:`retrieval_run` (chapter 3): one attention layer learns to retrieve the label of the
  key that matches its query, with the scores scaled by ``1/sqrt(D_K)``, ``1/D_K`` or not at all.
* :func:`ffn_w2_gradients` (chapter 8): the gradient norm of each block's ``W_2`` (the MLP's
  second weight) at initialisation, the quantity Xiong et al. (2020) plot, for Post-LN and
  Pre-LN stacks.
* :func:`warmup_run` and :func:`warmup_experiment` (chapter 8): Post-LN and Pre-LN stacks
  trained with and without learning-rate warm-up, plus Post-LN seed 0 without warm-up at the
  smaller rate ``WARMUP_RECIPE["small_lr"]``. The experiment takes a minute or more on a CPU, so
  its loss curves ship in ``tfbook/weights/ch8_warmup_curves.json`` and the final weights of the
  three seed-0 Post-LN runs (float16, :data:`WARMUP_SLICE`) in ``ch8_warmup_seed0.pt``; the
  chapter retrains only their first steps and measures the shipped weights on held-out
  sequences (:func:`heldout_sort_loss`). Regenerate both files with
  ``python -m tfbook.tasks.dynamics [--out DIR]``.
* :func:`rank_collapse` (chapter 8): how far a stack of self-attention layers (alone, with
  skip connections, with skips and MLPs) leaves its input from the rank-one matrices
  ``1 x^T`` (Dong, Cordonnier and Loukas, 2021).

Every function seeds its own generators, so equal arguments give equal results.

The task's verbs, as in the other modules of :mod:`tfbook.tasks`: ``RECIPE`` (the warm-up
experiment's, :data:`WARMUP_RECIPE`), ``ARTIFACTS`` (the file it ships), :func:`train` (run the
experiment), :func:`evaluate` (chapter 8's bar on a result), :func:`load_pretrained` (the
shipped result), :func:`save` and :func:`main`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .. import numpy as tnp
from ..torch.modules import EncoderBlock, LayerNorm
from ..torch.training import train as train_loop
from ._common import WEIGHTS, cli, write_json

__all__ = [
    "RECIPE",
    "ARTIFACTS",
    "train",
    "evaluate",
    "load_pretrained",
    "save",
    "main",
    "SCALES",
    "WARMUP_CURVES",
    "WARMUP_RECIPE",
    "WARMUP_FAILED_ABOVE",
    "WARMUP_LEARNED_BELOW",
    "Retrieval",
    "retrieval_batch",
    "retrieval_loss",
    "retrieval_run",
    "steps_to_threshold",
    "xavier_",
    "ffn_w2_gradients",
    "SortNet",
    "sort_batch",
    "warmup_run",
    "warmup_experiment",
    "load_warmup_curves",
    "WARMUP_MODELS",
    "WARMUP_SLICE",
    "load_warmup_models",
    "heldout_sort_loss",
    "meets_warmup_bar",
    "final_loss",
    "rank_one_residual",
    "rank_collapse",
]

#: The score scales chapter 3 compares, by name: each maps D_K to the factor applied to Q K^T.
SCALES = {"1/sqrt(D_K)": lambda D_K: 1 / math.sqrt(D_K), "1/D_K": lambda D_K: 1 / D_K, "none": lambda D_K: 1.0}
#: The shipped warm-up curves of chapter 8 (JSON written by ``python -m tfbook.tasks.dynamics``).
WARMUP_CURVES = WEIGHTS / "ch8_warmup_curves.json"
#: The recipe of chapter 8's warm-up experiment (model size, steps, learning rate, seeds).
WARMUP_RECIPE = dict(L=6, D=32, H=2, V=10, T=8, B=32, steps=200, lr=1e-2, warmup=50, seeds=(0, 1, 2),
                     small_lr=3e-3)
#: The shipped final weights (float16) of the three seed-0 Post-LN runs of :data:`WARMUP_SLICE`.
WARMUP_MODELS = WEIGHTS / "ch8_warmup_seed0.pt"
#: The seed-0 Post-LN runs whose weights ship, by name: (warm-up steps, learning rate); the third
#: is the smaller-rate run, whose curve ships under ``result["small_lr_curve"]``.
WARMUP_SLICE = {"no warm-up, 1e-2": (0, 1e-2), "50-step warm-up, 1e-2": (50, 1e-2), "no warm-up, 3e-3": (0, 3e-3)}
#: chapter 8's bar on the warm-up experiment (mean loss of the last 20 steps, nats; chance is
#: log 10 = 2.30): Post-LN without warm-up did not learn, every other run learned
WARMUP_FAILED_ABOVE, WARMUP_LEARNED_BELOW = 1.5, 1.0
RECIPE = WARMUP_RECIPE
ARTIFACTS = (WARMUP_CURVES.name, WARMUP_MODELS.name)


# --------------------------------------------------------------------------------------------
# Chapter 3: does the scale change how fast attention learns?
# --------------------------------------------------------------------------------------------

class Retrieval(nn.Module):
    """One attention row: scores ``c (x_q W_Q) . (x_j W_K)``, output ``z = softmax(s) V``.

    ``V`` holds one-hot labels, so ``z`` is a distribution over the ``C`` labels; ``W_Q`` and
    ``W_K`` (D, D_K) start with entries of variance ``1/D``, so queries and keys have entries of
    variance about one, as in the chapter's analysis.
    """

    def __init__(self, D: int, D_K: int, scale: float, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.W_Q = nn.Parameter(torch.randn(D, D_K, generator=g, dtype=torch.float64) / math.sqrt(D))
        self.W_K = nn.Parameter(torch.randn(D, D_K, generator=g, dtype=torch.float64) / math.sqrt(D))
        self.scale = float(scale)

    def forward(self, X, x_q, V):
        """X (B, T, D) keys, x_q (B, D) queries, V (B, T, C) one-hot labels -> z (B, C)."""
        s = self.scale * torch.einsum("bk,btk->bt", x_q @ self.W_Q, X @ self.W_K)    # (B, T)
        return torch.einsum("bt,btc->bc", torch.softmax(s, dim=-1), V)


def retrieval_batch(g: torch.Generator, B: int = 32, T: int = 16, D: int = 32, C: int = 4):
    """Keys ``X (B, T, D)``, labels ``V (B, T, C)``; the query is a copy of one key, the target its label."""
    X = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    V = nn.functional.one_hot(torch.randint(0, C, (B, T), generator=g), C).to(torch.float64)
    j = torch.randint(0, T, (B,), generator=g)
    rows = torch.arange(B)
    return X, X[rows, j], V, V[rows, j]


def retrieval_loss(model, X, x_q, V, target):
    """Squared error of the retrieved label distribution: bounded, like a loss seen through later layers."""
    return ((model(X, x_q, V) - target) ** 2).sum(-1).mean()


def retrieval_run(scale: str, D_K: int = 256, seed: int = 0, steps: int = 150, lr: float = 3e-3,
                  D: int = 32) -> np.ndarray:
    """Training losses (float64, Adam, no clipping) of :class:`Retrieval` with the given score scale."""
    model = Retrieval(D, D_K, SCALES[scale](D_K), seed)
    return np.array(train_loop(model, retrieval_loss, lambda g: retrieval_batch(g, D=D), steps, lr=lr,
                          grad_clip=None, seed=seed, disable=True).loss)


def steps_to_threshold(losses, threshold: float, window: int = 10) -> int:
    """First step at which the running mean of ``window`` losses is below ``threshold`` (len+1 if never)."""
    smooth = np.convolve(np.asarray(losses), np.ones(window) / window, mode="valid")
    below = np.flatnonzero(smooth < threshold)
    return int(below[0]) + window if below.size else len(losses) + 1


# --------------------------------------------------------------------------------------------
# Chapter 8: gradients at initialisation (Xiong et al.'s quantity)
# --------------------------------------------------------------------------------------------

def xavier_(block: nn.Module) -> nn.Module:
    """Xavier-normal weight matrices, zero biases, LayerNorm gains 1 (Xiong et al.'s initialisation)."""
    for name, p in block.named_parameters():
        if p.dim() == 2:
            nn.init.xavier_normal_(p)
        elif "norm" not in name:
            nn.init.zeros_(p)
    return block


def ffn_w2_gradients(norm_first: bool, L: int = 6, init: str = "xavier", rho: float = 0.5, seeds=range(8),
                     D: int = 64, H: int = 4, T: int = 16, B: int = 8, classes: int = 10):
    """Mean over seeds of ``||dloss/dW_2||`` for each of ``L`` blocks, and of each block's whole gradient.

    A random stack (float64) reads tokens whose entries have variance one and share a fraction
    ``rho`` of it within a sequence (``rho = 0``: independent tokens; real embeddings of a
    sentence are correlated); a linear read-out (after a final LayerNorm in Pre-LN) and a
    cross-entropy loss against random labels. ``init``: ``"xavier"`` or ``"torch"`` (the
    modules' default, uniform in +-1/sqrt(fan_in)). Returns two arrays ``(L,)``.
    """
    w2, whole = [], []
    for seed in seeds:
        torch.manual_seed(seed)
        blocks = nn.ModuleList(EncoderBlock(D, H, 4 * D, norm_first=norm_first) for _ in range(L)).double()
        if init == "xavier":
            for b in blocks:
                xavier_(b)
        elif init != "torch":
            raise ValueError(f"init must be 'xavier' or 'torch', got {init!r}")
        final = LayerNorm(D).double() if norm_first else nn.Identity()
        head = nn.Linear(D, classes).double()
        X = (math.sqrt(rho) * torch.randn(B, 1, D, dtype=torch.float64)
             + math.sqrt(1 - rho) * torch.randn(B, T, D, dtype=torch.float64))      # (B, T, D)
        labels = torch.randint(0, classes, (B, T))
        for b in blocks:
            X = b(X)
        nn.functional.cross_entropy(head(final(X)).reshape(-1, classes), labels.reshape(-1)).backward()
        w2.append([b.ffn.W_2.grad.norm().item() for b in blocks])
        whole.append([torch.cat([p.grad.flatten() for p in b.parameters()]).norm().item() for b in blocks])
    return np.mean(w2, axis=0), np.mean(whole, axis=0)


# --------------------------------------------------------------------------------------------
# Chapter 8: learning-rate warm-up
# --------------------------------------------------------------------------------------------

class SortNet(nn.Module):
    """Embedding + learned positions, ``L`` EncoderBlocks, (final LayerNorm in Pre-LN), linear head."""

    def __init__(self, norm_first: bool, L: int, D: int, H: int, V: int, T: int):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.pos = nn.Parameter(0.02 * torch.randn(T, D))
        self.blocks = nn.ModuleList(EncoderBlock(D, H, 4 * D, norm_first=norm_first) for _ in range(L))
        self.final = LayerNorm(D) if norm_first else nn.Identity()
        self.head = nn.Linear(D, V)

    def forward(self, x):                      # x (B, T) tokens -> logits (B, T, V)
        h = self.emb(x) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(self.final(h))


def sort_batch(g: torch.Generator, B: int, T: int, V: int):
    """Random digits ``x (B, T)`` and the target: the same digits sorted."""
    x = torch.randint(0, V, (B, T), generator=g)
    return x, torch.sort(x, dim=1).values


def warmup_run(norm_first: bool, warmup: int, seed: int, L=6, D=32, H=2, V=10, T=8, B=32, steps=200,
               lr=1e-2, stop_after: int | None = None, return_model: bool = False):
    """Training losses (nats) on the sort task; ``warmup`` steps of linear warm-up (0: none), then ``lr``.

    float32, AdamW without weight decay and without gradient clipping (clipping is itself a cure).
    ``stop_after``: stop after that many steps of the same ``steps``-step run (its first losses,
    equal to those of the whole run). ``return_model``: return ``(losses, model)``.
    """
    if stop_after is not None and not 1 <= stop_after <= steps:
        raise ValueError(f"stop_after must lie in 1..steps={steps}, got {stop_after}")
    torch.manual_seed(seed)
    model = SortNet(norm_first, L, D, H, V, T)

    def loss_fn(m, x, y):
        return nn.functional.cross_entropy(m(x).reshape(-1, V), y.reshape(-1))

    callbacks = () if stop_after is None else (lambda step, m, h: step >= stop_after,)
    schedule = ("warmup_cosine", warmup, lr) if warmup else "constant"   # min_lr = lr: flat after warm-up
    try:
        losses = list(train_loop(model, loss_fn, lambda g: sort_batch(g, B, T, V), steps, lr=lr, grad_clip=None,
                                 schedule=schedule, seed=seed, threads=1, disable=True, callbacks=callbacks).loss)
    except ValueError:                                      # a non-finite loss: diverged
        losses = [float("nan")] * (steps if stop_after is None else stop_after)
    return (losses, model) if return_model else losses


def warmup_experiment(recipe: dict = WARMUP_RECIPE) -> dict:
    """Loss curves ``{"Post-LN, no warm-up": [[...] per seed], ...}``, the recipe, the curve of
    Post-LN seed 0 without warm-up at ``recipe["small_lr"]`` (``"small_lr_curve"``) and, under
    ``"models"``, the trained seed-0 Post-LN models of :data:`WARMUP_SLICE` (not JSON: :func:`save`
    writes them to their own file)."""
    r = dict(recipe)
    seeds, warm, small_lr = r.pop("seeds"), r.pop("warmup"), r.pop("small_lr")
    curves, models = {}, {}
    for norm_first, name in ((False, "Post-LN"), (True, "Pre-LN")):
        for w, label in ((0, "no warm-up"), (warm, f"{warm}-step warm-up")):
            runs = [warmup_run(norm_first, w, s, **r, return_model=True) for s in seeds]
            curves[f"{name}, {label}"] = [c for c, _ in runs]
            if not norm_first and seeds[0] == 0:
                models[f"{label}, 1e-2"] = runs[0][1]
    small, models["no warm-up, 3e-3"] = warmup_run(False, 0, 0, **dict(r, lr=small_lr), return_model=True)
    return {"recipe": dict(recipe, seeds=list(seeds)), "curves": curves, "small_lr_curve": small, "models": models}


def load_warmup_curves(path=WARMUP_CURVES) -> dict:
    """The shipped result of :func:`warmup_experiment` (see the module docstring)."""
    return json.loads(Path(path).read_text())


def load_warmup_models(path=WARMUP_MODELS) -> dict:
    """The shipped seed-0 Post-LN models ``{name: SortNet}`` of :data:`WARMUP_SLICE` (float16
    weights, returned in float64, eval mode)."""
    blob = torch.load(Path(path), weights_only=True)
    r = blob["recipe"]
    models = {}
    for name, state in blob["state_dicts"].items():
        m = SortNet(False, r["L"], r["D"], r["H"], r["V"], r["T"]).double()
        m.load_state_dict({k: v.to(torch.float64) for k, v in state.items()})
        models[name] = m.eval()
    return models


def heldout_sort_loss(model: nn.Module, n: int = 1024, seed: int = 10_000) -> float:
    """Mean cross-entropy (nats per digit) of ``model`` on ``n`` fresh sort sequences drawn with
    generator ``seed`` (no training run draws from it: they use seeds 0-2), in the model's dtype."""
    V, T = model.head.out_features, model.pos.shape[0]
    x, y = sort_batch(torch.Generator().manual_seed(seed), n, T, V)
    with torch.no_grad():
        return float(nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1)))


def meets_warmup_bar(curves: dict) -> bool:
    """Every seed of "Post-LN, no warm-up" ends above :data:`WARMUP_FAILED_ABOVE`, every seed
    of the three other runs below :data:`WARMUP_LEARNED_BELOW` (chapter 8's claim)."""
    final = {name: [final_loss(c) for c in runs] for name, runs in curves.items()}
    others = [v for k, v in final.items() if k != "Post-LN, no warm-up"]
    return (min(final["Post-LN, no warm-up"]) > WARMUP_FAILED_ABOVE and len(others) == 3
            and max(max(v) for v in others) < WARMUP_LEARNED_BELOW)


def final_loss(curve, last: int = 20) -> float:
    """Mean loss of the last ``last`` steps (inf if training diverged)."""
    tail = np.asarray(curve[-last:], dtype=float)
    return float(tail.mean()) if np.isfinite(tail).all() else math.inf


# --------------------------------------------------------------------------------------------
# Chapter 8: rank collapse of pure attention
# --------------------------------------------------------------------------------------------

def rank_one_residual(X) -> float:
    """``min_x ||X - 1 x^T||_F`` for ``X (T, D)``: the minimiser ``x`` is the column mean."""
    return float(np.linalg.norm(X - X.mean(axis=0, keepdims=True)))


def rank_collapse(kind: str, depth: int = 24, T: int = 16, D: int = 32, H: int = 1, seed: int = 0):
    """Distance of the stream from the rank-one matrices ``1 x^T`` after 0..depth layers (float64).

    ``kind``: ``"attention"`` (X <- SA(X)), ``"skip"`` (X <- X + SA(X)) or ``"skip+mlp"``
    (X <- X + SA(X), then X <- X + MLP(X)). Fresh random weights in every layer: attention
    entries ``N(0, 1/D)``; the ReLU MLP He-initialised (``W_1`` entries of variance ``2/D``,
    ``W_2`` of ``1/D_ff``). No LayerNorm: it rescales each token, which changes neither
    collapse nor its absence (Dong et al., 2021). Returns two arrays ``(depth + 1,)``: the
    residual ``||X_l - 1 m_l^T||_F`` divided by that of the input, and divided by ``||X_l||_F``.
    """
    if kind not in ("attention", "skip", "skip+mlp"):
        raise ValueError(f"kind must be 'attention', 'skip' or 'skip+mlp', got {kind!r}")
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(T, D))                                     # (T, D)
    res0 = rank_one_residual(X)
    absolute, relative = [1.0], [res0 / float(np.linalg.norm(X))]
    for _ in range(depth):
        p = {k: rng.normal(size=(D, D)) / math.sqrt(D) for k in ("W_Q", "W_K", "W_V", "W_O")}
        p.update(b_Q=None, b_K=None, b_V=None, b_O=None)
        A = tnp.multi_head_attention(X, X, p, num_heads=H)[0]
        X = A if kind == "attention" else X + A
        if kind == "skip+mlp":
            mlp = {"W_1": rng.normal(size=(D, 4 * D)) * math.sqrt(2 / D), "b_1": np.zeros(4 * D),
                   "W_2": rng.normal(size=(4 * D, D)) / math.sqrt(4 * D), "b_2": np.zeros(D)}
            X = X + tnp.feed_forward(X, mlp, activation="relu")
        r = rank_one_residual(X)
        absolute.append(r / res0)
        relative.append(r / float(np.linalg.norm(X)))
    return np.array(absolute), np.array(relative)


# --------------------------------------------------------------------------------------------
# The task's verbs
# --------------------------------------------------------------------------------------------

def train(recipe: dict = WARMUP_RECIPE) -> dict:
    """Run chapter 8's warm-up experiment (:func:`warmup_experiment`): minutes on a CPU."""
    return warmup_experiment(recipe)


def evaluate(result: dict) -> bool:
    """Chapter 8's bar (:func:`meets_warmup_bar`) on a result of :func:`train` or :func:`load_pretrained`."""
    return meets_warmup_bar(result["curves"])


def load_pretrained(path=None) -> dict:
    """The shipped result of :func:`train` (``tfbook/weights/ch8_warmup_curves.json``)."""
    return load_warmup_curves(WARMUP_CURVES if path is None else path)


def save(result: dict, folder) -> Path:
    """Write ``result`` as ``ch8_warmup_curves.json`` into ``folder`` and, if it holds ``"models"``
    (a fresh :func:`train`), their float16 weights as ``ch8_warmup_seed0.pt``; returns the JSON's path."""
    folder = Path(folder)
    result = dict(result)
    models = result.pop("models", None)
    if models is not None:
        folder.mkdir(parents=True, exist_ok=True)
        r = result["recipe"]
        torch.save({"recipe": {k: r[k] for k in ("L", "D", "H", "V", "T")},
                    "state_dicts": {name: {k: v.detach().to(torch.float16).clone() for k, v in m.state_dict().items()}
                                    for name, m in models.items()}}, folder / WARMUP_MODELS.name)
    return write_json(folder / WARMUP_CURVES.name, result)


def _print_finals(result: dict) -> None:
    for name, runs in result["curves"].items():
        print(f"{name:28s} final losses " + ", ".join(f"{final_loss(c):.3f}" for c in runs))
    if "small_lr_curve" in result:
        print(f"{'Post-LN, no warm-up, ' + str(result['recipe']['small_lr']):28s} final loss "
              f"{final_loss(result['small_lr_curve']):.3f} (seed 0)")


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped file
    """``python -m tfbook.tasks.dynamics [--out DIR]``: rerun the warm-up experiment and write its curves."""
    def run(out, args):
        result = train()
        path = save(result, out)
        _print_finals(result)
        print(f"wrote {path}")

    cli(__doc__, run, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
