"""Hidden cases of chapter 16 (see README.md in this folder)."""

HIDDEN = {
    "ex16-1-cross-attention-flops-tests": {
        "A": "a single query against many keys, against FlopCounterMode",
        "B": "more queries than keys and one width per head, against FlopCounterMode",
        "C": "a single key, against FlopCounterMode",
        "D": "a single head, against FlopCounterMode",
        "E": "the count is an integer",
    },
    "ex16-2-crossover-softmax-tests": {
        "F": "the crossover equals the positive root of the quadratic (one head, one FLOP per score)",
        "G": "the crossover equals the positive root of the quadratic (many heads)",
        "H": "the crossover equals the positive root of the quadratic (a costly softmax)",
        "I": "the first whole length where attention costs more, found by counting (one head)",
        "J": "the first whole length where attention costs more, found by counting (many heads)",
        "K": "the first whole length where attention costs more, found by counting (a costly softmax)",
        "L": "0.0 when the MLP is narrower than twice the width",
    },
    "ex16-3-prediction-tests": {"M": "the predicted growth factor"},
    "ex16-4-prediction-tests": {"N": "the predicted log10 of the budget"},
}
