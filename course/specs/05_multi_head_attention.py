"""Hidden cases of chapter 5 (see README.md in this folder)."""

HIDDEN = {
    "ex5-1-multi-head-loop-tests": {
        "A": "weights copied from nn.MultiheadAttention without biases (Z)",
        "B": "weights copied from nn.MultiheadAttention without biases (P, one per head)",
        "C": "one head and no batch axis",
    },
    "ex5-2-gqa-counts-tests": {"D": "the predicted counts"},
    "ex5-3-prediction-tests": {"E": "the predicted answer"},
}
