"""Tests of tfbook.data: tokenizers, generated data sets, shipped data."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfbook.data import (
    BPETokenizer,
    CharTokenizer,
    addition_dataset,
    load_corpus,
    load_digits_images,
    number_split,
    number_to_words,
    number_words_dataset,
    pad_batch,
)

TRAIN_TEXT = "the cat sat on the mat; the hat is flat.\nthat rat ran at ten to ten!"
ALPHABET = sorted(set(TRAIN_TEXT))


# --- character tokenizer -------------------------------------------------------------


def test_char_tokenizer_vocab_is_sorted_and_order_free():
    tok = CharTokenizer.fit("banana")
    assert tok.vocab == ["a", "b", "n"]
    assert tok.encode("nab") == [2, 0, 1]
    # same characters in a different order give the same vocabulary
    assert CharTokenizer.fit("nnaabb").vocab == tok.vocab


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=60))
def test_char_tokenizer_round_trip(s):
    tok = CharTokenizer.fit(TRAIN_TEXT)
    ids = tok.encode(s)
    assert len(ids) == len(s)
    assert tok.decode(ids) == s


def test_char_tokenizer_rejects_unknown():
    tok = CharTokenizer.fit("abc")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.encode("abz")
    with pytest.raises(ValueError, match="outside"):
        tok.decode([0, 3])


# --- BPE -----------------------------------------------------------------------------


def test_bpe_learns_the_most_frequent_pair_first():
    # In "aaab aaab aaab" the pair ("a", "a") occurs 2 * 3 = 6 times; nothing else
    # reaches 6 (("a", "b") occurs 3 times, (" ", "a") twice).
    tok = BPETokenizer.train("aaab aaab aaab", num_merges=1)
    assert tok.merges == [("a", "a")]
    assert tok.vocab == [" ", "a", "b", "aa"]
    # merging is left to right: "aaa" -> "aa" + "a"
    assert tok.encode("aaab") == [3, 1, 2]


def test_bpe_merges_do_not_cross_words_and_compress():
    text = load_corpus()
    tok = BPETokenizer.train(text, num_merges=100)
    assert len(tok.merges) == 100
    assert tok.vocab_size == len(set(text)) + 100
    assert not any(" " in right for _, right in tok.merges)  # whitespace only starts a chunk
    ids = tok.encode(text)
    # 100 merges on English prose remove about half of the tokens (measured on the
    # shipped corpus: 6111 characters -> 3150 tokens); the bar leaves room for edits
    # to the corpus but fails if merges stop being applied.
    assert len(ids) < 0.6 * len(text)
    assert tok.decode(ids) == text


def test_bpe_is_deterministic():
    a = BPETokenizer.train(TRAIN_TEXT, 20)
    b = BPETokenizer.train(TRAIN_TEXT, 20)
    assert a.merges == b.merges
    # rebuilding from the list of merges gives the same encoder
    c = BPETokenizer(a.alphabet, a.merges)
    assert c.encode(TRAIN_TEXT) == a.encode(TRAIN_TEXT)


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=80))
def test_bpe_round_trip(s):
    tok = _BPE
    ids = tok.encode(s)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == s


_BPE = BPETokenizer.train(TRAIN_TEXT, 25)


def test_bpe_rejects_unknown_characters():
    with pytest.raises(ValueError, match="training alphabet"):
        _BPE.encode("zebra")


# --- number words --------------------------------------------------------------------

# Written by hand, not generated.
EXPECTED_WORDS = {
    0: "zero",
    7: "seven",
    13: "thirteen",
    20: "twenty",
    45: "forty-five",
    100: "one hundred",
    110: "one hundred and ten",
    407: "four hundred and seven",
    999: "nine hundred and ninety-nine",
    1000: "one thousand",
    1007: "one thousand and seven",
    1100: "one thousand one hundred",
    2019: "two thousand and nineteen",
    21000: "twenty-one thousand",
    100007: "one hundred thousand and seven",
    120512: "one hundred and twenty thousand five hundred and twelve",
    999999: "nine hundred and ninety-nine thousand nine hundred and ninety-nine",
}


@pytest.mark.parametrize("n, words", sorted(EXPECTED_WORDS.items()))
def test_number_to_words(n, words):
    assert number_to_words(n) == words


def test_number_to_words_without_hyphen():
    assert number_to_words(45, hyphen=False) == "forty five"


@pytest.mark.parametrize("bad", [-1, 1_000_000, 3.0, True])
def test_number_to_words_rejects(bad):
    with pytest.raises(ValueError, match="n must"):
        number_to_words(bad)


def test_number_to_words_is_injective_below_1000():
    assert len({number_to_words(n) for n in range(1000)}) == 1000


def test_number_split_disjoint_and_complete():
    train, held = number_split(max_value=999, held_out_fraction=0.2, seed=3)
    assert len(held) == 200 and len(train) == 800
    assert not set(train.tolist()) & set(held.tolist())
    assert sorted(train.tolist() + held.tolist()) == list(range(1000))
    again_train, again_held = number_split(max_value=999, held_out_fraction=0.2, seed=3)
    np.testing.assert_array_equal(held, again_held)


def test_number_words_dataset_never_uses_held_out():
    _, held = number_split(seed=0)
    pairs = number_words_dataset(3000, seed=1, exclude=held)
    seen = {int(d) for _, d in pairs}
    assert not seen & set(held.tolist())
    # 3000 draws from 800 numbers miss almost none of them
    assert len(seen) > 780
    for words, digits in pairs[:50]:
        assert number_to_words(int(digits)) == words
    assert pairs == number_words_dataset(3000, seed=1, exclude=held)
    assert pairs != number_words_dataset(3000, seed=2, exclude=held)


# --- addition ------------------------------------------------------------------------


def test_addition_format_and_arithmetic():
    problems = addition_dataset(200, digits=3, seed=0)
    assert problems == addition_dataset(200, digits=3, seed=0)
    for p in problems:
        lhs, c = p.split("=")
        a, b = lhs.split("+")
        assert int(a) + int(b) == int(c)
        assert 0 <= int(a) < 1000 and 0 <= int(b) < 1000


def test_addition_reversed_and_padded():
    plain = addition_dataset(50, digits=2, seed=5)
    rev = addition_dataset(50, digits=2, seed=5, reverse_answer=True, pad=True)
    for p, r in zip(plain, rev):
        assert len(r) == 3 * 2 + 3
        lhs, c = p.split("=")
        rlhs, rc = r.split("=")
        assert [int(x) for x in lhs.split("+")] == [int(x) for x in rlhs.split("+")]
        assert int(rc[::-1]) == int(c)


def test_addition_example_by_hand():
    # one case typed in, independent of the generator
    for p in addition_dataset(500, digits=1, seed=0, reverse_answer=True, pad=True):
        if p.startswith("7+5="):
            assert p == "7+5=21"
            break
    else:
        pytest.fail("7+5 not drawn in 500 one-digit problems")


# --- shipped data --------------------------------------------------------------------


def test_corpus_loads():
    text = load_corpus()
    assert 4000 < len(text) < 20000
    assert "attention" in text
    with pytest.raises(ValueError, match="available"):
        load_corpus("no_such_corpus")


def test_digits_shapes_range_and_split():
    d = load_digits_images(test_fraction=0.25, seed=0)
    assert d.X_train.shape[1:] == (1, 8, 8) and d.X_test.shape[1:] == (1, 8, 8)
    assert d.X_train.dtype == np.float32 and d.y_train.dtype == np.int64
    assert d.X_train.shape[0] + d.X_test.shape[0] == 1797  # the size of sklearn's set
    assert d.X_train.min() == 0.0 and d.X_train.max() == 1.0
    assert d.X_test.min() >= 0.0 and d.X_test.max() <= 1.0
    # stratified: each class has a 25 % share of the test set, to within one image
    for c in range(10):
        n_train = int((d.y_train == c).sum())
        n_test = int((d.y_test == c).sum())
        assert abs(n_test - 0.25 * (n_train + n_test)) <= 1
    again = load_digits_images(test_fraction=0.25, seed=0)
    np.testing.assert_array_equal(d.y_test, again.y_test)
    np.testing.assert_array_equal(d.X_test, again.X_test)


def test_pad_batch():
    ids, valid = pad_batch([[5, 6, 7], [8]], pad_id=0)
    np.testing.assert_array_equal(ids, [[5, 6, 7], [8, 0, 0]])
    np.testing.assert_array_equal(valid, [[True, True, True], [True, False, False]])
