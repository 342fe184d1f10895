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
