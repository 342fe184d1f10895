"""What a notebook's code cells import, read from their source (shared by the install tests)."""

from __future__ import annotations

import ast
import json
from pathlib import Path


def _guarded(tree) -> set[int]:
    """ids of the import nodes inside a ``try`` whose handlers catch ImportError (or its
    subclass ModuleNotFoundError, or everything): optional peers a page skips without them."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                h.type is None or any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError",
                                                                          "Exception")
                                      for n in ast.walk(h.type)) for h in node.handlers):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def imported_modules(path: Path) -> set[str]:
    """Full dotted names of the modules a notebook's code cells import (magics and shell
    escapes become `pass`; relative imports are left out, and so are imports guarded by a
    ``try``/``except ImportError``: a page that says what it skips without them)."""
    names: set[str] = set()
    for cell in json.loads(Path(path).read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = "".join(cell["source"]).splitlines()
        src = "\n".join(l[: len(l) - len(l.lstrip())] + "pass" if l.lstrip().startswith(("%", "!")) else l
                        for l in lines)
        tree = ast.parse(src)
        guarded = _guarded(tree)
        for node in ast.walk(tree):
            if id(node) in guarded:
                continue
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module)
    return names
