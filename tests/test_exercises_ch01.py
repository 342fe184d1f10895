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

from exercise_harness import code, exercise_tests, variant

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


_MERGES = """
    def learn_merges(text, num_merges):
        pieces = PIECES
        words = [list(p.encode("utf-8")) for p in pieces]
        weights = WEIGHTS
        vocab = [bytes([b]) for b in range(256)]
        merges = []
        while len(merges) < num_merges:
            counts = Counter()
            for ids, w in zip(words, weights):
                for pair in zip(ids, ids[1:]):
                    counts[pair] += w
            if not counts or max(counts.values()) STOP:
                break
            best = max(counts.values())
            a, b = CHOOSE
            merges.append((a, b))
            vocab.append(vocab[a] + vocab[b])
            for k, ids in enumerate(words):
                out, i = [], 0
                while i < len(ids):
                    if i + 1 < len(ids) and ids[i] == a and ids[i + 1] == b:
                        out.append(len(vocab) - 1)
                        i += 2
                    else:
                        out.append(ids[i])
                        i += 1
                words[k] = out
        return merges
"""
_MERGE_DEFAULTS = {"PIECES": "Counter(pretokenize(text))", "WEIGHTS": "list(pieces.values())", "STOP": "< 2",
                   "CHOOSE": "min((p for p, c in counts.items() if c == best), key=lambda p: (vocab[p[0]], vocab[p[1]]))"}


def _merges(**change: str) -> str:
    """An answer to exercise 1.2 (the byte-level BPE merge loop) with one part changed."""
    return variant(_MERGES, _MERGE_DEFAULTS, **change)


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
    "ex1-2-learn-merges-tests": {
        "a pair seen once merged": (_merges(STOP="< 1"), "a pair seen once was merged"),
        "pieces not cut (merges cross them)": (_merges(PIECES="Counter([text])"), "a merge crossed a piece boundary"),
        "a repeated piece counted once": (_merges(WEIGHTS="[1] * len(pieces)"), "a repeated piece was counted once"),
        "pairs counted once, before the first merge": (code("""
            def learn_merges(text, num_merges):
                counts = Counter()
                for piece in pretokenize(text):
                    ids = list(piece.encode("utf-8"))
                    counts.update(zip(ids, ids[1:]))
                ranked = sorted((p for p, c in counts.items() if c >= 2),
                                key=lambda p: (-counts[p], bytes([p[0]]), bytes([p[1]])))
                return ranked[:num_merges]
        """), "the pairs were counted once, before the first merge"),
        "tie broken by order of appearance": (_merges(CHOOSE="counts.most_common(1)[0][0]"),
                                              "the tie was broken by the order in which the pairs appear"),
        "tie broken by token ids": (_merges(CHOOSE="min(p for p, c in counts.items() if c == best)"),
                                    "the tie was broken by token ids"),
    },
}}


globals().update(exercise_tests(MISTAKES))
