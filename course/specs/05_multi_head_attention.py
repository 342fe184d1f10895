"""Hidden cases of chapter 5 (see README.md in this folder)."""

HIDDEN = {
    "ex5-1-prune-heads-tests": {
        "A": "a layer copied from nn.MultiheadAttention (with biases), one head kept",
        "B": "every head kept, listed in another order: the full layer",
        "C": "heads of width 1, several kept out of order",
    },
    "ex5-2-gqa-counts-tests": {"D": "the predicted counts"},
    "ex5-3-prediction-tests": {"E": "the predicted (token, first coordinate) of the second head's rows"},
}
