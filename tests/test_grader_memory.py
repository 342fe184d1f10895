"""A test cell that measures the memory of the student's call (``tracemalloc`` around it) is
judged on the memory the student's function took in the sandbox, not on the memory of the
grader's replay (which returns recorded values and allocates almost nothing): the driver
measures each such call, and the replay allocates that many bytes once.

The sandbox's own report cannot be trusted for this: a student's function can call
``tracemalloc.reset_peak()``, or compute in PyTorch, whose memory tracemalloc does not see.
So, where the grader has a memory control group per sandbox (as root on Linux), the kernel
measures each measured test's hidden calls (a window opened before the sandbox has their
inputs, which the student's code cannot reset) and the replay allocates at least that.

The book's chapters no longer measure memory in a test (exercise 17.1 was redesigned so that
the keys exist only inside the test), so a synthetic chapter carries the exercise: the sum of
all pairwise products of a vector, without its n x n outer product."""

from __future__ import annotations

import nbformat
import pytest

from tfbook.course import (
    grade as course_grade,
    judge as course_judge,
    sandbox as course_sandbox,
)

A = "98_memory_checks"
GID = "ex98-1-pair-sum"
TEST = '''_x = np.random.default_rng(0).normal(size=3000)
tracemalloc.start()
tracemalloc.reset_peak()
_s = pair_sum(_x)
_peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
check_close(_s, np.sum(_x) ** 2, "pair_sum(x)", rtol=1e-9)  # float64 round-off over 3000 terms
assert _peak < 2**20, "✘ pair_sum made the n x n matrix of products (over 1 MiB)"
### BEGIN HIDDEN TESTS
_y = np.random.default_rng(1).normal(size=4000)
tracemalloc.start()
tracemalloc.reset_peak()
_t = pair_sum(_y)
_peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
assert _peak < 2**20, "hidden case A"
check_close(_t, np.sum(_y) ** 2, "hidden case B", rtol=1e-9)
### END HIDDEN TESTS'''
ANSWERS = {
    "honest": "def pair_sum(x):\n    return float(np.sum(x)) ** 2\n",
    "outer": "def pair_sum(x):\n    return float(np.outer(x, x).sum())\n",
    # the same matrix, and the peak reset before returning: tracemalloc sees nothing
    "outer_reset": "import tracemalloc\ndef pair_sum(x):\n    s = float(np.outer(x, x).sum())\n"
                   "    tracemalloc.reset_peak()\n    return s\n",
    # the matrix made by PyTorch, whose allocator tracemalloc does not trace
    "torch_outer": "import torch\ndef pair_sum(x):\n    t = torch.from_numpy(x)\n"
                   "    return float(torch.outer(t, t).sum())\n",
}


def master():
    def graded(cell, gid, test):
        cell.metadata["nbgrader"] = {"grade_id": gid, "grade": test, "solution": not test, "locked": test,
                                     "schema_version": 3, **({"points": 2} if test else {})}
        return cell

    return nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import tracemalloc\n\nimport numpy as np\nfrom tfbook.checks import check_close"),
        nbformat.v4.new_markdown_cell("### Exercise 98.1 (implement it)\n\nWrite `pair_sum(x)`, the sum of "
                                      "x_i x_j over all pairs, without the n x n matrix."),
        graded(nbformat.v4.new_code_cell("def pair_sum(x):\n    ### BEGIN SOLUTION\n    return float(np.sum(x)) ** 2\n"
                                         "    ### END SOLUTION\n"), GID, False),
        graded(nbformat.v4.new_code_cell(TEST), f"{GID}-tests", True),
    ])


def student(answer: str):
    nb = master()
    nb.cells[2].source = answer
    nb.cells[3].source = TEST.split("### BEGIN HIDDEN TESTS")[0].rstrip()
    return nb


def test_the_memory_measuring_cells_are_found():
    assert course_judge.memory_measuring_tests(course_judge.plan(master(), A)) == [f"{GID}-tests"]
    no_memory = master()
    no_memory.cells[3].source = "check_close(pair_sum(np.ones(2)), 4.0, 'x')"
    assert course_judge.memory_measuring_tests(course_judge.plan(no_memory, A)) == []


def test_memory_is_measured_where_the_student_cannot_hide_it(tmp_path):
    if course_sandbox.available():
        pytest.skip(course_sandbox.available())
    masters, subs = tmp_path / "notebooks", tmp_path / "subs"
    masters.mkdir()
    nbformat.write(master(), str(masters / f"{A}.ipynb"))
    for name, answer in ANSWERS.items():
        (subs / name / A).mkdir(parents=True)
        nbformat.write(student(answer), str(subs / name / A / f"{A}.ipynb"))
    rows = {r.student: r for r in course_grade.grade(subs, out=tmp_path / "out", timeout=120, total_timeout=600,
                                                     verbose=False, notebooks_dir=masters, specs=tmp_path)}
    assert (rows["honest"].score, rows["honest"].status) == (2, "graded"), rows["honest"].reason
    assert rows["outer"].score == 0 and "n x n matrix" in rows["outer"].reason  # tracemalloc saw it
    slots = course_sandbox.Slots(1, course_sandbox.Limits())
    try:
        kernel = slots.all[0].usage() is not None
    finally:
        slots.remove()
    if not kernel:
        pytest.skip("no memory control group per sandbox here (needs root): the reset and PyTorch "
                    "answers are measured by tracemalloc only")
    for name in ("outer_reset", "torch_outer"):  # visible checks pass; the kernel's window does not
        assert rows[name].score == 0, (name, rows[name].reason)
        assert f"{GID}-tests: hidden case A" in rows[name].reason, (name, rows[name].reason)
