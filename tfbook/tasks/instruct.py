"""Instruction tuning of the book's small prose model (chapters 24 and 25).

The pretrained model is chapter 13's ``prose_small`` (a character-level decoder, 2 blocks,
``D = 64``, a context of 64 characters, trained on the King James prose). Three tokens are
added to its 62 characters, the chat template (:data:`SPECIALS`)::

    <|user|> reverse: abram <|assistant|> marba <|end|>

and it is fine-tuned on a synthetic instruction set of four tasks whose answers a program can
check (:data:`TASKS`): reversing a word, counting a letter in a word, adding two numbers
written in words, and looking up the word that follows a given word in a given passage. Words
and number pairs are split between train, validation and test, so a test item never occurs in
training; the lookup passages of training and validation come from the pretraining text's
training and validation slices, and the test passages half from its training slice (text the
model has read) and half from its test slice (text it has not), which chapter 25 uses to
measure contamination.

Three methods (:data:`METHODS`), each trained with the loss on the answers only, on rows
packed with several conversations (:func:`tfbook.torch.assistant.answer_loss`):

* ``full``: every weight trained;
* ``lora``: chapter 19's low-rank updates (rank :data:`LORA_RANK`) on every matrix of the
  blocks, plus the three new embedding rows, the rest frozen;
* ``scratch``: the same model trained from a random initialisation (no pretraining): what
  the pretraining is worth.

Each method's learning rate is chosen on validation exact match (seed 0) from
:data:`LR_GRID`; the chosen rate is then trained with seeds 0, 1, 2. The test items are read
once, at the end, for every shipped model. Shipped (``tfbook/weights/``): the nine merged
models (``instruct_{method}_seed{s}.pt``, float16) and ``instruct_results.json`` (the grid,
validation and test exact match per task and seed, bits per character on the pretraining
text before and after). Regenerated, in about six CPU-minutes (320 s measured), by::

    python -m tfbook.tasks.instruct                 # or --out DIR; --quick: 30 steps, one seed
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import torch

from ..data import CharTokenizer
from ..torch import assistant as A
from ..torch.experts import add_lora, merge_lora
from ..torch.models import DecoderLM
from ..torch.training import History
from ..torch.training import train as train_loop
from . import prose
from ._common import Splits, cli, load_decoder_lm, load_json, save_model, shipped, write_json

__all__ = ["SPECIALS", "TASKS", "METHODS", "RECIPE", "LR_GRID", "LORA_RANK", "ARTIFACTS", "Tokenizer",
           "tokenizer", "data", "conversation", "encode_conversation", "prompt_ids", "pack", "encode_items", "batch_fn", "base_model", "train",
           "evaluate", "answers", "scores", "exact_match", "forgetting_bits", "load_pretrained", "load_results", "save", "main",
           "NUMBER_WORDS"]

SPECIALS = ("<|user|>", "<|assistant|>", "<|end|>")
TASKS = ("reverse", "count", "add", "lookup")
METHODS = ("full", "lora", "scratch")
#: the shipped models' recipe; changing a number changes the weights (rerun the command)
RECIPE = dict(steps=800, rows=16, warmup=50, min_lr_ratio=0.1, weight_decay=0.0, grad_clip=1.0,
              n_val=100, n_test=100, bpc_chars=20_000, seed=0)
LR_GRID = {"full": (1e-3, 3e-3), "lora": (3e-3, 1e-2), "scratch": (1e-3, 3e-3)}
LORA_RANK = 8
LORA_NAMES = ("W_Q", "W_K", "W_V", "W_O", "W_1", "W_2")
SEEDS = (0, 1, 2)
ARTIFACTS = tuple(f"instruct_{m}_seed{s}.pt" for m in METHODS for s in SEEDS) + ("instruct_results.json",)
NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
                "fifteen sixteen seventeen eighteen nineteen twenty").split()
MAX_OPERAND = 14  # "a plus b" with a, b in 0..14


def number_word(n: int) -> str:
    """``n`` (0..99) in words: ``28 -> "twenty eight"``."""
    if n <= 20:
        return NUMBER_WORDS[n]
    tens = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"][n // 10]
    return tens if n % 10 == 0 else f"{tens} {NUMBER_WORDS[n % 10]}"


class Tokenizer:
    """The prose model's characters (ids 0..61) and the three template tokens (62, 63, 64)."""

    def __init__(self, chars: CharTokenizer):
        self.chars = chars
        n = chars.vocab_size
        self.user_id, self.assistant_id, self.end_id = n, n + 1, n + 2
        self.vocab_size = n + 3

    def encode(self, text: str) -> list[int]:
        return self.chars.encode(text)

    def decode(self, ids) -> str:
        names = {self.user_id: SPECIALS[0], self.assistant_id: SPECIALS[1], self.end_id: SPECIALS[2]}
        return "".join(names[i] if i in names else self.chars.decode([i]) for i in (int(t) for t in ids))


def tokenizer() -> Tokenizer:
    return Tokenizer(prose.tokenizer())


# ----------------------------------------------------------------------------- data
def _words(text: str) -> list[str]:
    """Distinct lower-case words of 3 to 8 letters, in order of first appearance."""
    seen, out = set(), []
    for w in re.findall(r"[a-z]+", text.lower()):
        if 3 <= len(w) <= 8 and w not in seen:
            seen.add(w)
            out.append(w)
    return out


def _passages(text: str, rng: np.random.Generator, n: int) -> list[tuple[str, str, str]]:
    """``n`` items ``(passage, word, next word)``: a run of whole words of at most 32
    characters, lower case, in which ``word`` occurs once and is not last."""
    lines = [re.sub(r"[^a-z ]", "", ln.lower()).split() for ln in text.split("\n")]
    lines = [ln for ln in lines if len(ln) >= 5]
    out, seen = [], set()
    while len(out) < n:
        ln = lines[int(rng.integers(len(lines)))]
        start = int(rng.integers(len(ln) - 3))
        words = []
        for w in ln[start:]:
            if len(" ".join(words + [w])) > 32:
                break
            words.append(w)
        if len(words) < 4:
            continue
        passage = " ".join(words)
        j = int(rng.integers(len(words) - 1))
        if words.count(words[j]) != 1 or len(words[j]) > 8 or len(words[j + 1]) > 8 or passage in seen:
            continue
        seen.add(passage)
        out.append((passage, words[j], words[j + 1]))
    return out


def conversation(task: str, item) -> tuple[str, str]:
    """``(prompt, answer)`` texts of one item of ``task``."""
    if task == "reverse":
        return f"reverse: {item}", item[::-1]
    if task == "count":
        word, ch = item
        return f"count {ch} in {word}", number_word(word.count(ch))
    if task == "add":
        a, b = item
        return f"{number_word(a)} plus {number_word(b)}", number_word(a + b)
    if task == "lookup":
        passage, word, nxt = item
        return f"{passage}; after {word}?", nxt
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


_DATA: dict = {}


def data() -> Splits:
    """``Splits(train, validation, test)``, each a dict ``task -> list of (prompt, answer)``.

    Reverse and count use disjoint sets of words (from the whole corpus); add uses disjoint
    sets of operand pairs; lookup passages come from the pretraining text's slices (train:
    training slice; validation: validation slice; test: 50 from the training slice, then 50
    from the test slice)."""
    if "splits" in _DATA:
        return _DATA["splits"]
    rng = np.random.default_rng(24)
    text = prose.load_text()
    p_train, p_val, p_test = prose.text_splits()
    words = _words(text)
    order = rng.permutation(len(words))
    n_val, n_test = RECIPE["n_val"], RECIPE["n_test"]
    w_test = [words[i] for i in order[:n_test * 2]]
    w_val = [words[i] for i in order[n_test * 2:n_test * 2 + n_val * 2]]
    w_train = [words[i] for i in order[n_test * 2 + n_val * 2:]]

    def count_items(ws, n, r):
        out = []
        for w in ws:
            letters = sorted(set(w))
            # half the time a letter of the word, half the time any letter: counts 0..3 all occur
            ch = letters[int(r.integers(len(letters)))] if r.random() < 0.75 else "abcdefghijklmnopqrstuvwxyz"[int(r.integers(26))]
            out.append((w, ch))
            if len(out) == n:
                break
        return out

    pairs = [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    po = rng.permutation(len(pairs))
    n_add_test, n_add_val = 50, 25
    add_test = [pairs[i] for i in po[:n_add_test]]
    add_val = [pairs[i] for i in po[n_add_test:n_add_test + n_add_val]]
    add_train = [pairs[i] for i in po[n_add_test + n_add_val:]]
    lk_train = _passages(p_train.decode("ascii"), rng, 4000)
    lk_val = _passages(p_val.decode("ascii"), rng, n_val)
    seen_train = {p for p, _, _ in lk_train}
    lk_test_seen = [x for x in _passages(p_train.decode("ascii"), rng, 200) if x[0] not in seen_train][:n_test // 2]
    lk_test_new = _passages(p_test.decode("ascii"), rng, n_test // 2)

    def conv(task, items):
        return [conversation(task, it) for it in items]

    train = {"reverse": conv("reverse", w_train), "count": conv("count", count_items(w_train, 10**9, rng)),
             "add": conv("add", add_train), "lookup": conv("lookup", lk_train)}
    val = {"reverse": conv("reverse", w_val[:n_val]), "count": conv("count", count_items(w_val[n_val:], n_val, rng)),
           "add": conv("add", add_val), "lookup": conv("lookup", lk_val)}
    test = {"reverse": conv("reverse", w_test[:n_test]),
            "count": conv("count", count_items(w_test[n_test:], n_test, rng)),
            "add": conv("add", add_test), "lookup": conv("lookup", lk_test_seen + lk_test_new)}
    _DATA["splits"] = Splits(train, val, test)
    return _DATA["splits"]


def encode_conversation(tok: Tokenizer, prompt: str, answer: str) -> list[int]:
    """``<|user|> prompt <|assistant|> answer <|end|>`` as ids."""
    return [tok.user_id, *tok.encode(prompt), tok.assistant_id, *tok.encode(answer), tok.end_id]


def prompt_ids(tok: Tokenizer, prompt: str) -> list[int]:
    """``<|user|> prompt <|assistant|>``: what the model is given to answer."""
    return [tok.user_id, *tok.encode(prompt), tok.assistant_id]


def pack(convs: list, T: int, rows: int | None = None, pad_id: int = 0, first_fit: bool = True
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Conversations (id lists) packed into rows of ``T`` tokens, first fit: each goes, whole,
    into the first row with room for it, else starts a new row (at most ``rows`` rows; one
    that fits nowhere then is left out). ``first_fit=False``: only the last row is tried
    (next fit), so the conversations stay in their order, row by row. The rest of a row is padding (``doc = -1``).
    Returns ``ids (R, T)`` and ``doc (R, T)``: the index of each token's conversation within
    its row."""
    ids_rows, doc_rows = [], []
    for c in convs:
        if len(c) > T:
            raise ValueError(f"a conversation of {len(c)} tokens does not fit in rows of T={T}")
        for r_ids, r_doc in (zip(ids_rows, doc_rows) if first_fit else zip(ids_rows[-1:], doc_rows[-1:])):
            if len(r_ids) + len(c) <= T:
                r_doc += [r_doc[-1] + 1] * len(c)
                r_ids += list(c)
                break
        else:
            if rows is None or len(ids_rows) < rows:
                ids_rows.append(list(c))
                doc_rows.append([0] * len(c))
    ids = [r + [pad_id] * (T - len(r)) for r in ids_rows]
    doc = [r + [-1] * (T - len(r)) for r in doc_rows]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(doc, dtype=torch.long)


def _train_convs(tok: Tokenizer) -> list:
    if "train_convs" not in _DATA:
        _DATA["train_convs"] = [encode_conversation(tok, p, a) for task in TASKS for p, a in data().train[task]]
        _DATA["train_task"] = [t for t in TASKS for _ in data().train[t]]
    return _DATA["train_convs"]


def batch_fn(generator: torch.Generator, rows: int = RECIPE["rows"], T: int = 64):
    """Packed rows of training conversations: each task drawn with probability 1/4, then
    an item of it uniformly (tasks with few items are not drowned out)."""
    tok = tokenizer()
    convs = _train_convs(tok)
    starts = np.cumsum([0] + [len(data().train[t]) for t in TASKS])
    need = rows * T // 12  # about as many conversations as the rows hold (mean length 27)
    task = torch.randint(0, len(TASKS), (need,), generator=generator)
    u = torch.rand(need, generator=generator, dtype=torch.float64)
    chosen = [convs[starts[t] + int(x * (starts[t + 1] - starts[t]))] for t, x in zip(task.tolist(), u.tolist())]
    ids, doc = pack(chosen, T, rows=rows)
    if ids.shape[0] < rows:  # pragma: no cover - need conversations always fill the rows
        raise RuntimeError("too few conversations drawn to fill the rows")
    return ids, doc


# ----------------------------------------------------------------------------- models
def base_model() -> DecoderLM:
    """Chapter 13's ``prose_small`` with the three template tokens added (float32, eval mode)."""
    model, _ = prose.load_pretrained("small")
    return A.extend_vocab(model, len(SPECIALS)).eval()


@torch.no_grad()
def answers(model: DecoderLM, prompts: list[str], batch: int = 256, temperature: float = 0.0,
            generator=None) -> list[str]:
    """The model's answer text to each prompt (greedy by default)."""
    tok = tokenizer()
    out = []
    for i in range(0, len(prompts), batch):
        got = A.complete(model, [prompt_ids(tok, p) for p in prompts[i:i + batch]], tok.end_id, max_new=13,
                         temperature=temperature, generator=generator)
        out += [tok.decode([t for t in g if t < tok.chars.vocab_size]) for g in got]
    return out


def encode_items(items: list, T: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """A list of ``(prompt, answer)`` as packed rows, in order (next fit)."""
    tok = tokenizer()
    return pack([encode_conversation(tok, p, a) for p, a in items], T, first_fit=False)


@torch.no_grad()
def scores(model: DecoderLM, items: list, dtype=torch.float64) -> tuple[np.ndarray, np.ndarray]:
    """``(exact, logprob)`` per item (``(prompt, answer)`` pairs): greedy exact match and the
    log-probability of sampling the answer, from one teacher-forced pass in ``dtype``
    (:func:`tfbook.torch.assistant.answer_scores`); the model is left in the dtype it came in."""
    tok = tokenizer()
    ids, doc = encode_items(items)
    dtype0 = next(model.parameters()).dtype                   # the caller's, restored afterwards
    m = model.to(dtype)
    try:
        exact, logprob = A.answer_scores(m, ids, doc, tok.assistant_id, tok.end_id)
    finally:
        model.to(dtype0)
    return exact.numpy().astype(int), logprob.double().numpy()


def exact_match(model: DecoderLM, items: dict) -> dict:
    """``task -> list of 0/1`` (greedy decoding writes the answer exactly) over ``items`` (a
    split's dict), computed in float64 by teacher forcing (:func:`scores`)."""
    return {t: scores(model, items[t])[0].tolist() for t in items}


def evaluate(model: DecoderLM, split: str = "validation") -> float:
    """Mean exact match over the four tasks of ``split`` (each task weighted equally)."""
    em = exact_match(model, getattr(data(), split))
    return float(np.mean([np.mean(v) for v in em.values()]))


@torch.no_grad()
def forgetting_bits(model: DecoderLM, chars: int = RECIPE["bpc_chars"], split: str = "test") -> float:
    """Bits per character on the first ``chars`` characters of the pretraining text's
    ``split`` slice (the full softmax, template tokens included)."""
    ids = getattr(prose.data(), split)[:chars]
    return prose.bits_per_char(model, ids)


def train(method: str = "full", lr: float | None = None, seed: int = 0, steps: int | None = None,
          disable: bool = True, stop_after: int | None = None) -> tuple[DecoderLM, History]:
    """Fine-tune (``full``, ``lora``) or train from scratch (``scratch``) with the answer-only
    loss on packed rows; returns the plain model (LoRA merged) and its history.
    ``stop_after``: stop after that many steps of the ``steps``-step schedule (the first steps
    of the full run, e.g. to check a shipped loss curve)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    r = RECIPE
    steps = r["steps"] if steps is None else int(steps)
    lr = LR_GRID[method][0] if lr is None else float(lr)
    tok = tokenizer()
    torch.manual_seed(seed)
    model = base_model()
    if method == "scratch":
        model = DecoderLM(model.config)
    model.train()
    handle = None
    if method == "lora":
        add_lora(model, LORA_RANK, names=LORA_NAMES, seed=seed)
        model.W_E.requires_grad_(True)
        handle = A.freeze_rows(model.W_E, tok.chars.vocab_size)

    def loss_fn(m, ids, doc):
        return A.answer_loss(m, ids, doc, tok.assistant_id, tok.end_id)

    history = train_loop(model, loss_fn, batch_fn, steps, lr=lr, weight_decay=r["weight_decay"],
                         grad_clip=r["grad_clip"], schedule=("warmup_cosine", min(r["warmup"], steps), lr * r["min_lr_ratio"]),
                         seed=seed, threads=1, deterministic=True, disable=disable, desc=f"instruct-{method}",
                         callbacks=[] if stop_after is None else [lambda step, m, h: step >= stop_after])
    if handle is not None:
        handle.remove()
        merge_lora(model)
        for p in model.parameters():
            p.requires_grad_(True)
    history.extra["recipe"] = dict(r, method=method, lr=lr, seed=seed, steps=steps)
    return model.eval(), history


def load_pretrained(method: str = "full", seed: int = 0, folder=None) -> tuple[DecoderLM, History]:
    """A shipped model (merged, float32, eval mode) and its training history."""
    if method not in METHODS or seed not in SEEDS:
        raise ValueError(f"method must be one of {METHODS} and seed one of {SEEDS}, got {method!r}, {seed!r}")
    name = f"instruct_{method}_seed{seed}.pt"
    return load_decoder_lm(name, None if folder is None else Path(folder) / name)


def load_results(folder=None) -> dict:
    """The shipped ``instruct_results.json``."""
    return load_json("instruct_results.json", folder)


def save(model: DecoderLM, history: History, folder, method: str, seed: int) -> Path:
    return save_model(Path(folder) / f"instruct_{method}_seed{seed}.pt", model, history)


def rescore(folder) -> dict:  # pragma: no cover - rewrites instruct_results.json
    """Recompute every exact match in ``folder``'s results with :func:`exact_match` (float64,
    teacher forced; the first shipped run scored float32 greedy generations) and the test
    answers' log-probabilities; the models are not retrained."""
    folder = Path(folder)
    res = json.loads((folder / "instruct_results.json").read_text())
    base = base_model()
    res["test_base"], res["val_base"] = exact_match(base, data().test), exact_match(base, data().validation)
    for key, run in res["runs"].items():
        method, seed = key.rsplit("_seed", 1)
        m, _ = load_pretrained(method, int(seed), folder=folder)
        run["val"], run["test"] = exact_match(m, data().validation), exact_match(m, data().test)
        run["test_logprob"] = {t: scores(m, data().test[t])[1].tolist() for t in TASKS}
    res["scoring"] = "float64, teacher forced (tfbook.torch.assistant.answer_scores)"
    write_json(folder / "instruct_results.json", res)
    return res


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped artifacts
    def add(parser):
        parser.add_argument("--quick", action="store_true", help="30 steps, seed 0 only (needs --out)")
        parser.add_argument("--rescore", action="store_true",
                            help="only recompute the exact matches of the models in --out (float64, teacher forced)")

    def run(out: Path, args):
        if args.rescore:
            return rescore(out)
        steps = 30 if args.quick else RECIPE["steps"]
        seeds = (0,) if args.quick else SEEDS
        t0 = time.process_time()
        res = {"recipe": RECIPE, "lr_grid": {m: list(v) for m, v in LR_GRID.items()}, "lora_rank": LORA_RANK,
               "grid": {}, "chosen_lr": {}, "runs": {}}
        base = base_model()
        res["bpc_base"] = forgetting_bits(base)
        res["bpc_pretrained62"] = forgetting_bits(prose.load_pretrained("small")[0])
        res["test_base"] = exact_match(base, data().test)
        res["val_base"] = exact_match(base, data().validation)
        models = {}
        for method in METHODS:
            grid = {}
            for lr in LR_GRID[method]:
                m, h = train(method, lr=lr, seed=0, steps=steps)
                grid[lr] = (evaluate(m), m, h)
                print(f"{method} lr={lr:g}: validation exact match {grid[lr][0]:.3f} "
                      f"({time.process_time() - t0:.0f} s CPU)", flush=True)
            best = max(grid, key=lambda k: grid[k][0])  # ties: the first (smaller) rate
            res["grid"][method] = {f"{k:g}": v[0] for k, v in grid.items()}
            res["chosen_lr"][method] = best
            for seed in seeds:
                if seed == 0:
                    m, h = grid[best][1], grid[best][2]
                else:
                    m, h = train(method, lr=best, seed=seed, steps=steps)
                save(m, h, out, method, seed)
                m, _ = load_pretrained(method, seed, folder=out)  # float16 round trip: what ships
                models[(method, seed)] = m
                run = {"val": exact_match(m, data().validation), "test": exact_match(m, data().test),
                       "bpc": forgetting_bits(m), "final_loss": h.loss[-1]}
                res["runs"][f"{method}_seed{seed}"] = run
                print(f"{method} seed {seed}: test exact match "
                      + ", ".join(f"{t} {np.mean(v):.2f}" for t, v in run["test"].items())
                      + f"; bpc {run['bpc']:.3f} ({time.process_time() - t0:.0f} s CPU)", flush=True)
        res["cpu_seconds"] = time.process_time() - t0
        write_json(out / "instruct_results.json", res)

    cli(__doc__, run, add, argv)


if __name__ == "__main__":  # pragma: no cover
    main()
