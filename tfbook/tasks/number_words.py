"""Number words to digits: the translation task of chapter 12, and its shipped weights.

A small :class:`~tfbook.torch.models.EncoderDecoder` learns to turn British number words
into digits, ``"four thousand two hundred and seven"`` -> ``"4207"``, for ``0..9999``.
Source tokens are whole words (``number_to_words(n, hyphen=False)`` split on spaces,
31 words); target tokens are the ten digits plus ``pad``, ``bos`` and ``eos``.

:func:`data` splits the numbers once: 1,000 test numbers (:func:`tfbook.data.number_split`,
``held_out_fraction=0.1``), then 500 validation numbers drawn from the other 9,000, and
8,500 training numbers. Training draws a number of digits uniformly from 1 to 4, then a
number with that many digits, so that the few short numbers are practised as often as
the long ones. The metric (:func:`evaluate`) is the exact-match rate of greedy decoding.

Training takes a few minutes on a 2-core CPU, more than a notebook's budget, so the
weights (``number_words.pt``) and the loss of every step (``number_words_losses.json``)
ship in ``tfbook/weights/``; :func:`load_pretrained` reads both. Two more training seeds
(:data:`SEEDS`), so that the chapter can report every figure over three runs, ship in
``number_words_seeds.pt`` (float16 weights, half the file; their losses as float32):
``load_pretrained(seed=1)``. Regenerate them with::

    python -m tfbook.tasks.number_words            # or --out DIR; --seeds 0 to skip the extra seeds

(``tests/test_number_words_weights.py`` retrains once and checks the result agrees.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..data import number_split, number_to_words, pad_batch
from ..torch.models import EncoderDecoder, EncoderDecoderConfig, seq2seq_loss
from ..torch.training import History
from ..torch.training import train as train_loop
from ._common import Splits, cli, pick, shipped, write_json

__all__ = [
    "MAX_VALUE", "WORDS", "PAD", "BOS", "EOS", "RECIPE", "ARTIFACTS",
    "data", "config", "make_model", "train", "evaluate", "load_pretrained", "save", "main",
    "words_of", "encode_source", "encode_target", "decode_target", "source_batch",
    "training_batch", "translate", "exact_match", "SEEDS",
]

MAX_VALUE = 9999  # numbers 0..9999
# every word number_to_words(n, hyphen=False) uses for n <= 9999, sorted; id 0 is padding
WORDS = sorted(set(" ".join(number_to_words(n, hyphen=False) for n in range(1000)).split())
               | {"thousand"})
PAD, BOS, EOS = 0, 1, 2  # target ids; digit d has id 3 + d
_SRC_ID = {w: i + 1 for i, w in enumerate(WORDS)}

#: the shipped weights' recipe: AdamW at lr for 60% of the steps, then linearly towards 0
RECIPE = dict(steps=1000, batch_size=128, lr=3e-3, hold=0.6, grad_clip=1.0, seed=0,
              test_fraction=0.1, n_validation=500)
#: the files ``python -m tfbook.tasks.number_words`` writes
ARTIFACTS = ("number_words.pt", "number_words_losses.json", "number_words_seeds.pt")
#: the training seeds that ship: seed 0 in float32 (the chapter's main model), the others in float16
SEEDS = (0, 1, 2)


def data(seed: int = 0) -> Splits:
    """``Splits(train, validation, test)`` of the numbers ``0..9999``: disjoint sorted arrays
    of 8,500, 500 and 1,000 numbers. The test numbers are :func:`tfbook.data.number_split`'s
    held-out tenth; the validation numbers are drawn (seeded) from the rest, never from the test."""
    rest, test = number_split(MAX_VALUE, held_out_fraction=RECIPE["test_fraction"], seed=seed)
    rng = np.random.default_rng(seed + 1)
    val_idx = rng.choice(rest.size, size=RECIPE["n_validation"], replace=False)
    is_val = np.zeros(rest.size, dtype=bool)
    is_val[val_idx] = True
    return Splits(rest[~is_val], np.sort(rest[is_val]), test)


def config(**overrides) -> EncoderDecoderConfig:
    """The chapter's model: D = 48, four heads, 2 + 2 Pre-LN blocks (about 98 thousand parameters)."""
    kw = dict(src_vocab_size=len(WORDS) + 1,  # the words and padding
              tgt_vocab_size=13,  # pad, bos, eos and ten digits
              d_model=48, num_heads=4, d_ff=96, num_encoder_layers=2, num_decoder_layers=2,
              max_len=16)  # the longest source has 8 words; targets have at most 6 tokens
    kw.update(overrides)
    return EncoderDecoderConfig(**kw)


def words_of(n: int) -> list[str]:
    """The source words of ``n``: ``words_of(407) == ['four', 'hundred', 'and', 'seven']``."""
    return number_to_words(int(n), hyphen=False).split()


def encode_source(n: int) -> list[int]:
    return [_SRC_ID[w] for w in words_of(n)]


def encode_target(n: int) -> list[int]:
    """``[bos, digits..., eos]`` as ids."""
    return [BOS] + [3 + int(c) for c in str(int(n))] + [EOS]


def decode_target(ids) -> str:
    """Digits up to the first ``eos`` (``?`` for a stray special token)."""
    out = []
    for t in (ids.tolist() if hasattr(ids, "tolist") else ids):
        if t == EOS:
            break
        out.append(str(t - 3) if t >= 3 else "?")
    return "".join(out)


def source_batch(numbers) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded source ids ``(B, S)`` and their validity mask for a list of numbers."""
    ids, valid = pad_batch([encode_source(n) for n in numbers], pad_id=PAD)
    return torch.from_numpy(ids), torch.from_numpy(valid)


def training_batch(train_numbers: np.ndarray, batch_size: int, generator: torch.Generator):
    """A batch ``(src, tgt, src_valid, tgt_valid)``, numbers drawn digit-length-balanced."""
    pools = [train_numbers[(train_numbers >= lo) & (train_numbers < hi)]
             for lo, hi in ((0, 10), (10, 100), (100, 1000), (1000, MAX_VALUE + 1))]
    k = torch.randint(0, len(pools), (batch_size,), generator=generator).tolist()
    u = torch.rand(batch_size, generator=generator, dtype=torch.float64).tolist()
    numbers = [int(pools[j][int(x * len(pools[j]))]) for j, x in zip(k, u)]
    src, src_valid = source_batch(numbers)
    tgt, tgt_valid = pad_batch([encode_target(n) for n in numbers], pad_id=PAD)
    return src, torch.from_numpy(tgt), src_valid, torch.from_numpy(tgt_valid)


def make_model(seed: int = 0) -> EncoderDecoder:
    torch.manual_seed(seed)
    return EncoderDecoder(config())


def train(steps: int | None = None, seed: int | None = None, disable: bool = True
          ) -> tuple[EncoderDecoder, History]:
    """Train from scratch with :data:`RECIPE` on the training numbers of :func:`data`.

    Returns the model (eval mode) and its :class:`~tfbook.torch.training.History`
    (``loss``: teacher-forced cross-entropy per step, nats per target token). One thread
    and deterministic algorithms: the same arguments give the same losses on one machine.
    """
    r = dict(RECIPE, steps=RECIPE["steps"] if steps is None else int(steps),
             seed=RECIPE["seed"] if seed is None else int(seed))
    train_numbers = data().train
    model = make_model(r["seed"])
    history = train_loop(
        model, seq2seq_loss, lambda g: training_batch(train_numbers, r["batch_size"], g), r["steps"],
        lr=r["lr"], weight_decay=0.0, grad_clip=r["grad_clip"],
        schedule=("hold_linear", int(r["hold"] * r["steps"])), seed=r["seed"], threads=1,
        deterministic=True, disable=disable, desc="number words")
    history.extra["recipe"] = r
    return model, history


@torch.no_grad()
def translate(model: EncoderDecoder, numbers) -> list[str]:
    """Greedy translations of ``numbers`` (read as words) into digit strings."""
    src, src_valid = source_batch(numbers)
    out = model.greedy_decode(src, max_len=6, bos=BOS, eos=EOS, src_valid=src_valid)
    return [decode_target(row) for row in out]


def exact_match(model: EncoderDecoder, numbers) -> float:
    """Fraction of ``numbers`` translated exactly."""
    preds = translate(model, numbers)
    return float(np.mean([p == str(int(n)) for p, n in zip(preds, numbers)]))


def evaluate(model: EncoderDecoder, split="validation") -> float:
    """Exact-match rate on ``split`` (``"train"``, ``"validation"``, ``"test"`` or numbers)."""
    return exact_match(model, pick(data(), split))


def load_pretrained(folder=None, seed: int = 0) -> tuple[EncoderDecoder, History]:
    """The shipped model of training seed ``seed`` (one of :data:`SEEDS`; float32, eval mode)
    and its training history (``loss`` per step). ``folder``: read the :data:`ARTIFACTS`
    from there instead (e.g. a regenerated set)."""
    if seed not in SEEDS:
        raise ValueError(f"seed must be one of {SEEDS}, got {seed!r}")
    paths = [shipped(n, folder) for n in ARTIFACTS]
    model = make_model(0)
    if seed == 0:
        with paths[0].open("rb") as f:
            state = torch.load(f, map_location="cpu", weights_only=True)
        with paths[1].open() as f:
            losses = json.load(f)
    else:
        with paths[2].open("rb") as f:
            runs = torch.load(f, map_location="cpu", weights_only=True)
        state = {k: v.float() for k, v in runs[seed]["state_dict"].items()}
        losses = [float(x) for x in runs[seed]["loss"]]
    model.load_state_dict(state)
    return model.eval(), History(loss=losses, extra={"recipe": dict(RECIPE, seed=seed)})


def save(model: EncoderDecoder, history: History, folder, others: dict | None = None) -> list:
    """Write the :data:`ARTIFACTS` into ``folder``: seed 0's float32 weights and its losses as
    JSON (7 significant digits, the precision of float32); with ``others`` (``{seed: (model,
    history)}``), the other seeds' float16 weights and float32 losses in one file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, folder / ARTIFACTS[0])
    write_json(folder / ARTIFACTS[1], [float(f"{x:.7g}") for x in history.loss])
    written = [folder / ARTIFACTS[0], folder / ARTIFACTS[1]]
    if others:
        torch.save({int(sd): {"state_dict": {k: v.detach().half().clone() for k, v in m.state_dict().items()},
                              "loss": torch.tensor(h.loss, dtype=torch.float32)}
                    for sd, (m, h) in others.items()}, folder / ARTIFACTS[2])
        written.append(folder / ARTIFACTS[2])
    return written


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped artifacts
    def run(out, args):
        model, history = train(disable=False)
        others = {sd: train(seed=sd, disable=False) for sd in SEEDS[1:]} if args.seeds else None
        paths = save(model, history, out, others)
        print(f"number words: mean loss of the last 50 steps {np.mean(history.loss[-50:]):.3g}; "
              f"validation exact match {evaluate(model, 'validation'):.4f}; wrote {', '.join(map(str, paths))}")

    cli(__doc__, run, argv=argv,
        add_arguments=lambda p: p.add_argument("--seeds", type=int, default=1,
                                               help="1: also train seeds 1 and 2 (default); 0: seed 0 only"))


if __name__ == "__main__":  # pragma: no cover
    main()
