"""Chapter 22's exercises teach through their visible tests (tests/exercise_harness.py): each
likely mistake that a visible test names is written here as a deliberately wrong answer and must
fail that test's visible part with its words; the chapter's solution must pass the whole cell."""

from __future__ import annotations

from exercise_harness import code, exercise_tests

CHAPTERS = ("22_in_context_learning",)

MISTAKES = {"22_in_context_learning": {
    "ex22-1-ridge-tests": {
        "isotropic prior": (code("""
            def posterior_mean(X_ctx, y_ctx, Sigma, noise_var):
                X_ctx, y_ctx = np.asarray(X_ctx, float), np.asarray(y_ctx, float)
                k, d = X_ctx.shape
                return X_ctx.T @ np.linalg.solve(X_ctx @ X_ctx.T + noise_var * np.eye(k), y_ctx)
        """), "the penalty sigma^2 I"),
        "Sigma not inverted": (code("""
            def posterior_mean(X_ctx, y_ctx, Sigma, noise_var):
                X_ctx, y_ctx = np.asarray(X_ctx, float), np.asarray(y_ctx, float)
                return np.linalg.solve(X_ctx.T @ X_ctx + noise_var * np.asarray(Sigma), X_ctx.T @ y_ctx)
        """), "not sigma^2 Sigma"),
        "primal form only": (code("""
            def posterior_mean(X_ctx, y_ctx, Sigma, noise_var):
                X_ctx, y_ctx = np.asarray(X_ctx, float), np.asarray(y_ctx, float)
                P = noise_var * np.linalg.inv(Sigma)
                return np.linalg.solve(X_ctx.T @ X_ctx + P, X_ctx.T @ y_ctx)
        """), "X^T X is singular"),
    },
    "ex22-2-averaging-tests": {
        "noiseless": (code("prediction_avg = 11 / 20"), "the noiseless error"),
        "d over k": (code("prediction_avg = 10.25 / 20"), "the variance of each term"),
        "sigma not squared": (code("prediction_avg = 11.5 / 20"), "not sigma = 0.5"),
        "query noise": (code("prediction_avg = 11 / 20 + 0.25"), "the query's own noise"),
        "not divided": (code("prediction_avg = 11.25 / 20 * 10"), "divide by d = 10"),
        "d + 2": (code("prediction_avg = 12.25 / 20"), "bring it to d + 1"),
    },
    "ex22-3-subspace-tests": {
        "full space": (code("prediction_sub = 1 - 1 / 5\nexact_from = 3"), "only w's component in the subspace"),
        "divided by r": (code("prediction_sub = 2 / 3\nexact_from = 3"), "the error was divided by r"),
        "no example": (code("prediction_sub = 3 / 5\nexact_from = 3"), "one example already fixes one direction"),
        "exact from d": (code("prediction_sub = 2 / 5\nexact_from = 5"), "r = 3 independent examples"),
    },
}}


globals().update(exercise_tests(MISTAKES, CHAPTERS))
