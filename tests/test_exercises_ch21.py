"""Chapter 21's exercises teach through their visible tests (tests/exercise_harness.py): each
likely mistake that a visible test names is written here as a deliberately wrong answer and must
fail that test's visible part with its words; the chapter's solution must pass the whole cell."""

from __future__ import annotations

from exercise_harness import code, exercise_tests, variant

CHAPTERS = ("21_induction_heads",)

_DUPLICATE = """
def duplicate_score(P, ids):
    P, ids = np.asarray(P, dtype=float), np.asarray(ids)
    total, count = 0.0, 0
    for t in range(len(ids)):
        js = [j for j in RANGE if ids[J] == ids[t]]
        if js:
            total += P[t, JS].sum()
            count += 1
    return total / COUNT if count else EMPTY
"""


def _duplicate(**change):
    """Exercise 21.1's answer, with the mistake put in by replacing one of its upper-case parts
    (JS before J: the placeholders are replaced in this order)."""
    return variant(_DUPLICATE, dict(RANGE="range(t)", JS="js", J="j", COUNT="count", EMPTY='float("nan")'), **change)


MISTAKES = {"21_induction_heads": {
    "ex21-1-prefix-match-tests": {
        "prefix matching": (_duplicate(RANGE="range(1, t)", J="j - 1"), "the position right after the earlier copy"),
        "every query": (_duplicate(COUNT="len(ids)"), "only the queries whose token occurred before count"),
        "the query itself": (_duplicate(RANGE="range(t + 1)"), "the query's own position"),
        "zero for no repeats": (_duplicate(EMPTY="0.0"), "return nan"),
    },
    "ex21-2-offset-tests": {
        "the earlier copy itself": (code("prediction_offset = 29"), "attends to the earlier copy of the query's own token"),
        "one before the copy": (code("prediction_offset = 30"), "comes after it"),
        "a previous-token head": (code("prediction_offset = 1"), "previous-token head"),
    },
    "ex21-3-prev-prefix-tests": {
        "never": (code("prediction_prefix = 0.0"), "the position before the query is also the position after the earlier copy"),
        "over all queries": (code("prediction_prefix = 2 / 9"), "only the queries whose token occurred before"),
        "a pure induction head": (code("prediction_prefix = 1.0"), "the queries 8 and 9 look elsewhere"),
    },
}}


globals().update(exercise_tests(MISTAKES, CHAPTERS))
