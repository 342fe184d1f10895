"""tfbook.lm_tasks: the data, targets, loop and metrics behind chapter 12 (fast).

Tolerances: ``1e-12`` where two float64 computations agree in exact arithmetic; float16
round trips are compared with the float16-rounded weights, so they are exact too.
"""

import math

import numpy as np
import pytest
import torch

from tfbook import lm_tasks as lt
from tfbook.data import load_corpus
from tfbook.torch.models import DecoderLM, DecoderLMConfig, lm_loss, train_steps


@pytest.fixture(scope="module")
def split():
    return lt.addition_split(n_train=5_000, n_test=300)


def test_addition_split_is_disjoint_and_correct(split):
    train, test = split
    assert train.shape[1] == test.shape[1] == 12 and test.shape[0] == 300
    assert train.shape[0] <= 5_000
    rows_test = set(map(tuple, test.tolist()))
    assert len(rows_test) == 300 and not rows_test & set(map(tuple, train.tolist()))
    tok = lt.addition_tokenizer()
    for row in torch.cat([train[:200], test]):
        s = tok.decode(row)
        a, b, ans = int(s[0:3]), int(s[4:7]), s[8:]
        assert s[3] == "+" and s[7] == "=" and ans == str(a + b).zfill(4)[::-1], s


def test_answer_targets_score_only_the_answer(split):
    _, test = split
    x, y = lt.answer_targets(test, 8)
    assert x.shape == y.shape == (300, 11)
    assert (y[:, :7] == -100).all() and torch.equal(y[:, 7:], test[:, 8:])
    assert torch.equal(x, test[:, :-1])
    with pytest.raises(ValueError, match="prompt_len"):
        lt.answer_targets(test, 12)


def test_train_equals_train_steps(split):
    train_ids, _ = split
    x_all, y_all = lt.answer_targets(train_ids, 8)

    def batch_fn(g):
        rows = torch.randint(0, x_all.shape[0], (16,), generator=g)
        return x_all[rows], y_all[rows]

    losses = []
    for loop in (lt.train, train_steps):
        torch.manual_seed(3)
        m = DecoderLM(lt.addition_config())
        out = loop(m, lm_loss, batch_fn, 3, seed=5, disable=True)
        losses.append(out["loss"] if isinstance(out, dict) else out)
    assert losses[0] == losses[1]


def test_train_records_evaluations():
    torch.manual_seed(0)
    m = DecoderLM(DecoderLMConfig(vocab_size=5, block_size=4, d_model=8, num_heads=2, num_layers=1, d_ff=16))
    data = torch.arange(40) % 5

    def batch_fn(g):
        start = torch.randint(0, 30, (4,), generator=g)
        w = data[start[:, None] + torch.arange(5)]
        return w[:, :-1], w[:, 1:]

    h = lt.train(m, lm_loss, batch_fn, 6, evaluate=lambda mm: 1.0, eval_every=3)
    assert h["eval_step"] == [0, 3, 6] and len(h["loss"]) == 6
    with pytest.raises(ValueError, match="steps"):
        lt.train(m, lm_loss, batch_fn, 0)


def test_bits_per_char_closed_forms():
    torch.manual_seed(0)
    m = DecoderLM(DecoderLMConfig(vocab_size=7, block_size=5, d_model=8, num_heads=2, num_layers=1,
                                  d_ff=16)).double()
    ids = torch.randint(0, 7, (23,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        m.W_E.zero_()  # tied weights: every logit is exactly 0, a uniform model
    assert abs(lt.bits_per_char(m, ids) - math.log2(7)) < 1e-12
    torch.manual_seed(0)
    m = DecoderLM(DecoderLMConfig(vocab_size=7, block_size=32, d_model=8, num_heads=2, num_layers=1,
                                  d_ff=16)).double()
    with torch.no_grad():  # one window: the plain cross-entropy of the whole sequence
        ce = torch.nn.functional.cross_entropy(m(ids[None, :-1])[0], ids[1:]).item() / math.log(2)
    assert abs(lt.bits_per_char(m, ids) - ce) < 1e-12
    with pytest.raises(ValueError, match="1-D"):
        lt.bits_per_char(m, ids[None])


def test_corpus_split_is_contiguous():
    tok, tr, va = lt.corpus_split(0.1)
    text = load_corpus()
    assert tok.decode(torch.cat([tr, va])) == text
    assert abs(va.numel() - 0.1 * len(text)) <= 1
    with pytest.raises(ValueError, match="val_fraction"):
        lt.corpus_split(1.5)


def test_corpus_split3_is_contiguous_and_keeps_the_test_slice():
    tok, tr, va, te = lt.corpus_split3(0.1, 0.1)
    text = load_corpus()
    assert tok.decode(torch.cat([tr, va, te])) == text
    assert abs(va.numel() - 0.1 * len(text)) <= 1 and abs(te.numel() - 0.1 * len(text)) <= 1
    assert torch.equal(te, lt.corpus_split(0.1)[2])  # the test slice is the last tenth
    with pytest.raises(ValueError, match="test_fraction"):
        lt.corpus_split3(0.5, 0.6)


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    m = DecoderLM(lt.corpus_config(50))
    path = lt.save_model(tmp_path / "m.pt", m, {"loss": [1.0], "eval": [], "eval_step": []})
    loaded, hist = lt.load_model("corpus", path)
    assert hist["loss"] == [1.0] and loaded.config == m.config
    for k, v in m.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v.half().float()), k
    with pytest.raises(ValueError, match="name"):
        lt.load_model("poetry")
