"""Hidden cases of appendix A (see README.md in this folder)."""

HIDDEN = {
    "exA-1-additive-scores-tests": {
        "A": "one query, one-dimensional attention space, against the written-out formula",
        "B": "a zero scoring vector gives zero scores",
    },
    "exA-2-longest-fit-tests": {"C": "the predicted length"},
    "exA-3-prefix-pairs-tests": {"D": "the predicted count"},
}
