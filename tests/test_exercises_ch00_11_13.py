"""The implement-it exercises of chapters 0, 11, 12 and 13 teach through their visible tests.

The contract and the generic tests are those of tests/exercise_harness.py: each likely mistake
that a visible test names is written here as a deliberately wrong answer and must fail the
test cell's *visible* part with that mistake's words, on a ``✘`` line; the master's solution
must pass the whole cell, hidden part included; every implement-it exercise names at least two
mistakes; every exercise binds its own answer names, and no ordinary cell binds one.

The test cells run in a namespace holding only the chapter's imports (no model is trained
here), so their tests must not depend on the chapter's state; the prediction exercises, which
do, are executed with their chapters by nbval.
"""

from __future__ import annotations

from exercise_harness import code, exercise_tests, variant

CHAPTERS = ("00_setup_and_notation", "11_decoders", "12_encoder_decoder", "13_language_model")


def _packed(self="causal & same", cross="tp[:, None] == sp[None, :]") -> str:
    """packed_masks with a mistake put in by replacing how one mask is built."""
    return code(f"""
        def packed_masks(src_lengths, tgt_lengths):
            tp = np.repeat(np.arange(len(tgt_lengths)), tgt_lengths)
            sp = np.repeat(np.arange(len(src_lengths)), src_lengths)
            causal = np.tril(np.ones((len(tp), len(tp)), dtype=bool))
            same = tp[:, None] == tp[None, :]
            return {self}, {cross}
    """)


_MIN_P_PROBS = """
def min_p_probs(logits, temperature, p_min):
    logits = np.asarray(logits, dtype=np.float64)
    z = logits / temperature
    z = z - SHIFT
    e = np.where(KEEP, np.exp(z), 0.0)
    return e / NORM
"""


def _min_p_probs(**change) -> str:
    """Exercise 11.1's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_MIN_P_PROBS, dict(
        SHIFT="z.max(axis=-1, keepdims=True)", KEEP="z >= np.log(p_min)", NORM="e.sum(axis=-1, keepdims=True)"),
        **change)


# {chapter: {test grade_id: {mistake: (wrong answer, words its visible failure must contain)}}}
MISTAKES: dict[str, dict[str, dict[str, tuple[str, str]]]] = {
    "00_setup_and_notation": {
        "ex0-1-softmax-tests": {
            "no max subtracted": (code("""
                def softmax(x, axis=-1):
                    e = np.exp(x)
                    return e / e.sum(axis=axis, keepdims=True)
            """), "exp(1e4) overflows"),
            "max over the whole array": (code("""
                def softmax(x, axis=-1):
                    e = np.exp(x - x.max())
                    return e / e.sum(axis=axis, keepdims=True)
            """), "the max was taken over the whole array"),
            "normalised over axis 0": (code("""
                def softmax(x, axis=-1):
                    e = np.exp(x - x.max(axis=0, keepdims=True))
                    return e / e.sum(axis=0, keepdims=True)
            """), "you normalised over axis 0"),
            "float64 promotion": (code("""
                def softmax(x, axis=-1):
                    x = np.asarray(x, dtype=float)
                    e = np.exp(x - x.max(axis=axis, keepdims=True))
                    return e / e.sum(axis=axis, keepdims=True)
            """), "a float32 input gave a float64 result"),
        },
        "ex0-3-scores-tests": {
            "K.T": (code("""
                def scores(Q, K):
                    return Q @ K.T / np.sqrt(Q.shape[-1])
            """), "K.T reverses all three axes"),
            "a transpose for one batch axis": (code("""
                def scores(Q, K):
                    return Q @ np.transpose(K, (0, 2, 1)) / np.sqrt(Q.shape[-1])
            """), "a transpose written for fewer axes"),
            "not scaled": (code("""
                def scores(Q, K):
                    G = Q.shape[-3] // K.shape[-3]
                    return Q @ np.swapaxes(np.repeat(K, G, axis=-3), -1, -2)
            """), "without the 1/sqrt(D_K) factor"),
            "divided by D_K": (code("""
                def scores(Q, K):
                    G = Q.shape[-3] // K.shape[-3]
                    return Q @ np.swapaxes(np.repeat(K, G, axis=-3), -1, -2) / Q.shape[-1]
            """), "divided by D_K = 4 instead of sqrt(D_K)"),
            "heads not grouped": (code("""
                def scores(Q, K):
                    return Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
            """), "the head axes 4 and 2 do not broadcast"),
            "groups interleaved (np.tile)": (code("""
                def scores(Q, K):
                    G = Q.shape[-3] // K.shape[-3]
                    reps = (1,) * (K.ndim - 3) + (G, 1, 1)
                    return Q @ np.swapaxes(np.tile(K, reps), -1, -2) / np.sqrt(Q.shape[-1])
            """), "the groups are consecutive heads"),
        },
    },
    "11_decoders": {
        "ex11-1-min-p-probs-tests": {
            "absolute threshold": (_min_p_probs(KEEP="np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True) >= p_min"),
                                   "an absolute threshold"),
            "cut on the logits": (_min_p_probs(KEEP="logits >= p_min * logits.max(axis=-1, keepdims=True)"),
                                  "the cut was made on the logits"),
            "cut at temperature 1": (_min_p_probs(KEEP="logits - logits.max(axis=-1, keepdims=True) >= np.log(p_min)"),
                                     "chosen at temperature 1"),
            "not renormalised": (_min_p_probs(NORM="np.exp(z).sum(axis=-1, keepdims=True)"), "not renormalised"),
            "> for >=": (_min_p_probs(KEEP="z > np.log(p_min)"), "compare with >=, not >"),
            "max over the whole array": (_min_p_probs(SHIFT="z.max()"), "taken over the whole array"),
            "no max subtracted": (code("""
                def min_p_probs(logits, temperature, p_min):
                    e = np.exp(np.asarray(logits, dtype=np.float64) / temperature)
                    p = e / e.sum(axis=-1, keepdims=True)
                    q = np.where(p >= p_min * p.max(axis=-1, keepdims=True), p, 0.0)
                    return q / q.sum(axis=-1, keepdims=True)
            """), "exp(1e5) overflows"),
        },
        "ex11-2-attend-with-window-tests": {
            "the cache never trimmed": (code("""
                def attend_with_window(q, k, v, cache, window):
                    K, V = (k, v) if cache is None else (np.concatenate([cache[0], k], axis=-2),
                                                         np.concatenate([cache[1], v], axis=-2))
                    z, _ = tnp.scaled_dot_product_attention(q, K, V)
                    return z, (K, V)
            """), "the cache grew past the window"),
            "trimmed before the new row is added": (code("""
                def attend_with_window(q, k, v, cache, window):
                    K, V = (k, v) if cache is None else (np.concatenate([cache[0][..., -window:, :], k], axis=-2),
                                                         np.concatenate([cache[1][..., -window:, :], v], axis=-2))
                    z, _ = tnp.scaled_dot_product_attention(q, K, V)
                    return z, (K, V)
            """), "the cache holds window + 1 rows"),
            "the oldest rows kept": (code("""
                def attend_with_window(q, k, v, cache, window):
                    K, V = (k, v) if cache is None else (np.concatenate([cache[0], k], axis=-2),
                                                         np.concatenate([cache[1], v], axis=-2))
                    K, V = K[..., :window, :], V[..., :window, :]
                    z, _ = tnp.scaled_dot_product_attention(q, K, V)
                    return z, (K, V)
            """), "the cache kept the oldest rows"),
            "attended before trimming": (code("""
                def attend_with_window(q, k, v, cache, window):
                    K, V = (k, v) if cache is None else (np.concatenate([cache[0], k], axis=-2),
                                                         np.concatenate([cache[1], v], axis=-2))
                    z, _ = tnp.scaled_dot_product_attention(q, K, V)
                    return z, (K[..., -window:, :], V[..., -window:, :])
            """), "each token attended to window + 1 keys"),
            "not scaled": (code("""
                def attend_with_window(q, k, v, cache, window):
                    K, V = (k, v) if cache is None else (np.concatenate([cache[0], k], axis=-2),
                                                         np.concatenate([cache[1], v], axis=-2))
                    K, V = K[..., -window:, :], V[..., -window:, :]
                    z, _ = tnp.scaled_dot_product_attention(q, K, V, scale=1.0)
                    return z, (K, V)
            """), "not divided by sqrt(D_K)"),
            "concatenated along axis 0": (code("""
                def attend_with_window(q, k, v, cache, window):
                    K, V = (k, v) if cache is None else (np.concatenate([cache[0], k], axis=0),
                                                         np.concatenate([cache[1], v], axis=0))
                    K, V = K[..., -window:, :], V[..., -window:, :]
                    z, _ = tnp.scaled_dot_product_attention(q, K, V)
                    return z, (K, V)
            """), "concatenate along the token axis, -2, not 0"),
        },
    },
    "12_encoder_decoder": {
        "ex12-1-packed-masks-tests": {
            "cross all True": (_packed(cross="np.ones((len(tp), len(sp)), dtype=bool)"),
                               "the cross mask must be block-diagonal"),
            "causal over the whole row": (_packed(self="causal"), "the self mask must also be block-diagonal"),
            "not causal": (_packed(self="same"), "the self mask must be causal"),
            "cross transposed": (_packed(cross="(tp[:, None] == sp[None, :]).T"), "rows are target tokens"),
            "diagonal left out": (_packed(self="np.tril(causal, -1) & same"), "missing True entries"),
        },
    },
    "13_language_model": {
        "ex13-1-next-digit-tests": {
            "no final carry": (code("""
                def next_answer_digit(a_digits, b_digits, written):
                    i = len(written)
                    carry = 0 if i == 0 else int(written[-1] < a_digits[i - 1] + b_digits[i - 1])
                    return (a_digits[i] + b_digits[i] + carry) % 10
            """), "the next digit is then the final carry"),
            "carry left out": (code("""
                def next_answer_digit(a_digits, b_digits, written):
                    i = len(written)
                    if i == len(a_digits):
                        return int(written[-1] < a_digits[i - 1] + b_digits[i - 1])
                    return (a_digits[i] + b_digits[i]) % 10
            """), "the carry was left out"),
            "<= for <": (code("""
                def next_answer_digit(a_digits, b_digits, written):
                    i = len(written)
                    carry = 0 if i == 0 else int(written[-1] <= a_digits[i - 1] + b_digits[i - 1])
                    return carry if i == len(a_digits) else (a_digits[i] + b_digits[i] + carry) % 10
            """), "a written digit equal to a + b of its column means no carry"),
            "carry recomputed from the columns": (code("""
                def next_answer_digit(a_digits, b_digits, written):
                    i, carry = len(written), 0
                    for j in range(i):
                        carry = (a_digits[j] + b_digits[j] + carry) // 10
                    return carry if i == len(a_digits) else (a_digits[i] + b_digits[i] + carry) % 10
            """), "the carry was recomputed from the columns"),
            "the wrong column": (code("""
                def next_answer_digit(a_digits, b_digits, written):
                    i = len(written)
                    if i == len(a_digits):
                        return int(written[-1] < a_digits[i - 1] + b_digits[i - 1])
                    carry = 0 if i == 0 else int(written[-1] < a_digits[i] + b_digits[i])
                    return (a_digits[i] + b_digits[i] + carry) % 10
            """), "compared with the wrong column"),
            "a float": (code("""
                def next_answer_digit(a_digits, b_digits, written):
                    i = len(written)
                    carry = 0.0 if i == 0 else float(written[-1] < a_digits[i - 1] + b_digits[i - 1])
                    return carry if i == len(a_digits) else (a_digits[i] + b_digits[i] + carry) % 10
            """), "not floats"),
        },
        "ex13-2-greedy-tests": {
            "new tokens only": (code("""
                def greedy_generate(logits_fn, prompt, n_new):
                    ids, new = np.asarray(prompt), []
                    for _ in range(n_new):
                        new.append(logits_fn(ids)[:, -1].argmax(axis=-1))
                        ids = np.concatenate([ids, new[-1][:, None]], axis=1)
                    return np.stack(new, axis=1)
            """), "only the 4 new tokens were returned"),
            "first row": (code("""
                def greedy_generate(logits_fn, prompt, n_new):
                    ids = np.asarray(prompt)
                    for _ in range(n_new):
                        ids = np.concatenate([ids, logits_fn(ids)[:, 0].argmax(axis=-1)[:, None]], axis=1)
                    return ids
            """), "the logits of the first position were used"),
            "not fed back": (code("""
                def greedy_generate(logits_fn, prompt, n_new):
                    ids = np.asarray(prompt)
                    for _ in range(n_new):
                        ids = np.concatenate([ids, logits_fn(np.asarray(prompt))[:, -1].argmax(axis=-1)[:, None]],
                                             axis=1)
                    return ids
            """), "the new tokens were not fed back"),
            "the last token only": (code("""
                def greedy_generate(logits_fn, prompt, n_new):
                    ids = np.asarray(prompt)
                    for _ in range(n_new):
                        ids = np.concatenate([ids, logits_fn(ids[:, -1:])[:, -1].argmax(axis=-1)[:, None]], axis=1)
                    return ids
            """), "logits_fn was given the last token only"),
        },
    },
}


globals().update(exercise_tests(MISTAKES, CHAPTERS))


def test_min_p_solution_matches_hugging_face():
    """Exercise 11.1's solution keeps, and renormalises, the tokens that Hugging Face's
    MinPLogitsWarper keeps after its TemperatureLogitsWarper (the order of ``generate``)."""
    import numpy as np
    import torch
    from exercise_harness import master
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper

    source = next(c.source for c in master("11_decoders").cells if c.get("id") == "ex11-1-min-p-probs")
    ns = {"np": np}
    exec(source, ns)
    logits = 3 * np.random.default_rng(0).normal(size=(64, 50))
    no_ids = torch.zeros((64, 0), dtype=torch.long)
    for tau in (0.5, 1.0, 2.0):
        for p_min in (0.02, 0.1, 0.5, 1.0):
            ours = ns["min_p_probs"](logits, tau, p_min)
            scores = MinPLogitsWarper(p_min)(no_ids, TemperatureLogitsWarper(tau)(no_ids, torch.from_numpy(logits)))
            theirs = torch.softmax(scores, -1).numpy()
            assert np.array_equal(ours > 0, theirs > 0), (tau, p_min)
            assert np.abs(ours - theirs).max() < 1e-12, (tau, p_min)
