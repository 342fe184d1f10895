"""Training recipes of chapter 12: one small decoder-only language model, two tasks.

* **Addition written as text.** ``"123+456=9750"``: two zero-padded operands, then the
  sum zero-padded to ``digits + 1`` characters and written least significant digit
  first. The model reads the prompt ``"123+456="`` and must write the answer; it is
  graded by exact match (all answer characters right, greedy decoding) on held-out
  problems that never occur in its training data.
* **A small corpus.** ``tfbook/corpus/tiny_corpus.txt``, one token per character, split
  in reading order into training text (80%), a validation slice (10%) that picks the
  early-stopping step, and a test slice (the last 10%) that nothing in training looks
  at; graded by bits per character on the test slice.

Both models are trained from scratch by::

    python -m tfbook.lm_tasks          # writes tfbook/weights/ch12_*.pt

and the chapter loads those files by default (:func:`load_model`). Training is
deterministic on CPU: the same seed gives the same losses and weights, on one thread.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .data import CharTokenizer, addition_dataset, load_corpus
from .torch.models import DecoderLM, DecoderLMConfig, lm_batch, lm_loss

__all__ = [
    "ADDITION_DIGITS",
    "addition_tokenizer",
    "addition_split",
    "answer_targets",
    "addition_config",
    "corpus_config",
    "corpus_split",
    "train",
    "train_addition",
    "train_corpus",
    "greedy_answers",
    "exact_match",
    "bits_per_char",
    "save_model",
    "load_model",
]

ADDITION_DIGITS = 3  # operands 0..999, so the answer has 4 digits
ADDITION_VOCAB = "0123456789+="
IGNORE = -100  # targets equal to this are skipped by nn.functional.cross_entropy (its default)

# The recipes. Changing any number here changes the shipped weights: retrain with
# `python -m tfbook.lm_tasks` and rerun tests/test_ch12_weights.py.
ADDITION_RECIPE = dict(n_train=60_000, n_test=1_000, steps=1_000, batch_size=128, lr=3e-3, seed=0)
CORPUS_RECIPE = dict(val_fraction=0.1, test_fraction=0.1, steps=800, batch_size=16, lr=2e-3, weight_decay=0.1,
                     seed=0, eval_every=50)


# ---------------------------------------------------------------------------------------
# Addition
# ---------------------------------------------------------------------------------------


def addition_tokenizer() -> CharTokenizer:
    """Twelve tokens: the digits 0..9 (ids 0..9), ``+`` (10) and ``=`` (11)."""
    return CharTokenizer(list(ADDITION_VOCAB))


def addition_split(n_train: int = 60_000, n_test: int = 1_000, digits: int = ADDITION_DIGITS,
                   seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of training and held-out problems, each ``(N, 3 * digits + 3)`` int64.

    The ``n_test`` held-out problems are distinct; every training problem equal to one
    of them is dropped, so the held-out score measures generalisation, not memory.
    """
    if n_test < 1 or n_train < 1:
        raise ValueError(f"n_train and n_test must be >= 1, got {n_train} and {n_test}")
    tok = addition_tokenizer()
    fmt = dict(digits=digits, reverse_answer=True, pad=True)
    candidates = addition_dataset(2 * n_test + 10, seed=seed + 1, **fmt)
    test = list(dict.fromkeys(candidates))[:n_test]  # distinct, in draw order
    if len(test) < n_test:
        raise ValueError(f"only {len(test)} distinct problems with digits={digits}; lower n_test")
    held_out = set(test)
    train = [s for s in addition_dataset(n_train, seed=seed, **fmt) if s not in held_out]
    encode = lambda rows: torch.tensor([tok.encode(s) for s in rows], dtype=torch.long)  # noqa: E731
    return encode(train), encode(test)


def answer_targets(ids: torch.Tensor, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forcing pairs that score only the answer.

    ``ids (B, L)`` -> inputs ``x = ids[:, :-1]`` and targets ``y = ids[:, 1:]`` with the
    first ``prompt_len - 1`` targets set to ``-100``: position ``t`` of ``x`` predicts
    ``ids[:, t + 1]``, and only ``t >= prompt_len - 1`` predicts an answer character.
    """
    if ids.ndim != 2 or not 1 <= prompt_len < ids.shape[1]:
        raise ValueError(f"need ids (B, L) with 1 <= prompt_len < L, got ids {tuple(ids.shape)} "
                         f"and prompt_len={prompt_len}")
    x, y = ids[:, :-1], ids[:, 1:].clone()
    y[:, : prompt_len - 1] = IGNORE
    return x, y


def addition_config(digits: int = ADDITION_DIGITS) -> DecoderLMConfig:
    """Two Pre-LN blocks of width 48 (four heads of 16): about 58 thousand parameters."""
    return DecoderLMConfig(vocab_size=len(ADDITION_VOCAB), block_size=3 * digits + 3,
                           d_model=48, num_heads=4, num_layers=2, d_ff=192)


# ---------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------


def corpus_split(val_fraction: float = 0.1) -> tuple[CharTokenizer, torch.Tensor, torch.Tensor]:
    """The shipped corpus as character ids: ``(tokenizer, train (N_train,), val (N_val,))``.

    The split is contiguous: the last ``val_fraction`` of the text is held out, so no
    held-out window overlaps a training window. The vocabulary is every character of
    the whole text (a character seen only in the held-out part still gets an id).
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    text = load_corpus()
    tok = CharTokenizer.fit(text)
    ids = torch.tensor(tok.encode(text), dtype=torch.long)
    n = int(round((1.0 - val_fraction) * ids.numel()))
    return tok, ids[:n], ids[n:]


def corpus_split3(val_fraction: float = 0.1, test_fraction: float = 0.1
                  ) -> tuple[CharTokenizer, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokenizer, train, val, test)``: the corpus cut in reading order into three parts.

    ``test`` is the last ``test_fraction`` of the text (the same slice as the held-out
    part of ``corpus_split(test_fraction)``), ``val`` the ``val_fraction`` just before it,
    ``train`` the rest. Training uses ``train``, early stopping ``val``; ``test`` is read
    only to report the final score, so that score is not inflated by the stopping choice.
    """
    if not (0.0 < val_fraction < 1.0 and 0.0 < test_fraction < 1.0
            and val_fraction + test_fraction < 1.0):
        raise ValueError("val_fraction and test_fraction must be in (0, 1) with a sum below 1, "
                         f"got val_fraction={val_fraction}, test_fraction={test_fraction}")
    tok, rest, test = corpus_split(test_fraction)
    n_val = int(round(val_fraction * (rest.numel() + test.numel())))
    return tok, rest[:-n_val], rest[-n_val:], test


def corpus_config(vocab_size: int) -> DecoderLMConfig:
    """Two Pre-LN blocks of width 32 and a context of 64 characters (about 29 thousand
    parameters): small on purpose, the corpus has only about 5,500 training characters."""
    return DecoderLMConfig(vocab_size=vocab_size, block_size=64, d_model=32, num_heads=4,
                           num_layers=2, d_ff=128)


# ---------------------------------------------------------------------------------------
# Training and evaluation
# ---------------------------------------------------------------------------------------


def train(model: nn.Module, loss_fn: Callable, batch_fn: Callable, steps: int, lr: float = 3e-3,
          weight_decay: float = 0.0, grad_clip: float | None = 1.0, seed: int = 0,
          evaluate: Callable | None = None, eval_every: int = 100, disable: bool = True,
          desc: str = "training") -> dict:
    """AdamW for ``steps`` steps; the loss of every step and, every ``eval_every`` steps,
    ``evaluate(model)``.

    The same loop as :func:`tfbook.torch.models.train_steps` (same generator, same
    order of operations, so the same losses), plus the periodic evaluation. Returns
    ``{"loss": [...], "eval_step": [...], "eval": [...]}``; ``"eval_step"`` counts the
    optimisation steps taken before each evaluation (0 = at initialisation).
    """
    from tqdm.auto import tqdm

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    generator = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    history: dict = {"loss": [], "eval_step": [], "eval": []}

    def record(step: int) -> None:
        model.eval()
        with torch.no_grad():
            history["eval_step"].append(step)
            history["eval"].append(float(evaluate(model)))
        model.train()

    model.train()
    if evaluate is not None:
        record(0)
    for step in tqdm(range(1, steps + 1), disable=disable, desc=desc):
        batch = batch_fn(generator)
        loss = loss_fn(model, *batch)  # batch_fn returns a tuple, e.g. (x, y)
        if not torch.isfinite(loss):
            raise ValueError(f"loss became {loss.item()} after {step - 1} steps; lower lr?")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        history["loss"].append(loss.item())
        if evaluate is not None and step % eval_every == 0:
            record(step)
    model.eval()
    return history


@torch.no_grad()
def greedy_answers(model: DecoderLM, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Greedy, KV-cached continuation of ``ids[:, :prompt_len]`` to the full length of ``ids``;
    returns the generated part, ``(B, L - prompt_len)``."""
    L = ids.shape[1]
    out = model.generate(ids[:, :prompt_len], L - prompt_len, greedy=True)
    return out[:, prompt_len:]


def exact_match(model: DecoderLM, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Boolean ``(B,)``: True where greedy decoding reproduces every answer character."""
    return (greedy_answers(model, ids, prompt_len) == ids[:, prompt_len:]).all(dim=1)


@torch.no_grad()
def bits_per_char(model: DecoderLM, ids: torch.Tensor, block_size: int | None = None) -> float:
    """Mean cross-entropy in bits of predicting ``ids[1:]``, reading ``ids`` in
    consecutive windows of ``block_size`` characters (each window starts with no context).

    Every character after the first is predicted exactly once.
    """
    block_size = block_size or model.config.block_size
    if ids.ndim != 1 or ids.numel() < 2:
        raise ValueError(f"ids must be 1-D with at least 2 tokens, got shape {tuple(ids.shape)}")
    total, count = 0.0, 0
    for start in range(0, ids.numel() - 1, block_size):
        x = ids[start:start + block_size]
        y = ids[start + 1:start + block_size + 1]
        x = x[: y.numel()]
        logits = model(x[None])[0]  # (T, V)
        total += nn.functional.cross_entropy(logits, y, reduction="sum").item()
        count += y.numel()
    return total / count / math.log(2)


class _Reproducible:
    """Train on one thread with deterministic algorithms; both settings are restored after.

    One thread: results then do not depend on the machine's thread count, and tiny
    models run faster than on two threads that compete with other jobs.
    """

    def __enter__(self):
        self.n = torch.get_num_threads()
        self.det = torch.are_deterministic_algorithms_enabled()
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc):
        torch.set_num_threads(self.n)
        torch.use_deterministic_algorithms(self.det)


def train_addition(steps: int | None = None, seed: int | None = None,
                   disable: bool = True) -> tuple[DecoderLM, dict]:
    """Train the addition model of chapter 12 with :data:`ADDITION_RECIPE`.

    Returns ``(model, history)``; ``history["loss"]`` is the answer-only cross-entropy
    (nats per answer character) of every step.
    """
    r = dict(ADDITION_RECIPE)
    r["steps"] = r["steps"] if steps is None else steps
    r["seed"] = r["seed"] if seed is None else seed
    train_ids, _ = addition_split(r["n_train"], r["n_test"])
    prompt_len = 2 * ADDITION_DIGITS + 2
    x_all, y_all = answer_targets(train_ids, prompt_len)  # (N, L - 1) each

    def batch_fn(generator):
        rows = torch.randint(0, x_all.shape[0], (r["batch_size"],), generator=generator)
        return x_all[rows], y_all[rows]

    with _Reproducible():
        torch.manual_seed(r["seed"])
        model = DecoderLM(addition_config())
        history = train(model, lm_loss, batch_fn, r["steps"], lr=r["lr"], seed=r["seed"],
                        disable=disable, desc="addition")
    history["recipe"] = r
    return model, history


def train_corpus(steps: int | None = None, seed: int | None = None,
                 disable: bool = True) -> tuple[DecoderLM, dict]:
    """Train the character model on the shipped corpus with :data:`CORPUS_RECIPE`.

    ``history["loss"]`` is the training cross-entropy (nats per character) of every
    step; ``history["eval"]`` the validation bits per character every ``eval_every`` steps
    (and at step 0). The returned model holds the weights of the best validation score,
    taken at step ``history["best_step"]`` (early stopping). The test slice of
    :func:`corpus_split3` is not used here.
    """
    r = dict(CORPUS_RECIPE)
    r["steps"] = r["steps"] if steps is None else steps
    r["seed"] = r["seed"] if seed is None else seed
    tok, train_ids, val_ids, _ = corpus_split3(r["val_fraction"], r["test_fraction"])
    config = corpus_config(tok.vocab_size)

    def batch_fn(generator):
        return lm_batch(train_ids, config.block_size, r["batch_size"], generator=generator)

    # Early stopping: a corpus this small is memorised within a few hundred steps, after
    # which the validation loss rises. Keep the weights of the best validation score.
    best: dict = {"bpc": math.inf, "step": 0, "state": None, "evals": 0}

    def evaluate(m):
        bpc = bits_per_char(m, val_ids)
        if bpc < best["bpc"]:
            best.update(bpc=bpc, step=best["evals"] * r["eval_every"],
                        state={k: v.detach().clone() for k, v in m.state_dict().items()})
        best["evals"] += 1
        return bpc

    with _Reproducible():
        torch.manual_seed(r["seed"])
        model = DecoderLM(config)
        history = train(model, lm_loss, batch_fn, r["steps"], lr=r["lr"],
                        weight_decay=r["weight_decay"], seed=r["seed"], evaluate=evaluate,
                        eval_every=r["eval_every"], disable=disable, desc="corpus")
    model.load_state_dict(best["state"])
    model.eval()
    history["best_step"] = best["step"]
    history["recipe"] = r
    return model, history


# ---------------------------------------------------------------------------------------
# Shipped weights
# ---------------------------------------------------------------------------------------

WEIGHTS = {"addition": "ch12_addition.pt", "corpus": "ch12_corpus.pt"}


def save_model(path, model: DecoderLM, history: dict) -> Path:
    """Write ``{"config", "state_dict" (float16), "history"}`` to ``path``.

    float16 halves the file; the chapter checks its quality bars on the rounded weights.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16).clone() for k, v in model.state_dict().items()}
    torch.save({"config": asdict(model.config), "state_dict": state, "history": history}, path)
    return path


def load_model(name: str, path=None) -> tuple[DecoderLM, dict]:
    """Load a shipped model (``"addition"`` or ``"corpus"``) as float32, in eval mode.

    Returns ``(model, history)``, the history saved by training.
    """
    if name not in WEIGHTS:
        raise ValueError(f"name must be one of {sorted(WEIGHTS)}, got {name!r}")
    if path is None:
        path = resources.files("tfbook") / "weights" / WEIGHTS[name]
    with open(path, "rb") as f:
        blob = torch.load(f, map_location="cpu", weights_only=True)
    model = DecoderLM(DecoderLMConfig(**blob["config"]))
    model.load_state_dict({k: v.float() for k, v in blob["state_dict"].items()})
    model.eval()
    return model, blob["history"]


def main(out_dir=None, which=("addition", "corpus")) -> None:
    """Retrain the models named in ``which`` from scratch and write their weights (a few
    minutes on a CPU). ``python -m tfbook.lm_tasks corpus`` retrains only the corpus model."""
    out = Path(out_dir) if out_dir else Path(__file__).resolve().parent / "weights"
    if "addition" in which:
        model, history = train_addition(disable=False)
        _, test_ids = addition_split(ADDITION_RECIPE["n_train"], ADDITION_RECIPE["n_test"])
        acc = exact_match(model, test_ids, 2 * ADDITION_DIGITS + 2).double().mean().item()
        print(f"addition: final loss {history['loss'][-1]:.5f}, held-out exact match {acc:.4f}")
        save_model(out / WEIGHTS["addition"], model, history)
    if "corpus" in which:
        model, history = train_corpus(disable=False)
        _, _, _, test_ids = corpus_split3(CORPUS_RECIPE["val_fraction"], CORPUS_RECIPE["test_fraction"])
        print(f"corpus: validation bits per character {min(history['eval']):.3f} at step "
              f"{history['best_step']}; test {bits_per_char(model, test_ids):.3f}")
        save_model(out / WEIGHTS["corpus"], model, history)


if __name__ == "__main__":
    import sys

    main(which=tuple(sys.argv[1:]) or ("addition", "corpus"))
