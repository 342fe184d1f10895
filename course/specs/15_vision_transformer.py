"""Hidden cases of chapter 15 (see README.md in this folder)."""

HIDDEN = {
    "ex15-1-resize-positions-tests": {
        "A": "a 4 x 4 grid enlarged to 7 x 7 (a factor that is not an integer), random table of width 5",
        "B": "a 6 x 6 grid shrunk to 3 x 3",
        "C": "the same grid size (the table must come back unchanged)",
    },
    "ex15-2-pruned-rollout-tests": {
        "D": "three layers, two batch axes, two prunings that reorder the kept tokens",
        "E": "nothing pruned: equal to the rollout of the chapter",
        "F": "a single layer (no product, nothing pruned)",
    },
    "ex15-3-prediction-tests": {"G": "the predicted entries"},
    "ex15-4-score-growth-tests": {"H": "the predicted growth factor"},
}
