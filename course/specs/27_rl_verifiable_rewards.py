"""Hidden cases of chapter 27 (see README.md in this folder)."""

HIDDEN = {
    "ex27-1-surrogate-tests": {
        "A": "random ratios and advantages of both signs, another epsilon, a 2-D array",
        "B": "an advantage per answer broadcast over its tokens, and epsilon 1.5 (the lower clip bound negative)",
    },
    "ex27-2-dead-tests": {"C": "the second prediction, G = 4 at p = 0.35, which the visible test does not check"},
    "ex27-3-wvote-tests": {
        "D": "fifty random rows of nine weighted samples, against summed weights per answer",
        "E": "equal totals go to the answer sampled first, which is not the smallest id",
    },
}
