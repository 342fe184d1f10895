"""Chapter 27's exercises teach through their visible tests (tests/exercise_harness.py): each likely
mistake that a visible test names is written here as a deliberately wrong answer and must fail that
test's visible part with its words; the chapter's solution must pass the whole cell."""

from __future__ import annotations

from exercise_harness import code, exercise_tests

CHAPTERS = ("27_rl_verifiable_rewards",)

MISTAKES = {
    "27_rl_verifiable_rewards": {
        "ex27-1-surrogate-tests": {
            "clipped only": (code("""
                def clipped_surrogate(ratio, advantage, epsilon):
                    return np.clip(np.asarray(ratio, float), 1 - epsilon, 1 + epsilon) * np.asarray(advantage, float)
            """), "clipped term alone"),
            "max": (code("""
                def clipped_surrogate(ratio, advantage, epsilon):
                    r, a = np.asarray(ratio, float), np.asarray(advantage, float)
                    return np.maximum(r * a, np.clip(r, 1 - epsilon, 1 + epsilon) * a)
            """), "max instead of min"),
        },
        "ex27-2-dead-tests": {
            "all right only": (code("prediction_dead = 0.9 ** 8"), "all wrong is the other"),
            "some wrong": (code("prediction_dead = 1 - 0.9 ** 8"), "some answer is wrong"),
            "all wrong only": (code("prediction_dead = 0.1 ** 8"), "all right"),
        },
        "ex27-3-wvote-tests": {
            "heaviest sample": (code("""
                def weighted_vote(answers, weights):
                    answers, weights = np.asarray(answers), np.asarray(weights, float)
                    return answers[np.arange(len(answers)), weights.argmax(1)]
            """), "single heaviest sample"),
            "unweighted": (code("""
                def weighted_vote(answers, weights):
                    answers = np.asarray(answers)
                    out = []
                    for row in answers:
                        counts = {a: list(row).count(a) for a in row}
                        top = max(counts.values())
                        out.append(next(a for a in row if counts[a] == top))
                    return np.array(out)
            """), "ignores the weights"),
        },
    },
}


globals().update(exercise_tests(MISTAKES, CHAPTERS))
