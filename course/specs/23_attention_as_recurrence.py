"""Hidden cases of chapter 23 (see README.md in this folder)."""

HIDDEN = {
    "ex23-1-delta-step-tests": {
        "A": "a state with more key than value dimensions, a key that is not unit length, and a decay below one: "
             "the step equals the library's gated delta rule",
        "B": "a write strength of zero and no decay leave the state unchanged",
    },
    "ex23-2-crossover-tests": {"C": "the predicted first length at which the KV cache holds more bytes than the state"},
    "ex23-3-horizon-tests": {"D": "the predicted 1% horizon and half-life of a constant decay"},
}
