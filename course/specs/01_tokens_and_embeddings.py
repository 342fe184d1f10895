"""Hidden cases of chapter 1 (see README.md in this folder)."""

HIDDEN = {
    "ex1-1-overlapping-patches-tests": {
        "A": "a patch starting at every pixel (stride 1), so that neighbouring patches share most pixels",
        "B": "a stride larger than the patch, so that the pixels between patches are skipped",
        "C": "one patch as large as the whole image",
        "D": "a single channel and a rectangular image whose last rows and columns must be dropped",
    },
    "ex1-2-learn-merges-tests": {
        "E": "a text with accented letters and emoji, whose characters are several bytes each (merges are learned on bytes)",
        "F": "no merges asked for (num_merges = 0)",
        "G": "150 merges on another 40,000 characters of the same book, compared with the package's trainer",
        "H": "two pieces made of one repeated letter, where merges must not overlap",
        "I": "the answer must not call the package's own trainer",
    },
    "ex1-3-dilated-reach-tests": {"K": "the predicted receptive field with doubling dilations"},
    "ex1-4-prediction-tests": {"L": "the predicted number of rows"},
    "ex1-5-bytes-tests": {"M": "the predicted number of ids for the decomposed word", "N": "the predicted number of ids for the joined emoji"},
}
