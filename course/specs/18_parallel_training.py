"""Hidden cases of chapter 18 (see README.md in this folder)."""

HIDDEN = {
    "ex18-1-combine-tests": {
        "A": "equal shards (the plain average), gradients that are matrices",
        "B": "a single shard",
        "C": "shard sizes given as NumPy integers",
        "D": "a shard of one example against the full-batch gradient",
    },
    "ex18-2-prediction-tests": {"E": "the predicted amount"},
    "ex18-3-prediction-tests": {"F": "the predicted learning rate"},
}
