"""The implement-it exercises of chapter 1 teach through their visible tests.

The contract and the generic tests are those of tests/exercise_harness.py: each likely mistake
that a visible test names is written here as a deliberately wrong answer and must fail the
test cell's *visible* part with that mistake's words, on a ``✘`` line; the master's solution
must pass the whole cell, hidden part included; every implement-it exercise names at least two
mistakes; every exercise binds its own answer names; every hidden case is described.

The test cells run in a namespace holding only the chapter's imports, so this file is quick;
the prediction exercises, whose verification cells use the chapter's state, run with the
chapter under nbval.
"""

from __future__ import annotations

from exercise_harness import code, exercise_tests

CHAPTER = "01_tokens_and_embeddings"


def _patches(keep: str, order: str = "0, 2, 3, 1, 4, 5") -> str:
    """A sliding-window answer to exercise 1.1 with the window selection and the axis order given."""
    return code(f"""
        def overlapping_patches(images, p, stride):
            B, C, H, W = images.shape
            x = np.lib.stride_tricks.sliding_window_view(images, (p, p), axis=(2, 3)){keep}
            n_rows, n_cols = x.shape[2], x.shape[3]
            return x.transpose({order}).reshape(B, n_rows * n_cols, C * p * p)
    """)


# {chapter: {test grade_id: {mistake: (wrong answer, words its visible failure must contain)}}}
MISTAKES: dict[str, dict[str, dict[str, tuple[str, str]]]] = {CHAPTER: {
    "ex1-1-overlapping-patches-tests": {
        "stride ignored (a patch every p pixels)": (_patches("[:, :, ::p, ::p]"), "the stride was ignored"),
        "every window kept (stride 1)": (_patches(""), "a patch starts at every pixel"),
        "starts stop before H - p": (code("""
            def overlapping_patches(images, p, stride):
                B, C, H, W = images.shape
                rows = [np.stack([images[:, :, i:i + p, j:j + p].reshape(B, -1)
                                  for j in range(0, W - p, stride)], axis=1)
                        for i in range(0, H - p, stride)]
                return np.concatenate(rows, axis=1)
        """), "the last patch of a column is missing"),
        "flattened channels last, (p, p, C)": (_patches("[:, :, ::stride, ::stride]", "0, 2, 3, 4, 5, 1"),
                                               "flattened in (p, p, C) order"),
        "numbered column by column": (_patches("[:, :, ::stride, ::stride]", "0, 3, 2, 1, 4, 5"),
                                      "numbered column by column"),
        "channel axis not moved before the reshape": (_patches("[:, :, ::stride, ::stride]", "0, 1, 2, 3, 4, 5"),
                                                      "with the channel axis still in front"),
    },
    "ex1-2-receptive-field-tests": {
        "strides ignored": (code("""
            def receptive_field(kernel_sizes, strides=None):
                return 1 + sum(s - 1 for s in kernel_sizes)
        """), "the strides were ignored"),
        "layer l's own stride counted": (code("""
            def receptive_field(kernel_sizes, strides=None):
                strides = [1] * len(kernel_sizes) if strides is None else strides
                r, jump = 1, 1
                for s, stride in zip(kernel_sizes, strides):
                    jump *= stride
                    r += (s - 1) * jump
                return r
        """), "layer l's own stride was counted"),
        "strides=None not handled": (code("""
            def receptive_field(kernel_sizes, strides=None):
                r, jump = 1, 1
                for s, stride in zip(kernel_sizes, strides):
                    r += (s - 1) * jump
                    jump *= stride
                return r
        """), "strides=None must mean stride 1 in every layer"),
        "a NumPy integer returned": (code("""
            def receptive_field(kernel_sizes, strides=None):
                s = np.asarray(kernel_sizes)
                strides = np.ones_like(s) if strides is None else np.asarray(strides)
                jumps = np.concatenate([[1], np.cumprod(strides)[:-1]]).astype(int)
                return 1 + np.sum((s - 1) * jumps)
        """), "not an int"),
    },
}}


globals().update(exercise_tests(MISTAKES))
