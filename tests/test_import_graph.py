"""No import cycle among tfbook's modules, and the components import nothing above them.

The graph is drawn from the source (every ``import`` and ``from ... import`` statement, at the
top of a module or inside a function: a lazy import that closes a circle is still a circle),
over whatever modules exist when the test runs. An edge goes to the module named; ``from
package import name`` goes to ``package.name`` when that is a module, else to ``package``. The two tests at the
end show the checks fail: on a package written with a circle, and on a component that
imports a task.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tfbook"

# Circles known and owned by another change, each with the reason; empty when there are none.
KNOWN_CYCLES: dict[frozenset, str] = {}  # none: a circle found is a failure

# The components (the floor everything else stands on) may import only these tfbook modules.
COMPONENTS = ("tfbook.numpy", "tfbook.torch.functional")
COMPONENT_DEPENDENCIES = ("tfbook._validate", "tfbook.measure")


def module_files(package: Path) -> dict[str, Path]:
    """``dotted name -> file`` for every ``.py`` file of the package (data folders have none)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of a relative import written in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def import_graph(package: Path) -> dict[str, set[str]]:
    """``module -> the package's modules it imports`` (anywhere in its source)."""
    files = module_files(package)
    root = package.name
    graph: dict[str, set[str]] = {m: set() for m in files}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_pkg, node.level, node.module)
                # ``from package import module`` depends on the module; ``from module import name`` on the module
                targets = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files] or [base]
            for t in targets:
                # the longest prefix that is a module of the package (``tfbook.numpy.softmax`` -> tfbook.numpy)
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t.split(".")[0] == root and t in files and t != name:
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(component, module)`` pairs where a component imports outside the components' floor."""
    def is_component(m):
        return any(m == c or m.startswith(c + ".") for c in COMPONENTS)

    return sorted((a, b) for a, deps in graph.items() if is_component(a) for b in deps
                  if not is_component(b) and b not in COMPONENT_DEPENDENCIES)


def test_the_graph_covers_the_package():
    graph = import_graph(PACKAGE)
    assert len(graph) >= 40  # every module found on disk, subpackages included
    assert "tfbook.numpy.attention" in graph["tfbook.numpy.heads"]
    assert "tfbook.numpy.modern" in graph["tfbook.torch.functional.modern"]  # shared helpers


def test_no_import_cycle():
    found = cycles(import_graph(PACKAGE))
    new = [c for c in found if frozenset(c) not in KNOWN_CYCLES]
    assert new == [], f"import cycles among tfbook's modules: {new}"
    # each known circle still exists (remove it from the list once it is gone) and says why
    assert all(known in map(frozenset, found) and reason for known, reason in KNOWN_CYCLES.items())


def test_components_import_nothing_above_them():
    assert upward_imports(import_graph(PACKAGE)) == []


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / rel.split("/")[0]


def test_a_circle_is_found(tmp_path):
    """The circle of the old ``tfbook.numpy``: a package that imports a module at its end,
    which imports a helper back from the package; one of the imports is inside a function."""
    pkg = _write(tmp_path, {
        "tfbook/__init__.py": "",
        "tfbook/numpy.py": "def _as_float(x):\n    return x\n\nfrom tfbook import _numpy_modern\n",
        "tfbook/_numpy_modern.py": "def rms_norm(X):\n    from .numpy import _as_float\n    return _as_float(X)\n",
        "tfbook/torch/__init__.py": "from . import functional\n",
        "tfbook/torch/functional.py": "from ..numpy import _as_float\n",
    })
    graph = import_graph(pkg)
    assert graph["tfbook.torch.functional"] == {"tfbook.numpy"}
    assert cycles(graph) == [["tfbook._numpy_modern", "tfbook.numpy"]]


def test_a_component_importing_a_task_is_found(tmp_path):
    pkg = _write(tmp_path, {
        "tfbook/__init__.py": "",
        "tfbook/_validate.py": "",
        "tfbook/tasks/__init__.py": "",
        "tfbook/tasks/addition.py": "from ..numpy import softmax\n",
        "tfbook/numpy/__init__.py": "from .attention import softmax\n",
        "tfbook/numpy/attention.py": "from .. import _validate\n\ndef softmax(x):\n    from ..tasks import addition\n",
    })
    graph = import_graph(pkg)
    assert upward_imports(graph) == [("tfbook.numpy.attention", "tfbook.tasks.addition")]
    assert cycles(graph) == [["tfbook.numpy", "tfbook.numpy.attention", "tfbook.tasks.addition"]]


def test_old_module_paths_are_gone_or_give_the_moved_names():
    """No module exists only to re-export another: the old paths the chapters no longer import are
    gone; the ones left give the very objects of the new home."""
    import importlib.util

    import tfbook.tasks.ablation
    import tfbook.torch.optim

    for old in ("tfbook.backprop", "tfbook.optim", "tfbook.positions", "tfbook.dynamics", "tfbook.decoding",
                "tfbook.efficient"):
        assert importlib.util.find_spec(old) is None, old
    for name in ("load_ablation", "ablation_run", "ABLATION_RECIPE", "ABLATION_VARIANTS", "compress_ablation"):
        assert getattr(tfbook.torch.optim, name) is getattr(tfbook.tasks.ablation, name), name
    assert not hasattr(tfbook.torch.optim, "no_such_name")
