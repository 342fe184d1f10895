"""Hidden cases of chapter 6 (see README.md in this folder)."""

HIDDEN = {
    "ex6-1-multiset-attention-tests": {
        "A": "a count of 0: the token is absent",
        "B": "multiplying every count by the same factor changes nothing",
        "C": "overflow at large scores: subtract each row's largest score before exp",
        "D": "more queries, keys and counts, and wider keys",
    },
    "ex6-2-prediction-tests": {"E": "the predicted set of unchanged rows"},
    "ex6-3-symmetry-counts-tests": {"F": "the three predicted counts"},
    "ex6-4-table-equivariance-tests": {
        "G": "the result must be a Python float",
        "H": "two leading batch axes, a non-square table and a map that depends on both orders",
        "I": "a transpose is equivariant when the rows and the columns move together: its error is exactly 0",
    },
}
