"""Hidden cases of chapter 10 (see README.md in this folder)."""

HIDDEN = {
    "ex10-1-smoothed-gradient-tests": {
        "A": "the default ignore_index (-100) on a 2-D batch (N, V), epsilon 0.5",
        "B": "more than one leading axis, no position ignored, epsilon 0 (plain cross-entropy)",
    },
    "ex10-2-adamw-update-tests": {
        "C": "the first step (t = 1, zero moments) with other betas, eps and weight decay, on a 1-D parameter",
        "D": "the second moment after the first step: (1 - beta2) g**2",
    },
    "ex10-3-prediction-tests": {"E": "the predicted step sizes, each within 0.1%"},
    "ex10-4-prediction-tests": {"F": "the two predicted singular values, each within 0.1%"},
}
