"""Number words to digits: the translation task of chapter 11, and its shipped weights.

A small :class:`~tfbook.torch.models.EncoderDecoder` learns to turn British number words
into digits, ``"four thousand two hundred and seven"`` -> ``"4207"``, for ``0..9999``.
Source tokens are whole words (``number_to_words(n, hyphen=False)`` split on spaces,
31 words); target tokens are the ten digits plus ``pad``, ``bos`` and ``eos``.

The held-out test set is 1,000 numbers that training never sees
(:func:`tfbook.data.number_split` with ``held_out_fraction=0.1``). Training draws a
number of digits uniformly from 1 to 4, then a number with that many digits, so that the
few short numbers (there are only 10 one-digit and 90 two-digit ones) are practised as
often as the long ones.

Training takes a few minutes on a 2-core CPU, more than a notebook's budget, so the
weights are shipped in ``tfbook/weights/number_words.pt`` and :func:`load_pretrained`
reads them. Reproduce them with::

    python -m tfbook.number_words_task --out tfbook/weights/number_words.pt

(``tests/test_ch11_weights.py`` retrains once and checks the result agrees.)
"""

from __future__ import annotations

import argparse
from importlib import resources

import numpy as np
import torch

from .data import number_split, number_to_words, pad_batch
from .torch.models import EncoderDecoder, EncoderDecoderConfig, seq2seq_loss

__all__ = [
    "MAX_VALUE",
    "WORDS",
    "PAD",
    "BOS",
    "EOS",
    "CONFIG",
    "TRAIN",
    "split",
    "words_of",
    "encode_source",
    "encode_target",
    "decode_target",
    "source_batch",
    "training_batch",
    "make_model",
    "train",
    "translate",
    "exact_match",
    "load_pretrained",
]

MAX_VALUE = 9999  # numbers 0..9999
# every word number_to_words(n, hyphen=False) uses for n <= 9999, sorted; id 0 is padding
WORDS = sorted(set(" ".join(number_to_words(n, hyphen=False) for n in range(1000)).split())
               | {"thousand"})
PAD, BOS, EOS = 0, 1, 2  # target ids; digit d has id 3 + d
_SRC_ID = {w: i + 1 for i, w in enumerate(WORDS)}

CONFIG = EncoderDecoderConfig(
    src_vocab_size=len(WORDS) + 1,  # the words and padding
    tgt_vocab_size=13,  # pad, bos, eos and ten digits
    d_model=48,
    num_heads=4,
    d_ff=96,
    num_encoder_layers=2,
    num_decoder_layers=2,
    max_len=16,  # the longest source has 8 words; targets have at most 6 tokens
)
TRAIN = dict(steps=1000, batch_size=128, lr=3e-3, seed=0)  # the shipped weights' recipe


def split(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(train_numbers, held_out)``: 9,000 and 1,000 numbers, disjoint, sorted."""
    return number_split(MAX_VALUE, held_out_fraction=0.1, seed=seed)


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
    return EncoderDecoder(CONFIG)


def train(steps: int = TRAIN["steps"], batch_size: int = TRAIN["batch_size"], lr: float = TRAIN["lr"],
          seed: int = TRAIN["seed"], disable: bool = False) -> tuple[EncoderDecoder, list[float]]:
    """Train from scratch; returns the model (in eval mode) and the loss of every step.

    AdamW at a constant ``lr`` for the first 60% of the steps, then linearly down to
    zero (the decay settles the last errors on rare numbers). Gradients are clipped to
    norm 1. The same arguments give the same losses on the same machine and thread count.
    """
    from tqdm.auto import tqdm

    train_numbers, _ = split()
    model = make_model(seed)
    generator = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    n_flat = int(0.6 * steps)
    model.train()
    losses: list[float] = []
    for step in tqdm(range(steps), disable=disable, desc="training"):
        for group in opt.param_groups:
            group["lr"] = lr if step < n_flat else lr * (steps - step) / (steps - n_flat)
        loss = seq2seq_loss(model, *training_batch(train_numbers, batch_size, generator))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return model, losses


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


def load_pretrained() -> EncoderDecoder:
    """The shipped model (float32, eval mode)."""
    path = resources.files("tfbook") / "weights" / "number_words.pt"
    with resources.as_file(path) as p:
        state = torch.load(p, map_location="cpu", weights_only=True)
    model = make_model(0)
    model.load_state_dict(state)
    return model.eval()


def _main() -> None:  # pragma: no cover - the command that writes the shipped weights
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="tfbook/weights/number_words.pt")
    args = parser.parse_args()
    torch.set_num_threads(1)  # deterministic and as fast as two threads for this size
    model, losses = train()
    _, held_out = split()
    print(f"final loss {np.mean(losses[-50:]):.4f}; held-out exact match {exact_match(model, held_out):.4f}")
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)


if __name__ == "__main__":  # pragma: no cover
    _main()
