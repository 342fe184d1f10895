"""The implement-it exercises of chapters 0, 11, 12 and 13 teach through their visible tests.

The same contract as tests/test_exercises_ch02_05.py (whose helpers this file reuses): for
every implement-it exercise, each likely mistake that its visible test names is written here
as a deliberately wrong answer, and the test cell's *visible* part (what a student receives)
must fail on it with that mistake's words, printed on a ``✘`` line; the master's solution
must pass the whole cell, hidden part included; every implement-it exercise names at least
two mistakes; every exercise binds its own answer names, and no ordinary cell binds one.

The test cells run in a namespace holding only the chapter's imports (no model is trained
here), so their tests must not depend on the chapter's state; the prediction exercises, which
do, are executed with their chapters by nbval.
"""

from __future__ import annotations

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from test_exercises_ch02_05 import _code, _master, _plan, _run
from tfbook import course_judge

CHAPTERS = ("00_setup_and_notation", "11_decoders", "12_encoder_decoder", "13_language_model")


def _decoder_block(self="self_mask", kv="memory", cross="cross_mask", activation="relu") -> str:
    """The Post-LN decoder block, with a mistake put in by replacing one of its arguments."""
    return _code(f"""
        def my_decoder_block(X, memory, params, num_heads, self_mask=None, cross_mask=None):
            def norm(Y, name):
                return tnp.layer_norm(Y, params[name]["gamma"], params[name]["beta"])
            Z, _ = tnp.multi_head_attention(X, X, params["self_attn"], num_heads, mask={self})
            X = norm(X + Z, "norm1")
            Z, _ = tnp.multi_head_attention(X, {kv}, params["cross_attn"], num_heads, mask={cross})
            X = norm(X + Z, "norm2")
            return norm(X + tnp.feed_forward(X, params["ffn"], activation="{activation}"), "norm3")
    """)


# {chapter: {test grade_id: {mistake: (wrong answer, words its visible failure must contain)}}}
MISTAKES: dict[str, dict[str, dict[str, tuple[str, str]]]] = {
    "00_setup_and_notation": {
        "ex0-1-softmax-tests": {
            "no max subtracted": (_code("""
                def softmax(x, axis=-1):
                    e = np.exp(x)
                    return e / e.sum(axis=axis, keepdims=True)
            """), "exp(1e4) overflows"),
            "max over the whole array": (_code("""
                def softmax(x, axis=-1):
                    e = np.exp(x - x.max())
                    return e / e.sum(axis=axis, keepdims=True)
            """), "the max was taken over the whole array"),
            "normalised over axis 0": (_code("""
                def softmax(x, axis=-1):
                    e = np.exp(x - x.max(axis=0, keepdims=True))
                    return e / e.sum(axis=0, keepdims=True)
            """), "you normalised over axis 0"),
            "float64 promotion": (_code("""
                def softmax(x, axis=-1):
                    x = np.asarray(x, dtype=float)
                    e = np.exp(x - x.max(axis=axis, keepdims=True))
                    return e / e.sum(axis=axis, keepdims=True)
            """), "a float32 input gave a float64 result"),
        },
        "ex0-3-scores-tests": {
            "K.T": (_code("""
                def scores(Q, K):
                    return Q @ K.T / np.sqrt(Q.shape[-1])
            """), "K.T reverses all three axes"),
            "a transpose for one batch axis": (_code("""
                def scores(Q, K):
                    return Q @ np.transpose(K, (0, 2, 1)) / np.sqrt(Q.shape[-1])
            """), "a transpose written for one batch axis"),
            "not scaled": (_code("""
                def scores(Q, K):
                    return Q @ np.swapaxes(K, -1, -2)
            """), "without the 1/sqrt(D_K) factor"),
            "divided by D_K": (_code("""
                def scores(Q, K):
                    return Q @ np.swapaxes(K, -1, -2) / Q.shape[-1]
            """), "divided by D_K = 4 instead of sqrt(D_K)"),
        },
    },
    "11_decoders": {
        "ex11-1-next-token-probs-tests": {
            "multiplied by the temperature": (_code("""
                def next_token_probs(logits, temperature):
                    logits = np.asarray(logits, dtype=np.float64)
                    if temperature == 0:
                        return (np.arange(logits.shape[-1]) == logits.argmax(axis=-1)[..., None]).astype(np.float64)
                    z = logits * temperature
                    e = np.exp(z - z.max(axis=-1, keepdims=True))
                    return e / e.sum(axis=-1, keepdims=True)
            """), "the logits were multiplied by the temperature"),
            "greedy returns the index": (_code("""
                def next_token_probs(logits, temperature):
                    logits = np.asarray(logits, dtype=np.float64)
                    if temperature == 0:
                        return logits.argmax(axis=-1)
                    z = logits / temperature
                    e = np.exp(z - z.max(axis=-1, keepdims=True))
                    return e / e.sum(axis=-1, keepdims=True)
            """), "returned the index of the argmax"),
            "argmax of the flattened array": (_code("""
                def next_token_probs(logits, temperature):
                    logits = np.asarray(logits, dtype=np.float64)
                    if temperature == 0:
                        return np.eye(logits.shape[-1])[logits.argmax()]
                    z = logits / temperature
                    e = np.exp(z - z.max(axis=-1, keepdims=True))
                    return e / e.sum(axis=-1, keepdims=True)
            """), "takes the argmax of the flattened array"),
            "no max subtracted": (_code("""
                def next_token_probs(logits, temperature):
                    logits = np.asarray(logits, dtype=np.float64)
                    if temperature == 0:
                        return (np.arange(logits.shape[-1]) == logits.argmax(axis=-1)[..., None]).astype(np.float64)
                    e = np.exp(logits / temperature)
                    return e / e.sum(axis=-1, keepdims=True)
            """), "exp(1e5) overflows"),
            "max over the whole array": (_code("""
                def next_token_probs(logits, temperature):
                    logits = np.asarray(logits, dtype=np.float64)
                    if temperature == 0:
                        return (np.arange(logits.shape[-1]) == logits.argmax(axis=-1)[..., None]).astype(np.float64)
                    z = logits / temperature
                    e = np.exp(z - z.max())
                    return e / e.sum(axis=-1, keepdims=True)
            """), "the max was taken over the whole array"),
        },
        "ex11-2-attend-with-cache-tests": {
            "the cache given back unchanged": (_code("""
                def attend_with_cache(q, k, v, cache):
                    K, V = (k, v) if cache is None else (np.concatenate([cache[0], k], axis=-2),
                                                         np.concatenate([cache[1], v], axis=-2))
                    z, _ = tnp.scaled_dot_product_attention(q, K, V)
                    return z, cache
            """), "the cache did not grow"),
            "new key first": (_code("""
                def attend_with_cache(q, k, v, cache):
                    K, V = (k, v) if cache is None else (np.concatenate([k, cache[0]], axis=-2),
                                                         np.concatenate([v, cache[1]], axis=-2))
                    z, _ = tnp.scaled_dot_product_attention(q, K, V)
                    return z, (K, V)
            """), "the new key went first"),
            "not scaled": (_code("""
                def attend_with_cache(q, k, v, cache):
                    K, V = (k, v) if cache is None else (np.concatenate([cache[0], k], axis=-2),
                                                         np.concatenate([cache[1], v], axis=-2))
                    z, _ = tnp.scaled_dot_product_attention(q, K, V, scale=1.0)
                    return z, (K, V)
            """), "not divided by sqrt(D_K)"),
            "the old cache only": (_code("""
                def attend_with_cache(q, k, v, cache):
                    if cache is None:
                        return v, (k, v)
                    z, _ = tnp.scaled_dot_product_attention(q, cache[0], cache[1])
                    return z, (np.concatenate([cache[0], k], axis=-2), np.concatenate([cache[1], v], axis=-2))
            """), "attended to the old cache only"),
            "concatenated along axis 0": (_code("""
                def attend_with_cache(q, k, v, cache):
                    K, V = (k, v) if cache is None else (np.concatenate([cache[0], k], axis=0),
                                                         np.concatenate([cache[1], v], axis=0))
                    z, _ = tnp.scaled_dot_product_attention(q, K, V)
                    return z, (K, V)
            """), "concatenate along the token axis, -2, not 0"),
        },
    },
    "12_encoder_decoder": {
        "ex12-1-decoder-block-tests": {
            "Pre-LN": (_code("""
                def my_decoder_block(X, memory, params, num_heads, self_mask=None, cross_mask=None):
                    def norm(Y, name):
                        return tnp.layer_norm(Y, params[name]["gamma"], params[name]["beta"])
                    Y = norm(X, "norm1")
                    X = X + tnp.multi_head_attention(Y, Y, params["self_attn"], num_heads, mask=self_mask)[0]
                    X = X + tnp.multi_head_attention(norm(X, "norm2"), memory, params["cross_attn"], num_heads,
                                                     mask=cross_mask)[0]
                    return X + tnp.feed_forward(norm(X, "norm3"), params["ffn"], activation="relu")
            """), "this is the Pre-LN block"),
            "cross-attention reads X": (_decoder_block(kv="X", cross="None"),
                                        "the cross-attention read X, not the memory"),
            "self_mask not applied": (_decoder_block(self="None"), "the causal self_mask was not applied"),
            "cross_mask ignored": (_decoder_block(cross="None"), "cross_mask was ignored"),
            "GELU": (_decoder_block(activation="gelu"), "the MLP used GELU"),
        },
    },
    "13_language_model": {
        "ex13-1-next-digit-tests": {
            "no final carry": (_code("""
                def next_answer_digit(a_digits, b_digits, written):
                    i = len(written)
                    carry = 0 if i == 0 else int(written[-1] < a_digits[i - 1] + b_digits[i - 1])
                    return (a_digits[i] + b_digits[i] + carry) % 10
            """), "the next digit is then the final carry"),
            "carry left out": (_code("""
                def next_answer_digit(a_digits, b_digits, written):
                    i = len(written)
                    if i == len(a_digits):
                        return int(written[-1] < a_digits[i - 1] + b_digits[i - 1])
                    return (a_digits[i] + b_digits[i]) % 10
            """), "the carry was left out"),
            "<= for <": (_code("""
                def next_answer_digit(a_digits, b_digits, written):
                    i = len(written)
                    carry = 0 if i == 0 else int(written[-1] <= a_digits[i - 1] + b_digits[i - 1])
                    return carry if i == len(a_digits) else (a_digits[i] + b_digits[i] + carry) % 10
            """), "a written digit equal to a + b of its column means no carry"),
            "carry recomputed from the columns": (_code("""
                def next_answer_digit(a_digits, b_digits, written):
                    i, carry = len(written), 0
                    for j in range(i):
                        carry = (a_digits[j] + b_digits[j] + carry) // 10
                    return carry if i == len(a_digits) else (a_digits[i] + b_digits[i] + carry) % 10
            """), "the carry was recomputed from the columns"),
            "the wrong column": (_code("""
                def next_answer_digit(a_digits, b_digits, written):
                    i = len(written)
                    if i == len(a_digits):
                        return int(written[-1] < a_digits[i - 1] + b_digits[i - 1])
                    carry = 0 if i == 0 else int(written[-1] < a_digits[i] + b_digits[i])
                    return (a_digits[i] + b_digits[i] + carry) % 10
            """), "compared with the wrong column"),
            "a float": (_code("""
                def next_answer_digit(a_digits, b_digits, written):
                    i = len(written)
                    carry = 0.0 if i == 0 else float(written[-1] < a_digits[i - 1] + b_digits[i - 1])
                    return carry if i == len(a_digits) else (a_digits[i] + b_digits[i] + carry) % 10
            """), "not floats"),
        },
        "ex13-2-greedy-tests": {
            "new tokens only": (_code("""
                def greedy_generate(logits_fn, prompt, n_new):
                    ids, new = np.asarray(prompt), []
                    for _ in range(n_new):
                        new.append(logits_fn(ids)[:, -1].argmax(axis=-1))
                        ids = np.concatenate([ids, new[-1][:, None]], axis=1)
                    return np.stack(new, axis=1)
            """), "only the 4 new tokens were returned"),
            "first row": (_code("""
                def greedy_generate(logits_fn, prompt, n_new):
                    ids = np.asarray(prompt)
                    for _ in range(n_new):
                        ids = np.concatenate([ids, logits_fn(ids)[:, 0].argmax(axis=-1)[:, None]], axis=1)
                    return ids
            """), "the logits of the first position were used"),
            "not fed back": (_code("""
                def greedy_generate(logits_fn, prompt, n_new):
                    ids = np.asarray(prompt)
                    for _ in range(n_new):
                        ids = np.concatenate([ids, logits_fn(np.asarray(prompt))[:, -1].argmax(axis=-1)[:, None]],
                                             axis=1)
                    return ids
            """), "the new tokens were not fed back"),
            "the last token only": (_code("""
                def greedy_generate(logits_fn, prompt, n_new):
                    ids = np.asarray(prompt)
                    for _ in range(n_new):
                        ids = np.concatenate([ids, logits_fn(ids[:, -1:])[:, -1].argmax(axis=-1)[:, None]], axis=1)
                    return ids
            """), "logits_fn was given the last token only"),
        },
    },
}


CASES = [(c, gid, m) for c, per in MISTAKES.items() for gid, ms in per.items() for m in ms]


@pytest.mark.parametrize("chapter,gid,mistake", CASES, ids=[f"{g}:{m}" for _, g, m in CASES])
def test_each_named_mistake_fails_the_visible_test(chapter, gid, mistake):
    wrong, words = MISTAKES[chapter][gid][mistake]
    test = _plan(chapter).test(gid)
    exc, printed = _run(chapter, wrong, test.visible)
    assert isinstance(exc, AssertionError), (mistake, exc, printed)
    assert words in str(exc), (mistake, str(exc))
    assert any(line.startswith("✘") and words in line for line in printed.splitlines()), printed


@pytest.mark.parametrize("chapter,gid", sorted({(c, g) for c, g, _ in CASES}))
def test_the_solution_passes_the_whole_test_cell(chapter, gid):
    plan = _plan(chapter)
    test = plan.test(gid)
    exc, printed = _run(chapter, plan.answers[test.answer], test.source)
    assert exc is None, (exc, printed)
    assert "✘" not in printed


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_implement_it_exercise_names_two_mistakes(chapter):
    plan = _plan(chapter)
    implement = [t.gid for t in plan.tests if any(mode == "call" for _, mode in t.names)]
    assert implement, chapter
    for gid in implement:
        assert len(MISTAKES.get(chapter, {}).get(gid, {})) >= 2, gid


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_exercise_has_its_own_answer_names(chapter):
    plan = _plan(chapter)
    bound = {gid: set(course_judge._bound_names(src)) for gid, src in plan.answers.items()}
    seen: dict[str, str] = {}
    for gid, names in bound.items():
        for n in names:
            assert n not in seen, f"{n} is bound by both {seen[n]} and {gid}"
            seen[n] = gid
    for test in plan.tests:
        used = {n for n, _ in test.names}
        assert used and used <= bound[test.answer], (test.gid, used, bound[test.answer])
    for cell in _master(chapter).cells:
        if cell.cell_type == "code" and not cell.get("metadata", {}).get("nbgrader"):
            clash = set(course_judge._bound_names(TransformerManager().transform_cell(cell.source))) & set(seen)
            assert not clash, (chapter, clash)
