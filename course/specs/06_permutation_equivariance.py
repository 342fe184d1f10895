"""Hidden cases of chapter 6 (see README.md in this folder)."""

HIDDEN = {
    "ex6-1-graph-attention-tests": {
        "A": "a node with no senders must get a row of zeros (not NaN)",
        "B": "a random directed graph: each node averages over its own senders only",
        "C": "relabelling the nodes (permuting X and both axes of A) must permute the output rows",
        "D": "overflow at large scores on a complete graph: subtract the largest score before exp",
    },
    "ex6-2-prediction-tests": {"E": "the predicted set of unchanged rows"},
    "ex6-3-symmetry-counts-tests": {"F": "the three predicted counts"},
    "ex6-4-equivariance-error-tests": {
        "G": "the result must be a Python float",
        "H": "two leading batch axes and a map that reorders the tokens",
        "I": "multi-head attention is equivariant: its error is round-off",
    },
}
