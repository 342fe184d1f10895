"""Hidden cases of chapter 21 (see README.md in this folder)."""

HIDDEN = {
    "ex21-1-prefix-match-tests": {
        "A0": "random causal patterns on a sequence of twelve tokens from four symbols (many repeats), against the chapter's function",
        "A1": "another random pattern and sequence of the same kind",
        "A2": "a third random pattern and sequence of the same kind",
    },
    "ex21-2-which-head-tests": {"B": "the predicted head is the layer-0 head with the higher previous-token score"},
    "ex21-3-half-prev-tests": {"C": "the predicted score against the chapter's previous_token_score"},
}
