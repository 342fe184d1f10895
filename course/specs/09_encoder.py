"""Hidden cases of chapter 9 (see README.md in this folder)."""

HIDDEN = {
    "ex9-1-block-tests": {
        "A0": "another width and number of heads, a sequence without a batch axis",
        "A1": "two leading batch axes",
    },
    "ex9-2-fold-norms-tests": {
        "B": "another width and a wider MLP (D_ff different from D)",
        "C": "gains of both signs and large shifts",
    },
    "ex9-3-masked-mean-tests": {"D": "a longer sequence beside one with a single real token"},
    "ex9-4-mqa-count-tests": {"E": "the predicted parameter count"},
}
