"""Bad-input cases for the training chapter's components, collected by test_backends_errors.py.

Each case is (name, args, kwargs, message regex), as CASES there. ``PARITY_CASES`` holds the
NumPy == torch builders for the same names, in the form of test_backends_parity's ``_cases``.
"""

import numpy as np

_g = np.random.default_rng(0)


def _r(*shape):
    return _g.standard_normal(shape)


_T = np.array([[1, 2, 0], [3, -100, 4]])  # (2, 3) targets, one ignored

CASES: list = [
    ("log_softmax", (np.ones(()),), {}, r"x must have at least 1 axis, got shape \(\)"),
    ("log_softmax", (_r(3, 4),), {"axis": 2}, r"axis=2 .*\(3, 4\)"),
    ("cross_entropy", (_r(2, 3, 5), np.array([[1, 2], [3, 4]])), {},
     r"targets must have shape logits.shape\[:-1\] = \(2, 3\), got \(2, 2\) \(logits: \(2, 3, 5\), targets: \(2, 2\)\)"),
    ("cross_entropy", (_r(2, 3, 5), np.array([[1, 2, 0], [3, 7, 4]])), {},
     r"targets must lie in \[0, V=5\).*got 7 \(logits: \(2, 3, 5\), targets: \(2, 3\)\)"),
    ("cross_entropy", (_r(2, 3, 5), _T * 1.0), {}, r"targets must be integers.*\(2, 3\)"),
    ("cross_entropy", (_r(2, 3, 5), _T), {"ignore_index": -1}, r"ignore_index=-1, got -100"),
    ("cross_entropy_grad", (_r(2, 3, 4), _T), {}, r"targets must lie in \[0, V=4\).*got 4 \(logits: \(2, 3, 4\)"),
    ("cross_entropy_grad", (_r(6, 5), _T), {}, r"shape logits.shape\[:-1\] = \(6,\), got \(2, 3\)"),
]


def _ce(g, ignore=True, scale=1.0):
    logits = g.standard_normal((2, 3, 5)) * scale
    t = g.integers(0, 5, (2, 3))
    if ignore:
        t[1, 1] = -100
    return (logits, t), {}, {}


PARITY_CASES = {
    "log_softmax": [lambda g: ((g.standard_normal((3, 4, 5)) * 5,), {}, {}),
                    lambda g: ((g.standard_normal((3, 4)) * 100,), {"axis": 0}, {})],
    "cross_entropy": [_ce, lambda g: _ce(g, False, 100.0)],
    "cross_entropy_grad": [_ce, lambda g: _ce(g, False, 100.0)],
}
