"""Hidden cases of chapter 11 (see README.md in this folder)."""

HIDDEN = {
    "ex11-1-min-p-probs-tests": {
        "A": "two leading axes, a temperature below 1 and a small p_min: the cut and renormalisation row by row",
        "B": "extreme logits with a very small temperature, rows of very different sizes: finite, the max taken per row",
        "C": "a vanishing p_min: every token kept, the plain softmax at temperature tau",
        "D": "a very large temperature: every token kept, the distribution approaches uniform",
        "E": "the largest p_min with two tied likeliest tokens: both kept, half each",
    },
    "ex11-2-attend-with-window-tests": {
        "E": "one leading axis, D_K different from D_V and another window, fed one token at a time: the banded mask",
        "F": "the cached values after a whole sequence: only the newest window rows, in token order",
        "G": "a window of one token: each token attends to itself alone",
        "J": "a window longer than the sequence: plain causal attention",
        "K": "a step with a full cache and large scores: finite, the oldest row dropped, the new token attended",
    },
    "ex11-3-batch-intensity-tests": {"H": "the predicted FLOPs per byte"},
    "ex11-4-window-rows-tests": {"I": "the predicted number of rows"},
}
