"""Byte-level byte-pair encoding, the kind GPT-2 uses, in plain Python.

The character tokenizers of :mod:`tfbook.data` only know the characters of their
training text. This one starts from the 256 values a byte can take, so *every* string
encodes (its UTF-8 bytes), there is no unknown token, and ``decode(encode(s)) == s`` for
every Python string ``s``.

Pipeline of :meth:`ByteBPETokenizer.encode`:

1. **special tokens** (such as ``<|endoftext|>``) are cut out first and get their own
   ids; they are never split. The text is scanned left to right and at each position
   the *longest* special token that starts there wins, so with the specials
   ``"<|endoftext|>"`` and ``"<|endoftext|><|endoftext|>"`` the doubled string is one
   token.
2. **pre-tokenization**: the text between special tokens is cut into pieces by
   :func:`gpt2_split` (the GPT-2 pattern, written for the standard-library :mod:`re`;
   :func:`pretokenize`). Merges never cross a piece boundary.
3. **merges**: each piece is turned into its UTF-8 bytes (ids ``0..255``) and the learned
   merges are applied in the order they were learned.

Ids: ``0..255`` are the bytes, ``256 .. 256 + M - 1`` the ``M`` merges in the order
they were learned, then the special tokens in the order given.

Training (:meth:`ByteBPETokenizer.train`) counts pairs over the *distinct* pieces of the
text, each weighted by how often it occurs, and after each merge updates only the pieces
that contain the merged pair (an index pair -> pieces, a heap of counts). **Tie rule**: the
most frequent pair wins; among pairs with the same count, the pair ``(left, right)``
whose byte strings sort first (compare the left tokens' bytes, then the right tokens'
bytes; two tokens can spell the same bytes, and then the smaller ids win). Training
stops early when no pair occurs twice.
"""

from __future__ import annotations

import functools
import heapq
import json
import operator
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator, Sequence

__all__ = [
    "GPT2_PATTERN",
    "WHITE_SPACE",
    "gpt2_split",
    "pretokenize",
    "ByteBPETokenizer",
]

#: GPT-2's pre-tokenizing pattern as published, for the third-party ``regex`` module
#: (``\p{L}``: any letter, ``\p{N}``: any number). :func:`gpt2_split` is the same pattern
#: written for the standard library's :mod:`re`, which has no ``\p{...}``.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

#: The 25 code points with Unicode's White_Space property, the ``\s`` of ``regex``.
#: ``re``'s own ``\s`` (``str.isspace``) also matches U+001C..U+001F, which are not
#: White_Space, so the pattern spells the set out.
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + \
    "\u2028\u2029\u202f\u205f\u3000"


def _class_ranges(codepoints: list[int]) -> str:
    """The body of a character class matching exactly ``codepoints`` (sorted)."""
    out = []
    i = 0
    while i < len(codepoints):
        j = i
        while j + 1 < len(codepoints) and codepoints[j + 1] == codepoints[j] + 1:
            j += 1
        lo, hi = codepoints[i], codepoints[j]
        out.append(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}")
        i = j + 1
    return "".join(out)


@functools.lru_cache(maxsize=1)
def _numbers_not_digits() -> str:
    """Class body for the Unicode categories Nl and No (letter-like and other numbers).

    In ``re``, ``\\w`` is exactly letters (L), numbers (N) and ``_``, and ``\\d`` is exactly
    the decimal digits (Nd), both taken from the running Python's Unicode database. The
    numbers that are not decimal digits (``'²'``, ``'½'``, ``'Ⅻ'``) are the one piece
    ``re`` cannot name, so they are listed, from that same database (about 1,100 code
    points in some 80 ranges; computed once, in about 0.2 s).
    """
    every = "".join(map(chr, range(0x110000)))
    alnum_not_digit = re.sub(r"[\W\d_]+", "", every)  # letters, Nl and No
    return _class_ranges([ord(c) for c in alnum_not_digit if not c.isalpha()])


@functools.lru_cache(maxsize=1)
def gpt2_split() -> re.Pattern:
    r"""GPT-2's pre-tokenizing pattern (:data:`GPT2_PATTERN`) compiled for the standard
    :mod:`re`; built on the first call (about 0.2 s), then cached.

    ``\p{L}`` becomes ``[^\W\d_]`` without the non-decimal numbers, ``\p{N}`` becomes
    ``\d`` with them, and ``\s`` the 25 code points of :data:`WHITE_SPACE`.
    """
    ws = re.escape(WHITE_SPACE)
    nl_no = _numbers_not_digits()
    letter = rf"[^\W\d_{nl_no}]"  # \p{L}: word characters that are no digit, no number, not _
    number = rf"[\d{nl_no}]"  # \p{N}: decimal digits and the other numbers
    other = rf"(?:[^{ws}\w]|_)"  # [^\s\p{L}\p{N}]: neither white space, letter nor number ('_' is one)
    return re.compile(
        r"'s|'t|'re|'ve|'m|'ll|'d"  # English contractions, split off the word before
        rf"| ?{letter}+"  # a word, with at most one leading space
        rf"| ?{number}+"  # a run of digits, with at most one leading space
        rf"| ?{other}+"  # a run of punctuation and symbols, with at most one leading space
        rf"|[{ws}]+(?![^{ws}])"  # white space, leaving its last character to the next word
        rf"|[{ws}]+"  # what is left: one white-space character before a non-space
    )


def pretokenize(text: str) -> list[str]:
    """Cut ``text`` into the pieces BPE merges within (GPT-2's rule).

    The pieces, joined, give ``text`` back: every character belongs to exactly one.

    >>> pretokenize("I'm  here, 42 times!")
    ['I', "'m", ' ', ' here', ',', ' 42', ' times', '!']
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    return gpt2_split().findall(text)


def _merge(ids: list[int], a: int, b: int, new_id: int) -> list[int]:
    """Replace each occurrence of the pair ``(a, b)``, left to right without overlap."""
    out: list[int] = []
    i, n = 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == a and ids[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _check_specials(special_tokens) -> list[str]:
    if isinstance(special_tokens, str) or not isinstance(special_tokens, (list, tuple)):
        raise ValueError("special_tokens must be a list or tuple of strings, "
                         f"got {type(special_tokens).__name__}")
    for s in special_tokens:
        if not isinstance(s, str) or not s:
            raise ValueError(f"special_tokens must be non-empty strings, got {s!r}")
    if len(set(special_tokens)) != len(special_tokens):
        raise ValueError(f"special_tokens has repeated entries: {list(special_tokens)}")
    return list(special_tokens)


def _as_int(value, must: str) -> int:
    """``value`` as an int (anything with ``__index__``, not a bool); else ``ValueError(must, got value)``."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise ValueError(f"{must}, got {value!r}")


def _check_count(name: str, value, minimum: int = 0) -> int:
    value = _as_int(value, f"{name} must be an integer")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


class ByteBPETokenizer:
    """Byte-level BPE: bytes ``0..255``, then learned merges, then special tokens.

    Parameters
    ----------
    merges : sequence of (int, int)
        the learned merges as pairs of ids, in the order learned; merge ``k`` makes id
        ``256 + k`` and may only use ids below that.
    special_tokens : sequence of str
        strings that are never split; they get the ids after the merges.

    Attributes
    ----------
    vocab : list of bytes
        the bytes of every id below ``256 + len(merges)``.
    special_ids : dict str -> int
    """

    #: :meth:`encode_iterable` encodes once this many characters are buffered
    STREAM_BLOCK = 1 << 12
    #: most pieces remembered by the encoder's cache (it is cleared when full)
    CACHE_SIZE = 1 << 12

    def __init__(self, merges: Sequence[tuple[int, int]] = (), special_tokens: Sequence[str] = ()):
        self.special_tokens = _check_specials(special_tokens)
        if isinstance(merges, (str, bytes)) or not hasattr(merges, "__iter__"):
            raise ValueError(f"merges must be a sequence of (left id, right id) pairs, got {type(merges).__name__}")
        self.vocab: list[bytes] = [bytes([b]) for b in range(256)]
        self.merges: list[tuple[int, int]] = []
        self._ranks: dict[tuple[int, int], int] = {}  # (left, right) -> id of the merged token
        for k, pair in enumerate(merges):
            try:
                if isinstance(pair, (str, bytes)) or len(pair) != 2 or any(isinstance(x, bool) for x in pair):
                    raise TypeError
                a, b = (operator.index(x) for x in pair)
            except (TypeError, ValueError):
                raise ValueError(f"merges[{k}] must be a pair of integer ids, got {pair!r}") from None
            new_id = 256 + k
            if not (0 <= a < new_id and 0 <= b < new_id):
                raise ValueError(f"merges[{k}] = {pair!r} uses an id outside 0..{new_id - 1}")
            if (a, b) in self._ranks:
                raise ValueError(f"merges[{k}] = {pair!r} repeats an earlier merge")
            self.merges.append((a, b))
            self._ranks[(a, b)] = new_id
            self.vocab.append(self.vocab[a] + self.vocab[b])
        first = len(self.vocab)
        self.special_ids: dict[str, int] = {s: first + k for k, s in enumerate(self.special_tokens)}
        self._special_of = {i: s for s, i in self.special_ids.items()}
        # longest first: at one position, the longest special token that starts there wins
        self._special_re = (re.compile("|".join(re.escape(s) for s in sorted(self.special_tokens, key=len, reverse=True)))
                            if self.special_tokens else None)
        self._cache: dict[str, tuple[int, ...]] = {}

    # -- sizes ---------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Bytes + merges + special tokens."""
        return len(self.vocab) + len(self.special_tokens)

    def __repr__(self) -> str:
        return (f"ByteBPETokenizer(merges={len(self.merges)}, special_tokens={len(self.special_tokens)}, "
                f"vocab_size={self.vocab_size})")

    # -- training ------------------------------------------------------------------------

    @classmethod
    def train(cls, text: str, vocab_size: int | None = None, *, num_merges: int | None = None,
              special_tokens: Sequence[str] = ()) -> "ByteBPETokenizer":
        """Learn merges from ``text``: give ``vocab_size`` (bytes + merges + specials) or
        ``num_merges``. Fewer merges are learned if no pair occurs twice.

        Special tokens are cut out of the training text first, so no merge crosses them
        and none of their bytes are counted. Ties follow the rule in the module's
        docstring: most frequent, then the smallest ``(left bytes, right bytes)``.
        """
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        specials = _check_specials(special_tokens)
        if (vocab_size is None) == (num_merges is None):
            raise ValueError("give exactly one of vocab_size and num_merges, "
                             f"got vocab_size={vocab_size!r}, num_merges={num_merges!r}")
        if vocab_size is not None:
            floor = 256 + len(specials)
            num_merges = _check_count("vocab_size", vocab_size, floor) - floor
        else:
            num_merges = _check_count("num_merges", num_merges)
        pieces: Counter = Counter()
        for segment in (cls(special_tokens=specials)._split_specials(text) if specials else [text]):
            if isinstance(segment, str):
                pieces.update(pretokenize(segment))
        return cls(_learn_merges(pieces, num_merges), specials)

    # -- encoding ------------------------------------------------------------------------

    def _split_specials(self, text: str) -> list:
        """Text segments (str) and special-token ids (int), in order."""
        if self._special_re is None:
            return [text] if text else []
        out: list = []
        start = 0
        for m in self._special_re.finditer(text):
            if m.start() > start:
                out.append(text[start:m.start()])
            out.append(self.special_ids[m.group()])
            start = m.end()
        if start < len(text):
            out.append(text[start:])
        return out

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        ids = list(piece.encode("utf-8"))
        ranks = self._ranks
        while len(ids) > 1:
            # the pair learned first among those present (its new id is the smallest)
            new_id = min((ranks.get(p, 1 << 62) for p in zip(ids, ids[1:])))
            if new_id == 1 << 62:
                break
            a, b = self.merges[new_id - 256]
            ids = _merge(ids, a, b, new_id)
        if len(self._cache) >= self.CACHE_SIZE:
            self._cache.clear()
        self._cache[piece] = out = tuple(ids)
        return out

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``: special tokens whole, the rest as merged UTF-8 bytes."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        out: list[int] = []
        for segment in self._split_specials(text):
            if isinstance(segment, int):
                out.append(segment)
            else:
                for piece in gpt2_split().findall(segment):
                    out.extend(self._encode_piece(piece))
        return out

    def _stable_prefix(self, buf: str) -> tuple[int, list]:
        """``(cut, items)``: the special-token ids and pieces of ``buf[:cut]`` that no
        continuation of ``buf`` can change, for the largest such ``cut``.

        Special tokens: a match starting at ``i`` is final once the longest special
        token fits (``i + L <= len(buf)``), so only starts below ``limit = len - L + 1``
        are decided. Pieces: matching a piece ``[p, e)`` reads characters up to index
        ``e + 1`` at most (a contraction reads ``p..p+2``; a run reads the character that
        stops it; white space followed by a word reads the word's first character and
        gives back one space), so a piece is final when ``e + 2 <= limit``. The pieces
        are returned as found in ``buf``: pre-tokenizing ``buf[:cut]`` alone could differ
        (``"\n\n"`` alone is one piece; followed by a word it is two).
        """
        n = len(buf)
        L = max((len(s) for s in self.special_tokens), default=1)
        limit = n - L + 1
        pattern = gpt2_split()
        items: list = []
        text_start = 0
        if self._special_re is not None:
            for m in self._special_re.finditer(buf):
                if m.start() >= limit:
                    break
                items.extend(pattern.findall(buf, text_start, m.start()))  # a finished segment
                items.append(self.special_ids[m.group()])
                text_start = m.end()
        cut = text_start
        for m in pattern.finditer(buf, text_start):
            if m.end() + 2 > limit:
                break
            items.append(m.group())
            cut = m.end()
        return cut, items

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """Ids of the concatenation of the strings in ``iterable`` (lines of a file, say),
        read lazily: memory holds one block of text, not the stream.

        Equals ``encode("".join(iterable))``. The text is encoded up to the last point
        that no later text can change (:meth:`_stable_prefix`); the rest waits for more. So
        memory is bounded by :attr:`STREAM_BLOCK` plus the longest piece and the longest
        chunk of the iterable, and the encoder's cache of at most :attr:`CACHE_SIZE` pieces.
        The argument is checked at the call, its items as they are read.
        """
        if isinstance(iterable, (str, bytes)) or not hasattr(iterable, "__iter__"):
            raise ValueError("iterable must be an iterable of strings (e.g. an open text file), "
                             f"got {type(iterable).__name__}")
        return self._stream(iterable)

    def _stream(self, iterable: Iterable[str]) -> Iterator[int]:
        buf = ""
        for k, chunk in enumerate(iterable):
            if not isinstance(chunk, str):
                raise ValueError(f"iterable must yield strings, item {k} is {type(chunk).__name__}")
            buf += chunk
            if len(buf) >= self.STREAM_BLOCK:
                cut, items = self._stable_prefix(buf)
                for item in items:
                    if isinstance(item, int):
                        yield item
                    else:
                        yield from self._encode_piece(item)
                buf = buf[cut:]
        yield from self._iter_encode(buf)

    def _iter_encode(self, text: str) -> Iterator[int]:
        """:meth:`encode` as a generator: no list of pieces or ids is built."""
        for segment in self._split_specials(text):
            if isinstance(segment, int):
                yield segment
            else:
                for m in gpt2_split().finditer(segment):
                    yield from self._encode_piece(m.group())

    # -- decoding ------------------------------------------------------------------------

    def decode_bytes(self, ids) -> bytes:
        """The bytes of ``ids`` joined (special tokens as their UTF-8 bytes)."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise ValueError(f"ids must be a sequence of integers, got {type(ids).__name__}")
        n, parts = len(self.vocab), []
        for i in ids:
            i = _as_int(i, "ids must be integers")
            if 0 <= i < n:
                parts.append(self.vocab[i])
            elif i in self._special_of:
                parts.append(self._special_of[i].encode("utf-8"))
            else:
                raise ValueError(f"ids must lie in 0..{self.vocab_size - 1}, got {i}")
        return b"".join(parts)

    def decode(self, ids, errors: str = "replace") -> str:
        """The text of ``ids``. Ids from :meth:`encode` decode exactly; an arbitrary id
        sequence may cut a character's bytes, and ``errors`` (as in ``bytes.decode``)
        says what to do then."""
        if errors not in ("strict", "replace", "ignore", "backslashreplace"):
            raise ValueError(f"errors must be 'strict', 'replace', 'ignore' or 'backslashreplace', got {errors!r}")
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    # -- files ---------------------------------------------------------------------------

    def save(self, path) -> None:
        """Write merges, vocabulary (hex bytes, for reading) and special tokens as JSON."""
        if not isinstance(path, (str, Path)):
            raise ValueError(f"path must be a str or Path, got {type(path).__name__}")
        data = {"format": "tfbook-byte-bpe-1", "pattern": GPT2_PATTERN,
                "merges": [list(p) for p in self.merges],
                "vocab": {str(i): self.vocab[i].hex() for i in range(256, len(self.vocab))},
                "special_tokens": self.special_tokens}
        Path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path) -> "ByteBPETokenizer":
        """Read a file written by :meth:`save`; the vocabulary is checked against the merges."""
        if not isinstance(path, (str, Path)):
            raise ValueError(f"path must be a str or Path, got {type(path).__name__}")
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"path {str(path)!r} is not a readable tokenizer file: {err}") from None
        if not isinstance(data, dict) or data.get("format") != "tfbook-byte-bpe-1":
            raise ValueError(f"path {str(path)!r} is not a tfbook byte-BPE file")
        try:
            tok = cls([tuple(p) for p in data["merges"]], data["special_tokens"])
            vocab = dict(data.get("vocab", {}))
            bad = [i for i, hx in vocab.items() if tok.vocab[int(i)].hex() != hx]
        except (KeyError, TypeError, IndexError, ValueError) as err:
            raise ValueError(f"path {str(path)!r} holds a malformed tokenizer: {err}") from None
        if bad:
            raise ValueError(f"path {str(path)!r}: vocab entries {bad[:5]} do not match the merges")
        return tok


def _learn_merges(pieces: Counter, num_merges: int) -> list[tuple[int, int]]:
    """Learn up to ``num_merges`` merges from ``pieces`` (piece -> count): the fast way.

    Pairs are counted once over the distinct pieces, weighted by their counts. A merge
    only changes the pieces that contain its pair, so after each merge only those are
    recounted (``where`` maps a pair to the pieces that contain it, perhaps stale). The
    best pair comes from a heap of ``(-count, left bytes, right bytes, left, right)``:
    its smallest entry is the most frequent pair, ties going to the smallest bytes. An
    entry whose count is out of date is dropped when it reaches the top.
    """
    vocab = [bytes([b]) for b in range(256)]
    words = [list(p.encode("utf-8")) for p in pieces]
    freq = list(pieces.values())
    counts: dict[tuple[int, int], int] = {}
    where: dict[tuple[int, int], set[int]] = {}
    for w, (ids, f) in enumerate(zip(words, freq)):
        for pair in zip(ids, ids[1:]):
            counts[pair] = counts.get(pair, 0) + f
            where.setdefault(pair, set()).add(w)
    heap = [(-c, vocab[a], vocab[b], a, b) for (a, b), c in counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[int, int]] = []
    while len(merges) < num_merges:
        while heap and counts.get((heap[0][3], heap[0][4]), 0) != -heap[0][0]:
            heapq.heappop(heap)  # out of date
        if not heap or -heap[0][0] < 2:
            break
        _, left, right, a, b = heapq.heappop(heap)
        new_id = 256 + len(merges)
        merges.append((a, b))
        vocab.append(left + right)
        delta: dict[tuple[int, int], int] = {}
        for w in where.pop((a, b)):
            old = words[w]
            new = _merge(old, a, b, new_id)
            if len(new) == len(old):
                continue  # stale entry: this piece no longer holds the pair
            f = freq[w]
            for pair in zip(old, old[1:]):
                delta[pair] = delta.get(pair, 0) - f
            for pair in zip(new, new[1:]):
                delta[pair] = delta.get(pair, 0) + f
                where.setdefault(pair, set()).add(w)
            words[w] = new
        for pair, d in delta.items():
            if d == 0 or pair == (a, b):
                continue
            c = counts.get(pair, 0) + d
            if c > 0:
                counts[pair] = c
                heapq.heappush(heap, (-c, vocab[pair[0]], vocab[pair[1]], pair[0], pair[1]))
            else:
                counts.pop(pair, None)
                where.pop(pair, None)
        del counts[(a, b)]
    return merges
