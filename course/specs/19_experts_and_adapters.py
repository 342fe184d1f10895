"""Hidden cases of chapter 19 (see README.md in this folder)."""

HIDDEN = {
    "ex19-1-expert-choice-tests": {
        "A": "every expert may take every token: the full order of each expert's preference",
        "B": "one token per expert: its probability, not renormalised",
        "C": "large router logits: the probabilities must stay finite and exact",
    },
    "ex19-2-balance-tests": {"D": "the predicted balance loss"},
    "ex19-3-priority-tests": {
        "E": "three choices per token and six experts with a small capacity",
        "F": "a capacity no expert reaches: nothing is dropped",
        "G": "equal weights: the earlier tokens go first",
    },
}
