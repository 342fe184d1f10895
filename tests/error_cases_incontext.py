"""Bad-input cases for chapter 22's components (tfbook.numpy.incontext and its torch twin),
collected by tests/test_incontext.py; every name in ``tfbook.numpy.incontext.__all__`` has at
least one.

Each case is (name, args, kwargs, message regex), as in tests/test_backends_errors.py.
"""

import numpy as np

g = np.random.default_rng(0)


def r(*shape):
    return g.standard_normal(shape)


CASES: list = [
    ("interleave", (r(4, 7, 3), r(4, 6)), {}, r"y must be \(\.\.\., K\) = \(4, 7\) to match X \(4, 7, 3\), got y \(4, 6\)"),
    ("interleave", (r(5), r(5)), {}, r"X must be \(\.\.\., K, d\), got shape \(5,\)"),
    ("interleave", (r(2, 3, 0), r(2, 3)), {}, r"X must have d >= 1 features, got shape \(2, 3, 0\)"),
    ("least_squares", (r(4, 7, 3), r(7, 4)), {}, r"y must be \(\.\.\., K\) = \(4, 7\) to match X \(4, 7, 3\), got y \(7, 4\)"),
    ("least_squares", (r(4, 7, 3), r(4, 7)), {"ridge": -1.0}, r"ridge must be a number >= 0, got -1.0"),
    ("least_squares", (r(4, 7, 3), r(4, 7)), {"ridge": None}, r"ridge must be a number >= 0, got None"),
    ("averaging", (r(4, 7, 3), r(4, 7, 3)), {}, r"y must be \(\.\.\., K\) = \(4, 7\) to match X \(4, 7, 3\), got y \(4, 7, 3\)"),
    ("averaging", (np.array(["a", "b"]), r(2)), {}, r"X must be floating point"),
    ("nearest_neighbours", (r(4, 7, 3), r(4, 7)), {"n_neighbors": 0}, r"n_neighbors must be an integer >= 1, got 0"),
    ("nearest_neighbours", (r(7, 3), r(3)), {}, r"y must be \(\.\.\., K\) = \(7,\) to match X \(7, 3\), got y \(3,\)"),
]
