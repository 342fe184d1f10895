"""tfbook.tasks.instruct: the instruction set, the packing, the scoring, and the shipped models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tfbook.tasks import instruct as I
from tfbook.torch import assistant as A


def test_splits_are_disjoint_and_fit_the_context():
    s = I.data()
    tok = I.tokenizer()
    for task in I.TASKS:
        prompts = [set(p for p, _ in getattr(s, part)[task]) for part in ("train", "validation", "test")]
        assert not (prompts[0] & prompts[2] or prompts[0] & prompts[1] or prompts[1] & prompts[2]), task
        for part in s:
            for p, a in part[task]:
                assert len(I.encode_conversation(tok, p, a)) <= 64
    # reverse and count: no test word in training
    words = lambda items: {p.split()[-1] for p, _ in items}  # noqa: E731
    assert not words(s.train["reverse"]) & words(s.test["reverse"])
    assert not words(s.train["count"]) & words(s.test["count"])


def test_answers_are_right():
    for task in I.TASKS:
        for p, a in I.data().test[task][:20]:
            if task == "reverse":
                assert a == p.split(": ")[1][::-1]
            elif task == "count":
                _, ch, _, w = p.split()
                assert a == I.number_word(w.count(ch))
            elif task == "add":
                x, _, y = p.split(" plus ")[0], None, p.split(" plus ")[1]
                assert a == I.number_word(I.NUMBER_WORDS.index(x) + I.NUMBER_WORDS.index(y))
            else:
                passage, rest = p.split("; after ")
                w = passage.split()
                assert w[w.index(rest[:-1]) + 1] == a


def test_pack_keeps_conversations_whole():
    tok = I.tokenizer()
    convs = [I.encode_conversation(tok, p, a) for p, a in I.data().train["lookup"][:30]]
    for first_fit in (True, False):
        ids, doc = I.pack(convs, 64, first_fit=first_fit)
        got = sorted(tuple(ids[b][doc[b] == d].tolist()) for b in range(ids.shape[0]) for d in range(int(doc[b].max()) + 1))
        assert got == sorted(map(tuple, convs))
    ids, doc = I.pack(convs, 64, first_fit=False)
    flat = [tuple(ids[b][doc[b] == d].tolist()) for b in range(ids.shape[0]) for d in range(int(doc[b].max()) + 1)]
    assert flat == list(map(tuple, convs))  # next fit keeps the order
    with pytest.raises(ValueError, match="does not fit"):
        I.pack([[0] * 65], 64)


def test_teacher_forced_exact_match_equals_greedy_generation():
    torch.manual_seed(0)
    model = I.base_model()
    # a model that answers something: a few steps of fine-tuning
    model, _ = I.train("full", steps=40)
    items = [x for t in I.TASKS for x in I.data().validation[t][:15]]
    exact, logprob = I.scores(model, items)
    gen = I.answers(model.double(), [p for p, _ in items])
    model.float()
    assert exact.tolist() == [int(g == a) for g, (_, a) in zip(gen, items)]
    assert (logprob <= 0).all()


def test_answer_scores_logprob_is_the_product_of_the_steps():
    torch.manual_seed(1)
    model = I.base_model().double()
    tok = I.tokenizer()
    p, a = I.data().test["reverse"][0]
    ids, doc = I.encode_items([(p, a)])
    _, lp = A.answer_scores(model, ids, doc, tok.assistant_id, tok.end_id)
    seq = I.prompt_ids(tok, p)
    total = 0.0
    for nxt in tok.encode(a) + [tok.end_id]:
        total += float(torch.log_softmax(model(torch.tensor([seq]))[0, -1], -1)[nxt])
        seq.append(nxt)
    assert abs(float(lp[0]) - total) < 1e-10


# ----------------------------------------------------------------------------- shipped artifacts
def test_shipped_artifacts_and_choices():
    from tfbook.tasks._common import shipped

    for name in I.ARTIFACTS:
        assert shipped(name).is_file(), name
    res = I.load_results()
    for method in I.METHODS:
        grid = res["grid"][method]
        assert f"{res['chosen_lr'][method]:g}" == max(grid, key=grid.get)  # chosen on validation
        for s in (0, 1, 2):
            _, hist = I.load_pretrained(method, s)
            assert hist.extra["recipe"]["lr"] == res["chosen_lr"][method] and hist.extra["recipe"]["seed"] == s
            assert len(hist.loss) == I.RECIPE["steps"]


@pytest.mark.parametrize("method", I.METHODS)
def test_shipped_scores_recomputed(method):
    res = I.load_results()
    model, _ = I.load_pretrained(method, 0)
    assert I.exact_match(model, I.data().test) == res["runs"][f"{method}_seed0"]["test"]
    base, _ = I.load_pretrained.__globals__["prose"].load_pretrained("small")
    if method == "lora":  # the old vocabulary is untouched
        assert torch.equal(model.W_E[:base.config.vocab_size], base.W_E)


def test_shipped_bars():
    res = I.load_results()
    mean = lambda e: float(np.mean([np.mean(v) for v in e.values()]))  # noqa: E731
    assert mean(res["test_base"]) == 0.0
    for method in ("full", "lora"):
        for s in (0, 1, 2):
            run = res["runs"][f"{method}_seed{s}"]
            assert mean(run["test"]) > 0.2, (method, s)
            assert run["bpc"] > res["bpc_base"] + 0.5, (method, s)  # forgetting is measured, and large


def test_scores_leaves_the_model_in_its_dtype():
    # scores works in float64 and must hand the model back as it came (it once forced float32,
    # so a float64 model sampled afterwards silently ran in float32)
    items = [x for t in I.TASKS for x in I.data().validation[t][:2]]
    for dtype in (torch.float32, torch.float64):
        model = I.base_model().to(dtype)
        I.scores(model, items)
        assert {p.dtype for p in model.parameters()} == {dtype}
