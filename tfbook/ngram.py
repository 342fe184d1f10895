"""The classical language models a reviewer compares a character transformer with.

* :class:`KneserNey`: interpolated Kneser-Ney character n-grams (Kneser & Ney 1995, in the
  interpolated form of Chen & Goodman 1999), with one discount per order (``modified=False``)
  or three (``modified=True``: counts of 1, 2 and 3 or more, Chen & Goodman's *modified*
  Kneser-Ney). The discounts start at Chen & Goodman's closed-form estimates from the counts
  of counts and are scaled by one factor chosen on validation text (:func:`fit_kneser_ney`).
  Any order works: n-grams are numbered level by level (an n-gram's id is the rank of the
  pair (id of its first n-1 characters, last character)), so no key ever overflows.
* :func:`compressed_bits`: the code length of a text *given* a training text under a
  general-purpose compressor (7-Zip's PPMd, xz, bzip2, gzip), as
  ``8 * (size(train + text) - size(train))`` bits. A compressor is a language model: an
  arithmetic coder spends ``-log2 p(c | past)`` bits on a character, so bits per character
  is a cross-entropy. PPMd (Shkarin's PPM variant H) needs the ``7zz`` program (Debian's
  ``7zip`` package; the Makefile installs it).

Bits are always those of the characters after a given start, each predicted from the text
before it, so every model here and the transformer of :mod:`tfbook.tasks.prose` are scored
on the same characters from the same preceding text.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["KneserNey", "fit_kneser_ney", "COMPRESSORS", "compressed_size", "compressed_bits",
           "fit_ppmd"]


def _ids(name: str, x, vocab_size: int, min_len: int = 1) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size < min_len:
        raise ValueError(f"{name} needs at least {min_len} ids, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} must hold integer ids, got dtype {a.dtype}")
    a = a.astype(np.int64)
    if a.size and (a.min() < 0 or a.max() >= vocab_size):
        raise ValueError(f"{name} ids must be in 0..{vocab_size - 1} (vocab_size={vocab_size}), "
                         f"got min {a.min()} max {a.max()}")
    return a


class KneserNey:
    """Interpolated (modified) Kneser-Ney character n-gram model of order ``order``.

    For a context ``h`` of ``n - 1`` characters and a character ``c``::

        p_n(c | h) = max(a(h c) - D(a(h c)), 0) / A(h) + gamma(h) p_{n-1}(c | h')
        gamma(h)   = sum_c D(a(h c)) [a(h c) > 0] / A(h),      A(h) = sum_c a(h c)

    where ``h'`` drops the oldest character. At the highest order ``a`` is the count in the
    training text; below it, the *continuation count*: the number of distinct characters
    seen before ``h c`` (Kneser and Ney's observation: a lower order is used only when the
    longer context is new, so it should model how many contexts a string completes, not
    how often it occurs). A context with ``A(h) = 0`` uses ``p_{n-1}`` unchanged. The
    recursion ends at ``p_0(c) = 1 / V``, so every character, seen or not, has probability
    above zero and each ``p_n(. | h)`` sums to 1 over the vocabulary.

    ``D(a)``: one discount per order for ``a >= 1`` (``modified=False``) or ``D_1, D_2,
    D_3+`` by count (``modified=True``); by default Chen & Goodman's estimates from the
    counts of counts ``n_k`` of that order, ``Y = n_1 / (n_1 + 2 n_2)``, ``D = Y`` (plain) or
    ``D_k = k - (k + 1) Y n_{k+1} / n_k`` (modified), times ``discount_scale`` and clipped
    to ``[0, k]`` (where a count of counts they need is zero: ``D = 0.5``, or ``D_k = k / 2``).
    """

    def __init__(self, train_ids, vocab_size: int, order: int, modified: bool = True,
                 discount_scale: float = 1.0):
        if int(vocab_size) != vocab_size or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        if int(order) != order or order < 1:
            raise ValueError(f"order must be an int >= 1, got {order!r}")
        self.V, self.order, self.modified = int(vocab_size), int(order), bool(modified)
        x = _ids("train_ids", train_ids, self.V, min_len=self.order)
        # level n (1..order): sorted pair keys (id of the first n-1 chars) * V + last char,
        # and the id of the n-gram at every position (its rank among the keys)
        self.keys, pos_ids, first_pos = [], [np.zeros(x.size + 1, dtype=np.int64)], []
        for n in range(1, self.order + 1):
            pair = pos_ids[n - 1][:x.size - n + 1] * self.V + x[n - 1:]
            keys, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
            self.keys.append(keys)
            pos_ids.append(inverse.astype(np.int64))
            first_pos.append(first)
        # a(.) per level: raw counts at the top, continuation counts below
        self.counts = []
        for n in range(1, self.order + 1):
            if n == self.order:
                a = np.bincount(pos_ids[n], minlength=self.keys[n - 1].size)
            else:  # distinct (n+1)-grams whose last n characters are this n-gram
                a = np.bincount(pos_ids[n][first_pos[n] + 1], minlength=self.keys[n - 1].size)
            self.counts.append(a.astype(np.int64))
        n_ctx = [1] + [k.size for k in self.keys[:-1]]  # contexts of level n: the (n-1)-grams
        self._ctx = []  # per level: prefix id of each n-gram, A(h), N_1(h.), N_2(h.), N_3+(h.)
        for n in range(1, self.order + 1):
            prefix = self.keys[n - 1] // self.V
            a = self.counts[n - 1]
            nc = n_ctx[n - 1]
            self._ctx.append((prefix,
                              np.bincount(prefix, weights=a, minlength=nc),
                              np.bincount(prefix, weights=a == 1, minlength=nc),
                              np.bincount(prefix, weights=a == 2, minlength=nc),
                              np.bincount(prefix, weights=a >= 3, minlength=nc)))
        self.estimates = [self._estimate(a) for a in self.counts]
        self.set_discount_scale(discount_scale)

    def _estimate(self, a: np.ndarray) -> tuple[float, float, float]:
        n = [np.count_nonzero(a == k) for k in range(1, 5)]
        if n[0] == 0:
            return (0.5, 1.0, 1.5) if self.modified else (0.5, 0.5, 0.5)
        Y = n[0] / (n[0] + 2 * n[1])
        if not self.modified:
            return (Y, Y, Y)
        return tuple(k - (k + 1) * Y * n[k] / n[k - 1] if n[k - 1] else 0.5 * k for k in (1, 2, 3))

    def set_discount_scale(self, scale: float) -> "KneserNey":
        """Discounts = ``scale`` x the closed-form estimates (clipped to ``[0, k]``); returns self."""
        if not np.isfinite(scale) or scale < 0:
            raise ValueError(f"discount_scale must be finite and >= 0, got {scale!r}")
        self.discount_scale = float(scale)
        self.discounts = [tuple(float(np.clip(scale * d, 0.0, k)) for k, d in zip((1, 2, 3), est))
                          for est in self.estimates]
        self._gamma = []
        for (prefix, A, n1, n2, n3), (d1, d2, d3) in zip(self._ctx, self.discounts):
            safe = np.where(A > 0, A, 1.0)
            self._gamma.append(np.where(A > 0, (d1 * n1 + d2 * n2 + d3 * n3) / safe, 1.0))
        return self

    def _lookup(self, n: int, ids_prev: np.ndarray, chars: np.ndarray) -> np.ndarray:
        """Ids at level ``n`` of (n-1)-gram id ``ids_prev`` followed by ``chars``; -1 if unseen."""
        keys = self.keys[n - 1]
        q = np.where(ids_prev >= 0, ids_prev, 0) * self.V + chars
        pos = np.minimum(np.searchsorted(keys, q), keys.size - 1)
        return np.where((ids_prev >= 0) & (keys[pos] == q), pos, -1)

    def probs(self, ids, start: int | None = None) -> np.ndarray:
        """``p(ids[t] | ids[t - order + 1 : t])`` for ``t = start .. len(ids) - 1`` (float64).

        ``start`` (default ``order - 1``) must leave ``order - 1`` characters of context
        before the first predicted one."""
        x = _ids("ids", ids, self.V, min_len=1)
        start = self.order - 1 if start is None else int(start)
        if not self.order - 1 <= start < x.size:
            raise ValueError(f"start must be in {self.order - 1}..len(ids)-1={x.size - 1} "
                             f"(order {self.order} needs {self.order - 1} characters of context), "
                             f"got {start} (ids: {x.shape})")
        t = np.arange(start, x.size)
        p = np.full(t.size, 1.0 / self.V)
        ctx = np.zeros(t.size, dtype=np.int64)  # id of the (n-1)-gram before t; level 1: the empty context
        for n in range(1, self.order + 1):
            prefix, A, n1, n2, n3 = self._ctx[n - 1]
            d1, d2, d3 = self.discounts[n - 1]
            full = self._lookup(n, ctx, x[t])
            a = np.where(full >= 0, self.counts[n - 1][np.maximum(full, 0)], 0)
            d = np.select([a == 0, a == 1, a == 2], [0.0, d1, d2], d3)
            hseen = ctx >= 0
            A_h = np.where(hseen, A[np.maximum(ctx, 0)], 0.0)
            g = np.where(hseen, self._gamma[n - 1][np.maximum(ctx, 0)], 1.0)
            use = A_h > 0
            p = np.where(use, np.maximum(a - d, 0.0) / np.where(use, A_h, 1.0) + g * p, p)
            if n < self.order:  # the context of level n + 1: the n characters before t
                ctx = self._context_ids(n, x, t)
        return p

    def _context_ids(self, n: int, x: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Ids at level ``n`` of the n characters before each position ``t`` (-1 if unseen)."""
        ids = np.zeros(t.size, dtype=np.int64)
        for k in range(1, n + 1):  # grow the string x[t-n : t] one character at a time
            ids = self._lookup(k, ids, x[t - n + k - 1])
        return ids

    def bits(self, ids, start: int | None = None) -> np.ndarray:
        """Code length ``-log2 p`` of each of ``ids[start:]`` (see :meth:`probs`)."""
        return -np.log2(self.probs(ids, start))

    def bits_per_char(self, ids, start: int | None = None) -> float:
        """Mean bits of ``ids[start:]``, each predicted from the characters before it."""
        return float(self.bits(ids, start).mean())

    def distribution(self, context) -> np.ndarray:
        """The next-character distribution after ``context`` (at least ``order - 1`` ids;
        only the last ``order - 1`` matter): ``V`` probabilities."""
        c = _ids("context", context, self.V, min_len=self.order - 1)
        c = c[c.size - (self.order - 1):] if self.order > 1 else c[:0]
        q = np.concatenate([np.tile(c, (self.V, 1)), np.arange(self.V)[:, None]], axis=1)
        return np.array([self.probs(row, self.order - 1)[0] for row in q])


SCALES = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2)


def fit_kneser_ney(train_ids, validation_ids, vocab_size: int, orders=(4, 6, 8, 10, 12),
                   modified: bool = True, scales=SCALES) -> tuple[KneserNey, dict]:
    """Count each order on ``train_ids`` and keep the (order, discount scale) with the lowest
    bits per character on ``validation_ids`` (each validation character predicted from the
    characters before it, the first ones from the end of the training text). Returns the
    model (set to the chosen scale) and ``{(order, scale): validation bpc}``."""
    tr = _ids("train_ids", train_ids, vocab_size, min_len=2)
    va = _ids("validation_ids", validation_ids, vocab_size, min_len=1)
    if not orders or any(int(o) != o or o < 1 for o in orders):
        raise ValueError(f"orders must be ints >= 1, got {orders!r}")
    if not scales:
        raise ValueError("scales must not be empty")
    scores, best = {}, None
    for order in orders:
        m = KneserNey(tr, vocab_size, order, modified=modified)
        text = np.concatenate([tr[tr.size - (order - 1):] if order > 1 else tr[:0], va])
        for s in scales:
            scores[(order, s)] = m.set_discount_scale(s).bits_per_char(text, order - 1)
        s_best = min(scales, key=lambda s: scores[(order, s)])
        if best is None or scores[(order, s_best)] < scores[(best.order, best.discount_scale)]:
            best = m.set_discount_scale(s_best)
        else:
            m = None
    return best, scores


# ----------------------------------------------------------------------------- compressors
#: command lines that compress standard input to standard output (7zz: a PPMd .7z archive)
COMPRESSORS = {
    "gzip": lambda **o: ["gzip", "-9", "-c"],
    "bzip2": lambda **o: ["bzip2", "-9", "-c"],
    "xz": lambda **o: ["xz", "-9e", "-c"],
    "ppmd": lambda order=6, mem="256m", **o: ["7zz", "a", "-t7z", f"-m0=PPMd:o={order}:mem={mem}",
                                              "-bd", "-y"],
    # zpaq (Debian's zpaq): a context-mixing compressor of the PAQ family; methods 1-5, each
    # mixing more context models (5: the strongest and slowest)
    "zpaq": lambda method=5, **o: ["zpaq", "a"],
}


#: Python packages (PyPI wheels) that code as the programs above, used where installed
#: (pinned in requirements.txt): pyppmd's Ppmd7 is 7-Zip's PPMd (variant H, the same range coder: a
#: size differs from 7zz's archive by its fixed headers only, which cancel in compressed_bits), and
#: zpaq's libzpaq with the CLI's input hints (method 5: within 2 bytes of Debian's zpaq on chapter
#: 13's test slice; its levels 1 to 4 are not the CLI's methods 1 to 4 (on chapter 13's validation
#: slice 0.23 bits per character apart at 1, 0.004-0.006 at 3 and 4), so "auto" runs the program for
#: those where it is installed).
LIBRARY_TOOLS = {"ppmd": "pyppmd", "zpaq": "zpaq"}


def _library(tool: str, options: dict):
    """The PyPI module that codes ``tool`` with these options, or None."""
    if tool not in LIBRARY_TOOLS:
        return None
    try:
        return __import__(LIBRARY_TOOLS[tool])
    except ImportError:
        return None


def compressor_backend(tool: str, **options) -> str | None:
    """What :func:`compressed_size` runs for ``tool`` with these options: the PyPI package's
    name (``"pyppmd"``, ``"zpaq"``), the program's path, or None when neither is installed."""
    if tool not in COMPRESSORS:
        raise ValueError(f"tool must be one of {tuple(COMPRESSORS)}, got {tool!r}")
    program = shutil.which(COMPRESSORS[tool](**options)[0])
    if _library(tool, options) is not None and not (_prefer_program(tool, options) and program):
        return LIBRARY_TOOLS[tool]
    return program


def _prefer_program(tool: str, options: dict) -> bool:
    """zpaq's methods 1-4: the library's levels code differently, the program is the reference."""
    return tool == "zpaq" and options.get("method", 5) != 5


def _mem_bytes(mem) -> int:
    """7-Zip's memory size ("256m", "1g", "65536b" or an int of bytes) in bytes."""
    if isinstance(mem, (int, np.integer)) and not isinstance(mem, bool):
        n = int(mem)
    elif isinstance(mem, str) and mem[:-1].isdigit() and mem[-1].lower() in "bkmg":
        n = int(mem[:-1]) << {"b": 0, "k": 10, "m": 20, "g": 30}[mem[-1].lower()]
    else:
        raise ValueError(f"mem must be bytes (int) or a size such as '256m', got {mem!r}")
    if not 1 << 11 <= n <= 0xFFFFFFFF - 36:
        raise ValueError(f"mem must be between 2 KB and 4 GB, got {mem!r}")
    return n


def compressed_size(data: bytes, tool: str = "ppmd", backend: str = "auto", **options) -> int:
    """Size in bytes of ``data`` compressed by ``tool`` (a key of :data:`COMPRESSORS`; ppmd
    takes ``order`` (2..32) and ``mem``, the model's memory, e.g. ``"256m"``; zpaq takes
    ``method`` (1..5), run on one thread). ``backend``: ``"auto"`` (the PyPI package of
    :data:`LIBRARY_TOOLS` where installed, else the program), ``"library"`` or ``"cli"``.
    The two backends' sizes differ by a fixed header (PPMd) or a few bytes (zpaq), which
    :func:`compressed_bits` cancels."""
    if tool not in COMPRESSORS:
        raise ValueError(f"tool must be one of {tuple(COMPRESSORS)}, got {tool!r}")
    if not isinstance(data, (bytes, bytearray)):
        raise ValueError(f"data must be bytes, got {type(data).__name__}")
    if backend not in ("auto", "library", "cli"):
        raise ValueError(f"backend must be 'auto', 'library' or 'cli', got {backend!r}")
    if tool == "zpaq":
        method = options.get("method", 5)
        if int(method) != method or not 1 <= method <= 5:
            raise ValueError(f"method must be an int in 1..5 for zpaq, got {method!r}")
    if tool == "ppmd":
        order = options.get("order", 6)
        if int(order) != order or not 2 <= order <= 32:
            raise ValueError(f"order must be an int in 2..32 for ppmd, got {order!r}")
        mem = _mem_bytes(options.get("mem", "256m"))
    lib = _library(tool, options) if backend != "cli" else None
    if backend == "library" and lib is None:
        raise FileNotFoundError(f"no installed library codes {tool} (pip install {LIBRARY_TOOLS.get(tool, tool)})")
    if backend == "auto" and lib is not None and _prefer_program(tool, options) and shutil.which("zpaq"):
        lib = None
    if lib is not None and tool == "ppmd":
        # 7-Zip cuts the model's memory to the smallest power of two (64 KB .. 2 GB) that is at least
        # 16 times the input (PpmdEncoder.cpp, SetReduceSize): 32 MB for chapter 13's 1.2 MB, not 256 MB
        reduced = next((1 << i for i in range(16, 32) if len(data) <= (1 << i) // 16), mem)
        enc = lib.Ppmd7Encoder(int(order), min(mem, reduced))
        return len(enc.encode(bytes(data)) + enc.flush(endmark=False))
    if lib is not None and tool == "zpaq":
        return len(lib.compress(bytes(data), level=int(method), threads=1, hints=True))
    cmd = COMPRESSORS[tool](**options)
    if shutil.which(cmd[0]) is None:
        raise FileNotFoundError(f"{cmd[0]} is not installed (Debian: apt-get install "
                                f"{'7zip' if cmd[0] == '7zz' else cmd[0]}"
                                + (f"; or pip install {LIBRARY_TOOLS[tool]})" if tool in LIBRARY_TOOLS else ")"))
    if tool == "zpaq":
        with tempfile.TemporaryDirectory() as d:
            src, arc = Path(d) / "text", Path(d) / "text.zpaq"
            src.write_bytes(bytes(data))
            subprocess.run(cmd + [str(arc), "text", f"-m{int(method)}", "-t1"], check=True, capture_output=True,
                           cwd=d)
            return arc.stat().st_size
    if tool == "ppmd":
        with tempfile.TemporaryDirectory() as d:
            src, arc = Path(d) / "text", Path(d) / "text.7z"
            src.write_bytes(bytes(data))
            subprocess.run(cmd + [str(arc), str(src)], check=True, capture_output=True)
            return arc.stat().st_size
    return len(subprocess.run(cmd, input=bytes(data), check=True, capture_output=True).stdout)


def compressed_bits(train: bytes, text: bytes, tool: str = "ppmd", backend: str = "auto", **options) -> float:
    """Bits per byte of ``text`` coded after ``train``:
    ``8 * (size(train + text) - size(train)) / len(text)`` under ``tool``. The archive's
    fixed overhead (headers, the end of the stream) cancels in the difference."""
    if len(text) == 0:
        raise ValueError("text must not be empty")
    both = compressed_size(bytes(train) + bytes(text), tool, backend, **options)
    return 8.0 * (both - compressed_size(bytes(train), tool, backend, **options)) / len(text)


def fit_zpaq(train: bytes, validation: bytes, methods=(1, 2, 3, 4, 5)) -> tuple[int, dict]:
    """The zpaq method with the lowest bits per byte on ``validation`` coded after ``train``;
    returns ``(method, {method: validation bits})``."""
    scores = {m: compressed_bits(train, validation, "zpaq", method=m) for m in methods}
    return min(scores, key=scores.get), scores


def fit_ppmd(train: bytes, validation: bytes, orders=(4, 6, 8, 10, 12, 16, 24, 32), mem: str = "256m"
             ) -> tuple[int, dict]:
    """The PPMd model order with the lowest bits per byte on ``validation`` coded after
    ``train``; returns ``(order, {order: validation bits})``."""
    scores = {o: compressed_bits(train, validation, "ppmd", order=o, mem=mem) for o in orders}
    return min(scores, key=scores.get), scores
