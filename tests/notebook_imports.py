"""What a notebook's code cells import, read from their source (shared by the install tests)."""

from __future__ import annotations

import ast
import json
from pathlib import Path


def imported_modules(path: Path) -> set[str]:
    """Full dotted names of the modules a notebook's code cells import (magics and shell
    escapes become `pass`; relative imports are left out)."""
    names: set[str] = set()
    for cell in json.loads(Path(path).read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = "".join(cell["source"]).splitlines()
        src = "\n".join(l[: len(l) - len(l.lstrip())] + "pass" if l.lstrip().startswith(("%", "!")) else l
                        for l in lines)
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module)
    return names
