"""Chapter 22's exercises teach through their visible tests (tests/exercise_harness.py): each
likely mistake that a visible test names is written here as a deliberately wrong answer and must
fail that test's visible part with its words; the chapter's solution must pass the whole cell."""

from __future__ import annotations

from exercise_harness import code, exercise_tests

CHAPTERS = ("22_in_context_learning",)

MISTAKES = {"22_in_context_learning": {
    "ex22-1-ridge-tests": {
        "no penalty": (code("""
            def ridge_predict(X_ctx, y_ctx, x_query, ridge):
                X_ctx, y_ctx = np.asarray(X_ctx, float), np.asarray(y_ctx, float)
                if len(X_ctx) == 0:
                    return 0.0
                return float(np.asarray(x_query) @ np.linalg.pinv(X_ctx) @ y_ctx)
        """), "the penalty was left out"),
        "penalty on the labels": (code("""
            def ridge_predict(X_ctx, y_ctx, x_query, ridge):
                X_ctx, y_ctx = np.asarray(X_ctx, float), np.asarray(y_ctx, float)
                d = X_ctx.shape[1]
                return float(x_query @ np.linalg.solve(X_ctx.T @ X_ctx + ridge * np.eye(d), X_ctx.T @ (y_ctx + ridge)))
        """), "the penalty was added to the labels"),
        "normal equations only": (code("""
            def ridge_predict(X_ctx, y_ctx, x_query, ridge):
                X_ctx, y_ctx = np.asarray(X_ctx, float), np.asarray(y_ctx, float)
                d = X_ctx.shape[1]
                return float(x_query @ np.linalg.solve(X_ctx.T @ X_ctx + ridge * np.eye(d), X_ctx.T @ y_ctx))
        """), "X^T X is singular"),
    },
    "ex22-2-averaging-tests": {
        "d over k": (code("prediction_avg = 10 / 20"), "the variance of each term"),
        "least squares": (code("prediction_avg = 1 - 20 / 10"), "least squares' 1 - k/d"),
        "not divided": (code("prediction_avg = 11 / 20 * 10"), "divide by d = 10"),
        "d + 2": (code("prediction_avg = 12 / 20"), "bring it to d + 1"),
    },
    "ex22-3-subspace-tests": {
        "full space": (code("prediction_sub = 1 - 1 / 5\nexact_from = 3"), "only w's component in the subspace"),
        "divided by r": (code("prediction_sub = 2 / 3\nexact_from = 3"), "the error was divided by r"),
        "no example": (code("prediction_sub = 3 / 5\nexact_from = 3"), "one example already fixes one direction"),
        "exact from d": (code("prediction_sub = 2 / 5\nexact_from = 5"), "r = 3 independent examples"),
    },
}}


globals().update(exercise_tests(MISTAKES, CHAPTERS))
