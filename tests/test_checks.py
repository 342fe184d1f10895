"""tfbook.checks: each diagnosis is triggered by exactly the mistake it names, and the
correct implementations pass with a ✔ line.

The deliberately wrong implementations below are written out by hand (not derived from
the reference), so a check that names the wrong mistake, or passes a wrong function,
fails here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tfbook import checks
from tfbook.checks import (
    CheckFailed,
    check_attention,
    check_close,
    check_finite,
    check_projection,
    check_self_attention,
    check_shape,
    check_softmax,
)

# --------------------------------------------------------------------------- learner code


def softmax_ok(x, axis=-1):
    x = np.asarray(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_wrong_axis(x, axis=-1):
    return softmax_ok(x, axis=0)


def softmax_naive(x, axis=-1):  # overflows for logits of 1e3
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def softmax_torch(x, axis=-1):
    return torch.softmax(x, dim=axis)


def _attend(Q, K, V, mask=None, scale=None, mask_after=False, softmax_axis=-1):
    S = Q @ np.swapaxes(K, -1, -2) * (1 / math.sqrt(Q.shape[-1]) if scale is None else scale)
    if mask is not None and not mask_after:
        S = np.where(mask, S, -np.inf)
    P = softmax_ok(S, axis=softmax_axis)
    if mask is not None and mask_after:
        P = np.where(mask, P, 0.0)
    return P @ V, P


def attention_ok(Q, K, V, mask=None):
    return _attend(Q, K, V, mask)


def attention_unscaled(Q, K, V, mask=None):
    return _attend(Q, K, V, mask, scale=1.0)


def attention_mask_after(Q, K, V, mask=None):
    return _attend(Q, K, V, mask, mask_after=True)


def attention_wrong_axis(Q, K, V, mask=None):
    return _attend(Q, K, V, None, softmax_axis=-2)


def attention_transposed_P(Q, K, V, mask=None):
    Z, P = _attend(Q, K, V, mask)
    return Z, np.swapaxes(P, -1, -2)


def attention_nan(Q, K, V, mask=None):
    Z, P = _attend(Q, K, V, mask)
    Z = Z.copy()
    Z[0, 1, 2] = np.nan
    return Z, P


def attention_torch(Q, K, V, mask=None):
    S = Q @ K.transpose(-1, -2) / math.sqrt(Q.shape[-1])
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))
    P = torch.softmax(S, dim=-1)
    return P @ V, P


def attention_float32(Q, K, V, mask=None):
    Z, P = _attend(Q, K, V, mask)
    return Z.astype(np.float32), P.astype(np.float32)


def project_ok(X, W):
    return X @ W


def project_transposed(X, W):
    return X @ W.T if W.shape[0] == W.shape[1] else X @ W


def self_attention_ok(X, W_Q, W_K, W_V, mask=None):
    return _attend(X @ W_Q, X @ W_K, X @ W_V, mask)


def self_attention_transposed(X, W_Q, W_K, W_V, mask=None):
    if W_Q.shape[0] == W_Q.shape[1] == W_V.shape[1]:
        return _attend(X @ W_Q.T, X @ W_K.T, X @ W_V.T, mask)
    return _attend(X @ W_Q, X @ W_K, X @ W_V, mask)


def self_attention_unscaled(X, W_Q, W_K, W_V, mask=None):
    return _attend(X @ W_Q, X @ W_K, X @ W_V, mask, scale=1.0)


def self_attention_mask_after(X, W_Q, W_K, W_V, mask=None):
    return _attend(X @ W_Q, X @ W_K, X @ W_V, mask, mask_after=True)


# --------------------------------------------------------------------------- helpers


def fails_with(capsys, fn, *args, match: str, **kwargs) -> str:
    """Run a check that must fail; return its ✘ line after asserting it names ``match``."""
    with pytest.raises(AssertionError) as info:
        fn(*args, **kwargs)
    out = capsys.readouterr().out
    message = str(info.value)
    assert isinstance(info.value, CheckFailed)
    assert message.startswith("✘ ") and match in message, message
    assert out.strip() == message, "the printed line and the exception must say the same"
    assert out.count("\n") == 1, f"one line expected, got {out!r}"
    assert info.value.__cause__ is None and info.value.__suppress_context__
    return message


def passes(capsys, fn, *args, **kwargs) -> str:
    fn(*args, **kwargs)
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("✔ "), out
    return lines[0]


# --------------------------------------------------------------------------- softmax


def test_softmax_correct_passes(capsys):
    line = passes(capsys, check_softmax, softmax_ok)
    assert "max |error|" in line


def test_softmax_torch_backend_passes(capsys):
    passes(capsys, check_softmax, softmax_torch, backend="torch")


def test_softmax_wrong_axis_is_named(capsys):
    msg = fails_with(capsys, check_softmax, softmax_wrong_axis, match="not 1")
    assert msg.startswith("✘ softmax(x of shape (3, 5)): rows sum to") and "over axis 0" in msg


def test_softmax_overflow_is_named(capsys):
    with np.errstate(over="ignore", invalid="ignore"):
        fails_with(capsys, check_softmax, softmax_naive, match="NaN")


def test_softmax_wrong_shape(capsys):
    fails_with(capsys, check_softmax, lambda x, axis=-1: softmax_ok(x, axis)[..., :-1],
               match="expected (3, 5), got (3, 4)")


def test_softmax_missing_return(capsys):
    fails_with(capsys, check_softmax, lambda x, axis=-1: None, match="forget to `return`")


# --------------------------------------------------------------------------- attention


def test_attention_correct_passes(capsys):
    passes(capsys, check_attention, attention_ok)


def test_attention_torch_passes(capsys):
    passes(capsys, check_attention, attention_torch, backend="torch")


def test_attention_float32_passes_with_float32_tolerance(capsys):
    passes(capsys, check_attention, attention_float32)


def test_attention_missing_scale(capsys):
    fails_with(capsys, check_attention, attention_unscaled, match="without the 1/sqrt(D_K)")


def test_attention_mask_after_softmax(capsys):
    fails_with(capsys, check_attention, attention_mask_after, match="mask was applied after the softmax")


def test_attention_wrong_axis(capsys):
    msg = fails_with(capsys, check_attention, attention_wrong_axis, match="rows of P sum to")
    assert msg.endswith("not 1: softmax over axis -1?")


def test_attention_wrong_shape(capsys):
    fails_with(capsys, check_attention, attention_transposed_P, match="expected (2, 3, 5), got (2, 5, 3)")


def test_attention_nan(capsys):
    fails_with(capsys, check_attention, attention_nan, match="contains NaN in 1 of 36 entries")


def test_attention_must_return_pair(capsys):
    fails_with(capsys, check_attention, lambda Q, K, V, mask=None: _attend(Q, K, V)[0],
               match="should return the pair (Z, P)")


# --------------------------------------------------------------------------- projections


def test_projection_correct_passes(capsys):
    passes(capsys, check_projection, project_ok)
    passes(capsys, check_projection, lambda X, W: X @ W, backend="torch")


def test_projection_transposed(capsys):
    fails_with(capsys, check_projection, project_transposed, match="equals X @ W.T")


def test_self_attention_correct_passes(capsys):
    passes(capsys, check_self_attention, self_attention_ok)


def test_self_attention_transposed(capsys):
    fails_with(capsys, check_self_attention, self_attention_transposed, match="weights are transposed")


def test_self_attention_unscaled(capsys):
    fails_with(capsys, check_self_attention, self_attention_unscaled, match="1/sqrt(D_K)")


def test_self_attention_mask_after(capsys):
    fails_with(capsys, check_self_attention, self_attention_mask_after, match="after the softmax")


# --------------------------------------------------------------------------- generic checks


def test_check_close_passes_and_fails(capsys):
    x = np.linspace(0, 1, 5)
    assert "max |error| ≤ 1e-15" in passes(capsys, check_close, x, x.copy(), "x")
    y = x.copy()
    y[3] += 1e-6  # far above the float64 default atol of 1e-10
    msg = fails_with(capsys, check_close, y, x, "x", match="off by up to 1e-06")
    assert "index (3,)" in msg
    # an explicit looser tolerance is honoured; the figure is printed as a power-of-ten bound
    assert "max |error| ≤ 1e-5" in passes(capsys, check_close, y, x, "x", atol=1e-5)
    fails_with(capsys, check_close, x[:4], x, "x", match="expected (5,), got (4,)")
    fails_with(capsys, check_close, np.array([1.0, np.inf]), np.array([1.0, 2.0]), "x", match="inf")


def test_check_close_accepts_tensors(capsys):
    t = torch.arange(4, dtype=torch.float64, requires_grad=True) * 2
    passes(capsys, check_close, t, np.array([0.0, 2.0, 4.0, 6.0]), "t")
    fails_with(capsys, check_close, t, np.array([0.0, 2.0, 4.0, 7.0]), "t", match="off by up to 1")


def test_check_close_float32_tolerance(capsys):
    a = np.float32(1 / 3) * np.ones(3, dtype=np.float32)
    passes(capsys, check_close, a, np.full(3, 1 / 3), "a")  # float32 round-off ~3e-8 < 1e-5
    fails_with(capsys, check_close, a + np.float32(1e-3), np.full(3, 1 / 3), "a", match="off by up to")


def test_check_shape(capsys):
    passes(capsys, check_shape, np.zeros((2, 3)), (2, 3), "A")
    passes(capsys, check_shape, torch.zeros(2, 3), (None, 3), "A")
    fails_with(capsys, check_shape, np.zeros((2, 3)), (3, 2), "A", match="expected (3, 2), got (2, 3)")
    fails_with(capsys, check_shape, np.zeros((2, 3)), (2, 3, 1), "A", match="wrong shape")


def test_check_finite(capsys):
    passes(capsys, check_finite, np.ones(3), "v")
    fails_with(capsys, check_finite, np.array([1.0, -np.inf, np.nan]), "v", match="NaN, inf in 2 of 3")


def test_reference_is_tfbook_numpy():
    from tfbook import numpy as reference

    assert checks._reference() is reference


def test_checks_work_from_notebooks_dir(tmp_path):
    """A kernel started in notebooks/ (or anywhere) imports and runs the checks."""
    import subprocess
    import sys

    code = ("import numpy as np\nfrom tfbook.checks import check_softmax\n"
            "check_softmax(lambda x, axis=-1: np.exp(x - x.max(axis, keepdims=True)) / "
            "np.exp(x - x.max(axis, keepdims=True)).sum(axis, keepdims=True))\n")
    from pathlib import Path

    cwd = Path(__file__).resolve().parents[1] / "notebooks"
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("✔ softmax")


def test_check_close_complex_arrays(capsys):
    """Complex results are compared with their imaginary parts, and a failure prints them."""
    z = np.array([1 + 2j, -0.5 + 0.25j])
    assert "max |error| ≤ 1e-15" in passes(capsys, check_close, z, z.copy(), "z")
    w = z.copy()
    w[1] += 1e-3j  # differs in the imaginary part only
    msg = fails_with(capsys, check_close, w, z, "z", match="off by up to 0.001")
    assert "index (1,)" in msg and "j" in msg


def test_check_close_prints_an_explicit_rtol(capsys):
    x = np.array([100.0, 200.0])
    line = passes(capsys, check_close, x * 1.01, x, "x", atol=0, rtol=0.05)
    assert "atol=0, rtol=0.05" in line
    assert "rtol" not in passes(capsys, check_close, x, x.copy(), "x")


def test_check_finite_one_entry(capsys):
    assert "(1 entry)" in passes(capsys, check_finite, np.ones(1), "v")
