"""Chapter 21's exercises teach through their visible tests (tests/exercise_harness.py): each
likely mistake that a visible test names is written here as a deliberately wrong answer and must
fail that test's visible part with its words; the chapter's solution must pass the whole cell."""

from __future__ import annotations

from exercise_harness import code, exercise_tests, variant

CHAPTERS = ("21_induction_heads",)

_PREFIX = """
def prefix_match(P, ids):
    P, ids = np.asarray(P, dtype=float), np.asarray(ids)
    total, count = 0.0, 0
    for t in range(len(ids)):
        js = [j for j in range(1, t) if ids[j - 1] == ids[t]]
        if js:
            total += P[t, JS].sum()
            count += 1
    return total / COUNT if count else EMPTY
"""


def _prefix(**change):
    """Exercise 21.1's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_PREFIX, dict(JS="js", COUNT="count", EMPTY='float("nan")'), **change)


MISTAKES = {"21_induction_heads": {
    "ex21-1-prefix-match-tests": {
        "the match itself": (_prefix(JS="[j - 1 for j in js]"), "not on the position right after it"),
        "every query": (_prefix(COUNT="len(ids)"), "only the queries whose token occurred before count"),
        "zero for no repeats": (_prefix(EMPTY="0.0"), "return nan"),
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
