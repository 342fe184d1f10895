"""Hidden cases of chapter 3 (see README.md in this folder)."""

HIDDEN = {
    "ex3-1-score-std-tests": {
        "A": "projections that keep D_K coordinates of a unit-variance input: the scaled score has standard deviation 1",
        "B": "a zero query projection: every score is 0",
        "C": "D_K = 1: the score is a product of two independent normals, of standard deviation |w_Q| |w_K|",
        "H": "a key projection that is the query projection rotated (the two are not independent matrices)",
        "I": "the result must be a Python float",
    },
    "ex3-2-shifted-mean-tests": {"D": "the predicted variances"},
    "ex3-3-entropy-gradient-tests": {
        "E": "two leading batch axes, against autograd",
        "F": "a uniform row: the entropy is at its maximum, so the gradient is zero",
        "G": "finite at very large scores, where weights underflow to exactly 0 (take log p from the scores)",
    },
}
