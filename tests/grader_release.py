"""One release of every chapter per test process, shared by the grader tests: each release
starts nbgrader (about 20 s on a busy machine, then about 1 s per chapter), and six test files
each released chapter 0 (or 17) again. The notebooks are templates: tests copy them, never
write them."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_CACHE: dict[str, dict[str, Path]] = {}


def released_chapters() -> dict[str, Path]:
    """{assignment: released student notebook} for every chapter with graded cells."""
    if "all" not in _CACHE:
        from tfbook.course import release

        out = Path(tempfile.mkdtemp(prefix="grader-test-release-"))
        atexit.register(shutil.rmtree, out, True)
        _CACHE["all"] = release.release(out=out, verbose=False)
    return dict(_CACHE["all"])
