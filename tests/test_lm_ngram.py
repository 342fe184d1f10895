"""tfbook.ngram: Kneser-Ney n-grams against a brute-force reference written here from Chen &
Goodman's definitions (dictionaries of substrings, no shared code), normalisation on the real
corpus, and the compressors against closed forms (a compressor cannot beat the entropy of an
i.i.d. source, and a text coded after itself costs almost nothing). A few seconds, plus about
10 s for the order-10 model of the corpus."""

from __future__ import annotations

import shutil
from collections import Counter

import numpy as np
import pytest

from tfbook import ngram
from tfbook.tasks import prose


# ----------------------------------------------------------------------------- reference
class Reference:
    """Interpolated (modified) Kneser-Ney over strings, straight from the definitions."""

    def __init__(self, text: str, alphabet: str, order: int, modified: bool, scale: float):
        self.text, self.alphabet, self.order, self.modified = text, alphabet, order, modified
        self.V = len(alphabet)
        self.a = {}  # level n -> {n-gram: count used at that level}
        for n in range(1, order + 1):
            if n == order:
                self.a[n] = Counter(text[i:i + n] for i in range(len(text) - n + 1))
            else:
                left = {}  # n-gram -> set of characters seen just before it
                for i in range(1, len(text) - n + 1):
                    left.setdefault(text[i:i + n], set()).add(text[i - 1])
                self.a[n] = Counter({w: len(s) for w, s in left.items()})
        self.D = {}
        for n in range(1, order + 1):
            cc = Counter(self.a[n].values())
            if cc[1] == 0:   # the documented fallback when no count of 1 exists
                est = [0.5, 1.0, 1.5] if modified else [0.5, 0.5, 0.5]
            else:
                Y = cc[1] / (cc[1] + 2 * cc[2])
                if modified:
                    est = [k - (k + 1) * Y * cc[k + 1] / cc[k] if cc[k] else k / 2 for k in (1, 2, 3)]
                else:
                    est = [Y, Y, Y]
            self.D[n] = [min(max(scale * d, 0.0), k) for k, d in zip((1, 2, 3), est)]

    def disc(self, n: int, a: int) -> float:
        return 0.0 if a == 0 else self.D[n][min(a, 3) - 1]

    def p(self, c: str, h: str) -> float:
        n = len(h) + 1
        if n == 0 or h is None:
            return 1.0 / self.V
        lower = self.p(c, h[1:]) if n > 1 else 1.0 / self.V
        a = self.a[n]
        A = sum(a.get(h + x, 0) for x in self.alphabet)
        if A == 0:
            return lower
        gamma = sum(self.disc(n, a.get(h + x, 0)) for x in self.alphabet) / A
        ahc = a.get(h + c, 0)
        return max(ahc - self.disc(n, ahc), 0.0) / A + gamma * lower


def markov_text(n: int, alphabet: str, seed: int) -> str:
    """A text with real structure: each character depends on the two before it."""
    rng = np.random.default_rng(seed)
    k = len(alphabet)
    table = rng.dirichlet(np.full(k, 0.3), size=(k, k))
    out = [0, 1]
    for _ in range(n - 2):
        out.append(int(rng.choice(k, p=table[out[-2], out[-1]])))
    return "".join(alphabet[i] for i in out)


@pytest.mark.parametrize("modified", [False, True])
@pytest.mark.parametrize("order", [2, 3, 5])
def test_kneser_ney_equals_the_brute_force_reference(order, modified):
    alphabet = "abcdefghijk"                 # 'k' never occurs in training: V counts it
    train = markov_text(600, alphabet[:-1], seed=order)
    held = markov_text(150, alphabet, seed=100 + order)
    ids = {ch: i for i, ch in enumerate(alphabet)}
    tr = np.array([ids[ch] for ch in train])
    he = np.array([ids[ch] for ch in held])
    m = ngram.KneserNey(tr, len(alphabet), order, modified=modified)
    for scale in (0.7, 1.0, 1.3):
        ref = Reference(train, alphabet, order, modified, scale)
        m.set_discount_scale(scale)
        got = m.probs(he, order - 1)
        want = np.array([ref.p(held[t], held[t - order + 1:t]) for t in range(order - 1, len(held))])
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)   # float64, same sums in another order


def test_the_reference_catches_a_wrong_lower_order():
    """Scoring the lower orders with raw counts instead of continuation counts (plain
    interpolated absolute discounting) gives other probabilities: the comparison above
    would catch that mistake."""
    alphabet = "abcde"
    train = markov_text(400, alphabet, seed=7)
    ref = Reference(train, alphabet, 3, True, 1.0)
    raw = Reference(train, alphabet, 3, True, 1.0)
    raw.a[2] = Counter(train[i:i + 2] for i in range(len(train) - 1))
    raw.a[1] = Counter(train)
    diffs = [abs(ref.p(c, "ab") - raw.p(c, "ab")) for c in alphabet]
    assert max(diffs) > 1e-3


@pytest.fixture(scope="module")
def corpus():
    return prose.data(), prose.tokenizer().vocab_size


@pytest.mark.parametrize("modified", [False, True])
def test_distributions_sum_to_one_on_the_corpus(corpus, modified):
    splits, V = corpus
    tr, va = splits.train.numpy(), splits.validation.numpy()
    m = ngram.KneserNey(tr, V, 10, modified=modified)
    rng = np.random.default_rng(0)
    contexts = [va[p - 9:p] for p in rng.integers(9, va.size, size=4)]
    contexts.append(np.array(prose.tokenizer().encode("zzzqqqxxj")))   # a context never seen
    for ctx in contexts:
        p = m.distribution(ctx)
        assert p.shape == (V,) and (p > 0).all()
        assert abs(p.sum() - 1.0) < 1e-12          # float64 sum of 62 terms
    # and the probabilities of a text are the distributions' entries at its characters
    text = va[:40]
    pr = m.probs(text, 9)
    for t in (9, 25, 39):
        assert pr[t - 9] == pytest.approx(m.distribution(text[t - 9:t])[text[t]], rel=1e-12)


def test_kneser_ney_beats_absolute_discounting_on_validation(corpus):
    """Continuation counts are the point of Kneser-Ney: at order 5 it must beat the chapter's
    older interpolated absolute discounting (discount chosen on validation for both)."""
    splits, V = corpus
    tr, va = splits.train.numpy(), splits.validation.numpy()
    old, _ = prose.fit_ngram(5)
    kn, _ = ngram.fit_kneser_ney(tr, va, V, orders=(5,), modified=False)
    assert kn.bits_per_char(np.concatenate([tr[-4:], va]), 4) < old.bits_per_char(np.concatenate([tr[-4:], va])) - 0.02


def test_kneser_ney_rejects_bad_input():
    with pytest.raises(ValueError, match="order"):
        ngram.KneserNey([0, 1, 2], 3, 0)
    with pytest.raises(ValueError, match="train_ids"):
        ngram.KneserNey([0, 1, 5], 3, 2)
    with pytest.raises(ValueError, match="train_ids"):
        ngram.KneserNey(np.zeros((2, 2), dtype=int), 3, 2)
    with pytest.raises(ValueError, match="vocab_size"):
        ngram.KneserNey([0, 1], 0, 1)
    m = ngram.KneserNey([0, 1, 2, 0, 1], 3, 3)
    with pytest.raises(ValueError, match="start"):
        m.probs([0, 1, 2], 1)
    with pytest.raises(ValueError, match="context"):
        m.distribution([0])
    with pytest.raises(ValueError, match="discount_scale"):
        m.set_discount_scale(-1.0)
    with pytest.raises(ValueError, match="ids"):
        m.probs([0.5, 1.0, 2.0], 2)


# ----------------------------------------------------------------------------- compressors
@pytest.mark.parametrize("tool", ["ppmd", "xz", "bzip2", "gzip"])
def test_compressors_respect_the_entropy_of_an_iid_source(tool):
    """16 equally likely symbols, independent: 4 bits each, and no code does better on
    average (Shannon); a good adaptive coder spends little more. The same text coded after
    itself costs almost nothing for the coders that can copy from 20 KB back (PPMd's context
    model, the LZ77 of xz and gzip); bzip2 sorts 900 KB blocks instead and only gains."""
    rng = np.random.default_rng(0)
    text = bytes(rng.integers(65, 81, size=20_000).astype(np.uint8))
    other = bytes(rng.integers(65, 81, size=20_000).astype(np.uint8))
    fresh = ngram.compressed_bits(other, text, tool)
    assert 4.0 - 0.02 < fresh < {"ppmd": 4.2, "xz": 4.4, "bzip2": 4.5, "gzip": 5.0}[tool], fresh
    again = ngram.compressed_bits(text, text, tool)
    assert again < (0.5 * fresh if tool == "bzip2" else 0.2), again   # matches of at most 258 bytes (gzip)


def test_ppmd_uses_its_order():
    """A longer PPM context must help on text with long repeats: order 2 against order 8 on
    the corpus's validation slice, after the training slice."""
    tr, va, _ = prose.text_splits()
    tr, va = tr[-200_000:], va[:20_000]
    assert ngram.compressed_bits(tr, va, "ppmd", order=8) < ngram.compressed_bits(tr, va, "ppmd", order=2) - 0.3


def test_zpaq_uses_its_method():
    """zpaq's method 5 mixes more context models than method 1 (a fast LZ77 coder): on the
    corpus's validation slice, after the training slice, it must code in far fewer bits."""
    tr, va, _ = prose.text_splits()
    tr, va = tr[-200_000:], va[:20_000]
    assert ngram.compressed_bits(tr, va, "zpaq", method=5) < ngram.compressed_bits(tr, va, "zpaq", method=1) - 0.5
    with pytest.raises(ValueError, match="method"):
        ngram.compressed_size(b"abc", "zpaq", method=6)


def test_compressors_reject_bad_input():
    with pytest.raises(ValueError, match="tool"):
        ngram.compressed_size(b"abc", "zip")
    with pytest.raises(ValueError, match="data"):
        ngram.compressed_size("abc", "xz")
    with pytest.raises(ValueError, match="order"):
        ngram.compressed_size(b"abc", "ppmd", order=1)
    with pytest.raises(ValueError, match="text"):
        ngram.compressed_bits(b"abc", b"", "xz")


@pytest.mark.parametrize("tool, options", [("ppmd", dict(order=16, mem="256m")), ("zpaq", dict(method=5))])
def test_library_and_program_give_the_same_bits(tool, options):
    """The PyPI packages (pyppmd, zpaq) stand in for 7zz and Debian's zpaq where those are not
    installed: on 20,000 validation characters after 200,000 training characters they code
    the same bits per character (PPMd: the same range coder, only the archive's fixed headers
    differ and cancel; zpaq method 5: libzpaq with the program's input hints, a few bytes apart)."""
    pytest.importorskip(ngram.LIBRARY_TOOLS[tool])
    if shutil.which(ngram.COMPRESSORS[tool](**options)[0]) is None:
        pytest.skip(f"the {tool} program is not installed")
    tr, va, _ = prose.text_splits()
    tr, va = tr[-200_000:], va[:20_000]
    lib = ngram.compressed_bits(tr, va, tool, backend="library", **options)
    cli = ngram.compressed_bits(tr, va, tool, backend="cli", **options)
    assert lib == cli if tool == "ppmd" else abs(lib - cli) <= 8 * 4 / len(va), (lib, cli)   # zpaq: 4 bytes
    assert ngram.compressor_backend(tool, **options) == ngram.LIBRARY_TOOLS[tool]            # pip first


def test_compressor_backends_reject_bad_input():
    with pytest.raises(ValueError, match="backend"):
        ngram.compressed_size(b"abc", "ppmd", backend="7z")
    with pytest.raises(ValueError, match="mem"):
        ngram.compressed_size(b"abc", "ppmd", mem="lots")
    with pytest.raises(ValueError, match="tool"):
        ngram.compressor_backend("zip")
    with pytest.raises(FileNotFoundError, match="pip install"):
        ngram.compressed_size(b"abc", "gzip", backend="library")


def test_ppmd_memory_cut_explains_the_high_orders():
    """Chapter 13's PPMd search: 7-Zip gives the model at most the smallest power of two that
    is 16 times the input (32 MB for the 1.2 MB of training and validation text, not the 256 MB
    asked for). Orders 24 and 32 fill it and restart, which is why their validation scores rise;
    with the whole 256 MB they score no better than order 16, which never fills 32 MB."""
    pyppmd = pytest.importorskip("pyppmd")
    btr, bva, _ = prose.text_splits()

    def bits(order, mem):
        sizes = []
        for data in (btr, btr + bva):
            enc = pyppmd.Ppmd7Encoder(order, mem)
            sizes.append(len(enc.encode(data) + enc.flush(endmark=False)))
        return 8 * (sizes[1] - sizes[0]) / len(bva)

    assert ngram.compressed_bits(btr, bva, "ppmd", order=24, mem="256m") == bits(24, 32 << 20)   # the cut
    o16 = bits(16, 32 << 20)
    assert o16 == bits(16, 256 << 20)                            # order 16 never fills 32 MB
    assert bits(24, 32 << 20) > o16 + 0.1                        # order 24 does, and restarts
    assert o16 - 0.005 < bits(24, 256 << 20) < o16 + 0.005       # with room, no better than 16
