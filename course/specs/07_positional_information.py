"""Hidden cases of chapter 7 (see README.md in this folder)."""

HIDDEN = {
    "ex7-1-sinusoidal-tests": {
        "A": "another base than 10000 (use the `base` argument) and another width",
        "B": "leading batch axes: one position per encoding vector",
        "C": "a wide encoding and positions in the tens of thousands",
    },
    "ex7-2-rotary-tests": {
        "D": "a 4-D batch with rows and columns in no particular order",
        "E": "another base than 10000 (use the `base` argument)",
        "F": "a rotation must keep every vector's length",
    },
    "ex7-3-neighbour-distance-tests": {"G": "the predicted squared distance"},
    "ex7-4-alibi-weight-tests": {"H": "the predicted weight"},
}
