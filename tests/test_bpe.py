"""Tests of tfbook.bpe: byte-level BPE (pre-tokenizer, training, specials, streaming).

Every expected value here comes from a hand derivation or from an independent, plainly
written implementation in this file (a character-by-character scanner for the GPT-2
pattern, a trainer that recounts every pair after every merge), never from the code
under test.
"""

import csv
import gzip
import random
import subprocess
import sys
import tracemalloc
import unicodedata
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfbook.bpe import GPT2_PATTERN, WHITE_SPACE, ByteBPETokenizer, gpt2_split, pretokenize
from tfbook.data import ByteBPETokenizer as FromData

ROOT = Path(__file__).resolve().parents[1]
SPECIALS = ["<|endoftext|>", "<|endoftext|><|endoftext|>", "<|end"]


def kjv(n: int) -> str:
    with (resources.files("tfbook") / "corpus" / "kjv_prose.txt.gz").open("rb") as f:
        return gzip.decompress(f.read())[:n].decode("ascii")


# --- an independent pre-tokenizer: GPT-2's pattern read as a scanner ------------------

# Unicode's White_Space property, typed from the standard (PropList.txt), not imported
_WS = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {chr(c) for c in range(0x2000, 0x200B)}


def _kind(ch: str) -> str:
    if ch in _WS:
        return "space"
    cat = unicodedata.category(ch)
    return {"L": "letter", "N": "number"}.get(cat[0], "other")


def scan_gpt2(text: str) -> list[str]:
    """GPT-2's pattern, alternative by alternative, as the regex engine tries them."""
    out, i, n = [], 0, len(text)
    while i < n:
        for c in ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d"):
            if text.startswith(c, i):
                out.append(c)
                i += len(c)
                break
        else:
            start = None
            for kind in ("letter", "number", "other"):  # ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
                if text[i] == " " and i + 1 < n and _kind(text[i + 1]) == kind:
                    start = i + 1
                elif _kind(text[i]) == kind:
                    start = i
                if start is not None:
                    j = start
                    while j < n and _kind(text[j]) == kind:
                        j += 1
                    out.append(text[i:j])
                    i = j
                    break
            if start is None:  # white space: '\s+(?!\S)', else '\s+'
                j = i
                while j < n and _kind(text[j]) == "space":
                    j += 1
                end = j if j == n or j - i == 1 else j - 1
                out.append(text[i:end])
                i = end
    return out


TRICKY = [
    "Hello world", "I'm here", "  x", "x  ", "they'll've", "WE'LL", "don't'", "''s",
    "a  \n\nb", "a \t b", "tab\tend\t", "x² ½ Ⅻ 三十", "e\u0301te\u0301", "Ǆemal ǅ",  # No, Nl, Lo numerals, combining marks, titlecase
    "snake_case __init__ _", "1,000.50 and ٣٤ and १२", "emoji 😀👍🏽 👨‍👩‍👧 flags 🇫🇷",
    "中文字符，标点。", "\x1c\x1d\x1e\x1f sep", "nbsp\xa0here\u2003em\u3000ideo", "\u200bzero width",
    "line\u2028sep\u2029para", "\x00nul\x7f", "   ", "", "'", " '", "a'", "$$$ !!! ...", " ?!",
]


@pytest.mark.parametrize("text", TRICKY)
def test_pretokenize_equals_the_gpt2_scanner(text):
    pieces = pretokenize(text)
    assert "".join(pieces) == text
    assert pieces == scan_gpt2(text)


def test_gpt2_split_is_the_compiled_pattern():
    assert gpt2_split() is gpt2_split()  # built once
    text = "I'm  here, 42 times!"
    assert gpt2_split().findall(text) == pretokenize(text)
    # the published pattern, alternative for alternative
    assert GPT2_PATTERN.split("|")[:7] == ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]


def test_pretokenize_hand_worked_cases():
    # worked out by hand from the pattern's alternatives
    assert pretokenize("I'm  here, 42 times!") == ["I", "'m", " ", " here", ",", " 42", " times", "!"]
    assert pretokenize("a  \n\nb") == ["a", "  \n", "\n", "b"]  # the "\\n" just before b is left to \s+
    assert pretokenize("x² ½") == ["x", "²", " ½"]  # '²' is a number (No), not a letter
    assert pretokenize("e\u0301") == ["e", "\u0301"]  # a combining mark is neither letter nor number
    assert pretokenize("a_b") == ["a", "_", "b"]  # '_' is \w for re, punctuation for GPT-2
    assert pretokenize("a\x1cb") == ["a", "\x1c", "b"]  # \s in re, not White_Space


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_pretokenize_random_unicode(text):
    assert pretokenize(text) == scan_gpt2(text)


# --- the slow reference trainer ---------------------------------------------------------


def naive_train(text: str, num_merges: int):
    """Recount every pair of every piece after every merge; same tie rule, stated plainly:
    the largest count, then the smallest (left bytes, right bytes), then the smallest ids.
    Returns the merges and the training text's pieces as they stand after the last merge."""
    words = [list(p.encode("utf-8")) for p in pretokenize(text)]
    vocab = [bytes([b]) for b in range(256)]
    merges = []
    for _ in range(num_merges):
        counts = {}
        for w in words:
            for pair in zip(w, w[1:]):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts or max(counts.values()) < 2:
            break
        best = min(counts, key=lambda p: (-counts[p], vocab[p[0]], vocab[p[1]], p))
        new = len(vocab)
        vocab.append(vocab[best[0]] + vocab[best[1]])
        merges.append(best)
        for k, w in enumerate(words):
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[k] = out
    return merges, [i for w in words for i in w]


def test_hand_worked_training_with_a_tie():
    # "aaabdaaabac" is one piece. Pair counts: aa 4 (two in each "aaa"), ab 2, others 1.
    # 1. merge (a, a) -> 256: [aa a b d aa a b a c]; now (aa, a) 2 and (a, b) 2 tie;
    #    the rule compares left bytes first: b"a" < b"aa", so
    # 2. merge (a, b) -> 257: [aa ab d aa ab a c]; (aa, ab) 2, every other pair 1
    # 3. merge (256, 257) -> 258 "aaab"; then no pair occurs twice: stop.
    tok = ByteBPETokenizer.train("aaabdaaabac", num_merges=10)
    assert tok.merges == [(97, 97), (97, 98), (256, 257)]
    assert tok.vocab[256:] == [b"aa", b"ab", b"aaab"]
    assert tok.encode("aaabdaaabac") == [258, 100, 258, 97, 99]


def test_hand_worked_training_counts_pieces_with_their_frequency():
    # pieces "ab", " ab", " ab": (a, b) 3, (" ", a) 2 -> merge (a, b); then (" ", ab) 2
    tok = ByteBPETokenizer.train("ab ab ab", num_merges=5)
    assert tok.merges == [(97, 98), (32, 256)]
    assert tok.encode("ab ab") == [256, 257]


def test_tie_rule_smallest_bytes_first():
    # pieces "xy", " xy", " yx", " yx": (x,y) 2, (" ",y) 2, (y,x) 2, (" ",x) 1.
    # smallest left bytes: b" " -> (" ", y). Then (" y", x) 2 ties (x, y) 2: b" y" < b"x".
    # Then (x, y) 2; the rest occur once.
    tok = ByteBPETokenizer.train("xy xy yx yx", num_merges=10)
    assert tok.merges == [(32, 121), (256, 120), (120, 121)]
    # encoding applies merges in the order learned: " yxy" -> [" y" x y] -> [" yx" y];
    # the last merge first would give [" " y "xy"] -> [" y" "xy"]
    assert tok.encode(" yxy") == [257, 121]


@pytest.mark.parametrize("text", [
    kjv(4000),
    "".join(random.Random(0).choice("ab ") for _ in range(3000)),  # tiny alphabet: many ties
    "".join(random.Random(1).choice("aé😀 中\n") for _ in range(2000)),  # multi-byte characters
])
def test_fast_training_equals_the_naive_reference(text):
    merges, segmentation = naive_train(text, 150)
    tok = ByteBPETokenizer.train(text, num_merges=150)
    assert tok.merges == merges
    # encoding the training text reproduces the segmentation training ended with
    assert tok.encode(text) == segmentation


def test_numpy_integers_are_accepted():
    np = pytest.importorskip("numpy")
    tok = ByteBPETokenizer.train("ab ab ab", num_merges=np.int64(1))
    assert tok.merges == [(97, 98)]
    assert tok.decode(np.array(tok.encode("ab"))) == "ab"


def test_training_stops_when_no_pair_repeats():
    assert ByteBPETokenizer.train("abcdef", vocab_size=300).merges == []
    assert ByteBPETokenizer.train("", num_merges=5).vocab_size == 256


def test_vocab_size_counts_bytes_merges_and_specials():
    tok = ByteBPETokenizer.train(kjv(20000), vocab_size=300, special_tokens=["<|endoftext|>"])
    assert len(tok.merges) == 43 and tok.vocab_size == 300
    assert tok.special_ids == {"<|endoftext|>": 299}


# --- round trips ------------------------------------------------------------------------

_TOK = ByteBPETokenizer.train(kjv(30000) + " café 😀 中文 naïve", num_merges=200, special_tokens=SPECIALS)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_round_trip_any_unicode(text):
    ids = _TOK.encode(text)
    assert all(0 <= i < _TOK.vocab_size for i in ids)
    assert _TOK.decode(ids, errors="strict") == text


@pytest.mark.parametrize("text", TRICKY + ["👨‍👩‍👧‍👦 and 🏳️‍🌈", "\U0010fffd\ufeff\ufffd", "Ω≈ç√∫˜µ≤≥÷"])
def test_round_trip_tricky(text):
    assert _TOK.decode(_TOK.encode(text), errors="strict") == text


def test_untrained_tokenizer_is_utf8():
    tok = ByteBPETokenizer()
    assert tok.encode("é😀") == list("é😀".encode("utf-8"))
    assert tok.decode([0xC3]) == "\ufffd"  # half a character: replaced, as errors="replace" says


def test_save_and_load(tmp_path):
    path = tmp_path / "bpe.json"
    _TOK.save(path)
    back = ByteBPETokenizer.load(path)
    assert back.merges == _TOK.merges and back.special_tokens == _TOK.special_tokens
    text = kjv(2000) + "<|endoftext|> 😀"
    assert back.encode(text) == _TOK.encode(text)


def test_tfbook_data_reexports_the_class():
    assert FromData is ByteBPETokenizer


# --- special tokens ---------------------------------------------------------------------


def test_specials_are_never_split_longest_first():
    sid = _TOK.special_ids
    one, two, end = sid["<|endoftext|>"], sid["<|endoftext|><|endoftext|>"], sid["<|end"]
    assert _TOK.encode("<|endoftext|>") == [one]
    assert _TOK.encode("<|endoftext|><|endoftext|>") == [two]  # not [one, one]
    assert _TOK.encode("<|endoftext|>" * 3) == [two, one]  # left to right, longest first
    assert _TOK.encode("<|end") == [end]  # a prefix of the others
    assert _TOK.encode("<|endo") == [end] + _TOK.encode("o")
    assert _TOK.encode("a<|endoftext|>b") == _TOK.encode("a") + [one] + _TOK.encode("b")
    assert _TOK.decode([two, one]) == "<|endoftext|>" * 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(SPECIALS + ["<|", "|>", "end", "oftext", " a", "é", "\n"]), max_size=12))
def test_specials_found_where_a_plain_scanner_finds_them(parts):
    text = "".join(parts)
    # reference: at each position take the longest special that starts there
    expect, i, buf = [], 0, ""
    while i < len(text):
        hit = max((s for s in SPECIALS if text.startswith(s, i)), key=len, default=None)
        if hit:
            expect += _TOK.encode(buf) if buf else []
            expect.append(_TOK.special_ids[hit])
            buf, i = "", i + len(hit)
        else:
            buf, i = buf + text[i], i + 1
    expect += _TOK.encode(buf) if buf else []
    assert _TOK.encode(text) == expect


def test_training_never_merges_across_or_inside_specials():
    text = ("<|endoftext|>the cat<|endoftext|>" * 50)
    tok = ByteBPETokenizer.train(text, num_merges=50, special_tokens=["<|endoftext|>"])
    assert not any(b"|" in tok.vocab[i] or b"<" in tok.vocab[i] for i in range(256, len(tok.vocab)))


# --- streaming --------------------------------------------------------------------------


STREAM_PARTS = ["'", "re", "ll", "s", "t", " ", "  ", "\n", "\n\n", "ab", "7", "77", "😀", "é", "\u0301",
                ",", "x²", "we", "<|", "end", "oftext|>"]
# merges that care where pieces end: trained on the parts themselves
_STREAM_TEXT = "we're they'll can't it's  ab  ab\n\n ab 77 777 x² é😀 ,, 'll 's 't\n" * 30
_STREAM_TOKS = {
    "no specials": ByteBPETokenizer.train(_STREAM_TEXT, num_merges=80),
    "specials": ByteBPETokenizer.train(_STREAM_TEXT, num_merges=80, special_tokens=SPECIALS),
}


@pytest.mark.parametrize("kind", list(_STREAM_TOKS))
@settings(max_examples=150, deadline=None)
@given(parts=st.lists(st.sampled_from(SPECIALS + STREAM_PARTS), max_size=40),
       block=st.integers(1, 6), rnd=st.randoms(use_true_random=False))
def test_encode_iterable_equals_encode(kind, parts, block, rnd):
    whole = _STREAM_TOKS[kind]
    text = "".join(parts)
    cuts = sorted(rnd.sample(range(len(text) + 1), min(len(text) + 1, rnd.randint(0, 12))))
    chunks = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    tok = ByteBPETokenizer(whole.merges, whole.special_tokens)
    tok.STREAM_BLOCK = block  # cut as often as possible
    assert list(tok.encode_iterable(chunks)) == whole.encode(text)


@pytest.mark.parametrize("kind", list(_STREAM_TOKS))
@pytest.mark.parametrize("text", ["we're  ab\n\n ab", "it's 777,, x²é\u0301😀 't", "<|endoftext|><|endoftext|>we'll<|end"])
def test_encode_iterable_every_split_point(kind, text):
    whole = _STREAM_TOKS[kind]
    tok = ByteBPETokenizer(whole.merges, whole.special_tokens)
    tok.STREAM_BLOCK = 1
    for k in range(len(text) + 1):
        for j in range(k, len(text) + 1):
            assert list(tok.encode_iterable([text[:k], text[k:j], text[j:]])) == whole.encode(text), (k, j)


def test_encode_iterable_on_a_file(tmp_path):
    text = kjv(50000) + "<|endoftext|>" + kjv(3000)
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    tok = ByteBPETokenizer(_TOK.merges, SPECIALS)
    tok.STREAM_BLOCK = 1000
    with open(path, encoding="utf-8") as f:
        assert list(tok.encode_iterable(f)) == _TOK.encode(text)


class _Lines:
    """An open text file, counting the lines read from it."""

    def __init__(self, path):
        self.f, self.pulled = open(path, encoding="utf-8"), 0

    def __iter__(self):
        for line in self.f:
            self.pulled += 1
            yield line
        self.f.close()


def test_encode_iterable_memory_is_bounded(tmp_path):
    """Stream a 1.2 MB file: the traced peak during the last three quarters is no higher
    than during the first (memory does not grow with the text) and well below the text.
    The peak (about 0.6 MB) is mostly the encoder's cache of pieces, which CACHE_SIZE
    bounds, and one STREAM_BLOCK of text: the same for a file of any length."""
    text = (kjv(200_000) + "<|endoftext|>") * 6
    path = tmp_path / "stream.txt"
    path.write_text(text, encoding="utf-8")
    tok = ByteBPETokenizer(_TOK.merges, SPECIALS)
    lines = _Lines(path)
    n_lines = text.count("\n")
    early = None
    tracemalloc.start()
    try:
        for i, _ in enumerate(tok.encode_iterable(lines)):
            if i == 0:
                first_at = lines.pulled
            if lines.pulled >= n_lines // 4 and early is None:
                early = tracemalloc.get_traced_memory()[1]
                tracemalloc.reset_peak()
        late = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert first_at < n_lines / 10, (first_at, n_lines)  # ids come long before the end
    assert late < 1.2 * early + 100_000, (early, late)
    assert max(early, late) < len(text) / 2, (early, late)


# --- the benchmark ----------------------------------------------------------------------


def test_benchmark_script_runs_small(tmp_path):
    out = tmp_path / "bpe.csv"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bpe.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "bytes/token" in proc.stdout
    rows = list(csv.DictReader(open(out)))
    assert [r["variant"] for r in rows] == ["byte-bpe", "char-bpe"]
    assert all(int(r["merges"]) == 50 and int(r["corpus_bytes"]) == 8192 for r in rows)
    assert all(float(r["cpu_seconds"]) > 0 and 1.0 < float(r["bytes_per_token"]) < 8 for r in rows)


# --- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize("call, match", [
    (lambda: pretokenize(b"abc"), "text"),
    (lambda: ByteBPETokenizer.train(b"abc", num_merges=1), "text"),
    (lambda: ByteBPETokenizer.train("abc"), "vocab_size"),
    (lambda: ByteBPETokenizer.train("abc", 300, num_merges=3), "num_merges"),
    (lambda: ByteBPETokenizer.train("abc", vocab_size=100), "vocab_size"),
    (lambda: ByteBPETokenizer.train("abc", vocab_size=256, special_tokens=["<s>"]), "vocab_size"),
    (lambda: ByteBPETokenizer.train("abc", num_merges=-1), "num_merges"),
    (lambda: ByteBPETokenizer.train("abc", num_merges=2.0), "num_merges"),
    (lambda: ByteBPETokenizer.train("abc", num_merges=True), "num_merges"),
    (lambda: ByteBPETokenizer.train("abc", num_merges=1, special_tokens="<s>"), "special_tokens"),
    (lambda: ByteBPETokenizer(special_tokens=[""]), "special_tokens"),
    (lambda: ByteBPETokenizer(special_tokens=["<s>", "<s>"]), "special_tokens"),
    (lambda: ByteBPETokenizer([(97, 256)]), "merges"),
    (lambda: ByteBPETokenizer([(97,)]), "merges"),
    (lambda: ByteBPETokenizer([(97, 98), (97, 98)]), "merges"),
    (lambda: ByteBPETokenizer("ab"), "merges"),
    (lambda: _TOK.encode(["a"]), "text"),
    (lambda: _TOK.decode([_TOK.vocab_size]), "ids"),
    (lambda: _TOK.decode([-1]), "ids"),
    (lambda: _TOK.decode(["a"]), "ids"),
    (lambda: _TOK.decode("abc"), "ids"),
    (lambda: _TOK.decode([1], errors="oops"), "errors"),
    (lambda: _TOK.encode_iterable("a string"), "iterable"),  # at the call, before any iteration
    (lambda: _TOK.encode_iterable(3), "iterable"),
    (lambda: list(_TOK.encode_iterable(["ok", b"bytes"])), "iterable"),
    (lambda: _TOK.save(3), "path"),
    (lambda: ByteBPETokenizer.load("/nonexistent/bpe.json"), "path"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_load_rejects_a_vocab_that_disagrees_with_the_merges(tmp_path):
    path = tmp_path / "bpe.json"
    ByteBPETokenizer([(97, 98)]).save(path)
    path.write_text(path.read_text().replace(b"ab".hex(), b"ba".hex()))
    with pytest.raises(ValueError, match="path"):
        ByteBPETokenizer.load(path)


def test_load_rejects_malformed_files(tmp_path):
    path = tmp_path / "bpe.json"
    for body in ('{"format": "tfbook-byte-bpe-1"}', '{"format": "tfbook-byte-bpe-1", "merges": [[1, 999]], '
                 '"special_tokens": []}', "[1, 2]", "not json"):
        path.write_text(body)
        with pytest.raises(ValueError, match="path"):
            ByteBPETokenizer.load(path)


def test_white_space_constant_is_unicode_white_space():
    assert set(WHITE_SPACE) == _WS and len(WHITE_SPACE) == 25
