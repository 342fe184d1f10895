"""Refuse to build the book from notebooks that were not executed top to bottom.

    python tools/check_notebooks.py [NOTEBOOK_OR_FOLDER ...]   (default: notebooks/)

The book renders the outputs stored in the notebooks (it does not execute them), so
this runs before every build and fails (exit status 1, one line per problem) when a
notebook

* has a non-empty code cell that was not executed, or execution counts that are not
  exactly 1, 2, ..., n in cell order (a notebook edited after its run, or run out of
  order; re-run it with tools/execute_notebooks.py);
* contains an error output (a traceback would be published), except in cells tagged
  ``raises-exception``, which show an error on purpose (nbval and myst-nb honour the
  same tag);
* has an ``execute_result`` whose count differs from its cell's count;
* has a control character in a cell's source (a backslash eaten by a Python string when
  the cell was written: ``"\\binom"`` typed as ``"\binom"`` becomes a backspace and
  ``inom``, which MathJax then shows as "Math input error");
* glues a key twice (``tfbook.glue`` in a loop: the text would show whichever came last,
  and myst-nb warns), or writes ``{glue:text}`` with a key that no cell of the notebook glues
  (the strict build would fail on it later, with less context).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`([^`:]+)")


def problems(path: Path) -> list[str]:
    """Return the problems found in one notebook (empty when it is fine)."""
    nb = nbformat.read(path, as_version=4)
    found = []
    expected = 0
    for index, cell in enumerate(nb.cells):
        bad = sorted({f"U+{ord(ch):04X}" for ch in cell.source if ord(ch) < 32 and ch not in "\n\t"})
        if bad:
            found.append(f"{path.name}: cell {index}: control characters {', '.join(bad)} in its source "
                         "(a backslash lost in a Python string?)")
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        expected += 1
        where = f"{path.name}: cell {index}"
        count = cell.get("execution_count")
        tags = cell.get("metadata", {}).get("tags", [])
        if count is None:
            found.append(f"{where}: not executed (execution_count is empty)")
        elif count != expected:
            found.append(f"{where}: execution_count {count}, expected {expected} (not run top to bottom)")
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error" and "raises-exception" not in tags:
                found.append(f"{where}: error output {output.get('ename')}: {output.get('evalue')}")
            elif output.get("output_type") == "execute_result" and output.get("execution_count") != count:
                found.append(f"{where}: execute_result count {output.get('execution_count')} != cell count {count}")
    glued: dict[str, int] = {}
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            key = (output.get("metadata", {}).get("scrapbook") or {}).get("name")
            if key is None:
                continue
            if key in glued:
                found.append(f"{path.name}: cell {index}: glue key {key!r} stored again "
                             f"(first in cell {glued[key]}); glue it once")
            glued.setdefault(key, index)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for key in GLUE_ROLE.findall(cell.source):
                if key.strip() not in glued:
                    found.append(f"{path.name}: cell {index}: {{glue}} key {key.strip()!r} is stored by no cell")
    return found


def collect(args: list[str]) -> list[Path]:
    targets = [Path(a) for a in args] or [ROOT / "notebooks"]
    paths = []
    for target in targets:
        if target.is_dir():
            paths.extend(sorted(p for p in target.glob("*.ipynb")))
        elif target.suffix == ".ipynb" and target.is_file():
            paths.append(target)
        else:
            raise SystemExit(f"check_notebooks: {target} is neither a notebook nor a folder")
    return paths


def main(argv: list[str] | None = None) -> int:
    paths = collect(sys.argv[1:] if argv is None else argv)
    all_problems = [p for path in paths for p in problems(path)]
    for line in all_problems:
        print(line, file=sys.stderr)
    if all_problems:
        print(f"check_notebooks: {len(all_problems)} problem(s) in {len(paths)} notebook(s); "
              "re-run them with tools/execute_notebooks.py", file=sys.stderr)
        return 1
    print(f"check_notebooks: {len(paths)} notebook(s) executed top to bottom, no errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
