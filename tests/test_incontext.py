"""Chapter 22's components: tfbook.numpy.incontext against its torch twin, against direct
computations (NumPy's pseudo-inverse, a loop over the neighbours), and against the closed
forms of the estimators' expected errors; the in-context regressor's causality; bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import error_cases_incontext
from tfbook.numpy import incontext as N
from tfbook.torch.functional import incontext as T
from tfbook.torch.incontext import InContextConfig, InContextRegressor

NAMES = ("interleave", "least_squares", "averaging", "nearest_neighbours")


def _prompts(seed, n=300, k=9, d=4, noise=0.0):
    g = np.random.default_rng(seed)
    w = g.standard_normal((n, d))
    X = g.standard_normal((n, k, d))
    return X, np.einsum("nkd,nd->nk", X, w) + noise * g.standard_normal((n, k)), w


def test_every_function_has_error_cases_and_a_twin():
    assert {c[0] for c in error_cases_incontext.CASES} == set(N.__all__) == set(T.__all__) == set(NAMES)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name,kwargs", [("interleave", {}), ("least_squares", {}), ("least_squares", {"ridge": 0.5}),
                                         ("averaging", {}), ("nearest_neighbours", {}),
                                         ("nearest_neighbours", {"n_neighbors": 1})])
def test_numpy_equals_torch(name, kwargs, seed):
    X, y, _ = _prompts(seed, n=50)
    a = getattr(N, name)(X, y, **kwargs)
    b = getattr(T, name)(torch.tensor(X), torch.tensor(y), **kwargs)
    assert b.dtype == torch.float64 and a.shape == tuple(b.shape)
    np.testing.assert_allclose(a, b.numpy(), rtol=1e-9, atol=1e-9)  # float64; solves of Gram matrices


def test_float32_is_kept():
    X, y, _ = _prompts(0, n=5)
    assert N.averaging(X.astype(np.float32), y.astype(np.float32)).dtype == np.float32
    assert T.averaging(torch.tensor(X).float(), torch.tensor(y).float()).dtype == torch.float32


def test_interleave_layout():
    X, y, _ = _prompts(0, n=3, k=4, d=3)
    Z = N.interleave(X, y)
    assert Z.shape == (3, 8, 3)
    np.testing.assert_array_equal(Z[:, 0::2], X)
    np.testing.assert_array_equal(Z[:, 1::2, 0], y)
    assert not Z[:, 1::2, 1:].any()


def test_least_squares_is_the_pseudo_inverse_solution():
    X, y, _ = _prompts(3, n=20, k=9, d=4)
    pred = N.least_squares(X, y)
    for n in range(20):
        for i in range(9):
            w = np.linalg.pinv(X[n, :i]) @ y[n, :i] if i else np.zeros(4)
            assert abs(pred[n, i] - X[n, i] @ w) < 1e-8  # float64; pinv's cut-off never bites here


def test_ridge_is_the_closed_form_in_both_shapes():
    X, y, _ = _prompts(4, n=10, k=9, d=4, noise=0.3)
    lam = 0.09
    pred = N.least_squares(X, y, ridge=lam)
    for n in range(10):
        for i in range(1, 9):
            w = np.linalg.solve(X[n, :i].T @ X[n, :i] + lam * np.eye(4), X[n, :i].T @ y[n, :i])
            assert abs(pred[n, i] - X[n, i] @ w) < 1e-10


def test_least_squares_is_exact_from_d_examples_without_noise():
    X, y, _ = _prompts(5, n=200, k=9, d=4)
    err = (N.least_squares(X, y) - y) ** 2
    assert err[:, 4:].max() < 1e-12
    assert err[:, 3].mean() > 1e-2  # one example short: not exact


def test_averaging_and_nearest_neighbours_by_loops():
    X, y, _ = _prompts(6, n=15, k=8, d=3)
    avg, knn = N.averaging(X, y), N.nearest_neighbours(X, y, n_neighbors=3)
    for n in range(15):
        for i in range(8):
            w = sum(y[n, j] * X[n, j] for j in range(i)) / i if i else np.zeros(3)
            assert abs(avg[n, i] - X[n, i] @ w) < 1e-12
            near = sorted(range(i), key=lambda j: np.linalg.norm(X[n, j] - X[n, i]))[:3]
            assert abs(knn[n, i] - (np.mean(y[n, near]) if i else 0.0)) < 1e-12


def _within(mean_err, per_prompt, expected, z=5.0):
    """``mean_err`` within z standard errors of ``expected`` (the standard error estimated
    from the per-prompt errors)."""
    se = per_prompt.std(ddof=1) / math.sqrt(len(per_prompt))
    return abs(mean_err - expected) <= z * se + 1e-12  # + float64 round-off where the error is 0


@pytest.mark.parametrize("d", [3, 5])
def test_closed_forms_of_the_expected_errors(d):
    k = 2 * d + 1
    X, y, _ = _prompts(7 + d, n=20000, k=k, d=d)
    ls, avg = (N.least_squares(X, y) - y) ** 2, (N.averaging(X, y) - y) ** 2
    for i in range(k):
        assert _within(ls[:, i].mean(), ls[:, i], max(d - i, 0)), (d, i)  # E||(I-P_i) w||^2 = d - i
        expected_avg = d if i == 0 else d * (d + 1) / i  # E||w_hat - w||^2 = (d+1) ||w||^2 / i
        assert _within(avg[:, i].mean(), avg[:, i], expected_avg), (d, i)
    # the bound is tight enough to reject a wrong constant: (d+2)/i instead of (d+1)/i
    assert not all(_within(avg[:, i].mean(), avg[:, i], d * (d + 2) / i) for i in range(1, k))


def _model(seed=0, **changes):
    torch.manual_seed(seed)
    return InContextRegressor(InContextConfig(**dict(dict(d=3, n_points=6, d_model=16, num_heads=2, num_layers=2,
                                                          d_ff=32), **changes))).double().eval()


def test_regressor_is_causal():
    m = _model()
    X, y, _ = _prompts(8, n=4, k=6, d=3)
    X, y = torch.tensor(X), torch.tensor(y)
    out = m(X, y)
    assert out.shape == (4, 6)
    y2 = y.clone()
    y2[:, 3] += 1.0  # y_3 is seen from position 4 on, never at position 3
    out2 = m(X, y2)
    assert torch.equal(out[:, :4], out2[:, :4]) and (out[:, 4:] - out2[:, 4:]).abs().min() > 0
    X2 = X.clone()
    X2[:, 4] += 1.0
    out3 = m(X2, y)
    assert torch.equal(out[:, :4], out3[:, :4]) and (out[:, 4] - out3[:, 4]).abs().min() > 0


def test_regressor_fused_path_equals_the_blocks_with_p():
    m = _model()
    X, y, _ = _prompts(9, n=4, k=6, d=3)
    X, y = torch.tensor(X), torch.tensor(y)
    Z = T.interleave(X, y)
    H = m.pos(Z @ m.W_in + m.b_in)
    mask = torch.tril(torch.ones(12, 12, dtype=torch.bool))
    for block in m.blocks:
        H, _ = block(H, mask=mask, return_attention=True)
    ref = m.norm(H[:, 0::2]) @ m.w_out + m.b_out
    torch.testing.assert_close(m(X, y), ref, rtol=1e-12, atol=1e-12)


def test_regressor_rejects_bad_prompts():
    m = _model()
    with pytest.raises(ValueError, match=r"X must have d=3 features, got X \(2, 4, 5\)"):
        m(torch.zeros(2, 4, 5, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"X has K=7 > n_points=6 examples \(X: \(2, 7, 3\)\)"):
        m(torch.zeros(2, 7, 3, dtype=torch.float64), torch.zeros(2, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"y must be \(\.\.\., K\) = \(2, 4\)"):
        m(torch.zeros(2, 4, 3, dtype=torch.float64), torch.zeros(2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"d_model=10 must be divisible by num_heads=4"):
        InContextConfig(d_model=10, num_heads=4)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("name,args,kwargs,pattern", error_cases_incontext.CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(error_cases_incontext.CASES)])
def test_bad_input_raises_value_error_naming_it(backend, name, args, kwargs, pattern):
    fn = getattr(N if backend == "numpy" else T, name)
    if backend == "torch":
        if any(isinstance(a, np.ndarray) and a.dtype.kind == "U" for a in args):
            args, pattern = (torch.tensor([1, 2]), torch.zeros(2)), r"X must be floating point"
        args = tuple(torch.as_tensor(a) if isinstance(a, np.ndarray) else a for a in args)
    with pytest.raises(ValueError, match=pattern):
        fn(*args, **kwargs)
