"""Hidden cases of chapter 18 (see README.md in this folder)."""

HIDDEN = {
    "ex18-1-buckets-tests": {
        "A": "float32 gradients: the cap counts bytes, 4 a number",
        "B": "a tensor larger than the cap fills a bucket alone",
        "C": "a single rank",
        "D": "a cap larger than the whole model: one bucket",
        "E": "a first bucket with a smaller cap (first_cap_bytes), float32",
    },
    "ex18-2-padded-tests": {
        "A": "a rank holding only padding (its mean is nan) contributes nothing",
        "B": "gradients that are matrices",
        "C": "a single rank",
        "D": "masks given as 0/1 integers instead of booleans",
    },
    "ex18-3-tp-bytes-tests": {"A": "the predicted MiB, forward and backward"},
}
