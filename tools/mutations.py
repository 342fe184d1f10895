"""Show that every check can fail: run each chapter's checks under their mutations.

    python tools/mutations.py notebooks/03_why_scale.ipynb [more.ipynb ...] [--json out.json]

A code cell that asserts a claim names, in its metadata, the small changes to the thing
checked under which it must raise (CONTRIBUTING.md, "Every check is shown to fail")::

    "metadata": {"tfbook": {"mutations": [
        {"fails_if": "the scores are not divided by √D_K",
         "replace": [["/ np.sqrt(D_K)", ""]]},
        {"fails_if": "one weight of W_Q is perturbed by 1e-6",
         "before": "W_Q = W_Q.copy(); W_Q[0, 0] += 1e-6",
         "raises": "AssertionError"}]}}

This script executes the notebook top to bottom in one IPython shell (in this process,
with the notebook's folder as the working directory, as Jupyter and nbval do). Just
before a cell with mutations runs, it forks once per mutation: the child holds exactly
the state the notebook had reached, runs the mutated cell (``before`` first, then the
source with every ``replace`` pair applied; each ``old`` must occur in the source) with
its output discarded, and reports the exception it raised; the parent, untouched, then
runs the cell itself. A mutation is *caught* when the mutated cell raises ``raises``
(default ``AssertionError``, which ``tfbook.checks.CheckFailed`` is) or a subclass of it;
a mutation that only causes a ``NameError`` or a ``TypeError`` is not a caught one.

It also lists the *uncovered* cells: code cells outside the exercises' nbgrader cells
that assert (``assert``, a ``check_...(`` call, ``raise``) or whose stored output shows a
``✔``, and that carry neither mutations nor ``"illustration": "<why>"``; and the
illustration cells that print a ``✔`` anyway.

Exit code 0 when every mutation was caught and nothing is uncovered, else 1. With
``--json`` the full report (one record per mutation) is written for the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import select
import signal
import sys
import time
from pathlib import Path

import nbformat  # noqa: E402

TICK = "✔"
ASSERTING = re.compile(r"(^|[^\w.])assert\b|\bcheck_\w+\s*\(|(^|\s)raise\b", re.MULTILINE)
DEFAULT_RAISES = "AssertionError"


def cell_meta(cell) -> dict:
    return cell.get("metadata", {}).get("tfbook", {}) or {}


def is_nbgrader(cell) -> bool:
    nbg = cell.get("metadata", {}).get("nbgrader", {}) or {}
    return bool(nbg.get("solution") or nbg.get("grade"))


def shows_tick(cell) -> bool:
    for out in cell.get("outputs", []):
        text = out.get("text", "")
        if isinstance(text, list):
            text = "".join(text)
        data = out.get("data", {}).get("text/plain", "")
        if isinstance(data, list):
            data = "".join(data)
        if TICK in text or TICK in data:
            return True
    return False


def is_asserting(cell) -> bool:
    """A code cell that checks a claim (and so must name its mutations)."""
    if cell.cell_type != "code" or is_nbgrader(cell):
        return False
    if "raises-exception" in cell.get("metadata", {}).get("tags", []):
        return False  # fails on purpose: the failure is what it shows
    return bool(ASSERTING.search(cell.source)) or shows_tick(cell)


def mutated_source(source: str, mutation: dict) -> str:
    """The cell's source under ``mutation``; ValueError when the mutation does not apply."""
    unknown = set(mutation) - {"fails_if", "replace", "before", "raises"}
    if unknown:
        raise ValueError(f"unknown mutation keys {sorted(unknown)}")
    if not str(mutation.get("fails_if", "")).strip():
        raise ValueError("mutation has no 'fails_if' text")
    if not mutation.get("replace") and not mutation.get("before"):
        raise ValueError("mutation has neither 'replace' nor 'before': it changes nothing")
    for pair in mutation.get("replace", []):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise ValueError(f"replace entry {pair!r} is not an [old, new] pair of strings")
        old, new = pair
        if old not in source:
            raise ValueError(f"replace: {old!r} does not occur in the cell")
        source = source.replace(old, new)
    before = mutation.get("before", "")
    return (before + "\n" + source) if before else source


def _raised_names(exc: BaseException | None) -> list[str]:
    return [] if exc is None else [k.__name__ for k in type(exc).__mro__]


def _close_figures() -> None:
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close("all")


def run_mutation(shell, source: str, timeout: float) -> dict:
    """Fork; the child runs ``source`` in the shell's current state and reports what it raised."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: discard output, run, report, leave without cleanup
        try:
            os.close(read_fd)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            result = shell.run_cell(source, store_history=False, silent=True)
            exc = result.error_before_exec or result.error_in_exec
            report = {"raised": _raised_names(exc),
                      "message": (str(exc).splitlines() or [""])[0][:200] if exc else "",
                      "before_exec": result.error_before_exec is not None}
        except BaseException as exc:  # noqa: BLE001 - anything the child hits is the report
            report = {"raised": _raised_names(exc), "message": str(exc)[:200], "before_exec": False}
        try:
            os.write(write_fd, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    chunks, deadline = [], time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_fd)
            return {"raised": [], "message": f"timed out after {timeout:.0f} s", "timeout": True}
        ready, _, _ = select.select([read_fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return {"raised": [], "message": f"child died (status {status})", "died": True}
    return json.loads(b"".join(chunks).decode())


def _log(line: str) -> None:
    print(line, file=sys.__stdout__, flush=True)


def run_notebook(path: Path, timeout: float = 300.0, log=_log, verbose: bool = False) -> dict:
    """Execute ``path`` and every mutation of its checks; return the report."""
    from IPython.core.interactiveshell import InteractiveShell

    path = Path(path).resolve()
    nb = nbformat.read(str(path), as_version=4)
    report = {"notebook": path.name, "mutations": [], "uncovered": [], "illustration_ticks": [],
              "error": None}
    old_cwd = os.getcwd()
    os.chdir(path.parent)
    sys.path.insert(0, str(path.parent))
    shell = InteractiveShell.instance()
    shell.reset(new_session=False)  # a fresh namespace, as a fresh kernel has (the shell is a singleton)
    # multiprocessing's spawn start method reads __main__.__spec__; IPython's module lacks it.
    if not hasattr(shell.user_module, "__spec__"):
        shell.user_module.__spec__ = None
    start = time.perf_counter()
    try:
        code_index = 0
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            code_index += 1
            meta = cell_meta(cell)
            mutations = meta.get("mutations") or []
            if is_asserting(cell) and not mutations and not meta.get("illustration"):
                report["uncovered"].append({"cell": index, "id": cell.get("id"),
                                            "first_line": cell.source.strip().splitlines()[0][:80]})
            if meta.get("illustration") and shows_tick(cell):
                report["illustration_ticks"].append({"cell": index, "id": cell.get("id")})
            for number, mutation in enumerate(mutations):
                record = {"cell": index, "id": cell.get("id"), "mutation": number,
                          "fails_if": mutation.get("fails_if", ""),
                          "raises": mutation.get("raises", DEFAULT_RAISES)}
                try:
                    source = mutated_source(cell.source, mutation)
                except ValueError as exc:
                    record.update(status="bad", message=str(exc))
                else:
                    outcome = run_mutation(shell, source, timeout)
                    caught = record["raises"] in outcome.get("raised", [])
                    record.update(status="caught" if caught else "missed",
                                  raised=(outcome.get("raised") or ["nothing"])[0],
                                  message=outcome.get("message", ""))
                report["mutations"].append(record)
                log(f"  cell {index:3d} mutation {number}: {record['status'].upper():6s} "
                    f"{record['fails_if'][:70]}" + ("" if record["status"] == "caught"
                                                    else f"  [{record.get('raised', '')}: {record['message'][:90]}]"))
            if verbose:
                result = shell.run_cell(cell.source, store_history=True)
            else:  # the cells' own output is nbval's business, not this report's
                with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), \
                        contextlib.redirect_stderr(null):
                    result = shell.run_cell(cell.source, store_history=True)
            _close_figures()
            exc = result.error_before_exec or result.error_in_exec
            if exc is not None and "raises-exception" not in cell.get("metadata", {}).get("tags", []):
                report["error"] = f"cell {index} raised {type(exc).__name__}: {str(exc)[:200]}"
                break
    finally:
        os.chdir(old_cwd)
        sys.path.remove(str(path.parent))
    report["seconds"] = round(time.perf_counter() - start, 1)
    return report


def summary(report: dict) -> str:
    muts = report["mutations"]
    caught = sum(m["status"] == "caught" for m in muts)
    cells = len({m["cell"] for m in muts})
    return (f"{report['notebook']}: {cells} checked cells, {len(muts)} mutations, {caught} caught, "
            f"{len(muts) - caught} not caught, {len(report['uncovered'])} asserting cells without "
            f"mutations ({report['seconds']} s)" + (f"; ERROR {report['error']}" if report["error"] else ""))


def _quiet_environment() -> None:
    """One thread per pool (forked children and thread pools do not mix) and no GUI backend.

    Set by the command line only, never on import: ``tests/test_mutations_tool.py`` imports this
    module into a pytest worker whose later nbval kernels inherit ``os.environ`` (a kernel started
    with ``MPLBACKEND=Agg`` shows no figure, and every figure cell would differ)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("MPLBACKEND", "Agg")


def main(argv: list[str] | None = None) -> int:
    _quiet_environment()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, help="write the full report here")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutated cell")
    parser.add_argument("--verbose", action="store_true", help="show the cells' own output too")
    args = parser.parse_args(argv)
    if len(args.notebooks) > 1:
        # One shell per process: run each notebook in its own child so chapters cannot leak state.
        reports = []
        for path in args.notebooks:
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                rep = run_notebook(path, args.timeout, verbose=args.verbose)
                with os.fdopen(write_fd, "w") as fh:
                    json.dump(rep, fh)
                os._exit(0)
            os.close(write_fd)
            with os.fdopen(read_fd) as fh:
                data = fh.read()
            os.waitpid(pid, 0)
            reports.append(json.loads(data) if data else {"notebook": path.name, "mutations": [],
                                                          "uncovered": [], "illustration_ticks": [],
                                                          "error": "runner died", "seconds": 0})
    else:
        reports = [run_notebook(args.notebooks[0], args.timeout, verbose=args.verbose)]
    bad = 0
    for rep in reports:
        print(summary(rep))
        for cell in rep["uncovered"]:
            print(f"  cell {cell['cell']:3d} UNCOVERED {cell['first_line']}")
        for cell in rep["illustration_ticks"]:
            print(f"  cell {cell['cell']:3d} is an illustration but prints a ✔")
        bad += (any(m["status"] != "caught" for m in rep["mutations"]) or bool(rep["uncovered"])
                or bool(rep["illustration_ticks"]) or bool(rep["error"]))
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1, ensure_ascii=False))
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(main())
