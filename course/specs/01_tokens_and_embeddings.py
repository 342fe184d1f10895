"""Hidden cases of chapter 1 (see README.md in this folder)."""

HIDDEN = {
    "ex1-1-overlapping-patches-tests": {
        "A": "a patch starting at every pixel (stride 1), so that neighbouring patches share most pixels",
        "B": "a stride larger than the patch, so that the pixels between patches are skipped",
        "C": "one patch as large as the whole image",
        "D": "a single channel and a rectangular image whose last rows and columns must be dropped",
    },
    "ex1-2-receptive-field-tests": {
        "E": "no layers at all (the receptive field of the input itself)",
        "F": "kernels of size 1 with strides (they add nothing, whatever the strides)",
        "G": "a strided stem followed by stride-1 layers (the strides of earlier layers multiply later kernels)",
        "H": "stride-1 convolutions alternating with pooling layers",
        "I": "a deep stack with stride 1 in every layer (strides left out)",
        "J": "the result must be a Python int, not a NumPy integer or a float",
    },
    "ex1-3-vit-tokens-tests": {"K": "the predicted number of tokens and numbers per token"},
    "ex1-4-prediction-tests": {"L": "the predicted number of rows"},
    "ex1-5-bytes-tests": {"M": "the predicted number of token ids"},
}
