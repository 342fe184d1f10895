"""Hidden cases of chapter 11 (see README.md in this folder)."""

HIDDEN = {
    "ex11-1-next-token-probs-tests": {
        "A": "two leading axes at a temperature below 1: softmax(logits / tau) along the last axis",
        "B": "extreme logits with a very small temperature, rows of very different sizes: finite, max taken per row",
        "C": "greedy (temperature 0) with two leading axes: one-hot along the last axis",
        "D": "a very large temperature: the distribution approaches uniform",
    },
    "ex11-2-attend-with-cache-tests": {
        "E": "one leading axis and D_K different from D_V, fed one token at a time: causal attention",
        "F": "the cached values after a whole sequence, in token order",
        "G": "a step with a non-empty cache and large scores: finite, the new token attended as well",
    },
    "ex11-3-batch-intensity-tests": {"H": "the predicted FLOPs per byte"},
    "ex11-4-window-rows-tests": {"I": "the predicted number of rows"},
}
