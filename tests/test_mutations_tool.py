"""tools/mutations.py itself: it reports a caught mutation as caught and everything else as not.

The chapter tests (tests/test_mutations_*.py) trust this runner; here it runs on a small
notebook whose every outcome is known: a mutation that breaks the check, one that does not,
one whose ``replace`` does not apply, one that only raises a NameError, one that must raise a
ValueError, a cell that asserts without naming a mutation, an illustration that prints a ✔,
and a mutation that runs in the notebook's state (it reads a variable an earlier cell set and
must not change what the parent computes next).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import mutations  # noqa: E402

CELLS = [
    ("x = 2.0\ny = x * 3", None),
    ("assert y == 6.0\nprint('✔ y is 6')", {"mutations": [
        {"fails_if": "x doubled", "before": "x = 4.0\ny = x * 3"},             # caught
        {"fails_if": "a no-op", "before": "z = 1"},                             # missed
        {"fails_if": "a replace that does not apply", "replace": [["nope", "x"]]},  # bad
        {"fails_if": "a typo, not a wrong claim", "replace": [["y == 6.0", "yy == 6.0"]]},  # NameError: missed
    ]}),
    ("def f(n):\n    if n < 0:\n        raise ValueError('n < 0')\n    return n\ntry:\n    f(-1)\nexcept ValueError:\n    ok = True\nassert ok",
     {"mutations": [{"fails_if": "the guard is dropped", "replace": [["if n < 0:", "if False:"]],
                     "raises": "NameError"}]}),                                # caught (ok never set)
    ("assert x == 2.0  # the mutation of cell 1 ran in a child: x is still 2", None),   # uncovered
    ("print('✔ an illustration')", {"illustration": "an identity shown, not checked"}),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.instance().user_ns["ok"] = True  # left by an earlier user of the singleton shell
    nb = nbformat.v4.new_notebook()
    for source, meta in CELLS:
        cell = nbformat.v4.new_code_cell(source)
        if meta:
            cell.metadata["tfbook"] = meta
        if "illustration" in (meta or {}):
            cell.outputs = [nbformat.v4.new_output("stream", text="✔ an illustration\n")]
        nb.cells.append(cell)
    path = tmp_path_factory.mktemp("nb") / "toy.ipynb"
    nbformat.write(nb, str(path))
    return mutations.run_notebook(path, timeout=30, log=lambda line: None)


def test_each_outcome_is_reported(report):
    statuses = [(m["cell"], m["mutation"], m["status"]) for m in report["mutations"]]
    assert statuses == [(1, 0, "caught"), (1, 1, "missed"), (1, 2, "bad"), (1, 3, "missed"), (2, 0, "caught")]
    assert report["mutations"][3]["raised"] == "NameError"  # not an AssertionError: not a caught one


def test_the_parent_state_is_untouched_and_the_notebook_ran_to_the_end(report):
    assert report["error"] is None  # cell 3 asserts x == 2.0 after cell 1's mutation set x = 4.0 in a child


def test_uncovered_and_illustration_ticks(report):
    assert [c["cell"] for c in report["uncovered"]] == [3]
    assert [c["cell"] for c in report["illustration_ticks"]] == [4]


def test_importing_the_runner_leaves_the_environment_alone():
    import importlib
    import os

    before = dict(os.environ)
    importlib.reload(mutations)
    assert dict(os.environ) == before  # nbval kernels started later in this worker inherit it


def test_mutation_validation():
    with pytest.raises(ValueError, match="neither"):
        mutations.mutated_source("a", {"fails_if": "x"})
    with pytest.raises(ValueError, match="fails_if"):
        mutations.mutated_source("a", {"before": "b = 1"})
    with pytest.raises(ValueError, match="unknown mutation keys"):
        mutations.mutated_source("a", {"fails_if": "x", "before": "b", "extra": 1})
    assert mutations.mutated_source("a = 1\nb = a", {"fails_if": "x", "replace": [["a", "c"]], "before": "c = 2"}) \
        == "c = 2\nc = 1\nb = c"
