"""The job one submission's sandbox runs: the student's code cells in order, each test cell
replaced by the master's visible test (an edited test cell is reported; a deleted one is put
back after its answer; a copied one runs once, where the master has it, and the copy is named
in the reason)."""

from __future__ import annotations


import nbformat

from tfbook.course import judge as judge_mod


def read_submission(text: str):
    """A student's notebook from its text. Cells that share an id (a cell copied by a tool that
    kept its id) are given new ids by nbformat, silently: :func:`build_job` names a duplicated
    test or answer cell in the reason, and the console is no place for the student's data."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Non-unique cell id")
        return nbformat.reads(text, as_version=4)


def build_job(sub, plan) -> tuple[list[dict], list[str], dict[str, int]]:
    """(cells to run, notes for the reason, {test gid: submission cell index}).

    A test cell that appears more than once (Jupyter copies keep the grading metadata) runs
    where the master has it: the first occurrence after its answer cell (or the first one, where
    the answer cannot be found); every other occurrence is a copy, reported and never run."""
    tests = {t.gid: t for t in plan.tests}
    by_source = {judge_mod.normalise(t.visible): t.gid for t in plan.tests}
    kinds: dict[int, str | None] = {}  # code cell index -> the test gid it is, or None
    occurrences: dict[str, list[int]] = {}
    answer_at: dict[str, list[int]] = {}
    for idx, cell in enumerate(sub.cells):
        if cell.cell_type != "code":
            continue
        meta = judge_mod._nbgrader(cell)
        gid = meta.get("grade_id")
        if gid is None:  # no nbgrader metadata (a notebook saved by another tool): a test cell by its source
            gid = by_source.get(judge_mod.normalise(cell.source))
        if gid in tests:
            kinds[idx] = gid
            occurrences.setdefault(gid, []).append(idx)
        else:
            kinds[idx] = None
            if gid in plan.answers:
                answer_at.setdefault(gid, []).append(idx)
    chosen: dict[str, int] = {}
    for gid, where in occurrences.items():
        answer = answer_at.get(tests[gid].answer)
        after = [i for i in where if answer and i > answer[-1]]
        chosen[gid] = after[0] if after else where[0]
    cells, notes, placed = [], [], {}
    for idx, cell in enumerate(sub.cells):
        if idx not in kinds:
            continue
        gid = kinds[idx]
        if gid is not None:
            t = tests[gid]
            if chosen[gid] != idx:
                where = "above its answer" if idx < chosen[gid] else "below it"
                notes.append(f"{gid} appears again in cell {idx + 1} (a copy of test cell {gid}, "
                             f"{where}; the test runs in cell {chosen[gid] + 1}): the copy was ignored")
                continue
            placed[gid] = idx
            if judge_mod.normalise(cell.source) != judge_mod.normalise(t.visible):
                notes.append(f"test cell {gid} was edited: the original was run")
            cells.append({"index": idx, "kind": "test", "source": t.visible, "gid": gid,
                          "capture": [list(n) for n in t.names]})
        else:
            cells.append({"index": idx, "kind": "code", "source": cell.source})
    for gid, where in answer_at.items():
        if len(where) > 1:
            notes.append(f"answer cell {gid} appears {len(where)} times (cells "
                         f"{', '.join(str(i + 1) for i in where)}): all ran, in order")
    extra = 10_000
    for t in plan.tests:
        if t.gid in placed:
            continue
        after = answer_at.get(t.answer)
        pos = len(cells)
        if after:
            pos = next(k for k, c in enumerate(cells) if c["index"] == after[-1]) + 1
            notes.append(f"test cell {t.gid} was deleted: the original was run after its answer")
        cells.insert(pos, {"index": extra, "kind": "test", "source": t.visible, "gid": t.gid,
                           "capture": [list(n) for n in t.names]})
        placed[t.gid] = extra
        extra += 1
    return cells, notes, placed


__all__ = ["read_submission", "build_job"]
