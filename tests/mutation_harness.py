"""Every check of every chapter is shown to fail, in CI (issue 20; CONTRIBUTING.md).

``tools/mutations.py`` executes a chapter and, at each asserting cell, runs the cell under
each mutation named in its metadata (a forked copy of the notebook's state) and records
whether the mutated cell raised what it must. The ``tests/test_mutations_*.py`` files each
hold a few chapters (pytest-xdist's ``--dist loadfile`` gives each file to one worker, so the
chapters spread over both workers) and call :func:`make_test`.

What a chapter's test asserts:
* every mutation is *caught* (none missed, none malformed, none timed out);
* the chapter ran to the end;
* no illustration cell prints a ``✔``;
* no asserting cell without mutations (or an ``illustration`` reason).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def chapter_path(prefix: str) -> Path:
    matches = sorted(NOTEBOOKS.glob(f"{prefix}_*.ipynb"))
    assert len(matches) == 1, f"no single notebook for chapter {prefix}: {matches}"
    return matches[0]


def run_report(path: Path, tmp_path: Path) -> dict:
    out = tmp_path / f"{path.stem}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "mutations.py"), str(path), "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert out.exists(), f"tools/mutations.py wrote no report:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    (report,) = json.loads(out.read_text())
    report["log"] = proc.stdout
    return report


def check_report(report: dict) -> None:
    name = report["notebook"]
    assert report["error"] is None, f"{name} did not run to the end: {report['error']}"
    wrong = [m for m in report["mutations"] if m["status"] != "caught"]
    assert not wrong, f"{name}: mutations not caught (the check cannot fail this way):\n" + "\n".join(
        f"  cell {m['cell']} mutation {m['mutation']} ({m['fails_if']}): {m['status']} "
        f"[{m.get('raised', '')}: {m.get('message', '')}]" for m in wrong)
    assert not report["illustration_ticks"], f"{name}: illustration cells print a ✔: {report['illustration_ticks']}"
    uncovered = report["uncovered"]
    assert not uncovered, f"{name}: {len(uncovered)} asserting cells name no mutation:\n" + "\n".join(
        f"  cell {c['cell']}: {c['first_line']}" for c in uncovered)


def make_test(prefixes: list[str]):
    """A parametrised test over the given chapters (``"00"``, ``"A"``, ...)."""

    @pytest.mark.parametrize("prefix", prefixes)
    def test_every_check_is_shown_to_fail(prefix, tmp_path):
        path = chapter_path(prefix)
        report = run_report(path, tmp_path)
        check_report(report)

    return test_every_check_is_shown_to_fail
