"""Hidden cases of chapter 21 (see README.md in this folder)."""

HIDDEN = {
    "ex21-1-prefix-match-tests": {
        "A0": "random causal patterns on a sequence of twelve tokens from four symbols (many repeats), against the weight on earlier copies (j < t) averaged over the queries that have one",
        "A1": "another random pattern and sequence of the same kind",
        "A2": "a third random pattern and sequence of the same kind",
    },
    "ex21-2-offset-tests": {"B": "the predicted offset against the distance between the two copies of the chapter's first sequence, less one"},
    "ex21-3-prev-prefix-tests": {"C": "the predicted score against the chapter's prefix_matching_score of the pure previous-token pattern"},
}
