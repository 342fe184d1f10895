"""Hidden cases of chapter 12 (see README.md in this folder)."""

HIDDEN = {
    "ex12-1-decoder-block-tests": {
        "A": "a block copied from nn.TransformerDecoderLayer, with a causal mask and sources of different lengths",
        "B": "one sequence without batch axis and without masks",
    },
    "ex12-2-duplicate-rows-tests": {"C": "the two predicted booleans"},
    "ex12-3-prediction-tests": {"D": "the predicted boolean"},
}
