"""Checks for the reader's own code: one line saying what held, or what likely went wrong.

Every ``check_*`` function either prints one line starting with ``✔`` that names
the figure that held (for example the largest error against the reference), or
prints one line starting with ``✘`` that names the most likely mistake and raises
``AssertionError`` with the same message (so an autograder marks the test as
failed)::

    >>> from tfbook.checks import check_softmax
    >>> check_softmax(my_softmax)
    ✔ softmax: matches tfbook.numpy.softmax on 4 inputs (max |error| 1.1e-16)

The functions under test are compared with the reference implementations in
:mod:`tfbook.numpy` (imported lazily, the first time a check needs them). When a
result is wrong, it is also compared with the reference run the *wrong* way (the
softmax over the other axis, scores not divided by sqrt(D_K), the mask applied
after the softmax, transposed weights); a match names the mistake.

Results may be NumPy arrays or torch tensors (they are converted to NumPy). The
reader's function receives NumPy float64 arrays unless ``backend="torch"`` is
given, in which case it receives float64 tensors.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

__all__ = [
    "check_close",
    "check_shape",
    "check_finite",
    "check_softmax",
    "check_attention",
    "check_projection",
    "check_self_attention",
    "CheckFailed",
]

TICK, CROSS = "✔", "✘"


class CheckFailed(AssertionError):
    """Raised by a failing check; its message is the ``✘`` line."""


def _reference():
    from tfbook import numpy as reference  # lazy: keep `import tfbook.checks` light

    return reference


def _passed(message: str) -> None:
    print(f"{TICK} {message}")


def _fail(message: str):
    __tracebackhide__ = True  # IPython and pytest hide this frame
    line = f"{CROSS} {message}"
    print(line)
    raise CheckFailed(line) from None


def _to_numpy(x: Any, name: str) -> np.ndarray:
    """Convert an array, a tensor or a number to a NumPy array."""
    __tracebackhide__ = True
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        x = x.numpy()
    if x is None:
        _fail(f"{name} is None: did the function forget to `return` its result?")
    try:
        return np.asarray(x)
    except Exception as exc:  # e.g. a ragged list
        _fail(f"{name} cannot be read as an array ({type(exc).__name__}: {exc})")


def _tolerance(*arrays: np.ndarray) -> tuple[float, float]:
    """(atol, rtol) fit for the least precise of ``arrays``."""
    if any(a.dtype in (np.float16,) for a in arrays):
        return 1e-2, 1e-2  # float16 round-off (11-bit mantissa)
    if any(a.dtype == np.float32 for a in arrays):
        return 1e-5, 1e-5  # float32 round-off over a few dozen operations
    return 1e-10, 1e-10  # float64 round-off; equivalent formulas differ by ~1e-15


def _wide(a: np.ndarray) -> np.ndarray:
    """``a`` in float64, or complex128 when it is complex (so no imaginary part is dropped)."""
    return a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)


def _max_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(_wide(a) - _wide(b)))) if a.size else 0.0


def _fmt_value(x: Any) -> str:
    """One entry of an array for a message: real, or complex as ``a+bj``."""
    x = complex(x) if np.iscomplexobj(x) else float(x)
    if isinstance(x, complex):
        return f"{x.real:.3g}{x.imag:+.3g}j"
    return _fmt(x)


def _close(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> bool:
    return a.shape == b.shape and bool(np.allclose(a, b, atol=atol, rtol=rtol))


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _bound(err: float) -> str:
    """An error as a power-of-ten bound, e.g. ``≤ 1e-12``.

    Pass lines print this rather than the exact figure: the last bits of round-off
    differ between machines and BLAS builds, and the notebooks' outputs are compared
    run to run. Everything at float64 round-off level reads ``≤ 1e-15``.
    """
    if not err > 1e-15:
        return "≤ 1e-15"
    return f"≤ 1e{math.ceil(math.log10(err)):d}"


def _range(values: np.ndarray) -> str:
    lo, hi = float(np.min(values)), float(np.max(values))
    return _fmt(lo) if math.isclose(lo, hi, rel_tol=1e-3, abs_tol=1e-6) else f"{_fmt(lo)} to {_fmt(hi)}"


# --------------------------------------------------------------------------- generic checks


def check_shape(x: Any, expected: tuple, name: str = "output") -> None:
    """Check that ``x`` has shape ``expected``; ``None`` in ``expected`` matches any size."""
    __tracebackhide__ = True
    shape = _to_numpy(x, name).shape
    expected = tuple(expected)
    ok = len(shape) == len(expected) and all(e is None or e == s for s, e in zip(shape, expected))
    if not ok:
        hint = ""
        if len(shape) == len(expected) and sorted(shape) == sorted(e for e in expected if e is not None):
            hint = ": the right sizes in the wrong order, a transpose too many or too few?"
        _fail(f"{name} has the wrong shape: expected {expected}, got {shape}{hint}")
    _passed(f"{name} has shape {shape}")


def check_finite(x: Any, name: str = "output") -> None:
    """Check that ``x`` has no NaN and no infinity."""
    __tracebackhide__ = True
    a = _to_numpy(x, name)
    if not np.issubdtype(a.dtype, np.number) or np.issubdtype(a.dtype, np.integer):
        _passed(f"{name} is finite ({a.dtype})")
        return
    bad = ~np.isfinite(a)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        kinds = ", ".join(k for k, m in (("NaN", np.isnan(a)), ("inf", np.isinf(a))) if m.any())
        _fail(f"{name} contains {kinds} in {int(bad.sum())} of {a.size} entries (first at {first}): "
              "exp of a large number overflows (subtract the max first), or -inf reached an "
              "exp or a product?")
    _passed(f"{name} is finite ({a.size} {'entry' if a.size == 1 else 'entries'})")


def check_close(actual: Any, expected: Any, name: str = "output",
                atol: float | None = None, rtol: float | None = None) -> None:
    """Check that ``actual`` equals ``expected`` elementwise within ``atol + rtol * |expected|``.

    The default tolerances follow the dtypes: 1e-10 for float64 (round-off) and
    1e-5 when either side is float32.
    """
    __tracebackhide__ = True
    a, e = _to_numpy(actual, name), _to_numpy(expected, f"expected {name}")
    if a.shape != e.shape:
        _fail(f"{name} has the wrong shape: expected {e.shape}, got {a.shape}")
    if np.issubdtype(a.dtype, np.inexact) and not np.isfinite(a).all() and np.isfinite(e).all():
        check_finite(a, name)
    d_atol, d_rtol = _tolerance(a, e)
    rtol_given = rtol is not None
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    if not np.allclose(a, e, atol=atol, rtol=rtol, equal_nan=True):
        err = np.abs(_wide(a) - _wide(e))
        where = tuple(int(i) for i in np.unravel_index(np.nanargmax(err), err.shape)) if err.ndim else ()
        _fail(f"{name} is off by up to {_fmt(float(np.nanmax(err)))} (at index {where}: got "
              f"{_fmt_value(a[where])}, expected {_fmt_value(e[where])}; atol={atol:g}, rtol={rtol:g})")
    # an explicitly chosen rtol is part of what held, so it is printed (the default is not,
    # to keep the usual line short)
    tolerances = f"atol={atol:g}" + (f", rtol={rtol:g}" if rtol_given else "")
    _passed(f"{name} matches (max |error| {_bound(_max_error(a, e))}, {tolerances})")


# --------------------------------------------------------------------------- helpers for calls


def _as_backend(arrays: tuple, backend: str) -> tuple:
    if backend == "numpy":
        return tuple(None if a is None else a.copy() for a in arrays)
    if backend == "torch":
        import torch

        return tuple(None if a is None else torch.from_numpy(a.copy()) for a in arrays)
    raise ValueError(f"backend must be 'numpy' or 'torch', got {backend!r}")


def _pair(result: Any, fname: str) -> tuple[Any, Any]:
    __tracebackhide__ = True
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        _fail(f"{fname} should return the pair (Z, P), got {type(result).__name__}"
              + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""))
    return result[0], result[1]


def _require(a: np.ndarray, shape: tuple, name: str) -> None:
    __tracebackhide__ = True
    if a.shape != shape:
        hint = ""
        if len(a.shape) == len(shape) and sorted(a.shape) == sorted(shape):
            hint = ": the right sizes in the wrong order, a transpose too many or too few?"
        _fail(f"{name} has the wrong shape: expected {shape}, got {a.shape}{hint}")
    if np.issubdtype(a.dtype, np.inexact) and not np.isfinite(a).all():
        check_finite(a, name)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------- softmax


def check_softmax(fn: Callable, backend: str = "numpy") -> None:
    """Check the reader's ``softmax(x, axis=-1)`` against ``tfbook.numpy.softmax``.

    Inputs: a (3, 5) matrix, a batch (2, 3, 4), logits of size +-1e3 (which overflow
    a naive ``exp``), and a call with ``axis=0``.
    """
    __tracebackhide__ = True
    ref = _reference()
    rng = _rng(0)
    cases = [
        ("x of shape (3, 5)", rng.normal(size=(3, 5)), {}),
        ("x of shape (2, 3, 4)", 3.0 * rng.normal(size=(2, 3, 4)), {}),
        ("large logits (+-1e3)", np.array([[1000.0, 999.0, -1000.0], [-1000.0, -1000.0, -999.0]]), {}),
        ("x of shape (4, 3) with axis=0", rng.normal(size=(4, 3)), {"axis": 0}),
    ]
    worst = 0.0
    for label, x, kwargs in cases:
        (xin,) = _as_backend((x,), backend)
        axis = kwargs.get("axis", -1)
        P = _to_numpy(fn(xin, **kwargs), "softmax(x)")
        _require(P, x.shape, f"softmax({label})")
        expected = ref.softmax(x, **kwargs)
        atol, rtol = _tolerance(P)
        if _close(P, expected, atol, rtol):
            worst = max(worst, _max_error(P, expected))
            continue
        sums = P.sum(axis=axis)
        along = "rows" if axis in (-1, x.ndim - 1) else f"slices along axis {axis}"
        if not np.allclose(sums, 1.0, atol=max(atol, 1e-6)):
            other = 0 if axis in (-1, x.ndim - 1) else -1
            if _close(P, ref.softmax(x, axis=other), atol, rtol):
                _fail(f"softmax({label}): {along} sum to {_range(sums)}, not 1: "
                      f"you normalised over axis {other}; use the `axis` argument "
                      f"(default -1, the last axis)")
            _fail(f"softmax({label}): {along} sum to {_range(sums)}, not 1: "
                  "divide exp(x) by its sum over `axis` (keepdims=True)?")
        if _close(P, np.full_like(P, 1.0 / x.shape[axis]), atol, rtol):
            _fail(f"softmax({label}) is uniform: did the max-subtraction or a normalisation "
                  "remove the logits themselves?")
        _fail(f"softmax({label}) is off by up to {_fmt(_max_error(P, expected))} although "
              "it sums to 1: exp of (x - max) divided by the sum, both along `axis`?")
    _passed(f"softmax: matches tfbook.numpy.softmax on {len(cases)} inputs, including logits "
            f"of +-1e3 (max |error| {_bound(worst)})")


# --------------------------------------------------------------------------- attention


def _attention_variants(ref, Q, K, V, mask, D_K):
    """The reference output computed with each common mistake, by name."""
    S = Q @ np.swapaxes(K, -1, -2)
    variants = {}
    variants["unscaled"] = ref.scaled_dot_product_attention(Q, K, V, mask=mask, scale=1.0)
    variants["scaled by 1/D_K"] = ref.scaled_dot_product_attention(Q, K, V, mask=mask, scale=1.0 / D_K)
    S_scaled = S / math.sqrt(D_K)
    if mask is not None:
        P_late = ref.softmax(S_scaled, axis=-1) * mask  # masked after the softmax, not renormalised
        variants["mask after softmax"] = (P_late @ V, P_late)
        S_cols = np.where(mask, S_scaled, -np.inf)
    else:
        S_cols = S_scaled
    with np.errstate(invalid="ignore"):
        P_cols = ref.softmax(S_cols, axis=-2)
    P_cols = np.nan_to_num(P_cols)
    variants["softmax over keys axis"] = (P_cols @ V, P_cols)
    return variants


def _diagnose_attention(fname, Z, P, variants, mask, atol, rtol):
    __tracebackhide__ = True
    late = variants.get("mask after softmax")
    if late is not None and _close(P, late[1], atol, rtol):
        sums = P.sum(axis=-1)
        _fail(f"{fname}: masked weights are 0 but rows of P sum to {_range(sums)}, not 1: the "
              "mask was applied after the softmax; set masked scores S to -inf BEFORE the softmax")
    sums = P.sum(axis=-1)
    if not np.allclose(sums, 1.0, atol=max(atol, 1e-6)):
        _fail(f"{fname}: rows of P sum to {_range(sums)}, not 1: softmax over axis -1?")
    if _close(P, variants["unscaled"][1], atol, rtol):
        _fail(f"{fname}: P equals softmax(Q K^T) without the 1/sqrt(D_K) factor: divide the "
              "scores S by sqrt(D_K) (or use `scale`)")
    if _close(P, variants["scaled by 1/D_K"][1], atol, rtol):
        _fail(f"{fname}: scores were divided by D_K, not by sqrt(D_K)")


def _check_sdpa_case(fn, ref, backend, fname, Q, K, V, mask, extra_kwargs=None):
    """Run one case; return the max error on success, fail with a diagnosis otherwise."""
    __tracebackhide__ = True
    kwargs = dict(extra_kwargs or {})
    args = _as_backend((Q, K, V), backend)
    if mask is not None:
        (kwargs["mask"],) = _as_backend((mask,), backend)
    Z, P = _pair(fn(*args, **kwargs), fname)
    Z, P = _to_numpy(Z, "Z"), _to_numpy(P, "P")
    Z_ref, P_ref = ref.scaled_dot_product_attention(Q, K, V, mask=mask)
    _require(P, P_ref.shape, f"{fname}: P")
    _require(Z, Z_ref.shape, f"{fname}: Z")
    atol, rtol = _tolerance(Z, P)
    if _close(P, P_ref, atol, rtol) and _close(Z, Z_ref, atol, rtol):
        return max(_max_error(P, P_ref), _max_error(Z, Z_ref))
    D_K = Q.shape[-1]
    _diagnose_attention(fname, Z, P, _attention_variants(ref, Q, K, V, mask, D_K), mask, atol, rtol)
    if _close(P, P_ref, atol, rtol):
        _fail(f"{fname}: P is right but Z is off by up to {_fmt(_max_error(Z, Z_ref))}: Z = P @ V?")
    _fail(f"{fname}: P is off by up to {_fmt(_max_error(P, P_ref))} (rows sum to 1, so the "
          "scores S are wrong: S = Q @ K^T / sqrt(D_K)?)")


def check_attention(fn: Callable, backend: str = "numpy", masked: bool = True) -> None:
    """Check the reader's ``attention(Q, K, V, mask=None) -> (Z, P)``.

    Compared with ``tfbook.numpy.scaled_dot_product_attention`` on a batch with
    T_q=3, T_k=5, D_K=4, D_V=6 (different sizes, so a transpose shows in a shape),
    without a mask and, if ``masked``, with a boolean mask (True = may attend).
    """
    __tracebackhide__ = True
    ref = _reference()
    rng = _rng(1)
    Q, K, V = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 6))
    worst = _check_sdpa_case(fn, ref, backend, "attention(Q, K, V)", Q, K, V, None)
    n = 1
    if masked:
        mask = np.tril(np.ones((3, 5), dtype=bool), k=2)  # query i may attend to keys 0..i+2
        worst = max(worst, _check_sdpa_case(fn, ref, backend, "attention(Q, K, V, mask)", Q, K, V, mask))
        n = 2
    _passed(f"attention: Z and P match tfbook.numpy.scaled_dot_product_attention on {n} "
            f"case{'s' if n > 1 else ''} (T_q=3, T_k=5, D_K=4, D_V=6{', masked' if masked else ''}; "
            f"max |error| {_bound(worst)})")


# --------------------------------------------------------------------------- projections


def check_projection(fn: Callable, backend: str = "numpy") -> None:
    """Check the reader's ``project(X, W) -> X @ W`` (row vectors: ``X (..., T, D)``, ``W (D, D_out)``)."""
    __tracebackhide__ = True
    rng = _rng(2)
    X, W_sq = rng.normal(size=(2, 3, 4)), rng.normal(size=(4, 4))
    W_rect = rng.normal(size=(4, 6))
    worst = 0.0
    for W in (W_sq, W_rect):
        label = f"project(X {X.shape}, W {W.shape})"
        out = _to_numpy(fn(*_as_backend((X, W), backend)), label)
        expected = X @ W
        _require(out, expected.shape, label)
        atol, rtol = _tolerance(out)
        if _close(out, expected, atol, rtol):
            worst = max(worst, _max_error(out, expected))
            continue
        if W.shape[0] == W.shape[1] and _close(out, X @ W.T, atol, rtol):
            _fail(f"{label} equals X @ W.T: the weights are transposed; with row vectors "
                  "the projection is X @ W, W of shape (D, D_out)")
        _fail(f"{label} is off by up to {_fmt(_max_error(out, expected))}")
    _passed(f"projection: X @ W matches for square and rectangular W (max |error| {_bound(worst)})")


def check_self_attention(fn: Callable, backend: str = "numpy") -> None:
    """Check the reader's ``self_attention(X, W_Q, W_K, W_V, mask=None) -> (Z, P)``.

    ``Q = X @ W_Q`` (and likewise K, V), then scaled dot-product attention. Square
    weights first (so transposed weights give a wrong value, which is named), then
    rectangular ones (D=4, D_K=2, D_V=3).
    """
    __tracebackhide__ = True
    ref = _reference()
    rng = _rng(3)
    X = rng.normal(size=(2, 5, 4))
    mask = ref.causal_mask(5)
    worst = 0.0
    for D_K, D_V in ((4, 4), (2, 3)):
        W_Q, W_K, W_V = rng.normal(size=(4, D_K)), rng.normal(size=(4, D_K)), rng.normal(size=(4, D_V))
        for m in (None, mask):
            fname = f"self_attention(X, W_Q, W_K, W_V{', mask' if m is not None else ''}) with D_K={D_K}"
            args = _as_backend((X, W_Q, W_K, W_V), backend)
            kwargs = {} if m is None else {"mask": _as_backend((m,), backend)[0]}
            Z, P = _pair(fn(*args, **kwargs), fname)
            Z, P = _to_numpy(Z, "Z"), _to_numpy(P, "P")
            Q, K, V = X @ W_Q, X @ W_K, X @ W_V
            Z_ref, P_ref = ref.scaled_dot_product_attention(Q, K, V, mask=m)
            _require(P, P_ref.shape, f"{fname}: P")
            _require(Z, Z_ref.shape, f"{fname}: Z")
            atol, rtol = _tolerance(Z, P)
            if _close(P, P_ref, atol, rtol) and _close(Z, Z_ref, atol, rtol):
                worst = max(worst, _max_error(P, P_ref), _max_error(Z, Z_ref))
                continue
            if D_K == X.shape[-1] == D_V:
                Z_t, P_t = ref.scaled_dot_product_attention(X @ W_Q.T, X @ W_K.T, X @ W_V.T, mask=m)
                if _close(P, P_t, atol, rtol) and _close(Z, Z_t, atol, rtol):
                    _fail(f"{fname}: the weights are transposed (it matches X @ W.T); with "
                          "row vectors Q = X @ W_Q, W_Q of shape (D, D_K)")
            _diagnose_attention(fname, Z, P, _attention_variants(ref, Q, K, V, m, D_K), m, atol, rtol)
            if _close(P, P_ref, atol, rtol):
                _fail(f"{fname}: P is right but Z is off by up to {_fmt(_max_error(Z, Z_ref))}: "
                      "Z = P @ V with V = X @ W_V?")
            _fail(f"{fname}: P is off by up to {_fmt(_max_error(P, P_ref))}")
    _passed(f"self-attention: Z and P match the reference for D_K=4 and D_K=2, with and without "
            f"a causal mask (max |error| {_bound(worst)})")
