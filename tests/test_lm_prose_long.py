"""The long prose model of chapter 13 (tfbook.tasks.prose, the LONG_* part): dropout hooks,
scoring after a context, dynamic evaluation, cached sampling, a few training steps, and the
shipped weights and scores. About 20 s."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from tfbook.tasks import prose
from tfbook.torch.models import DecoderLM, DecoderLMConfig


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return DecoderLM(DecoderLMConfig(vocab_size=prose.tokenizer().vocab_size, block_size=32, d_model=32,
                                     num_heads=4, num_layers=2, d_ff=64)).double().eval()


@pytest.fixture(scope="module")
def splits():
    return prose.data()


def test_dropout_hooks_change_training_mode_only(tiny):
    import copy

    m = prose.add_dropout(copy.deepcopy(tiny), 0.3)
    x = torch.randint(0, 62, (2, 20), generator=torch.Generator().manual_seed(0))
    m.eval()
    torch.testing.assert_close(m(x), tiny(x), rtol=0, atol=0)      # eval: the same model
    m.train()
    torch.manual_seed(1)
    y1 = m(x)
    assert (y1 - tiny(x)).abs().max() > 1e-3                          # train: units dropped
    with pytest.raises(ValueError, match="p must be"):
        prose.add_dropout(copy.deepcopy(tiny), 1.0)


def test_bits_after_predicts_each_character_from_the_text_before_it(tiny, splits):
    ctx, ids = splits.validation[:100], splits.test[:50]
    bits = prose.bits_after(tiny, ctx, ids)
    assert bits.shape == (50,)
    T = tiny.config.block_size
    full = torch.cat([ctx, ids])
    # character i of ids sits at position 100 + i of full; the sliding window (stride T/2)
    # gives it between T/2 and T characters before it: check the first one by a direct forward
    # pass on the T characters before it, the window the first prediction uses
    with torch.no_grad():
        lp = torch.log_softmax(tiny(full[100 - T:100][None])[0, -1], -1)[ids[0]] / math.log(2)
    assert float(bits[0]) == pytest.approx(-float(lp), rel=1e-12)
    # and every prediction is a proper probability: bits > 0
    assert (bits > 0).all()
    with pytest.raises(ValueError, match="context"):
        prose.bits_after(tiny, ctx[:0], ids)
    with pytest.raises(ValueError, match="block"):
        prose.char_log_probs(tiny, full, block=T + 1)


def test_dynamic_evaluation_scores_each_segment_before_training_on_it(tiny, splits):
    ctx, ids = splits.train[-200:], splits.validation[:96]
    static = prose.dynamic_bits(tiny, ctx, ids, lr=0.0, segment=16)
    adapt = prose.dynamic_bits(tiny, ctx, ids, lr=1e-2, segment=16)
    # the first segment is scored before any step: equal; later ones by an updated model
    torch.testing.assert_close(adapt[:16], static[:16], rtol=1e-6, atol=1e-6)   # float32 copies
    assert (adapt[16:] - static[16:]).abs().max() > 1e-3
    # lr = 0 is the static score of each character after the block_size - 16 before its segment
    T = tiny.config.block_size
    full = torch.cat([ctx[-T:], ids])
    i = 20                                         # in segment 1 (16..31), which predicts full[T+16 : T+32]
    with torch.no_grad():
        lp = torch.log_softmax(tiny.float()(full[T + 32 - 1 - T:T + 32 - 1][None])[0], -1)
    tiny.double()
    want = -float(lp[T - 16 + (i - 16), ids[i]]) / math.log(2)
    assert float(static[i]) == pytest.approx(want, rel=1e-5)
    # the caller's model is not changed
    assert next(tiny.parameters()).dtype == torch.float64
    with pytest.raises(ValueError, match="segment"):
        prose.dynamic_bits(tiny, ctx, ids, lr=0.0, segment=T + 1)
    with pytest.raises(ValueError, match="lr"):
        prose.dynamic_bits(tiny, ctx, ids, lr=-1.0, segment=16)


def test_cached_sampling_equals_the_plain_loop(tiny):
    prompt, n, seed = "And the LORD said", 12, 3
    got = prose.sample(tiny, prompt, n, seed=seed, top_p=0.9)
    tok = prose.tokenizer()
    ids = torch.tensor(tok.encode(prompt))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(n):                          # no cache: the whole text each step
            logits = tiny(ids[None])[0, -1]
            probs = torch.softmax(prose.filter_logits(logits, top_p=0.9), -1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)])
    assert got == tok.decode(ids.tolist())


def test_train_long_takes_steps_and_keeps_the_best_validation(monkeypatch):
    monkeypatch.setitem(prose.LONG_CANDIDATES, "tiny", dict(d_model=32, num_heads=4, num_layers=1, d_ff=64,
                                                           block_size=32, dropout=0.1))
    monkeypatch.setitem(prose.LONG_RECIPE, "batch_size", 4)
    monkeypatch.setitem(prose.LONG_RECIPE, "eval_every", 2)
    model, h = prose.train_long("tiny", seed=0, steps=4)
    assert h.eval_step == [2, 4] and len(h.lr) == 4
    assert h.best_eval == min(h.eval) and h.eval[0] < math.log2(62) + 0.5
    assert h.extra["recipe"]["steps"] == 4 and not model.training
    # the returned weights are the best evaluation's: scoring them again gives best_eval
    assert prose.bits_per_char(model, prose.data().validation, dtype=torch.float32) == pytest.approx(h.best_eval, abs=1e-4)
    with pytest.raises(ValueError, match="name"):
        prose.long_config("huge")


def test_shipped_long_model_and_scores():
    scores = prose.load_long_scores()
    model, hist = prose.load_long()
    cfg = prose.long_config(scores["chosen"])
    assert model.config == cfg and scores["chosen"] == prose.LONG_NAME
    assert (prose.shipped("prose_long.pt").stat().st_size if hasattr(prose.shipped("prose_long.pt"), "stat")
            else len(prose.shipped("prose_long.pt").read_bytes())) < 6_000_000
    runs = scores["candidates"]
    names = {k.rsplit("_s", 1)[0] for k in runs}
    means = {n: statistics.mean(runs[f"{n}_s{s}"]["best_eval"] for s in range(3)) for n in names}
    assert min(means, key=means.get) == scores["chosen"]           # the choice follows the validation
    assert hist.best_eval == pytest.approx(runs[f"{scores['chosen']}_s0"]["best_eval"], rel=1e-9)
    assert set(scores["seeds"]) == {"0", "1", "2"}
    for kind in ("kn", "mkn", "ppmd", "zpaq"):                     # chosen on validation
        search = scores["classical"][kind]["search"]
        assert scores["classical"][kind]["validation"] == min(search.values())


def test_shipped_seed0_scores_recomputed_on_the_whole_test_slice(one_thread):
    """Chapter 13's table: seed 0's frozen and adapting test scores (the adapting one at the
    rate validation chose) and zpaq's, recomputed in full from the shipped weights and the
    compressor, equal the record (the chapter recomputes them on a slice), and so do the two mixtures
    with the count model, learning as it reads and with its counts frozen (tfbook.tasks.mixing's
    record; the chapter recomputes the first on a slice).
    About a minute."""
    scores = prose.load_long_scores()
    model, _ = prose.load_long()
    _, c_val, c_test = prose.data()
    frozen_bits = prose.bits_after(model, c_val, c_test, dtype=torch.float32).numpy()          # (n_test,)
    assert float(frozen_bits.mean()) == pytest.approx(scores["seeds"]["0"]["test"], abs=1e-4)  # float32 sums
    adapting_bits = prose.dynamic_bits(model, c_val, c_test, scores["dynamic"]["lr"]).numpy()
    assert float(adapting_bits.mean()) == pytest.approx(scores["dynamic"]["test_seeds"]["0"],
                                                        abs=1e-3)                      # float32, 489 Adam steps
    # chapter 13's headline: the same per-character bits mixed with the count model (learning as it
    # reads) under the weights chosen on validation give tfbook.tasks.mixing's whole-slice record; the
    # count model costs a few seconds, the transformer's bits are the ones just computed
    from tfbook.tasks import mixing
    mix_rec = mixing.load_pretrained()
    c_train = prose.data()[0].numpy()
    p_counts, longest = mixing.count_probs(c_train, c_test.numpy(), mix_rec["K"], mix_rec["discount"],
                                           prose.tokenizer().vocab_size, strength=mix_rec["strength"])
    assert mixing.bits(p_counts) == pytest.approx(mix_rec["counts"]["test"], abs=1e-9)       # float64
    # the control: the counts frozen after the training text (the same weights and classes)
    p_static, _ = mixing.count_probs(c_train, c_test.numpy(), mix_rec["K"], mix_rec["discount"],
                                     prose.tokenizer().vocab_size, online=False, strength=mix_rec["strength"])
    assert mixing.bits(p_static) == pytest.approx(mix_rec["counts"]["test_static"], abs=1e-9)
    static = {}
    for name, bits in (("frozen", frozen_bits), ("adapting", adapting_bits)):
        rec = mix_rec["mixtures"][name]
        cls = mixing.classes(longest) if rec["rule"] == "per class" else np.zeros(len(longest), dtype=int)
        p_model, lam = 2.0 ** -bits.astype(np.float64), np.array(rec["weights"])
        # 1e-3: the adapting bits as above; the record's frozen bits are dynamic_bits at rate 0, whose windows
        # differ from bits_after's (the transformer alone: 1.6337 against 1.6341)
        assert mixing.bits(mixing.mix(p_model, p_counts, cls, lam)) == pytest.approx(rec["test"], abs=1e-3), name
        static[name] = mixing.bits(mixing.mix(p_model, p_static, cls, lam))
        assert static[name] == pytest.approx(rec["test_static_counts"], abs=1e-3), name
    # the page's control: with the counts frozen (the weights and classes fitted for the learning counts) the
    # adapting mixture is behind zpaq; a mixture refitted for frozen counts is not measured
    assert static["adapting"] > scores["classical"]["zpaq"]["test"] > mix_rec["mixtures"]["adapting"]["test"]
    from tfbook import ngram
    z = scores["classical"]["zpaq"]
    if ngram.compressor_backend("zpaq", method=z["method"]):    # the zpaq package (pip) or program
        btr, _, bte = prose.text_splits()
        assert ngram.compressed_bits(btr, bte, "zpaq", method=z["method"]) == pytest.approx(z["test"], abs=2e-3)
