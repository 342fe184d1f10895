"""Hidden cases of chapter 17 (see README.md in this folder)."""

HIDDEN = {
    "ex17-1-merge-attention-tests": {
        "A": "six parts of very different sizes (one of a single key), merged two at a time in a shuffled order",
        "B": "one query, two parts of one key each, scores in the hundreds",
        "C": "a causal mask that hides a whole part from half of the queries, the parts given in reverse order",
    },
    "ex17-2-window-gqa-cache-tests": {"E": "the predicted size"},
    "ex17-3-prediction-tests": {"F": "the predicted count"},
    "ex17-4-linear-rnn-tests": {
        "G": "a longer sequence with a narrow key width, against the causal linear attention of tfbook.torch",
        "H": "a single position (the output is its value)",
    },
}
