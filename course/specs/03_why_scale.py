"""Hidden cases of chapter 3 (see README.md in this folder)."""

HIDDEN = {
    "ex3-1-jacobian-tests": {
        "A": "two leading batch axes: one Jacobian per row",
        "B": "a one-hot row: its Jacobian is exactly zero",
        "C": "a uniform row: diag(p) - p p^T in closed form",
    },
    "ex3-2-shifted-mean-tests": {"D": "the predicted variances"},
    "ex3-3-entropy-gradient-tests": {
        "E": "two leading batch axes, against autograd",
        "F": "a uniform row: the entropy is at its maximum, so the gradient is zero",
        "G": "finite at very large scores, where weights underflow to exactly 0 (take log p from the scores)",
    },
}
