"""The grader is a package of its own (``tfbook.course``) whose modules import each other in one
direction only (no circle), and the book's components never import it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "tfbook" / "course"
# each module and the grader modules it may import (a module may import only those below it)
LAYERS = {
    "wire": set(), "sandbox": set(), "policies": set(),
    "driver": {"wire"}, "judge": {"wire", "policies"},
    "release": set(), "report": {"release"},
    # grading, one job per module (issue 39)
    "rows": {"judge"}, "job": {"judge"}, "budget": {"sandbox"},
    "attempt": {"budget", "judge", "report", "sandbox", "wire"},
    "judging": {"budget", "judge", "sandbox"},
    "submission": {"attempt", "budget", "job", "judge", "judging", "policies", "rows", "sandbox"},
    "collect": {"job", "rows"}, "shards": {"collect", "release", "report", "rows"},
    "check": {"attempt", "budget", "job", "judge", "rows", "sandbox"},
    "grade": {"collect", "judge", "judging", "release", "report", "rows", "sandbox", "shards", "submission"},
    "demo": {"release"}, "__main__": {"release", "grade", "sandbox", "check", "shards"}, "__init__": set(),
}


def course_imports(path: Path) -> set[str]:
    """The tfbook.course modules a file imports (anywhere in it, functions included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            mod = node.module if node.level == 0 else "tfbook.course" + ("." + node.module if node.module else "")
            if mod == "tfbook.course":
                out |= {a.name for a in node.names if a.name != "__doc__"}
            elif mod.startswith("tfbook.course."):
                out.add(mod.split(".")[2])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[2] for a in node.names if a.name.startswith("tfbook.course.")}
    return out


def test_grader_modules_import_downwards_only():
    found = {p.stem for p in COURSE.glob("*.py")}
    assert found <= set(LAYERS), f"a new grader module needs its place in LAYERS: {found - set(LAYERS)}"
    for stem in sorted(found):
        got = course_imports(COURSE / f"{stem}.py")
        assert got <= LAYERS[stem], f"tfbook.course.{stem} imports {sorted(got - LAYERS[stem])}"


def test_layers_have_no_circle():
    seen, done = set(), set()

    def visit(m, path):
        assert m not in seen or m in done, f"import circle: {' -> '.join(path + [m])}"
        if m in done:
            return
        seen.add(m)
        for n in LAYERS[m]:
            visit(n, path + [m])
        done.add(m)

    for m in LAYERS:
        visit(m, [])
    LAYERS["wire"].add("grade")  # the check can fail: a circle wire -> grade -> wire
    try:
        seen.clear(), done.clear()
        try:
            visit("grade", [])
        except AssertionError as exc:
            assert "circle" in str(exc)
        else:
            raise AssertionError("a circle was not found")
    finally:
        LAYERS["wire"].discard("grade")


def test_the_books_components_never_import_the_grader():
    for path in sorted((ROOT / "tfbook").rglob("*.py")):
        if COURSE in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if isinstance(node, ast.ImportFrom) and node.module == "tfbook":
                names += [f"tfbook.{a.name}" for a in node.names]
            assert not any(n == "tfbook.course" or n.startswith("tfbook.course.") for n in names), path
