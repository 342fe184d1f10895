"""Hidden cases of chapter 0 (see README.md in this folder)."""

HIDDEN = {
    "ex0-1-softmax-tests": {
        "A": "overflow at large logits: extreme logits must give finite weights; subtract the max before exp",
        "B": "wrong dtype: a float32 input must give a float32 result",
        "C": "a 1-D input (a single vector of logits)",
    },
    "ex0-2-prediction-tests": {"D": "the predicted shape, as whole numbers"},
    "ex0-3-scores-tests": {
        "E": "a 4-D batch (B, H, T, D) with different numbers of queries and keys",
        "F": "matrices of size one",
    },
    "ex0-4-prediction-tests": {"G": "the predicted weight"},
}
