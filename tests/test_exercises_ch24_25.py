"""Chapters 24 and 25's exercises teach through their visible tests (tests/exercise_harness.py): each
likely mistake that a visible test names is written here as a deliberately wrong answer and must
fail that test's visible part with its words; the chapter's solution must pass the whole cell."""

from __future__ import annotations

from exercise_harness import code, exercise_tests

CHAPTERS = ("24_instruction_tuning", "25_evaluation")

MISTAKES = {
    "24_instruction_tuning": {
        "ex24-1-mask-tests": {
            "answer tokens themselves": (code("""
                def answer_mask(ids, assistant_id, end_id):
                    ids = np.asarray(ids)
                    m = np.zeros(len(ids), dtype=bool)
                    state = False
                    for t, token in enumerate(ids):
                        if token == end_id:
                            m[t] = state
                            state = False
                            continue
                        m[t] = state
                        if token == assistant_id:
                            state = True
                    return m
            """), "shift the mask one place left"),
            "assistant token scored": (code("""
                def answer_mask(ids, assistant_id, end_id):
                    ids = np.asarray(ids)
                    inside = np.zeros(len(ids), dtype=bool)
                    state = False
                    for t, token in enumerate(ids):
                        if token == assistant_id:
                            state = True
                        inside[t] = state
                        if token == end_id:
                            state = False
                    m = np.zeros(len(ids), dtype=bool)
                    m[:-1] = inside[1:]
                    return m
            """), "part of the prompt"),
            "end not scored": (code("""
                def answer_mask(ids, assistant_id, end_id):
                    ids = np.asarray(ids)
                    inside = np.zeros(len(ids), dtype=bool)
                    state = False
                    for t, token in enumerate(ids):
                        if token == end_id:
                            state = False
                        inside[t] = state
                        if token == assistant_id:
                            state = True
                    m = np.zeros(len(ids), dtype=bool)
                    m[:-1] = inside[1:]
                    return m
            """), "never learns to stop"),
            "turn never closes": (code("""
                def answer_mask(ids, assistant_id, end_id):
                    ids = np.asarray(ids)
                    inside = np.zeros(len(ids), dtype=bool)
                    state = False
                    for t, token in enumerate(ids):
                        inside[t] = state
                        if token == assistant_id:
                            state = True
                    m = np.zeros(len(ids), dtype=bool)
                    m[:-1] = inside[1:]
                    return m
            """), "a turn ends at <|end|>"),
        },
        "ex24-2-share-tests": {
            "mean over conversations": (code("prediction_share = 0.25"), "mean over scored tokens"),
            "end not counted": (code("prediction_share = 7 / 16"), "count <|end|> too"),
            "denominator without ends": (code("prediction_share = 8 / 16"), "3+5+1+7+4"),
        },
        "ex24-3-positions-tests": {
            "running positions": (code("""
                def positions_from_lengths(lengths):
                    return np.arange(sum(int(n) for n in lengths))
            """), "each conversation counts from 0"),
            "from one": (code("""
                def positions_from_lengths(lengths):
                    return np.concatenate([np.arange(1, int(n) + 1) for n in lengths])
            """), "not 1"),
        },
    },
    "25_evaluation": {
        "ex25-1-passk-tests": {
            "plug-in": (code("""
                def pass_at_k_estimate(n, c, k):
                    return 1 - (1 - c / n) ** k
            """), "plug-in"),
            "pass@1": (code("""
                def pass_at_k_estimate(n, c, k):
                    return c / n
            """), "that is c/n"),
            "overflow": (code("""
                def pass_at_k_estimate(n, c, k):
                    return 1 - float(math.comb(n - c, k)) / float(math.comb(n, k))
            """), "overflow"),
        },
        "ex25-2-items-tests": {
            "full width": (code("prediction_items = 601"), "half-width"),
            "z = 2": (code("prediction_items = 2500"), "not 2"),
            "not squared": (code("prediction_items = 49"), "square the ratio"),
            "rounded down": (code("prediction_items = 2400"), "round up"),
        },
        "ex25-3-paired-tests": {
            "separate intervals": (code("""
                def paired_difference_interval(a, b, idx):
                    a, b, idx = np.asarray(a, float), np.asarray(b, float), np.asarray(idx)
                    ma, mb = a[idx].mean(1), b[idx].mean(1)
                    return (float(np.quantile(ma, 0.025) - np.quantile(mb, 0.975)),
                            float(np.quantile(ma, 0.975) - np.quantile(mb, 0.025)))
            """), "two separate intervals"),
            "unpaired": (code("""
                def paired_difference_interval(a, b, idx):
                    a, b, idx = np.asarray(a, float), np.asarray(b, float), np.asarray(idx)
                    other = np.random.default_rng(0).integers(0, len(b), idx.shape)
                    lo, hi = np.quantile(a[idx].mean(1) - b[other].mean(1), [0.025, 0.975])
                    return float(lo), float(hi)
            """), "paired"),
        },
    },
}


globals().update(exercise_tests(MISTAKES, CHAPTERS))
