"""Hidden cases of chapter 4 (see README.md in this folder)."""

HIDDEN = {
    "ex4-1-self-attention-tests": {
        "A": "a batch of rows packed in other ways (documents of one token, one document filling the row, "
             "ids in no order) and D_K different from D_V",
        "B": "forbidden pairs must get a weight of exactly 0 (set their scores to -inf before the softmax)",
        "C": "one row without a batch axis",
        "D": "overflow at large inputs: large scores must not give NaN; subtract the row max before exp",
    },
    "ex4-2-prediction-tests": {"E": "the predicted weight"},
    "ex4-3-book-weights-tests": {
        "F": "layers of other sizes (the book's W is the transpose of nn.Linear.weight)",
        "G": "layers of other sizes, the value projection",
    },
    "ex4-4-orthonormal-keys-tests": {
        "H": "a wider layer (D = 10, D_K = 4) whose key projection is large (entries of size 100)",
        "I": "a key projection whose columns are already orthonormal",
        "J": "D_K = 1: one query and one key column",
    },
}
