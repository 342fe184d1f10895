"""Hidden cases of chapter 17 (see README.md in this folder)."""

HIDDEN = {
    "ex17-1-attention-by-blocks-tests": {
        "A": "large scores over several blocks with a ragged last one: finite and equal to softmax attention",
        "B": "a block larger than the whole sequence",
        "C": "one query, one key, blocks of one key",
        "D": "a long sequence in many blocks, equal to softmax attention",
    },
    "ex17-2-window-gqa-cache-tests": {"E": "the predicted size"},
    "ex17-3-prediction-tests": {"F": "the predicted count"},
    "ex17-4-linear-rnn-tests": {
        "G": "a longer sequence with a narrow key width, against the causal linear attention of tfbook.torch",
        "H": "a single position (the output is its value)",
    },
}
