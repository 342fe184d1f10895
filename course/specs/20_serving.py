"""Hidden cases of chapter 20 (see README.md in this folder)."""

HIDDEN = {
    "ex20-1-asymmetric-tests": {
        "A": "8 bits on a column range that straddles zero: every error within half a step",
        "B": "2 bits: every error within half a step of the coarsest grid",
        "C": "2 bits: at most 2^bits distinct values in a column",
    },
    "ex20-2-mla-cache-tests": {"D": "the predicted cache size"},
    "ex20-3-draft-length-tests": {
        "E": "a draft that is almost always right and almost free, with a longer range of lengths",
        "F": "a draft that is never right: the shortest draft",
        "G": "an expensive draft and a short range of lengths",
        "H": "this page's acceptance rate with a draft twice as costly as the one measured on the page, lengths 1 to 8",
    },
}
