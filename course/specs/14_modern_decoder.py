"""Hidden cases of chapter 14 (see README.md in this folder)."""

HIDDEN = {
    "ex14-1-rotate-half-tests": {
        "A": "three heads of another width, a batch axis, one key head: the scores must still agree",
        "B": "three heads of width 4 in float32: the dtype must be kept and each head's columns reordered",
        "C": "a single head: the rotate-half rotation of your projection must equal the permuted interleaved one",
    },
    "ex14-2-llama-params-tests": {"D": "the predicted number of parameters"},
    "ex14-3-gqa-from-mha-tests": {
        "E": "multi-query (one key/value head): the mean of all heads",
        "F": "as many key/value heads as query heads: nothing to pool",
        "G": "groups of three heads of another width",
    },
}
