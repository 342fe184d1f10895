"""Chapter 26's exercises teach through their visible tests (tests/exercise_harness.py): each
likely mistake that a visible test names is written here as a deliberately wrong answer and must
fail that test's visible part with its words; the chapter's solution must pass the whole cell."""

from __future__ import annotations

from exercise_harness import code, exercise_tests

CHAPTERS = ("26_preferences",)

MISTAKES = {
    "26_preferences": {
        "ex26-1-dpo-tests": {
            "no reference": (code("""
                def dpo_pair_loss(logp_w, logp_l, ref_w, ref_l, beta):
                    m = beta * (np.asarray(logp_w, float) - np.asarray(logp_l, float))
                    return float(np.mean(np.logaddexp(0.0, -m)))
            """), "the reference is missing"),
            "sign reversed": (code("""
                def dpo_pair_loss(logp_w, logp_l, ref_w, ref_l, beta):
                    m = beta * ((np.asarray(logp_w, float) - ref_w) - (np.asarray(logp_l, float) - ref_l))
                    return float(np.mean(np.logaddexp(0.0, m)))
            """), "the sign is reversed"),
            "beta divides": (code("""
                def dpo_pair_loss(logp_w, logp_l, ref_w, ref_l, beta):
                    m = ((np.asarray(logp_w, float) - ref_w) - (np.asarray(logp_l, float) - ref_l)) / beta
                    return float(np.mean(np.logaddexp(0.0, -m)))
            """), "beta multiplies"),
            "overflow": (code("""
                def dpo_pair_loss(logp_w, logp_l, ref_w, ref_l, beta):
                    m = beta * ((np.asarray(logp_w, float) - ref_w) - (np.asarray(logp_l, float) - ref_l))
                    with np.errstate(over="ignore"):
                        return float(np.mean(np.log(1 + np.exp(-m)) if (m > -700).all() else np.inf))
            """), "overflows"),
        },
        "ex26-2-optimum-tests": {
            "no reference": (code("prediction_prob = 2 / 3"), "the reference is missing"),
            "beta multiplies": (code("prediction_prob = 0.25 * 2 ** 0.5 / (0.75 + 0.25 * 2 ** 0.5)"), "do not multiply"),
            "beta forgotten": (code("prediction_prob = 0.4"), "divided by beta"),
        },
        "ex26-3-verifier-tests": {
            "no reference": (code("""
                def optimal_right_prob(q, beta):
                    q = np.asarray(q, float)
                    return np.exp(1 / beta) / (np.exp(1 / beta) + 1) + 0 * q
            """), "the reference's q is missing"),
            "beta multiplies": (code("""
                def optimal_right_prob(q, beta):
                    q = np.asarray(q, float)
                    return q * np.exp(beta) / (q * np.exp(beta) + 1 - q)
            """), "do not multiply"),
            "overflow": (code("""
                def optimal_right_prob(q, beta):
                    q = np.asarray(q, float)
                    with np.errstate(over="ignore", invalid="ignore"):
                        e = np.exp(1 / beta)
                        return q * e / (q * e + 1 - q)
            """), "overflows"),
        },
    },
}


globals().update(exercise_tests(MISTAKES, CHAPTERS))
