"""The modern decoder against the 2017 one, at equal parameter count: chapter 14's comparison.

The task is the prose character model (:mod:`tfbook.tasks.prose`: 1.25 MB of English, cut
in reading order into train / validation / test). Three models of about 108 thousand
parameters, two layers of width 64 with four heads and a 64-character context:

* ``"2017"``: the book's :class:`~tfbook.torch.models.DecoderLM` (prose's ``small`` size):
  LayerNorm, GELU MLP of width ``4D``, biases, a learned position table, in the Pre-LN
  arrangement of GPT-2 (chapter 8 shows why Post-LN is harder to train);
* ``"llama"``: :class:`~tfbook.torch.modern.LlamaLM` with ``H_kv = H``: RMSNorm, SwiGLU,
  rotary positions, no biases, no position table; the parameters saved go to the SwiGLU
  width (``d_ff`` chosen so the count matches);
* ``"gqa"``: the same with two key/value heads for the four query heads (half the KV cache).

Each is trained with the same recipe (AdamW, warm-up then cosine decay, 1,000 steps of 32
windows) for three seeds, at the peak learning rate that minimised its validation bits per
character on seed 0 among :data:`LRS`. The test slice is read once, in :func:`scores`.
The seed-0 weights (float16) and ``modern_scores.json`` (every run's validation and test
bits per character, test accuracy, training tokens per second, validation curve) are
regenerated, in 15 to 30 minutes of one CPU core (30 on a busy machine), by::

    python -m tfbook.tasks.modern                # or --out DIR

``python -m tfbook.tasks.modern --bracket`` trains seed 0 of each kind at :data:`BRACKET_LRS`
(about 6 CPU-minutes) and adds their validation bits per character to ``modern_scores.json``
under ``"lr_bracket"``, leaving the rest of the record (and the shipped weights) as they are.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from ..torch.models import DecoderLM, DecoderLMConfig, lm_batch, lm_loss, num_params
from ..torch.modern import LlamaLM, LlamaLMConfig
from ..torch.training import History
from . import prose
from ._common import cli, load_blob, load_state, pick, save_model, shipped, train_lm, write_json

__all__ = ["RECIPE", "KINDS", "LRS", "BRACKET_LRS", "ARTIFACTS", "data", "config", "matched_d_ff", "train", "predictions",
           "evaluate", "accuracy", "tokens_per_second", "load_pretrained", "load_scores", "save", "scores", "main"]

#: the shared training recipe (prose's, at the small size); ``lr`` is chosen per kind from LRS
RECIPE = dict(steps=1000, batch_size=32, weight_decay=0.1, warmup=100, min_lr=1e-4, eval_every=250,
              eval_chars=10_000, seeds=(0, 1, 2))
#: peak learning rates tried on seed 0; each kind keeps the one with the lowest validation bpc
LRS = (1.5e-3, 3e-3, 6e-3)
#: the rates above the grid, tried afterwards on seed 0 (``--bracket``) to see whether the best rate
#: of :data:`LRS` (its largest, for every kind) is also the best of a wider grid
BRACKET_LRS = (1.2e-2, 2.4e-2)
KINDS = ("2017", "llama", "gqa")
ARTIFACTS = tuple(f"modern_{k}.pt" for k in KINDS) + ("modern_scores.json",)


def data():
    """The prose task's ``Splits(train, validation, test)`` (character ids)."""
    return prose.data()


def _base() -> DecoderLMConfig:
    return prose.config("small")


def matched_d_ff(num_kv_heads: int, target: int | None = None) -> int:
    """The SwiGLU width whose Llama model has the parameter count closest to ``target``
    (default: the 2017 model's)."""
    target = num_params(DecoderLM(_base())) if target is None else int(target)
    b = _base()

    def count(d_ff):
        c = LlamaLMConfig(vocab_size=b.vocab_size, block_size=b.block_size, d_model=b.d_model,
                          num_heads=b.num_heads, num_kv_heads=num_kv_heads, num_layers=b.num_layers, d_ff=d_ff)
        D, L = c.d_model, c.num_layers
        D_kv = c.num_kv_heads * D // c.num_heads
        return c.vocab_size * D + L * (2 * D * D + 2 * D * D_kv + 3 * D * d_ff + 2 * D) + D

    return min(range(1, 8 * b.d_model), key=lambda f: (abs(count(f) - target), f))


def config(kind: str = "llama"):
    """The model configuration of ``kind`` (one of :data:`KINDS`)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    b = _base()
    if kind == "2017":
        return b
    H_kv = b.num_heads if kind == "llama" else b.num_heads // 2
    return LlamaLMConfig(vocab_size=b.vocab_size, block_size=b.block_size, d_model=b.d_model,
                         num_heads=b.num_heads, num_kv_heads=H_kv, num_layers=b.num_layers,
                         d_ff=matched_d_ff(H_kv), rope="half")


def _model(cfg):
    return DecoderLM(cfg) if isinstance(cfg, DecoderLMConfig) else LlamaLM(cfg)


def train(kind: str = "llama", steps: int | None = None, seed: int = 0, lr: float = 3e-3,
          disable: bool = True):
    """Train ``kind`` with :data:`RECIPE` at peak learning rate ``lr``; returns ``(model, History)``.

    ``history.eval``: validation bits per character on the first ``eval_chars`` characters
    of the validation slice every ``eval_every`` steps; the model returned holds the best
    evaluation's weights. The test slice is not used. ``steps`` shortens the run (the
    schedule stays the full recipe's).
    """
    cfg = config(kind)
    r = dict(RECIPE, kind=kind, lr=float(lr), seed=int(seed), steps=RECIPE["steps"] if steps is None else int(steps))
    splits = data()
    val = splits.validation[:r["eval_chars"]]
    model, history = train_lm(lambda: _model(cfg), splits.train, lambda m: prose.bits_per_char(m, val), r,
                              RECIPE["steps"], disable=disable, desc=f"modern-{kind}")
    r.pop("seeds")
    history.extra["recipe"] = r
    return model, history


@torch.no_grad()
def predictions(model, ids: torch.Tensor, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log2 p(ids[t] | context), argmax == ids[t])`` for ``t = 1..N-1``, with the sliding
    window of :func:`tfbook.tasks.prose.char_log_probs` (stride half the block), in ``dtype``."""
    T = model.config.block_size
    stride = T // 2
    N = ids.numel()
    if ids.ndim != 1 or N < T + 1:
        raise ValueError(f"ids must be 1-D with at least block_size + 1 = {T + 1} tokens, got shape {tuple(ids.shape)}")
    lp_out, ok_out = torch.empty(N - 1, dtype=dtype), torch.empty(N - 1, dtype=torch.bool)
    was = next(model.parameters()).dtype
    model = model.to(dtype).eval()
    try:
        starts = sorted(set(list(range(0, N - 1 - T, stride)) + [N - 1 - T]))
        done = 0
        for i in range(0, len(starts), 64):
            chunk = starts[i:i + 64]
            x = torch.stack([ids[s:s + T] for s in chunk])  # (B, T)
            y = torch.stack([ids[s + 1:s + T + 1] for s in chunk])
            logp = torch.log_softmax(model(x), -1)  # (B, T, V)
            lp = logp.gather(2, y[..., None])[..., 0] / math.log(2)
            ok = logp.argmax(-1) == y
            for row, s in enumerate(chunk):
                first = max(done, s)  # predict each character once
                lp_out[first:s + T], ok_out[first:s + T] = lp[row, first - s:], ok[row, first - s:]
                done = s + T
        return lp_out, ok_out
    finally:
        model.to(was)


def evaluate(model, split="validation") -> float:
    """Bits per character on ``split`` (sliding window, float64)."""
    return float(-predictions(model, pick(data(), split))[0].mean())


def accuracy(model, split="validation") -> float:
    """Fraction of characters of ``split`` whose most probable prediction is right (float64)."""
    return float(predictions(model, pick(data(), split))[1].double().mean())


def tokens_per_second(kind: str, steps: int = 30, batch_size: int | None = None, threads: int = 1) -> float:
    """Training throughput of a fresh ``kind`` model: tokens (``batch_size * block_size``
    per step) per second of this process's CPU time (on one thread, CPU time is wall time
    without the time other processes took), over ``steps`` steps after 3 warm-up steps.
    A measurement of this machine.

    The steps are the one loop's (:func:`tfbook.torch.training.train`): AdamW at a constant
    ``1e-3`` with weight decay ``0.01`` (``torch.optim.AdamW``'s defaults), no clipping,
    seed 0; a callback reads the clock after step 3 and after the last step."""
    from ..torch.training import train as train_loop

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    cfg = config(kind)
    B = RECIPE["batch_size"] if batch_size is None else batch_size
    torch.manual_seed(0)
    model = _model(cfg)
    train_ids = data().train
    clock = {}

    def batch_fn(generator):
        return lm_batch(train_ids, cfg.block_size, B, generator=generator)

    def read_clock(step, model, history):
        if step in (3, steps + 3):
            clock[step] = time.process_time()

    with torch.enable_grad():
        train_loop(model, lm_loss, batch_fn, steps + 3, lr=1e-3, weight_decay=0.01, grad_clip=None,
                   seed=0, threads=threads, callbacks=[read_clock], disable=True, desc=f"tokens/s {kind}")
    return steps * B * cfg.block_size / (clock[steps + 3] - clock[3])


def load_pretrained(kind: str = "llama", path=None):
    """The shipped seed-0 model of ``kind`` (float32, eval mode) and its history."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    blob = load_blob(shipped(f"modern_{kind}.pt") if path is None else path)
    cfg = (DecoderLMConfig if kind == "2017" else LlamaLMConfig)(**blob["config"])
    return load_state(_model(cfg), blob["state_dict"]), History.from_dict(blob["history"])


def load_scores(path=None) -> dict:
    """The shipped ``modern_scores.json``."""
    with open(shipped("modern_scores.json") if path is None else path) as f:
        return json.load(f)


def save(model, history: History, folder, kind: str = "llama"):
    """Write ``modern_{kind}.pt`` (float16 weights, config, history) into ``folder``."""
    return save_model(Path(folder) / f"modern_{kind}.pt", model, history)


def _rounded(model):
    """The model with float16-rounded weights (what is shipped), back in float32."""
    for p in model.parameters():
        p.data = p.data.half().float()
    return model


def scores(model) -> dict:
    """Validation and test bits per character and test accuracy of ``model`` (float64). The
    one place the test slice is read."""
    lp, ok = predictions(model, data().test)
    return dict(validation=evaluate(model, "validation"), test=float(-lp.mean()), test_accuracy=float(ok.double().mean()))


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped artifacts
    def add(parser):
        parser.add_argument("--kinds", default=",".join(KINDS))
        parser.add_argument("--bracket", action="store_true",
                            help="only train seed 0 at BRACKET_LRS and add the scores to modern_scores.json")
        parser.add_argument("--lrs", default=None, help="with --bracket: these rates (comma-separated) only")

    def bracket(out, args):
        path = Path(out) / "modern_scores.json"
        for kind in args.kinds.split(","):
            for lr in (BRACKET_LRS if args.lrs is None else [float(x) for x in args.lrs.split(",")]):
                model, history = train(kind, seed=0, lr=lr)
                print(f"{kind} lr={lr}: validation bpc {history.best_eval:.4f}", flush=True)
                res = load_scores(path)  # read again before each write: runs for other kinds or rates may share it
                res.setdefault("lr_bracket", {}).setdefault(kind, {})[str(lr)] = history.best_eval
                res["bracket_lrs"] = list(BRACKET_LRS)
                write_json(path, res)
        print(f"wrote {path}")

    def run(out, args):
        if args.bracket:
            return bracket(out, args)
        res = {"recipe": {k: v for k, v in RECIPE.items()}, "lrs": list(LRS), "params": {}, "lr_search": {},
               "runs": {}, "tokens_per_second": {}}
        for kind in args.kinds.split(","):
            res["params"][kind] = num_params(_model(config(kind)))
            search = {}
            first = {}
            for lr in LRS:  # seed 0, choose on validation
                model, history = train(kind, seed=0, lr=lr)
                search[str(lr)] = history.best_eval
                first[lr] = (model, history)
                print(f"{kind} lr={lr}: validation bpc {history.best_eval:.4f}", flush=True)
            lr = min(LRS, key=lambda x: search[str(x)])
            res["lr_search"][kind] = search
            runs = []
            for seed in RECIPE["seeds"]:
                model, history = first[lr] if seed == 0 else train(kind, seed=seed, lr=lr)
                model = _rounded(model)
                if seed == 0:
                    save(model, history, out, kind)
                s = scores(model)
                runs.append(dict(seed=seed, lr=lr, best_step=history.best_step, curve=history.eval,
                                 eval_steps=history.eval_step, **s))
                print(f"{kind} seed {seed}: {s}", flush=True)
            res["runs"][kind] = runs
            res["tokens_per_second"][kind] = [tokens_per_second(kind) for _ in range(3)]
        path = write_json(Path(out) / "modern_scores.json", res)
        print(f"wrote {path}")

    cli(__doc__, run, add, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
