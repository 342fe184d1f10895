"""Hidden cases of chapter 26 (see README.md in this folder)."""

HIDDEN = {
    "ex26-1-dpo-tests": {
        "A": "twenty random sets of seven pairs and random betas, against the chapter's dpo_loss",
        "B": "two pairs with margins of +2000 and -2000: the mean of 0 and 2000",
        "F": "float32 inputs: the result is a Python float, equal to the float64 loss to 1e-6",
    },
    "ex26-2-optimum-tests": {"C": "the predicted value of the objective at the optimum (beta log Z)"},
    "ex26-3-verifier-tests": {
        "D": "thirty reference probabilities at three betas, against the chapter's kl_optimal_policy",
        "E": "a reference that is almost never right and one that is right half the time, at a tiny beta, with overflow raising",
    },
}
