"""Hidden cases of chapter 22 (see README.md in this folder)."""

HIDDEN = {
    "ex22-1-ridge-tests": {
        "A": "fewer examples than dimensions with a positive penalty: the two forms of ridge agree",
        "B": "no penalty and fewer examples than dimensions: the minimum-norm least-squares prediction",
    },
    "ex22-2-averaging-tests": {"C": "the predicted error of averaging, divided by d"},
    "ex22-3-subspace-tests": {"D": "the predicted error at one example and the first exact k"},
}
