"""Hidden cases of chapter 8 (see README.md in this folder)."""

HIDDEN = {
    "ex8-1-rms-norm-tests": {
        "A": "eps = 0 must give x divided by its root mean square, exactly",
        "B": "an all-zero row must give zeros, not NaN",
        "C": "wrong dtype: float32 inputs must give a float32 result",
        "D": "another width and another eps, on tokens whose mean is far from 0",
    },
    "ex8-2-rms-backward-tests": {
        "E": "another width, gain and eps, on tokens of large mean and scale",
        "F": "with eps = 0 RMSNorm ignores the scale of x: dX must have no component along x",
        "I": "a single token with no leading axes",
    },
    "ex8-3-one-hot-ln-tests": {"G": "the predicted first entry"},
    "ex8-4-half-peak-tests": {"H": "the two predicted steps"},
}
