"""A real corpus: 1.25 MB of public-domain English prose for a character-level language model.

The text is ``tfbook/corpus/kjv_prose.txt.gz``: the King James Version of the Bible (1611;
public domain, see ``tfbook/corpus/README_kjv_prose.md``), Genesis 1:1 to 2 Samuel 22:15,
one verse per line, 1,250,052 characters, 62 distinct characters. It is cut in reading
order into training text (90%), a validation slice (5%) that picks the early-stopping step
and the n-gram smoothing, and a test slice (the last 5%) read once to report the score.

Evaluation is in bits per character with a *sliding* window (:func:`bits_per_char`): every
character is predicted once, and after the first window each prediction sees at least
``block_size - stride`` characters of context. The baselines (:class:`NGram`) are
character n-gram models with interpolated absolute discounting, counted on the training
slice, with the discount chosen on the validation slice.

Three sizes ship (:data:`SIZES`; small and medium train 1,000 steps, large 2,000). Measured
on the test slice: large 1.688 bits per character, 15% below the 5-gram's 1.993 (medium
1.904, small 2.125). The shipped weights (``prose_*.pt``, float16, with their histories) and
the scores ``prose_scores.json`` (the one place the test slice is read) are regenerated, in
about 25 minutes of one CPU core, by::

    python -m tfbook.tasks.prose                # or --out DIR; --sizes large,medium,small
"""

from __future__ import annotations

import gzip
import json
import math
from importlib import resources

import numpy as np
import torch
from torch import nn

from ..data import CharTokenizer
from ..torch.models import DecoderLM, DecoderLMConfig, lm_batch, lm_loss
from ..torch.training import History
from ..torch.training import train as train_loop
from ._common import Splits, cli, load_blob, load_state, pick, save_model, shipped, write_json

__all__ = ["RECIPE", "SIZES", "ARTIFACTS", "load_text", "tokenizer", "data", "config", "train",
           "bits_per_char", "evaluate", "NGram", "fit_ngram", "filter_logits", "sample",
           "load_pretrained", "save", "main"]

#: the shipped weights' recipe; changing a number changes the weights (rerun the command)
RECIPE = dict(val_fraction=0.05, test_fraction=0.05, batch_size=32, lr=3e-3, weight_decay=0.1,
              warmup=100, min_lr=1e-4, seed=0, eval_every=250, eval_chars=10_000)
#: three model sizes for the size curve; "large" is the chapter's model
SIZES = {
    "small": dict(num_layers=2, d_model=64, num_heads=4, d_ff=256, steps=1000),
    "medium": dict(num_layers=3, d_model=96, num_heads=4, d_ff=384, steps=1000),
    "large": dict(num_layers=4, d_model=128, num_heads=4, d_ff=512, steps=2000),
}
BLOCK_SIZE = 64
ARTIFACTS = tuple(f"prose_{s}.pt" for s in SIZES) + ("prose_scores.json",)


def load_text() -> str:
    """The whole corpus as one string (ASCII)."""
    with (resources.files("tfbook") / "corpus" / "kjv_prose.txt.gz").open("rb") as f:
        return gzip.decompress(f.read()).decode("ascii")


def tokenizer() -> CharTokenizer:
    """One id per character of the whole text."""
    return CharTokenizer.fit(load_text())


_DATA: dict = {}


def data(val_fraction: float = RECIPE["val_fraction"], test_fraction: float = RECIPE["test_fraction"]
         ) -> Splits:
    """``Splits(train, validation, test)``: the corpus as character ids (``torch.long``), cut
    in reading order: ``test`` is the last ``test_fraction``, ``validation`` the
    ``val_fraction`` just before it, ``train`` the rest (contiguous, no overlap)."""
    if not (0.0 < val_fraction < 1.0 and 0.0 < test_fraction < 1.0 and val_fraction + test_fraction < 1.0):
        raise ValueError("val_fraction and test_fraction must be in (0, 1) with a sum below 1, "
                         f"got val_fraction={val_fraction}, test_fraction={test_fraction}")
    key = (val_fraction, test_fraction)
    if key not in _DATA:
        ids = torch.tensor(tokenizer().encode(load_text()), dtype=torch.long)
        n_rest = int(round((1.0 - test_fraction) * ids.numel()))
        n_val = int(round(val_fraction * ids.numel()))
        _DATA[key] = Splits(ids[:n_rest - n_val], ids[n_rest - n_val:n_rest], ids[n_rest:])
    s = _DATA[key]
    return Splits(s.train.clone(), s.validation.clone(), s.test.clone())


def config(size: str = "large", vocab_size: int | None = None) -> DecoderLMConfig:
    """Pre-LN decoder of ``SIZES[size]`` with a context of 64 characters."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {tuple(SIZES)}, got {size!r}")
    vocab_size = tokenizer().vocab_size if vocab_size is None else vocab_size
    s = SIZES[size]
    return DecoderLMConfig(vocab_size=vocab_size, block_size=BLOCK_SIZE, d_model=s["d_model"],
                           num_heads=s["num_heads"], num_layers=s["num_layers"], d_ff=s["d_ff"])


# ----------------------------------------------------------------------------- evaluation
@torch.no_grad()
def char_log_probs(model: DecoderLM, ids: torch.Tensor, stride: int | None = None, batch: int = 64,
                   dtype=torch.float64) -> torch.Tensor:
    """log2 p(ids[t] | context) for t = 1..N-1 with a sliding window (a 1-D tensor of N - 1).

    Windows of ``block_size`` characters start every ``stride`` characters (default: half
    the block); the first window scores all its positions, each later one only its last
    ``stride`` positions, so every prediction after the first window sees at least
    ``block_size - stride`` characters. Computed in ``dtype`` (float64 by default: the
    printed digits then do not depend on the machine's float32 summation order).
    """
    T = model.config.block_size
    stride = T // 2 if stride is None else int(stride)
    if not 1 <= stride <= T:
        raise ValueError(f"stride must be in 1..block_size={T}, got {stride}")
    if ids.ndim != 1 or ids.numel() < 2:
        raise ValueError(f"ids must be 1-D with at least 2 tokens, got shape {tuple(ids.shape)}")
    N = ids.numel()
    out = torch.empty(N - 1, dtype=dtype)
    was = next(model.parameters()).dtype
    model = model.to(dtype).eval()
    try:
        if N - 1 <= T:
            lp = torch.log_softmax(model(ids[None, :-1])[0], -1)
            return lp.gather(1, ids[1:, None])[:, 0] / math.log(2)
        # window w covers inputs ids[s : s + T] predicting ids[s + 1 : s + T + 1]
        starts = list(range(0, N - 1 - T, stride)) + [N - 1 - T]
        starts = sorted(set(starts))
        done = 0  # predictions ids[1..done] are filled (out[:done])
        for i in range(0, len(starts), batch):
            chunk = starts[i:i + batch]
            x = torch.stack([ids[s:s + T] for s in chunk])
            y = torch.stack([ids[s + 1:s + T + 1] for s in chunk])
            lp = torch.log_softmax(model(x), -1).gather(2, y[..., None])[..., 0] / math.log(2)
            for row, s in enumerate(chunk):
                # this window predicts targets at positions s+1..s+T (out index s..s+T-1)
                first = max(done, s)
                out[first:s + T] = lp[row, first - s:]
                done = s + T
        assert done == N - 1
        return out
    finally:
        model.to(was)


def bits_per_char(model: DecoderLM, ids: torch.Tensor, stride: int | None = None, dtype=torch.float64
                  ) -> float:
    """Mean bits per character of ``ids[1:]`` under ``model`` (sliding window, float64 by default)."""
    return float(-char_log_probs(model, ids, stride, dtype=dtype).to(torch.float64).mean())


def evaluate(model: DecoderLM, split="validation", stride: int | None = None) -> float:
    """Sliding-window bits per character on ``split`` (a name or 1-D ids)."""
    return bits_per_char(model, pick(data(), split), stride)


# ----------------------------------------------------------------------------- n-grams
class NGram:
    """Character n-gram model with interpolated absolute discounting.

    ``p_n(c | h) = max(N(h c) - d, 0) / N(h) + d * K(h) / N(h) * p_{n-1}(c | h')``,
    where ``h'`` drops the oldest character of ``h``, ``K(h)`` is the number of distinct
    characters seen after ``h``, and a context never seen falls back to ``p_{n-1}``
    entirely. The recursion ends at the add-one unigram ``(N(c) + 1) / (N + V)``.
    ``order=1`` is that unigram; ``order=2`` a bigram, and so on.
    """

    def __init__(self, train_ids, vocab_size: int, order: int, discount: float = 0.75):
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        if not 0.0 <= discount < 1.0:
            raise ValueError(f"discount must be in [0, 1), got {discount}")
        self.V, self.order, self.d = int(vocab_size), int(order), float(discount)
        x = np.asarray(train_ids, dtype=np.int64)
        self.unigram = (np.bincount(x, minlength=self.V) + 1.0) / (x.size + self.V)
        self.tables = []  # per context length k >= 1: (sorted (h,c) keys, counts, sorted h keys, N(h), K(h))
        for k in range(1, self.order):
            hc = self._keys(x, k + 1)
            keys, counts = np.unique(hc, return_counts=True)
            hkeys_all = keys // self.V
            hkeys, first = np.unique(hkeys_all, return_index=True)
            n_h = np.add.reduceat(counts, first)
            k_h = np.diff(np.append(first, keys.size))
            self.tables.append((keys, counts, hkeys, n_h, k_h))

    def _keys(self, x: np.ndarray, n: int) -> np.ndarray:
        """Base-V integer codes of every n-gram of ``x`` (position i: x[i : i + n])."""
        key = np.zeros(x.size - n + 1, dtype=np.int64)
        for j in range(n):
            key = key * self.V + x[j:x.size - n + 1 + j]
        return key

    @staticmethod
    def _lookup(sorted_keys, values, query):
        pos = np.searchsorted(sorted_keys, query)
        pos_c = np.minimum(pos, sorted_keys.size - 1)
        hit = sorted_keys[pos_c] == query
        return np.where(hit, values[pos_c], 0)

    def probs_of(self, ids) -> np.ndarray:
        """p(ids[t] | up to order-1 previous characters) for t = order-1 .. N-1 (float64)."""
        x = np.asarray(ids, dtype=np.int64)
        start = self.order - 1
        tgt = x[start:]
        p = self.unigram[tgt].astype(np.float64)
        for k in range(1, self.order):
            keys, counts, hkeys, n_h, k_h = self.tables[k - 1]
            codes = self._keys(x, k + 1)[start - k:]  # (h c) with |h| = k, ending at each target
            h = codes // self.V
            c_hc = self._lookup(keys, counts, codes).astype(np.float64)
            N_h = self._lookup(hkeys, n_h, h).astype(np.float64)
            K_h = self._lookup(hkeys, k_h, h).astype(np.float64)
            seen = N_h > 0
            safe = np.where(seen, N_h, 1.0)
            p = np.where(seen, np.maximum(c_hc - self.d, 0.0) / safe + self.d * K_h / safe * p, p)
        return p

    def bits_per_char(self, ids) -> float:
        """Mean bits of predicting ``ids[order-1:]`` (the first order-1 characters are context)."""
        return float(-np.mean(np.log2(self.probs_of(ids))))

    def distribution(self, context) -> np.ndarray:
        """The full next-character distribution after ``context`` (sums to 1)."""
        ctx = list(np.asarray(context, dtype=np.int64)[-(self.order - 1):]) if self.order > 1 else []
        if len(ctx) < self.order - 1:
            raise ValueError(f"context needs {self.order - 1} characters")
        return np.array([self.probs_of(np.array(ctx + [c]))[-1] for c in range(self.V)])


DISCOUNTS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def fit_ngram(order: int, splits: Splits | None = None, discounts=DISCOUNTS) -> tuple[NGram, dict]:
    """Count an order-``order`` model on the training slice and pick the discount with the
    lowest validation bits per character; returns the model and ``{discount: val bpc}``."""
    splits = data() if splits is None else splits
    V = tokenizer().vocab_size
    scores = {}
    best = None
    for d in discounts:
        m = NGram(splits.train.numpy(), V, order, d)
        scores[d] = m.bits_per_char(splits.validation.numpy())
        if best is None or scores[d] < scores[best.d]:
            best = m
    return best, scores


# ----------------------------------------------------------------------------- sampling
def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None
                  ) -> torch.Tensor:
    """Set to ``-inf`` every logit outside the ``top_k`` largest and/or outside the nucleus:
    the smallest set of most likely tokens whose probability reaches ``top_p``.

    Works on the last axis. Ties at the k-th value are broken by index (``torch.topk``).
    """
    out = logits.clone()
    V = out.shape[-1]
    if top_k is not None:
        if not 1 <= int(top_k) <= V:
            raise ValueError(f"top_k must be in 1..{V}, got {top_k}")
        idx = torch.topk(out, int(top_k), dim=-1).indices
        keep = torch.zeros_like(out, dtype=torch.bool).scatter_(-1, idx, True)
        out = out.masked_fill(~keep, float("-inf"))
    if top_p is not None:
        if not 0.0 < float(top_p) <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        probs = torch.softmax(out, -1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, -1) - sorted_p  # mass strictly before each token
        keep_sorted = before < float(top_p)  # keep while the prefix before it has not reached p
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
        out = out.masked_fill(~keep, float("-inf"))
    return out


@torch.no_grad()
def sample(model: DecoderLM, prompt: str, n: int, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, seed: int = 0, dtype=torch.float64) -> str:
    """Continue ``prompt`` by ``n`` characters, sampling each from the model's distribution
    at ``temperature`` after :func:`filter_logits`. Runs in float64 with a seeded generator,
    so the text is the same on any machine (up to float64 round-off at a sampling boundary)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    tok = tokenizer()
    ids = torch.tensor(tok.encode(prompt), dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    was = next(model.parameters()).dtype
    model = model.to(dtype).eval()
    try:
        for _ in range(n):
            logits = model(ids[None, -model.config.block_size:])[0, -1] / temperature
            probs = torch.softmax(filter_logits(logits, top_k, top_p), -1)
            nxt = torch.multinomial(probs, 1, generator=gen)
            ids = torch.cat([ids, nxt])
    finally:
        model.to(was)
    return tok.decode(ids.tolist())


# ----------------------------------------------------------------------------- training
def train(size: str = "large", steps: int | None = None, seed: int | None = None, disable: bool = True
          ) -> tuple[DecoderLM, History]:
    """Train the ``size`` model with :data:`RECIPE` (AdamW, warm-up then cosine decay).

    ``history.loss``: training cross-entropy (nats per character) of every step;
    ``history.eval``: validation bits per character on the first ``eval_chars`` characters
    of the validation slice every ``eval_every`` steps; the returned model holds the best
    evaluation's weights. The test slice is not used.
    """
    cfg = config(size)
    total = SIZES[size]["steps"]
    r = dict(RECIPE, size=size, steps=total if steps is None else int(steps),
             seed=RECIPE["seed"] if seed is None else int(seed))
    splits = data(r["val_fraction"], r["test_fraction"])
    val = splits.validation[:r["eval_chars"]]

    def batch_fn(generator):
        return lm_batch(splits.train, cfg.block_size, r["batch_size"], generator=generator)

    torch.manual_seed(r["seed"])
    model = DecoderLM(cfg)
    # the schedule is always the full recipe's: a shorter run is the first steps of the full one
    def stop_at(step, model, history):  # a shorter run is the first steps of the full one
        return step >= r["steps"]

    history = train_loop(model, lm_loss, batch_fn, total, lr=r["lr"], weight_decay=r["weight_decay"],
                         schedule=("warmup_cosine", r["warmup"], r["min_lr"]), callbacks=[stop_at],
                         eval_fn=lambda m: bits_per_char(m, val), eval_every=r["eval_every"],
                         keep_best=True, seed=r["seed"], threads=1, deterministic=True, disable=disable,
                         desc=f"prose-{size}")
    history.extra["recipe"] = r
    return model, history


def load_pretrained(size: str = "large", path=None) -> tuple[DecoderLM, History]:
    """A shipped model (float32, eval mode) and its training history; ``path``: another file."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {tuple(SIZES)}, got {size!r}")
    blob = load_blob(shipped(f"prose_{size}.pt") if path is None else path)
    model = load_state(DecoderLM(DecoderLMConfig(**blob["config"])), blob["state_dict"])
    return model, History.from_dict(blob["history"])


def load_scores(path=None) -> dict:
    """The shipped ``prose_scores.json``: validation/test bpc of each size and baseline."""
    f = shipped("prose_scores.json") if path is None else path
    with open(f) as fh:
        return json.load(fh)


def save(model: DecoderLM, history: History, folder, size: str = "large"):
    """Write ``prose_{size}.pt`` into ``folder`` (float16 weights, config and history)."""
    from pathlib import Path

    return save_model(Path(folder) / f"prose_{size}.pt", model, history)


def scores(models: dict) -> dict:
    """Validation and test bpc (sliding window) of ``models`` and of the n-gram baselines.
    This is the one place the test slice is read."""
    splits = data()
    out = {"baselines": {}, "models": {}}
    for order in (1, 2, 3, 5):
        m, val = fit_ngram(order, splits)
        out["baselines"][f"{order}-gram"] = dict(discount=m.d, validation=val[m.d],
                                                 test=m.bits_per_char(splits.test.numpy()))
    for size, model in models.items():
        out["models"][size] = dict(params=sum(p.numel() for p in model.parameters()),
                                   validation=evaluate(model, "validation"), test=evaluate(model, "test"))
    return out


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped artifacts
    def add(parser):
        parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated sizes to train")
        parser.add_argument("--scores-only", action="store_true", help="only recompute prose_scores.json")

    def run(out, args):
        from pathlib import Path
        models = {}
        for size in args.sizes.split(","):
            if not args.scores_only:
                model, history = train(size, disable=False)
                path = save(model, history, out, size)
                print(f"prose {size}: validation bpc {history.best_eval:.3f} at step {history.best_step}; "
                      f"wrote {path}", flush=True)
        for size in SIZES:
            p = Path(out) / f"prose_{size}.pt"
            if p.exists():
                models[size] = load_pretrained(size, p)[0]
        path = write_json(Path(out) / "prose_scores.json", scores(models))
        print(f"wrote {path}")

    cli(__doc__, run, add, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
