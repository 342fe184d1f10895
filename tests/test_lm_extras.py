"""tfbook.tasks.addition and tfbook.tasks.corpus: the data, targets and metrics behind
chapter 13 (fast).

Tolerances: ``1e-12`` where two float64 computations agree in exact arithmetic; float16
round trips are compared with the float16-rounded weights, so they are exact too.

(The check that ``lm_tasks.train`` and ``train_steps`` took identical steps is gone: there
is one loop now; ``tests/test_training.py`` compares it with an independent AdamW loop.)
"""

import math

import pytest
import torch

from tfbook.data import load_corpus
from tfbook.tasks import addition, corpus
from tfbook.torch.models import DecoderLM, DecoderLMConfig
from tfbook.torch.training import History


@pytest.fixture(scope="module")
def split():
    return addition.data(n_train=5_000, n_validation=200, n_test=300)


def test_addition_split_is_disjoint_and_correct(split):
    train, val, test = split
    assert train.shape[1] == val.shape[1] == test.shape[1] == 12 and test.shape[0] == 300
    assert train.shape[0] <= 5_000 and val.shape[0] == 200
    rows_test, rows_val = set(map(tuple, test.tolist())), set(map(tuple, val.tolist()))
    rows_train = set(map(tuple, train.tolist()))
    assert len(rows_test) == 300 and len(rows_val) == 200
    assert not rows_test & rows_train and not rows_val & rows_train and not rows_val & rows_test
    tok = addition.tokenizer()
    for row in torch.cat([train[:200], val, test]):
        s = tok.decode(row)
        a, b, ans = int(s[0:3]), int(s[4:7]), s[8:]
        assert s[3] == "+" and s[7] == "=" and ans == str(a + b).zfill(4)[::-1], s


def test_addition_validation_does_not_change_train_or_test(split):
    other = addition.data(n_train=5_000, n_validation=50, n_test=300)
    assert torch.equal(other.train, split.train) and torch.equal(other.test, split.test)


def test_answer_targets_score_only_the_answer(split):
    test = split.test
    x, y = addition.answer_targets(test, 8)
    assert x.shape == y.shape == (300, 11)
    assert (y[:, :7] == -100).all() and torch.equal(y[:, 7:], test[:, 8:])
    assert torch.equal(x, test[:, :-1])
    with pytest.raises(ValueError, match="prompt_len"):
        addition.answer_targets(test, 12)


def test_bits_per_char_closed_forms():
    torch.manual_seed(0)
    m = DecoderLM(DecoderLMConfig(vocab_size=7, block_size=5, d_model=8, num_heads=2, num_layers=1,
                                  d_ff=16)).double()
    ids = torch.randint(0, 7, (23,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        m.W_E.zero_()  # tied weights: every logit is exactly 0, a uniform model
    assert abs(corpus.bits_per_char(m, ids) - math.log2(7)) < 1e-12
    torch.manual_seed(0)
    m = DecoderLM(DecoderLMConfig(vocab_size=7, block_size=32, d_model=8, num_heads=2, num_layers=1,
                                  d_ff=16)).double()
    with torch.no_grad():  # one window: the plain cross-entropy of the whole sequence
        ce = torch.nn.functional.cross_entropy(m(ids[None, :-1])[0], ids[1:]).item() / math.log(2)
    assert abs(corpus.bits_per_char(m, ids) - ce) < 1e-12
    with pytest.raises(ValueError, match="1-D"):
        corpus.bits_per_char(m, ids[None])


def test_corpus_split_is_contiguous_and_keeps_the_test_slice():
    tr, va, te = corpus.data(0.1, 0.1)
    text = load_corpus()
    assert corpus.tokenizer().decode(torch.cat([tr, va, te])) == text
    assert abs(va.numel() - 0.1 * len(text)) <= 1 and abs(te.numel() - 0.1 * len(text)) <= 1
    # the test slice is the last tenth of the text, whatever the validation share
    assert torch.equal(te, corpus.data(0.2, 0.1).test)
    assert corpus.tokenizer().decode(te) == text[-te.numel():]
    with pytest.raises(ValueError, match="test_fraction"):
        corpus.data(0.5, 0.6)
    with pytest.raises(ValueError, match="val_fraction"):
        corpus.data(1.5, 0.1)


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    m = DecoderLM(corpus.config(50))
    (path,) = corpus.save(m, History(loss=[1.0]), tmp_path)
    loaded, hist = corpus.load_pretrained(path)
    assert hist["loss"] == [1.0] and loaded.config == m.config
    for k, v in m.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v.half().float()), k
