"""QK-norm and the stable range of learning rates: chapter 14's experiment.

A small Llama-style character model (:class:`~tfbook.torch.modern.LlamaLM`: two layers of
width 32, two heads of width 16, context 64) on the prose task of chapter 13, trained with
and without QK-norm (``LlamaLMConfig(qk_norm=True)``: RMSNorm with a learned gain of each
head's queries and keys before the rotation, as in Qwen3 and Gemma 3) at each peak learning
rate of :data:`LRS`, three seeds each, with the same recipe (AdamW, weight decay 0.1,
gradient clipping at 1, warm-up then cosine decay, :data:`RECIPE`). Every ``probe_every``
steps a callback measures the **largest attention logit** ``max q.k / sqrt(D_K)`` over the
layers, heads and causal pairs of a fixed batch of validation windows (:func:`max_logit`);
at the end the validation bits per character (first ``eval_chars`` characters, float64) are
recorded. The test slice is not read: this is a study of training, not a model to report.

Artifacts: ``qknorm_curves.json`` (every run's logit curve and final validation score) and
the seed-0 models at the largest rate, ``qknorm_off.pt`` and ``qknorm_on.pt`` (float16), which
the chapter re-evaluates. Regenerated, in about 2 minutes of one CPU core, by::

    python -m tfbook.tasks.qknorm                # or --out DIR
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..torch.models import lm_batch, lm_loss, num_params
from ..torch.modern import LlamaLM, LlamaLMConfig
from ..torch.training import History
from ..torch.training import train as train_loop
from . import prose
from ._common import cli, load_blob, load_json, load_state, save_model, shipped, write_json

__all__ = ["RECIPE", "LRS", "ARMS", "ARTIFACTS", "data", "config", "max_logit", "probe_ids", "train",
           "evaluate", "load_pretrained", "load_curves", "save", "main"]

#: the recipe shared by every run; ``min_lr`` is a fraction of the peak rate
RECIPE = dict(steps=200, batch_size=16, weight_decay=0.1, warmup=20, min_lr_fraction=0.1, grad_clip=1.0,
              probe_every=10, probe_windows=8, eval_chars=4000, seeds=(0, 1, 2))
#: peak learning rates, each tried with both arms and every seed
LRS = (3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
#: the two arms: without and with QK-norm
ARMS = ("off", "on")
ARTIFACTS = ("qknorm_curves.json", "qknorm_off.pt", "qknorm_on.pt")


def data():
    """The prose task's ``Splits(train, validation, test)`` (character ids)."""
    return prose.data()


def config(arm: str = "on") -> LlamaLMConfig:
    """The model of ``arm`` (``"off"``: plain attention, ``"on"``: QK-norm)."""
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
    return LlamaLMConfig(vocab_size=prose.tokenizer().vocab_size, block_size=64, d_model=32, num_heads=2,
                         num_kv_heads=2, num_layers=2, d_ff=85, rope="half", qk_norm=arm == "on")


def probe_ids(windows: int | None = None) -> torch.Tensor:
    """The fixed probe batch: ``windows`` consecutive 64-character windows from the start of
    the validation slice, ``(windows, 64)``."""
    n = RECIPE["probe_windows"] if windows is None else int(windows)
    return data().validation[:n * 64].view(n, 64)


@torch.no_grad()
def max_logit(model: LlamaLM, ids: torch.Tensor) -> float:
    """The largest attention logit ``q . k / sqrt(D_K)`` (the score before the softmax) over the
    blocks, heads and causal (query, key) pairs of ``model`` run on ``ids (B, T)``."""
    inputs = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, args, kw=None: inputs.append(args[0]))
             for b in model.blocks]
    try:
        model(ids)
    finally:
        for h in hooks:
            h.remove()
    T = ids.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    best = -math.inf
    for block, X in zip(model.blocks, inputs):
        attn = block.attn
        Q, K = attn.qk(X)  # (B, H, T, D_K), (B, H_kv, T, D_K)
        K = K.repeat_interleave(attn.num_heads // attn.num_kv_heads, dim=-3)
        S = Q @ K.transpose(-1, -2) / math.sqrt(attn.head_dim)  # (B, H, T, T)
        best = max(best, float(S.masked_fill(~causal, -math.inf).max()))
    return best


def evaluate(model, split="validation", chars: int | None = None) -> float:
    """Bits per character (float64, sliding window) on the first ``chars`` characters of ``split``
    (default: ``RECIPE["eval_chars"]``)."""
    ids = getattr(data(), split) if isinstance(split, str) else split
    n = RECIPE["eval_chars"] if chars is None else int(chars)
    return prose.bits_per_char(model, ids[:n])


def train(arm: str = "on", lr: float = 1e-2, seed: int = 0, steps: int | None = None):
    """Train ``arm`` at peak rate ``lr`` with :data:`RECIPE`; returns ``(model, History)``.

    ``history.extra``: ``probe_steps`` and ``max_logit`` (the probe's largest logit at each),
    ``final_validation`` (bits per character after the last step, ``nan`` if the weights are
    not finite) and the recipe. The model returned is the last step's (no best-of selection).
    """
    r = RECIPE
    steps = r["steps"] if steps is None else int(steps)
    cfg = config(arm)
    torch.manual_seed(seed)
    model = LlamaLM(cfg)
    splits = data()
    probe = probe_ids()
    probe_steps, logits = [0], [max_logit(model, probe)]

    def batch_fn(generator):
        return lm_batch(splits.train, cfg.block_size, r["batch_size"], generator=generator)

    def probe_cb(step, model, history):
        if step % r["probe_every"] == 0:
            was = model.training
            model.eval()
            probe_steps.append(step)
            logits.append(max_logit(model, probe))
            model.train(was)
        return False

    history = train_loop(model, lm_loss, batch_fn, steps, lr=lr, weight_decay=r["weight_decay"],
                         grad_clip=r["grad_clip"], schedule=("warmup_cosine", r["warmup"], r["min_lr_fraction"] * lr),
                         callbacks=[probe_cb], seed=seed, threads=1, deterministic=True, disable=True,
                         desc=f"qknorm-{arm}")
    model.eval()
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    final = evaluate(model) if finite else float("nan")
    history.extra.update(probe_steps=probe_steps, max_logit=logits, final_validation=final,
                         recipe=dict({k: v for k, v in r.items() if k != "seeds"}, arm=arm, lr=float(lr), seed=seed))
    return model, history


def load_curves(path=None) -> dict:
    """The shipped ``qknorm_curves.json``: ``{"recipe", "lrs", "params", "runs": [{"arm", "lr",
    "seed", "probe_steps", "max_logit", "final_validation", "last_loss"}]}``."""
    if path is None:
        return load_json("qknorm_curves.json")
    return load_json(Path(path).name, Path(path).parent)


def load_pretrained(arm: str = "on", path=None):
    """The shipped seed-0 model of ``arm`` trained at the largest rate of :data:`LRS` (float32,
    eval mode) and its history."""
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
    blob = load_blob(shipped(f"qknorm_{arm}.pt") if path is None else path)
    model = load_state(LlamaLM(LlamaLMConfig(**blob["config"])), blob["state_dict"])
    return model, History.from_dict(blob["history"])


def save(model, history: History, folder, arm: str = "on"):
    """Write ``qknorm_{arm}.pt`` (float16 weights, config, history) into ``folder``."""
    return save_model(Path(folder) / f"qknorm_{arm}.pt", model, history)


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped artifacts
    def add(parser):
        parser.add_argument("--lrs", default=None,
                            help="only these peak rates (comma-separated; several commands may share --out)")

    def run(out, args):
        path = Path(out) / "qknorm_curves.json"
        lrs = LRS if args.lrs is None else [float(x) for x in args.lrs.split(",")]
        for lr in lrs:
            for arm in ARMS:
                for seed in RECIPE["seeds"]:
                    model, h = train(arm, lr=lr, seed=seed)
                    e = h.extra
                    run_ = dict(arm=arm, lr=lr, seed=seed, probe_steps=e["probe_steps"], max_logit=e["max_logit"],
                                final_validation=e["final_validation"], last_loss=h.loss[-1])
                    print(f"lr={lr:g} {arm} seed {seed}: max logit {e['max_logit'][0]:.2f} -> "
                          f"{max(e['max_logit']):.2f} (peak), final validation {e['final_validation']:.4f}", flush=True)
                    if seed == 0 and lr == max(LRS):
                        # the shipped copy is float16: the chapter re-evaluates these rounded weights
                        for p in model.parameters():
                            p.data = p.data.half().float()
                        h.extra["rounded"] = dict(final_validation=evaluate(model),
                                                  max_logit=max_logit(model.double(), probe_ids()))
                        save(model.float(), h, out, arm)
                    # read again before each write: commands for other rates may share the file
                    res = load_curves(path) if path.exists() else {
                        "recipe": dict(RECIPE), "lrs": list(LRS),
                        "params": {a: num_params(LlamaLM(config(a))) for a in ARMS}, "runs": []}
                    res["runs"] = [r for r in res["runs"] if (r["arm"], r["lr"], r["seed"]) != (arm, lr, seed)]
                    res["runs"].append(run_)
                    res["runs"].sort(key=lambda r: (r["lr"], ARMS.index(r["arm"]), r["seed"]))
                    write_json(path, res)
        print(f"wrote {path}")

    cli(__doc__, run, add, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
