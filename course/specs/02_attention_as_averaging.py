"""Hidden cases of chapter 2 (see README.md in this folder)."""

HIDDEN = {
    "ex2-1-masked-weights-tests": {
        "A": "a mask with its own batch axes, broadcast over the others, with a fully blocked row among them",
        "B": "a row with a single allowed key puts all of its weight there",
        "C": "finite at very large scores, ties included (subtract the row max of the allowed scores before exp)",
    },
    "ex2-2-prediction-tests": {"D": "the predicted weights"},
    "ex2-3-additive-tests": {
        "E": "two leading batch axes and query, key and hidden widths all different",
        "F": "zero inputs: tanh(0) = 0 gives zero scores",
    },
    "ex2-4-prediction-tests": {"G": "the predicted extremes"},
}
