"""Hidden cases of chapter 0 (see README.md in this folder)."""

HIDDEN = {
    "ex0-1-softmax-tests": {
        "A": "extreme logits normalised along axis 0: the max must be taken along `axis`, so every weight stays finite",
        "B": "float32 inputs, with ordinary and with large logits: the result must stay float32 and finite",
        "C": "a 1-D input (a single vector of logits)",
    },
    "ex0-2-prediction-tests": {"D": "the predicted shape, as whole numbers"},
    "ex0-3-scores-tests": {
        "E": "two batch axes, six query heads sharing three key heads (G = 2)",
        "F": "a single key head read by all four query heads (H_KV = 1)",
    },
    "ex0-4-prediction-tests": {"G": "the predicted weight"},
}
