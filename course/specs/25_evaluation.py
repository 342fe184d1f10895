"""Hidden cases of chapter 25 (see README.md in this folder)."""

HIDDEN = {
    "ex25-1-passk-tests": {
        "A": "thirty random (n, c, k) against the chapter's pass_at_k",
        "B": "a single sample that is right",
    },
    "ex25-2-items-tests": {"C": "the predicted number of items for a half-width of 0.02 at an accuracy of one half"},
    "ex25-3-paired-tests": {
        "D": "two models with identical answers: the interval of the difference is a point at zero",
        "E": "two models that disagree on every item: the difference of each item is plus or minus one",
    },
}
