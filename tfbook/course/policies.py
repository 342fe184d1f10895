"""An instructor's policies (``course/policies.py``): answers that use a forbidden reference function.

:func:`load` reads the policies; :func:`violations` finds, in a submission's source, the
exercises whose answers refer to a forbidden name (resolved through the notebook's imports)
or call a forbidden method. Only the student's own cells are read: answer cells, and cells
the student added or changed (a cell equal to one of the chapter's is the book's, not theirs).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

POLICIES = Path(__file__).resolve().parents[2] / "course" / "policies.py"
_MARKER = re.compile(r"^\s*#\s*NBVAL_[A-Z_]+\s*$")


def load(path: Path = POLICIES) -> dict:
    """{test grade_id: {"calls", "methods", "points", "reason"}} ({} without a policies file)."""
    path = Path(path)
    if not path.is_file():
        return {}
    spec = importlib.util.spec_from_file_location("tfbook_course_policies", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = {}
    for gid, p in dict(getattr(module, "FORBIDDEN", {})).items():
        out[gid] = {"calls": set(p.get("calls", [])), "methods": set(p.get("methods", [])),
                    "points": float(p.get("points", 0)), "reason": str(p.get("reason", "a forbidden function"))}
    return out


def normalise(source: str) -> str:
    return "\n".join(l.rstrip() for l in source.splitlines() if l.strip() and not _MARKER.match(l))


def _aliases(trees) -> dict[str, str]:
    """name -> dotted name, from every import in the notebook."""
    names: dict[str, str] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        names[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        names[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node, aliases) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        base = aliases.get(node.id)
        if base is None:
            return None
        return ".".join([base] + parts[::-1])
    return None


def _refers(tree, aliases, policy) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Name)):
            name = _dotted(node, aliases)
            if name in policy["calls"]:
                return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in policy["methods"] and _dotted(node.func.value, aliases) is None:
            return True  # x.softmax(...) on a value (a tensor), not on a module
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if any(f"{node.module}.{a.name}" in policy["calls"] for a in node.names):
                return True
    return False


def violations(plan, sub, master_sources: set[str], policies: dict) -> dict[str, dict]:
    """{test grade_id: policy} for the exercises whose answers break a policy."""
    if not policies:
        return {}
    trees, own = [], []
    for cell in sub.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        trees.append(tree)
        gid = (cell.get("metadata", {}).get("nbgrader", {}) or {}).get("grade_id")
        if gid in plan.answers or normalise(cell.source) not in master_sources:
            own.append((gid, tree))
    aliases = _aliases(trees)
    out = {}
    for t in plan.tests:
        policy = policies.get(t.gid)
        if policy is None:
            continue
        answer = [tree for gid, tree in own if gid == t.answer]
        used = {n.id for tree in answer for n in ast.walk(tree) if isinstance(n, ast.Name)}
        # the answer cell, and the student's own cells that define a name the answer uses (a
        # helper); a scratch cell that merely compares with the reference is not the answer
        helpers = [tree for gid, tree in own if gid not in plan.answers and _defines(tree) & used]
        if any(_refers(tree, aliases, policy) for tree in answer + helpers):
            out[t.gid] = policy
    return out


def _defines(tree) -> set[str]:
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out
