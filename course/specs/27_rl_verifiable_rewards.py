"""Hidden cases of chapter 27 (see README.md in this folder)."""

HIDDEN = {
    "ex27-1-surrogate-tests": {
        "A": "random ratios and advantages of both signs, another epsilon, a 2-D array",
        "B": "a zero advantage gives a zero objective whatever the ratio",
    },
    "ex27-2-dead-tests": {"C": "the predicted probability to eight decimals"},
    "ex27-3-wvote-tests": {
        "D": "fifty random rows of nine weighted samples, against summed weights per answer",
        "E": "equal totals go to the answer sampled first",
    },
}
