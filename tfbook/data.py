"""Data for the book's experiments: generated on the spot or shipped in the package.

Nothing here touches the network. Every random choice takes a ``seed`` and uses its own
``numpy.random.Generator``, so the same call gives the same data on every machine.

Contents
--------
* :class:`CharTokenizer` -- one token per character, sorted vocabulary.
* :class:`BPETokenizer` -- byte-pair-style merges learned from a text on the spot.
* :class:`ByteBPETokenizer` -- byte-level BPE of the GPT-2 kind (defined in :mod:`tfbook.bpe`).
* :func:`number_to_words`, :func:`number_words_dataset`, :func:`number_split` -- the
  number-words-to-digits translation task of the encoder-decoder chapter.
* :func:`addition_dataset` -- addition problems written as text, ``"123+456=579"``.
* :func:`load_corpus` -- a small English corpus written for this project.
* :func:`load_digits_images` -- the 8x8 handwritten digits bundled with scikit-learn.
* :func:`pad_batch` -- stack sequences of different lengths with a validity mask.
"""

from __future__ import annotations

import re
from collections import Counter
from importlib import resources
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from .bpe import ByteBPETokenizer
from .bpe import _merge  # replaces each (a, b) by new_id, left to right, as both trainers need

__all__ = [
    "CharTokenizer",
    "BPETokenizer",
    "ByteBPETokenizer",
    "number_to_words",
    "number_words_dataset",
    "number_split",
    "addition_dataset",
    "load_corpus",
    "load_digits_images",
    "DigitsSplit",
    "pad_batch",
]


def _as_int_list(ids) -> list[int]:
    """Accept a list, tuple, NumPy array or torch tensor of token ids."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    ids = list(ids)
    if ids and isinstance(ids[0], list):
        raise ValueError(f"decode takes one sequence of ids, got a nested sequence of length {len(ids)}")
    return [int(i) for i in ids]


def _decode(vocab, ids) -> str:
    """The strings of ``ids`` in ``vocab``, joined; ValueError for ids outside the vocabulary."""
    ids = _as_int_list(ids)
    bad = [i for i in ids if not 0 <= i < len(vocab)]
    if bad:
        raise ValueError(f"ids outside 0..{len(vocab) - 1}: {bad[:10]}")
    return "".join(vocab[i] for i in ids)


# ---------------------------------------------------------------------------------------
# Character tokenizer
# ---------------------------------------------------------------------------------------


class CharTokenizer:
    """One token per character.

    The vocabulary is the sorted set of characters seen by :meth:`fit`, so the ids do
    not depend on the order of the text, only on which characters it contains.

    >>> tok = CharTokenizer.fit("hello")
    >>> tok.vocab
    ['e', 'h', 'l', 'o']
    >>> tok.encode("hole")
    [1, 3, 2, 0]
    >>> tok.decode([1, 3, 2, 0])
    'hole'
    """

    def __init__(self, vocab: Sequence[str]):
        vocab = list(vocab)
        for ch in vocab:
            if not isinstance(ch, str) or len(ch) != 1:
                raise ValueError(f"vocab entries must be single characters, got {ch!r}")
        if len(set(vocab)) != len(vocab):
            raise ValueError(f"vocab has repeated characters: {vocab}")
        self.vocab: list[str] = vocab
        self.stoi: dict[str, int] = {ch: i for i, ch in enumerate(vocab)}

    @classmethod
    def fit(cls, text: str) -> "CharTokenizer":
        """Build the tokenizer whose vocabulary is the sorted characters of ``text``."""
        if not isinstance(text, str) or not text:
            raise ValueError("text must be a non-empty string")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            raise ValueError(f"text has characters outside the vocabulary: {unknown}")
        return [self.stoi[ch] for ch in text]

    def decode(self, ids) -> str:
        return _decode(self.vocab, ids)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


# ---------------------------------------------------------------------------------------
# Byte-pair encoding (over characters), trained on the spot
# ---------------------------------------------------------------------------------------

# A text is first cut into chunks: a word together with the whitespace before it, or a
# run of whitespace at the end. Merges never cross a chunk boundary, so " the" can become
# one token but "e t" cannot. The pattern matches every character exactly once, which is
# what makes decode(encode(s)) == s hold for any s.
_CHUNK = re.compile(r"\s*\S+|\s+")


def _chunks(text: str) -> list[str]:
    return _CHUNK.findall(text)


class BPETokenizer:
    """Byte-pair encoding over characters.

    Training starts from the sorted characters of the text (ids ``0..len(alphabet)-1``)
    and repeats ``num_merges`` times: count adjacent token pairs inside each chunk (a
    word with its leading whitespace), merge the most frequent pair into a new token.
    Ties go to the pair whose joined string sorts first, so training is deterministic.

    Attributes
    ----------
    alphabet : list of str
        the single characters, sorted; their ids come first.
    merges : list of (str, str)
        the learned merges, in the order they were learned (their rank).
    vocab : list of str
        the string of every token id: the alphabet, then one entry per merge.
    """

    def __init__(self, alphabet: Sequence[str], merges: Sequence[tuple[str, str]] = ()):
        self.alphabet = list(alphabet)
        if sorted(set(self.alphabet)) != self.alphabet or any(len(c) != 1 for c in self.alphabet):
            raise ValueError("alphabet must be sorted, distinct single characters")
        self.vocab: list[str] = list(self.alphabet)
        self.stoi: dict[str, int] = {s: i for i, s in enumerate(self.vocab)}
        self.merges: list[tuple[str, str]] = []
        self._ranks: dict[tuple[int, int], int] = {}  # (left id, right id) -> id of the merge
        for left, right in merges:
            self._add_merge(left, right)

    def _add_merge(self, left: str, right: str) -> int:
        if left not in self.stoi or right not in self.stoi:
            raise ValueError(f"merge ({left!r}, {right!r}) uses a token not yet in the vocabulary")
        joined = left + right
        if joined in self.stoi:
            raise ValueError(f"merge ({left!r}, {right!r}) makes {joined!r}, already a token")
        new_id = len(self.vocab)
        self.vocab.append(joined)
        self.stoi[joined] = new_id
        self.merges.append((left, right))
        self._ranks[(self.stoi[left], self.stoi[right])] = new_id
        return new_id

    @classmethod
    def train(cls, text: str, num_merges: int) -> "BPETokenizer":
        """Learn up to ``num_merges`` merges from ``text`` (fewer if no pair repeats)."""
        if not isinstance(text, str) or not text:
            raise ValueError("text must be a non-empty string")
        if num_merges < 0:
            raise ValueError(f"num_merges must be >= 0, got {num_merges}")
        tok = cls(sorted(set(text)))
        # Each distinct chunk is tokenized once and weighted by how often it occurs.
        words = Counter(_chunks(text))
        seqs = [[tok.stoi[ch] for ch in w] for w in words]
        counts = list(words.values())
        for _ in range(num_merges):
            pairs: Counter = Counter()
            for seq, c in zip(seqs, counts):
                for a, b in zip(seq, seq[1:]):
                    pairs[(a, b)] += c
            if not pairs:
                break
            best = max(pairs.values())
            if best < 2:  # a pair seen once saves one token, not worth a new row of the table
                break
            pair = min(
                (p for p, c in pairs.items() if c == best),
                key=lambda p: (tok.vocab[p[0]] + tok.vocab[p[1]], p),
            )
            new_id = tok._add_merge(tok.vocab[pair[0]], tok.vocab[pair[1]])
            seqs = [_merge(s, *pair, new_id) if len(s) > 1 else s for s in seqs]
        return tok

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def _encode_chunk(self, chunk: str) -> list[int]:
        symbols = [self.stoi[ch] for ch in chunk]
        # Apply the learned merges in the order they were learned: always the
        # lowest-ranked pair present, as training did.
        while len(symbols) > 1:
            candidates = [
                self._ranks[p] for p in zip(symbols, symbols[1:]) if p in self._ranks
            ]
            if not candidates:
                break
            new_id = min(candidates)
            left, right = self.merges[new_id - len(self.alphabet)]
            symbols = _merge(symbols, self.stoi[left], self.stoi[right], new_id)
        return symbols

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - set(self.alphabet))
        if unknown:
            raise ValueError(f"text has characters outside the training alphabet: {unknown}")
        ids: list[int] = []
        for chunk in _chunks(text):
            ids.extend(self._encode_chunk(chunk))
        return ids

    def decode(self, ids) -> str:
        return _decode(self.vocab, ids)

    def __repr__(self) -> str:
        return f"BPETokenizer(alphabet={len(self.alphabet)}, merges={len(self.merges)})"


# ---------------------------------------------------------------------------------------
# Number words
# ---------------------------------------------------------------------------------------

_ONES = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
    "seventeen", "eighteen", "nineteen",
]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _below_100(n: int, hyphen: bool) -> str:
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    if ones == 0:
        return _TENS[tens]
    return _TENS[tens] + ("-" if hyphen else " ") + _ONES[ones]


def _below_1000(n: int, hyphen: bool) -> str:
    hundreds, rest = divmod(n, 100)
    if hundreds == 0:
        return _below_100(rest, hyphen)
    words = _ONES[hundreds] + " hundred"
    if rest:
        words += " and " + _below_100(rest, hyphen)
    return words


def number_to_words(n: int, hyphen: bool = True) -> str:
    """Write ``0 <= n <= 999999`` in words, British style.

    British English says "and" before the tens and units: 407 is "four hundred and
    seven", and 1007 is "one thousand and seven" (the "and" also appears when a
    thousands group is followed directly by a number below one hundred). Compound tens
    take a hyphen ("twenty-one"); pass ``hyphen=False`` for "twenty one", which gives a
    smaller word vocabulary when splitting on spaces.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ValueError(f"n must be an integer, got {type(n).__name__}")
    n = int(n)
    if not 0 <= n <= 999_999:
        raise ValueError(f"n must be in 0..999999, got {n}")
    thousands, rest = divmod(n, 1000)
    if thousands == 0:
        return _below_1000(rest, hyphen)
    words = _below_1000(thousands, hyphen) + " thousand"
    if rest == 0:
        return words
    if rest < 100:
        return words + " and " + _below_100(rest, hyphen)
    return words + " " + _below_1000(rest, hyphen)


def number_split(
    max_value: int = 999, held_out_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Split ``0..max_value`` into training numbers and held-out numbers.

    Returns two sorted, disjoint integer arrays whose union is ``0..max_value``. The
    held-out numbers are the test of generalisation: pass them as ``exclude`` to
    :func:`number_words_dataset` and the model never sees them during training.
    """
    if max_value < 1:
        raise ValueError(f"max_value must be >= 1, got {max_value}")
    if not 0.0 < held_out_fraction < 1.0:
        raise ValueError(f"held_out_fraction must be in (0, 1), got {held_out_fraction}")
    rng = np.random.default_rng(seed)
    numbers = rng.permutation(max_value + 1)
    n_held = max(1, int(round(held_out_fraction * (max_value + 1))))
    return np.sort(numbers[n_held:]), np.sort(numbers[:n_held])


def number_words_dataset(
    n_samples: int,
    seed: int = 0,
    max_value: int = 999,
    exclude: Iterable[int] | None = None,
    hyphen: bool = True,
) -> list[tuple[str, str]]:
    """``n_samples`` pairs ``(words, digits)``, e.g. ``("four hundred and seven", "407")``.

    Numbers are drawn uniformly, with replacement, from ``0..max_value`` minus
    ``exclude``. To evaluate on unseen numbers, split first with :func:`number_split`,
    train on ``number_words_dataset(n, seed, exclude=held_out)`` and test on
    ``[(number_to_words(k), str(k)) for k in held_out]``.
    """
    if n_samples < 0:
        raise ValueError(f"n_samples must be >= 0, got {n_samples}")
    if not 0 <= max_value <= 999_999:
        raise ValueError(f"max_value must be in 0..999999, got {max_value}")
    pool = np.arange(max_value + 1)
    if exclude is not None:
        pool = np.setdiff1d(pool, np.asarray(list(exclude), dtype=np.int64))
    if pool.size == 0:
        raise ValueError(f"exclude removes every number in 0..{max_value}")
    rng = np.random.default_rng(seed)
    drawn = rng.choice(pool, size=n_samples, replace=True)
    return [(number_to_words(int(k), hyphen=hyphen), str(int(k))) for k in drawn]


# ---------------------------------------------------------------------------------------
# Addition as text
# ---------------------------------------------------------------------------------------


def addition_dataset(
    n: int, digits: int = 3, seed: int = 0, reverse_answer: bool = False, pad: bool = False
) -> list[str]:
    """``n`` addition problems as strings ``"a+b=c"``.

    ``a`` and ``b`` are drawn uniformly from ``0 .. 10**digits - 1``; ``c = a + b``.

    Format: ``"123+456=579"`` (no spaces, no leading zeros). With ``pad=True`` the
    operands are zero-padded to ``digits`` characters and the answer to ``digits + 1``
    (``"007+095=0102"``), so every string has the same length ``3 * digits + 3``.

    With ``reverse_answer=True`` the answer is written least significant digit first
    (``"123+456=975"``). Why that helps a left-to-right model: column addition produces
    the units digit first and passes a carry leftwards. Written in the usual order, the
    first answer digit the model must emit depends on every carry below it; reversed,
    each digit depends only on two operand digits and the carry out of the digit the
    model has just written, which it can read back through attention.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= digits <= 18:
        raise ValueError(f"digits must be in 1..18, got {digits}")
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 10**digits, size=n)
    b = rng.integers(0, 10**digits, size=n)
    out = []
    for x, y in zip(a.tolist(), b.tolist()):
        s = x + y
        if pad:
            xs, ys, ss = f"{x:0{digits}d}", f"{y:0{digits}d}", f"{s:0{digits + 1}d}"
        else:
            xs, ys, ss = str(x), str(y), str(s)
        if reverse_answer:
            ss = ss[::-1]
        out.append(f"{xs}+{ys}={ss}")
    return out


# ---------------------------------------------------------------------------------------
# Shipped corpus
# ---------------------------------------------------------------------------------------


def load_corpus(name: str = "tiny_corpus") -> str:
    """Return a text shipped in ``tfbook/corpus/`` (``name`` without ``.txt``).

    ``"tiny_corpus"`` is a few kilobytes of plain English prose written for this
    project (a story about a lighthouse keeper who counts and a note on how a reader
    attends to words), small enough to train on in seconds (:mod:`tfbook.tasks.corpus`);
    too small for samples that read as sentences. Chapter 1 fits its tokenizers on it.
    No chapter's language model trains on it: chapter 13's models (whose samples chapter 11
    shows) train on the 1.25 MB King James text (``kjv_prose.txt.gz``, read by
    :func:`tfbook.tasks.prose.load_text`, not by this function).
    """
    folder = resources.files("tfbook") / "corpus"
    path = folder / f"{name}.txt"
    if not path.is_file():
        names = sorted(p.name[:-4] for p in folder.iterdir() if p.name.endswith(".txt"))
        raise ValueError(f"no corpus named {name!r}; available: {names}")
    return path.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------
# 8x8 digits (bundled with scikit-learn, read offline)
# ---------------------------------------------------------------------------------------


class DigitsSplit(NamedTuple):
    """Images ``(N, 1, 8, 8)`` float32 in [0, 1] and labels ``(N,)`` int64 in 0..9."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray


def load_digits_images(test_fraction: float = 0.25, seed: int = 0) -> DigitsSplit:
    """The 1797 8x8 grey-scale digits of scikit-learn, split by class into train/test.

    Pixel values (0..16 in the file) are divided by 16. The split is stratified: each
    digit class keeps (to within one image) the same share in train and test. It is a
    function of ``seed`` only.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images.astype(np.float32) / np.float32(16.0))[:, None, :, :]
    labels = bunch.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    test_idx = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        test_idx.append(idx[: int(round(test_fraction * idx.size))])
    test_mask = np.zeros(labels.size, dtype=bool)
    test_mask[np.concatenate(test_idx)] = True
    return DigitsSplit(images[~test_mask], labels[~test_mask], images[test_mask], labels[test_mask])


# ---------------------------------------------------------------------------------------
# Batching
# ---------------------------------------------------------------------------------------


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Stack id sequences of different lengths.

    Returns ``ids (B, T_max)`` int64, filled with ``pad_id`` past each sequence's end,
    and ``valid (B, T_max)`` bool, True at real tokens.
    """
    sequences = [list(s) for s in sequences]
    if not sequences:
        raise ValueError("sequences is empty")
    T = max(len(s) for s in sequences)
    ids = np.full((len(sequences), T), pad_id, dtype=np.int64)
    valid = np.zeros((len(sequences), T), dtype=bool)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = s
        valid[i, : len(s)] = True
    return ids, valid
