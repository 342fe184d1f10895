"""Chapter 23's exercises teach through their visible tests (tests/exercise_harness.py): each
likely mistake that a visible test names is written here as a deliberately wrong answer and must
fail that test's visible part with its words; the chapter's solution must pass the whole cell."""

from __future__ import annotations

from exercise_harness import code, exercise_tests

CHAPTERS = ("23_attention_as_recurrence",)

MISTAKES = {"23_attention_as_recurrence": {
    "ex23-1-delta-step-tests": {
        "linear attention's write": (code("""
            def gated_delta_step(S, k, v, beta, alpha):
                S, k, v = (np.asarray(x, float) for x in (S, k, v))
                return alpha * S + beta * np.outer(k, v)
        """), "linear attention's write"),
        "read before the decay": (code("""
            def gated_delta_step(S, k, v, beta, alpha):
                S, k, v = (np.asarray(x, float) for x in (S, k, v))
                return alpha * S + beta * np.outer(k, v - S.T @ k)
        """), "read after the decay"),
        "decay after the write": (code("""
            def gated_delta_step(S, k, v, beta, alpha):
                S, k, v = (np.asarray(x, float) for x in (S, k, v))
                return alpha * (S + beta * np.outer(k, v - S.T @ k))
        """), "applied after the write"),
        "outer product transposed": (code("""
            def gated_delta_step(S, k, v, beta, alpha):
                S, k, v = (np.asarray(x, float) for x in (S, k, v))
                S = alpha * S
                return S.T + beta * np.outer(v - S.T @ k, k)
        """), "wrong shape"),
    },
    "ex23-2-crossover-tests": {
        "equal, not larger": (code("prediction_cross = 128"), "the two are equal"),
        "keys only": (code("prediction_cross = 257"), "keys and values"),
        "square state": (code("prediction_cross = 65"), "128 x 256"),
    },
    "ex23-3-horizon-tests": {
        "one step early": (code("horizon = 89\nhalf_life = 14"), "still above 1%"),
        "linear fall": (code("horizon = 20\nhalf_life = 14"), "straight line"),
        "half-life one early": (code("horizon = 90\nhalf_life = 13"), "still above 1/2"),
    },
}}


globals().update(exercise_tests(MISTAKES, CHAPTERS))
