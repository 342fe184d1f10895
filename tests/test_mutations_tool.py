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


# ---- the classifier: what a mutation changes (issue 32) ---------------------------------
# Each case: an earlier cell (the notebook's state), the checking cell, a mutation, and the
# kind the classifier must give it. Value-only: the mutation overwrites what the cell only
# checks, a result an earlier cell computed, or a field of a loaded record, or edits the
# assertion itself; every other kind simulates a bug.
SETUP = """import numpy as np, json, time, torch
from tfbook import numpy as tnp
from tfbook.tasks import lookups
rng = np.random.default_rng(0)
X = rng.normal(size=(4, 3))
W_Q = rng.normal(size=(3, 3))
rec = lookups.load_results()
t0 = time.process_time()
seconds = time.process_time() - t0
Z = tnp.softmax(X @ W_Q)
def train(steps, seed=0):
    return steps * 2
hits = train(10)
"""
CHECK = """P = tnp.softmax(X @ W_Q / np.sqrt(3))
err = np.abs(P.sum(-1) - 1).max()
assert err < 1e-12, err
assert seconds < 1.5
assert rec['four']['1'] > 0.9
assert hits == 20
print(f"✔ rows sum to one ({err:.1e})")
"""
CASES = [
    # code: a line of the computation changed, or a function redefined
    ({"replace": [["/ np.sqrt(3)", ""]]}, "code"),
    ({"before": "def train(steps, seed=0):\n    return steps"}, "code"),
    # library: a module's function replaced
    ({"before": "_s = tnp.softmax\ntnp.softmax = lambda S, axis=-1: _s(S * 2, axis)"}, "library"),
    # weights: a weight matrix or a parameter tensor
    ({"before": "W_Q = W_Q.copy(); W_Q[0, 0] += 1e-6"}, "weights"),
    ({"before": "m = torch.nn.Linear(2, 2)\nwith torch.no_grad():\n    m.weight[0, 0] += 1.0"}, "weights"),
    # inputs: the data fed to the computation
    ({"before": "X = X + 1e-3"}, "inputs"),
    ({"replace": [["P = tnp.softmax(X @ W_Q / np.sqrt(3))", "P = tnp.softmax(X[::-1] @ W_Q / np.sqrt(3))"]]}, "code"),
    # seed
    ({"before": "hits = train(10, seed=1)"}, "seed"),
    # value-only: the measured value overwritten, a loaded record edited, the assertion edited,
    # a result computed earlier overwritten
    ({"before": "seconds = 2.0"}, "value"),
    ({"before": "rec['four']['1'] = 0.5"}, "value"),
    ({"before": "rec = lookups.load_results(); rec['four']['1'] = 0.5"}, "value"),
    ({"replace": [["err < 1e-12", "err < 0"]]}, "value"),
    ({"before": "hits = 21"}, "value"),
    ({"before": "Z = Z + 1e-6"}, "value"),
    ({"replace": [["err = np.abs(P.sum(-1) - 1).max()", "err = np.abs(P.sum(-1) - 1).max()\nerr = 1.0"]]}, "value"),
    # a declared kind cannot hide a value-only mutation
    ({"before": "seconds = 2.0", "kind": "code"}, "value"),
]


@pytest.mark.parametrize("mutation, kind", CASES, ids=[f"{k}-{i}" for i, (_, k) in enumerate(CASES)])
def test_the_classifier_names_what_a_mutation_changes(mutation, kind):
    ctx = mutations.NotebookContext([SETUP, CHECK])
    got = mutations.classify_mutation(CHECK, dict(mutation, fails_if="x"), ctx, 1)
    assert got["kind"] == kind, got


def test_classify_mode_counts_record_guards_and_fails_outside_them(tmp_path, capsys):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_code_cell(CHECK)]
    nb.cells[1].metadata["tfbook"] = {"mutations": [
        {"fails_if": "the scale is left out", "replace": [["/ np.sqrt(3)", ""]]},
        {"fails_if": "the record says 0.5", "before": "rec['four']['1'] = 0.5"}]}
    path = tmp_path / "99_toy.ipynb"
    nbformat.write(nb, str(path))
    assert mutations.main(["--classify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "| 99 | 1 | 2 | 1 | 1 | 0 | 1 |" in out and "edits rec, a loaded record" in out
    nb.cells[1].metadata["tfbook"]["record"] = "the shipped sweep cannot be rerun on the page"
    nbformat.write(nb, str(path))
    assert mutations.main(["--classify", str(path)]) == 0
    assert "| 99 | 1 | 2 | 1 | 1 | 1 | 0 |" in capsys.readouterr().out


def test_a_seed_the_notebook_already_uses_is_no_seed_change():
    ctx = mutations.NotebookContext([SETUP, CHECK])
    same = {"fails_if": "x", "before": "rng = np.random.default_rng(0)\nX = rng.normal(size=(4, 3)) * 2"}
    other = {"fails_if": "x", "before": "rng = np.random.default_rng(5)\nX = rng.normal(size=(4, 3))"}
    assert mutations.classify_mutation(CHECK, same, ctx, 1)["kind"] == "inputs"
    assert mutations.classify_mutation(CHECK, other, ctx, 1)["kind"] == "seed"


def test_the_run_reports_each_mutations_kind(report):
    kinds = [(m["cell"], m["mutation"], m["kind"]) for m in report["mutations"]]
    # cell 1's first mutation recomputes y from a changed x (inputs); cell 2's drops a guard (code)
    assert kinds[0] == (1, 0, "inputs") and kinds[-1] == (2, 0, "code"), kinds
    assert "value-only outside record guards" in mutations.summary(report)
