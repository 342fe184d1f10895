"""An instructor's policies (``course/policies.py``): answers that use a forbidden reference function.

:func:`load` reads the policies and resolves each forbidden name to the object it names;
:func:`violations` finds, in a submission's source, the exercises whose answers refer to a
forbidden *object* or call a forbidden method. A dotted name in the student's source
(resolved through the notebook's imports) is looked up among the modules the grader has
already imported, never by importing what the student named, and matched by identity (or
by the function's module and qualified name, through ``functools.wraps``): so
``tfbook.numpy.attention.softmax``, ``tfbook.torch.functional.attention.softmax`` or any
other path to the same function is caught when the policy names ``tfbook.numpy.softmax``.
A name the grader cannot resolve is matched by its spelling. Only the student's own cells
are read: answer cells, and cells the student added or changed (a cell equal to one of the
chapter's is the book's, not theirs).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import sys
import threading
from pathlib import Path

POLICIES = Path(__file__).resolve().parents[2] / "course" / "policies.py"
_MARKER = re.compile(r"^\s*#\s*NBVAL_[A-Z_]+\s*$")


_LOADED: dict = {}
# One ast.parse at a time: CPython 3.11's AST constructor keeps its recursion depth in
# interpreter-wide state, so two grading threads parsing at once can fail with "SystemError: AST
# constructor recursion depth mismatch" (the grader error seen with --jobs 2 on a loaded machine).
_PARSING = threading.Lock()


def load(path: Path = POLICIES) -> dict:
    """{test grade_id: {"calls", "objects", "methods", "points", "reason"}} ({} without a
    policies file). ``objects``: what the forbidden names stand for (imported here: the
    instructor's names, trusted). Cached per file and modification time."""
    path = Path(path)
    if not path.is_file():
        return {}
    key = (str(path.resolve()), path.stat().st_mtime_ns)
    if key in _LOADED:
        return _LOADED[key]
    spec = importlib.util.spec_from_file_location("tfbook_course_policies", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = {}
    for gid, p in dict(getattr(module, "FORBIDDEN", {})).items():
        calls = set(p.get("calls", []))
        objects = [o for o in (_import(c) for c in sorted(calls)) if o is not _NOTHING]
        out[gid] = {"calls": calls, "objects": objects, "methods": set(p.get("methods", [])),
                    "points": float(p.get("points", 0)), "reason": str(p.get("reason", "a forbidden function"))}
    _LOADED.clear()
    _LOADED[key] = out
    return out


_NOTHING = object()


def _import(dotted: str):
    """The object an instructor's dotted name stands for (importing its module), or _NOTHING."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:  # noqa: BLE001  (not a module, or not installed here)
            continue
        try:
            for p in parts[i:]:
                obj = getattr(obj, p)
        except AttributeError:
            return _NOTHING
        return obj
    return _NOTHING


def _lookup(dotted: str):
    """The object a student's dotted name stands for, from the modules already imported here
    (a student's name never makes the grader import anything), or _NOTHING."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        obj = sys.modules.get(".".join(parts[:i]))
        if obj is None:
            continue
        try:
            for p in parts[i:]:
                obj = inspect.getattr_static(obj, p)
        except AttributeError:
            return _NOTHING
        return obj
    return _NOTHING


def _origin(obj):
    """(module, qualified name) of a function or class (unwrapped), else None."""
    try:
        obj = inspect.unwrap(obj)
    except (ValueError, TypeError):
        pass
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return (mod, qual) if isinstance(mod, str) and isinstance(qual, str) else None


def forbidden(dotted: str | None, policy: dict) -> bool:
    """Whether a dotted name (as the student's imports spell it) stands for a forbidden object."""
    if dotted is None:
        return False
    if dotted in policy["calls"]:
        return True
    objects = policy.get("objects") or []
    if not objects:
        return False
    obj = _lookup(dotted)
    if obj is _NOTHING or inspect.ismodule(obj):
        return False
    if any(obj is o for o in objects):
        return True
    origin = _origin(obj)
    return origin is not None and any(origin == _origin(o) for o in objects)


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
            if forbidden(_dotted(node, aliases), policy):
                return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in policy["methods"] and _dotted(node.func.value, aliases) is None:
            return True  # x.softmax(...) on a value (a tensor), not on a module
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if any(forbidden(f"{node.module}.{a.name}", policy) for a in node.names):
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
            with _PARSING:
                tree = ast.parse(cell.source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
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
