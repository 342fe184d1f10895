"""Hidden cases of chapter 9 (see README.md in this folder)."""

HIDDEN = {
    "ex9-1-block-tests": {
        "A0": "another width and number of heads, a sequence without a batch axis, Post-LN",
        "A1": "another width and number of heads, a sequence without a batch axis, Pre-LN",
    },
    "ex9-2-count-tests": {
        "B": "a deeper stack with a final LayerNorm",
        "C": "a single block of another width",
    },
    "ex9-3-masked-mean-tests": {"D": "a longer sequence beside one with a single real token"},
    "ex9-4-mqa-count-tests": {"E": "the predicted parameter count"},
}
