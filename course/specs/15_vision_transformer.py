"""Hidden cases of chapter 15 (see README.md in this folder)."""

HIDDEN = {
    "ex15-1-embed-patches-tests": {
        "A": "several channels and a non-square image, more tokens than in the visible case",
        "B": "a patch wider than 2 pixels on a non-square image",
        "C": "patches of a single pixel (the embedding is a per-pixel linear map)",
    },
    "ex15-2-rollout-tests": {
        "D": "three layers, two batch axes, with the residual",
        "E": "three layers, two batch axes, without the residual",
        "F": "a single layer (no product at all)",
    },
    "ex15-3-prediction-tests": {"G": "the predicted entries"},
    "ex15-4-score-growth-tests": {"H": "the predicted growth factor"},
}
