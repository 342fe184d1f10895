"""Hidden cases of chapter 12 (see README.md in this folder)."""

HIDDEN = {
    "ex12-1-packed-masks-tests": {
        "A": "one pair of one source and one target token",
        "B": "four pairs of other lengths, both masks compared entry by entry",
    },
    "ex12-2-duplicate-rows-tests": {"C": "the two predicted booleans"},
    "ex12-3-prediction-tests": {"D": "the two predicted probabilities"},
}
