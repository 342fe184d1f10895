"""tfbook.torch.models.beam_search: beam search for the encoder-decoder (chapter 12).

On the shipped number-words model in float64: beam width 1 is greedy decoding exactly, and
every beam search finds a sequence whose log-probability is at least greedy's, on all 1,000
held-out numbers. On an untrained (random) model, where greedy is often not the most likely
sequence, beam search must do strictly better somewhere.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tfbook.torch import models
from tfbook.tasks import number_words as nw


def _pad_to(x, L, value):
    return F.pad(x, (0, L - x.shape[1]), value=value)


@pytest.fixture(scope="module")
def model64():
    model, _ = nw.load_pretrained()
    m = nw.make_model().double().eval()
    m.load_state_dict(model.state_dict())
    return m


@pytest.fixture(scope="module")
def held_out():
    return nw.data().test


def _greedy(model, numbers):
    src, valid = nw.source_batch(numbers)
    ids = model.greedy_decode(src, max_len=6, bos=nw.BOS, eos=nw.EOS, src_valid=valid)
    return src, valid, ids


def test_beam_width_one_is_greedy_exactly(model64, held_out):
    src, valid, g = _greedy(model64, held_out)
    b, scores = models.beam_search(model64, src, 6, nw.BOS, nw.EOS, beam_width=1, src_valid=valid)
    L = max(g.shape[1], b.shape[1])
    assert torch.equal(_pad_to(g, L, nw.PAD), _pad_to(b, L, nw.PAD))
    lp = models.sequence_log_prob(model64, src, g, eos=nw.EOS, bos=nw.BOS, src_valid=valid)
    # the incremental sum and the teacher-forced sum of the same log-probabilities: float64 round-off
    torch.testing.assert_close(scores, lp, atol=1e-12, rtol=0)


@pytest.mark.parametrize("width", [2, 4])
def test_beam_log_prob_is_at_least_greedy_on_every_held_out_number(model64, held_out, width):
    src, valid, g = _greedy(model64, held_out)
    lp_greedy = models.sequence_log_prob(model64, src, g, eos=nw.EOS, bos=nw.BOS, src_valid=valid)
    b, scores = models.beam_search(model64, src, 6, nw.BOS, nw.EOS, beam_width=width, src_valid=valid)
    lp_beam = models.sequence_log_prob(model64, src, b, eos=nw.EOS, bos=nw.BOS, src_valid=valid)
    torch.testing.assert_close(scores, lp_beam, atol=1e-12, rtol=0)  # the score it reports is the sequence's
    assert (lp_beam >= lp_greedy - 1e-12).all()  # float64 round-off between two equal sums


def test_beam_search_beats_greedy_somewhere_on_an_untrained_model():
    torch.manual_seed(1)
    m = nw.make_model(seed=3).double().eval()  # random weights: flat, ambiguous next-token distributions
    numbers = list(range(0, 400, 7))
    src, valid, g = _greedy(m, numbers)
    lp_greedy = models.sequence_log_prob(m, src, g, eos=nw.EOS, bos=nw.BOS, src_valid=valid)
    b, scores = models.beam_search(m, src, 6, nw.BOS, nw.EOS, beam_width=4, src_valid=valid)
    assert (scores >= lp_greedy - 1e-12).all()
    assert (scores > lp_greedy + 1e-6).any()  # a strictly better sequence exists, and beam search finds it


def test_finished_beams_are_padded_after_eos(model64):
    src, valid = nw.source_batch([7, 4207])
    b, _ = models.beam_search(model64, src, 6, nw.BOS, nw.EOS, beam_width=3, src_valid=valid)
    assert [nw.decode_target(r) for r in b] == ["7", "4207"]
    row = b[0].tolist()
    assert row[:2] == [3 + 7, nw.EOS] and all(t == nw.PAD for t in row[2:])


def test_bad_arguments_raise_value_errors(model64):
    src, valid = nw.source_batch([7])
    with pytest.raises(ValueError, match="beam_width"):
        models.beam_search(model64, src, 6, nw.BOS, nw.EOS, beam_width=0)
    with pytest.raises(ValueError, match="max_len"):
        models.beam_search(model64, src, 10_000, nw.BOS, nw.EOS)
    with pytest.raises(ValueError, match="eos"):
        models.beam_search(model64, src, 6, nw.BOS, 99)
