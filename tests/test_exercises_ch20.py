"""Chapter 20's exercises teach through their visible tests (tests/exercise_harness.py): each
likely mistake that a visible test names is written here as a deliberately wrong answer and must
fail that test's visible part with its words; the chapter's solution must pass the whole cell."""

from __future__ import annotations

from exercise_harness import code, exercise_tests, variant

CHAPTERS = ("20_serving",)

_ASYM = """
def quantize_asymmetric(W, bits):
    W = np.asarray(W)
    lo, hi = W.min(axis=0, keepdims=True), W.max(axis=0, keepdims=True)
    levels = LEVELS
    s = SCALE
    z = np.round(-lo / s)
    q = np.clip(np.round(W / s) + z, 0, levels)
    return RESULT
"""


def _asym(**change):
    """Exercise 20.1's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_ASYM, dict(LEVELS="2 ** bits - 1", SCALE="np.where(hi > lo, (hi - lo) / levels, 1)",
                               RESULT="(s * (q - z)).astype(W.dtype)"), **change)


_DRAFT = """
def best_draft_length(alpha, c, max_gamma=16):
    gammas = np.arange(1, max_gamma + 1)
    speedup = TOKENS / COST
    return int(gammas[np.argmax(speedup)])
"""


def _draft(**change):
    """Exercise 20.3's answer, with the mistake put in by replacing one of its upper-case parts."""
    return variant(_DRAFT, dict(TOKENS="(1 - alpha ** (gammas + 1)) / (1 - alpha)", COST="(gammas * c + 1)"), **change)


# {chapter: {test grade_id: {mistake: (wrong answer, words its visible failure must contain)}}}
MISTAKES = {"20_serving": {
    "ex20-1-asymmetric-tests": {
        "unchanged": (code("""
            def quantize_asymmetric(W, bits):
                return np.asarray(W).copy()
        """), "W came back unchanged"),
        "symmetric": (code("""
            def quantize_asymmetric(W, bits):
                W = np.asarray(W)
                s = np.abs(W).max(axis=0, keepdims=True) / (2 ** (bits - 1) - 1)
                return (s * np.round(W / s)).astype(W.dtype)
        """), "symmetric scale"),
        "2^bits steps": (_asym(LEVELS="2 ** bits", RESULT="(s * (np.minimum(q, 2 ** bits - 1) - z)).astype(W.dtype)"),
                         "exceeds half a step"),
        "float64 result": (code("""
            def quantize_asymmetric(W, bits):
                W = np.asarray(W, dtype=float)
                lo, hi = W.min(axis=0, keepdims=True), W.max(axis=0, keepdims=True)
                s = np.where(hi > lo, (hi - lo) / (2 ** bits - 1), 1)
                z = np.round(-lo / s)
                return s * (np.clip(np.round(W / s) + z, 0, 2 ** bits - 1) - z)
        """), "keep W's dtype"),
    },
    "ex20-2-mla-cache-tests": {
        "no rotary key": (code("prediction_mla_gib = 512 * 60 * 2 * 32768 / 2**30"), "the rotary key"),
        "doubled": (code("prediction_mla_gib = 2 * 576 * 60 * 2 * 32768 / 2**30"), "twice too much"),
        "one layer": (code("prediction_mla_gib = 576 * 2 * 32768 / 2**30"), "one layer only"),
        "GB": (code("prediction_mla_gib = 576 * 60 * 2 * 32768 / 1e9"), "GB (10^9 bytes)"),
        "rotary per head": (code("prediction_mla_gib = (512 + 128 * 64) * 60 * 2 * 32768 / 2**30"),
                            "shared by all heads"),
    },
    "ex20-3-draft-length-tests": {
        "no draft cost": (_draft(COST="1"), "the draft's cost"),
        "no bonus token": (_draft(TOKENS="(1 - alpha ** gammas) / (1 - alpha)"), "one off"),
        "float": (code("""
            def best_draft_length(alpha, c, max_gamma=16):
                gammas = np.arange(1, max_gamma + 1)
                speedup = (1 - alpha ** (gammas + 1)) / ((1 - alpha) * (gammas * c + 1))
                return float(gammas[np.argmax(speedup)])
        """), "return an int"),
    },
}}


globals().update(exercise_tests(MISTAKES, CHAPTERS, via="judge"))  # 20.3 reads the page's alpha and c_draft
