"""Hidden cases of chapter 22 (see README.md in this folder)."""

HIDDEN = {
    "ex22-1-ridge-tests": {
        "A": "fewer examples than dimensions with noise: the posterior mean equals the primal form (X^T X + sigma^2 Sigma^-1)^-1 X^T y",
        "B": "a diagonal prior covariance and more examples than dimensions: the primal form again",
    },
    "ex22-2-averaging-tests": {"C": "the predicted error of averaging with noisy labels, divided by d"},
    "ex22-3-subspace-tests": {"D": "the predicted error at one example and the first exact k"},
}
