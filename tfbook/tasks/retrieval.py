"""Key-value retrieval: the small trained encoder of chapters 4, 5 and 9.

A sequence holds ``N_PAIRS = 6`` *slots*, each a key letter ``A..H`` and a value digit
``0..7``, and ends with a query naming two of the keys; the model must output the two values
stored under them::

    C2 F1 H0 D5 A5 E5 ?D,E     ->  5, 5

Each position carries two token ids whose embeddings are added (a slot: key and value; the
query: first and second key), plus a learned position vector. Keys are distinct within a
sequence and values random, so guessing scores 1/8 per value and 1/64 for both: the query
has to *find* the slots of its keys, which is what attention is for.

The model (:class:`RetrievalEncoder`) is the book's own parts: the embeddings, one Pre-LN
:class:`~tfbook.torch.modules.EncoderBlock` (``return_attention=True`` gives its maps), a final
LayerNorm and a linear read-out of the query position with two rows of 8 logits. Two shipped
variants differ only in the number of heads (``VARIANTS``): ``h2`` (two heads of width 16:
they specialise, one per queried key; chapters 5 and 9) and ``h1`` (one head of width 32: it
solves the task by weighting the two queried slots unequally; chapter 4).

Splits (:func:`data`): fixed validation and test sets of 2,000 sequences each, from different
seeds and disjoint; training draws fresh sequences every step and rejects any held-out one,
so accuracy is measured on sequences the model never saw. :func:`train` validates every 100
steps and keeps the best weights (chosen on validation, never on test). It takes about 20 s
of CPU per model, more than a chapter should spend, so the weights ship (float16,
``retrieval.pt`` and ``retrieval_h1.pt``, 50 KB each). Regenerate them with::

    python -m tfbook.tasks.retrieval            # or --out DIR

(``tests/test_task_retrieval.py`` retrains both once and checks the bars on the result.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..torch.modules import EncoderBlock, LayerNorm
from ..torch.training import History
from ..torch.training import train as train_loop
from ._common import Splits, cli, load_model, pick, save_model, shipped

__all__ = ["N_PAIRS", "N_KEYS", "N_VALUES", "T", "KEYS", "VALUES", "RECIPE", "VARIANTS", "ARTIFACTS",
           "RetrievalConfig", "RetrievalEncoder", "sample", "data", "config", "make_model", "train",
           "accuracy", "evaluate", "load_pretrained", "save", "main", "tokens", "ablate_head", "loss_fn",
           "logits_one_distribution"]

N_PAIRS, N_KEYS, N_VALUES = 6, 8, 8
T = N_PAIRS + 1  # six slots, then the query
KEYS = [chr(ord("A") + i) for i in range(N_KEYS)]
VALUES = [str(i) for i in range(N_VALUES)]
# each position holds two ids, whose embeddings are added: a slot (key, value), or the query (a, b)
KEY0, VAL0, QA0, QB0 = 0, N_KEYS, N_KEYS + N_VALUES, 2 * N_KEYS + N_VALUES
VOCAB = 3 * N_KEYS + N_VALUES

#: training recipe shared by the variants (AdamW, constant rate, then linear decay to 0)
RECIPE = dict(steps=1200, batch_size=128, lr=3e-3, hold=0.6, grad_clip=1.0, seed=0,
              n_validation=2000, n_test=2000)
#: heads of each shipped model
VARIANTS = {"h2": 2, "h1": 1}
ARTIFACTS = ("retrieval.pt", "retrieval_h1.pt")
_FILE = dict(zip(VARIANTS, ARTIFACTS))


@dataclass
class RetrievalConfig:
    d_model: int = 32
    num_heads: int = 2
    d_ff: int = 64
    num_layers: int = 1
    vocab_size: int = VOCAB
    max_len: int = T
    num_classes: int = N_VALUES


class RetrievalEncoder(nn.Module):
    """Two added embeddings per position plus a learned position, ``num_layers`` Pre-LN
    :class:`EncoderBlock` s, a final LayerNorm and two linear read-outs of the last (query)
    position: ``ids (B, T, 2) -> logits (B, 2, 8)``, one row per queried key.
    ``forward(ids, return_attention=True)`` also returns the list of maps ``P (B, H, T, T)``,
    one per layer."""

    def __init__(self, config: RetrievalConfig):
        super().__init__()
        self.config = config
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Parameter(torch.randn(c.max_len, c.d_model) * 0.1)
        self.blocks = nn.ModuleList(EncoderBlock(c.d_model, c.num_heads, c.d_ff, norm_first=True)
                                    for _ in range(c.num_layers))
        self.norm = LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, 2 * c.num_classes)

    def inputs(self, ids: torch.Tensor) -> torch.Tensor:
        """``X (B, T, D)``: the sum of each position's two embeddings and its position vector."""
        return self.embed(ids).sum(-2) + self.pos[: ids.shape[-2]]

    def forward(self, ids: torch.Tensor, return_attention: bool = False):
        X = self.inputs(ids)
        maps = []
        for block in self.blocks:
            if return_attention:
                X, P = block(X, return_attention=True)
                maps.append(P)
            else:
                X = block(X)
        logits = self.head(self.norm(X[..., -1, :])).unflatten(-1, (2, self.config.num_classes))
        return (logits, maps) if return_attention else logits


def sample(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random sequences: ids ``(n, T, 2)`` and answers ``(n, 2)`` (the values stored
    under the two queried keys). ``rng``: a NumPy Generator."""
    keys = np.argsort(rng.random((n, N_KEYS)), axis=1)[:, :N_PAIRS]  # distinct keys
    vals = rng.integers(0, N_VALUES, size=(n, N_PAIRS))
    pick2 = np.argsort(rng.random((n, N_PAIRS)), axis=1)[:, :2]  # two different slots
    rows = np.arange(n)[:, None]
    ids = np.empty((n, T, 2), dtype=np.int64)
    ids[:, :-1, 0] = KEY0 + keys
    ids[:, :-1, 1] = VAL0 + vals
    ids[:, -1, 0] = QA0 + keys[rows[:, 0], pick2[:, 0]]
    ids[:, -1, 1] = QB0 + keys[rows[:, 0], pick2[:, 1]]
    return ids, vals[rows, pick2]


def _codes(ids: np.ndarray) -> np.ndarray:
    """One integer per sequence, to test membership."""
    flat = ids.reshape(len(ids), -1) % 8  # 14 digits in base 8: fits in int64
    return (flat * (8 ** np.arange(flat.shape[1], dtype=np.int64))).sum(axis=1)


def data(seed: int = 0) -> Splits:
    """``Splits(train, validation, test)``. ``validation`` and ``test`` are pairs
    ``(ids (N, T, 2) int64 tensor, answers (N, 2) int64 tensor)`` of 2,000 sequences each (no
    sequence in both). ``train`` holds the codes of every held-out sequence: training batches
    are drawn fresh and any sequence in it is rejected."""
    val = sample(RECIPE["n_validation"], np.random.default_rng(seed + 1000))
    test = sample(RECIPE["n_test"] + 200, np.random.default_rng(seed + 2000))
    keep = ~np.isin(_codes(test[0]), _codes(val[0]))
    test = (test[0][keep][: RECIPE["n_test"]], test[1][keep][: RECIPE["n_test"]])
    held = np.concatenate([_codes(val[0]), _codes(test[0])])
    as_t = lambda p: (torch.from_numpy(p[0]), torch.from_numpy(p[1]))  # noqa: E731
    return Splits(held, as_t(val), as_t(test))


def _batch(held: np.ndarray, batch_size: int, generator: torch.Generator):
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    ids, ans = sample(batch_size + 16, np.random.default_rng(seed))
    keep = ~np.isin(_codes(ids), held)  # never train on a held-out sequence
    return torch.from_numpy(ids[keep][:batch_size]), torch.from_numpy(ans[keep][:batch_size])


def loss_fn(model, ids, answers):
    """Cross-entropy of the two answers, summed (nats per sequence)."""
    logits = model(ids)
    return nn.functional.cross_entropy(logits.flatten(0, 1), answers.flatten()) * 2


def config(variant: str = "h2", **overrides) -> RetrievalConfig:
    """The model of ``variant``: D = 32, one block, ``VARIANTS[variant]`` heads."""
    kw = dict(num_heads=VARIANTS[variant])
    kw.update(overrides)
    return RetrievalConfig(**kw)


def make_model(variant: str = "h2", seed: int = 0) -> RetrievalEncoder:
    torch.manual_seed(seed)
    return RetrievalEncoder(config(variant))


@torch.no_grad()
def accuracy(model: nn.Module, ids: torch.Tensor, answers: torch.Tensor, per_answer: bool = False):
    """Fraction of sequences with both answers right; ``per_answer``: the two fractions
    (first queried key, second queried key) instead."""
    model.eval()
    right = (model(ids).argmax(-1) == answers).double()  # (N, 2)
    if per_answer:
        return tuple(float(x) for x in right.mean(0))
    return float(right.prod(-1).mean())


def evaluate(model: nn.Module, split="validation", per_answer: bool = False):
    """Accuracy on ``split``: the fraction of sequences whose two values are both retrieved
    (``per_answer``: the fraction for each of the two queried keys)."""
    ids, answers = pick(data(), split)
    return accuracy(model, ids, answers, per_answer)


def train(variant: str = "h2", steps: int | None = None, seed: int | None = None,
          disable: bool = True) -> tuple[RetrievalEncoder, History]:
    """Train ``variant`` from scratch with :data:`RECIPE`; validation accuracy every 100 steps,
    the best weights kept (chosen on validation, never on test)."""
    r = dict(RECIPE, steps=RECIPE["steps"] if steps is None else int(steps),
             seed=RECIPE["seed"] if seed is None else int(seed))
    splits = data()
    model = make_model(variant, r["seed"])
    val_ids, val_ans = splits.validation
    history = train_loop(
        model, loss_fn, lambda g: _batch(splits.train, r["batch_size"], g), r["steps"],
        lr=r["lr"], grad_clip=r["grad_clip"], schedule=("hold_linear", int(r["hold"] * r["steps"])),
        eval_fn=lambda m: accuracy(m, val_ids, val_ans), eval_every=100, maximize=True,
        keep_best=True, seed=r["seed"], threads=1, deterministic=True, disable=disable,
        desc=f"retrieval {variant}")
    history.extra["recipe"] = r
    history.extra["variant"] = variant
    return model.eval(), history


def load_pretrained(variant: str = "h2", folder=None) -> tuple[RetrievalEncoder, History]:
    """The shipped model of ``variant`` (float32 from float16 weights, eval mode) and its history."""
    path = shipped(_FILE[variant], folder)
    return load_model(path, RetrievalEncoder, RetrievalConfig)


def save(model: RetrievalEncoder, history: History, folder, variant: str = "h2") -> list:
    return [save_model(Path(folder) / _FILE[variant], model, history)]


def tokens(ids) -> list[str]:
    """Readable labels of one sequence ``(T, 2)``: ``['C5', 'A2', ..., '?F,B']``."""
    ids = ids.tolist() if hasattr(ids, "tolist") else [list(r) for r in ids]
    out = [KEYS[k - KEY0] + VALUES[v - VAL0] for k, v in ids[:-1]]
    a, b = ids[-1]
    return out + [f"?{KEYS[a - QA0]},{KEYS[b - QB0]}"]


def ablate_head(model: RetrievalEncoder, layer: int, head: int) -> RetrievalEncoder:
    """A copy of ``model`` with head ``head`` of block ``layer`` removed: the rows of ``W_O``
    that read that head's output are set to zero, so the head contributes nothing."""
    import copy

    m = copy.deepcopy(model)
    attn = m.blocks[layer].attn
    D_h = attn.d_model // attn.num_heads
    with torch.no_grad():
        attn.W_O[head * D_h:(head + 1) * D_h] = 0.0
    return m.eval()


@torch.no_grad()
def logits_one_distribution(model: RetrievalEncoder, ids: torch.Tensor, wide: bool = True,
                            scale: float | None = None) -> torch.Tensor:
    """The model's logits computed step by step from its parameters (one block), with the
    heads either as trained (``wide=False``: equal to ``model(ids)``) or fused into **one wide
    head**: the same ``W_Q, W_K, W_V, W_O``, but a single distribution per query,
    ``softmax(scale * sum_h Q_h K_h^T)``, shared by all value columns. ``scale`` defaults to
    each head's own ``1 / sqrt(D_h)``, so the wide head runs at the heads' temperature and the
    only change is one distribution instead of ``H``."""
    from ..torch import functional as F

    block = model.blocks[0]
    attn, H = block.attn, block.attn.num_heads
    X = model.inputs(ids)
    A = block.norm1(X)
    Q, K, V = (F.split_heads(A @ getattr(attn, f"W_{n}") + getattr(attn, f"b_{n}"), H) for n in "QKV")
    D_h = Q.shape[-1]
    c = 1 / D_h ** 0.5 if scale is None else scale
    S = Q @ K.transpose(-1, -2) * c  # (B, H, T, T)
    if wide:
        S = S.sum(dim=-3, keepdim=True).expand_as(S)  # one score matrix for every head's columns
    Z = F.merge_heads(torch.softmax(S, dim=-1) @ V) @ attn.W_O + attn.b_O
    X = X + Z
    X = X + block.ffn(block.norm2(X))
    return model.head(model.norm(X[..., -1, :])).unflatten(-1, (2, model.config.num_classes))


def main(argv=None) -> None:  # pragma: no cover - writes the shipped artifacts
    def run(out, args):
        for variant in VARIANTS:
            model, history = train(variant, disable=False)
            path = save(model, history, out, variant)[0]
            m, _ = load_pretrained(variant, out)
            print(f"retrieval {variant}: best validation accuracy {history.best_eval:.4f} at step "
                  f"{history.best_step}; float16 weights: validation {evaluate(m, 'validation'):.4f}; "
                  f"wrote {path}")

    cli(__doc__, run, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
