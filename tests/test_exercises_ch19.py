"""Chapter 19's exercises teach through their visible tests (tests/exercise_harness.py): each
likely mistake that a visible test names is written here as a deliberately wrong answer and must
fail that test's visible part with its words; the chapter's solution must pass the whole cell."""

from __future__ import annotations

from exercise_harness import code, exercise_tests, variant

CHAPTERS = ("19_experts_and_adapters",)

_CHOICE = """
def expert_choice(X, W_router, capacity):
    logits = np.asarray(X) @ np.asarray(W_router)
    P = np.exp(logits - logits.max(axis=AXIS, keepdims=True))
    P = P / P.sum(axis=AXIS, keepdims=True)
    tokens = np.argsort(ORDER, axis=1, kind="stable")[:, :capacity]
    weights = WEIGHTS
    return tokens, weights
"""


def _choice(**change):
    """Exercise 19.1's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_CHOICE, dict(AXIS="1", ORDER="-P.T", WEIGHTS="np.take_along_axis(P.T, tokens, axis=1)"), **change)


_PRIORITY = """
def keep_by_priority(experts, weights, num_experts, capacity):
    experts, weights = np.asarray(experts), np.asarray(weights)
    N, k = experts.shape
    order = np.lexsort((np.tile(np.arange(k), N), np.repeat(np.arange(N), k), KEY))
    kept = np.zeros(N * k, dtype=bool)
    used = np.zeros(num_experts, dtype=int)
    flat = experts.reshape(-1)
    for i in order:
        if USED < capacity:
            USED += 1
            kept[i] = True
    return RESULT
"""


def _priority(**change):
    """Exercise 19.3's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_PRIORITY, dict(KEY="-weights.reshape(-1)", USED="used[flat[i]]", RESULT="kept.reshape(N, k)"),
                   **change)


# {chapter: {test grade_id: {mistake: (wrong answer, words its visible failure must contain)}}}
MISTAKES = {"19_experts_and_adapters": {
    "ex19-1-expert-choice-tests": {
        "softmax over tokens": (_choice(AXIS="0"), "softmax was taken over the tokens"),
        "least probable": (_choice(ORDER="P.T"), "least probable tokens"),
        "renormalised": (_choice(WEIGHTS="(lambda w: w / w.sum(1, keepdims=True))(np.take_along_axis(P.T, tokens, axis=1))"),
                         "renormalised to sum to one per expert"),
        "logits": (_choice(WEIGHTS="np.take_along_axis(logits.T, tokens, axis=1)"), "the router's logits"),
    },
    "ex19-2-balance-tests": {
        "no E": (code("prediction_balance = 4 * 0.5 * 0.25"), "factor E = 8 was left out"),
        "f sums to one": (code("prediction_balance = 8 * 4 * 0.25 * 0.25"), "f_e was normalised to sum to one"),
        "even routing": (code("prediction_balance = 2.0"), "this router leaves four experts idle"),
        "collapsed": (code("prediction_balance = 8.0"), "every token goes to the same two experts"),
    },
    "ex19-3-priority-tests": {
        "first come": (code("""
            def keep_by_priority(experts, weights, num_experts, capacity):
                return npx._keep(np.asarray(experts), num_experts, capacity)
        """), "the chapter's rule"),
        "smallest": (_priority(KEY="weights.reshape(-1)"), "smallest weights were kept"),
        "global capacity": (_priority(USED="used[0]", RESULT="kept.reshape(N, k) | (np.arange(N * k).reshape(N, k) < 0)")
                            .replace("if used[0] < capacity:", "if used[0] < capacity * num_experts:"),
                            "applied to all experts together"),
        "counts": (_priority(RESULT="kept.reshape(N, k).astype(int)"), "return a boolean mask"),
    },
}}


globals().update(exercise_tests(MISTAKES, CHAPTERS))
