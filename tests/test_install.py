"""`pip install .` gives a working tfbook in an empty environment, without a network.

The wheel is built from a copy of the sources (nothing is written into the checkout),
installed with ``--no-deps`` into a new ``python -m venv``, and that venv is then shown
exactly the distributions that the wheel declares: the transitive closure of its
``Requires-Dist`` (plus a requested extra), taken from ``.venv``, each distribution's
top-level files symlinked into one folder that a ``.pth`` file puts on ``sys.path``.
Anything tfbook imports but does not declare is then missing and fails with
``ModuleNotFoundError``. Nothing is downloaded: every pip call is ``--no-index``.

Three environments:

* ``core`` (``pip install tfbook``): every module of tfbook except those of an extra
  (``EXTRA_MODULES``) imports, every third-party module that they import anywhere
  (also inside functions) imports, and the shipped data loads (corpus, weights);
* ``book`` (``tfbook[book]``): every module that a chapter notebook imports;
* ``course`` (``tfbook[course]``): all of the above for ``tfbook.course`` too.
"""

from __future__ import annotations

import ast
import email.parser
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from notebook_imports import imported_modules

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tfbook"
# Modules that need an extra beyond the core dependencies.
EXTRA_MODULES = {m: "course" for m in ("tfbook.course", "tfbook.course.__main__", "tfbook.course.demo",
                                        "tfbook.course.driver", "tfbook.course.grade", "tfbook.course.judge",
                                        "tfbook.course.release", "tfbook.course.report",
                                        "tfbook.course.sandbox", "tfbook.course.wire")}
SCENARIOS = {"core": (), "book": ("book",), "course": ("course",)}
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


def _run(cmd, **kw):
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=kw.pop("env", env), **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _package_files() -> list[str]:
    """The files of the source package (tracked, or new and not ignored), relative to tfbook/."""
    git = shutil.which("git")
    if git and (ROOT / ".git").exists():
        out = subprocess.run([git, "ls-files", "--cached", "--others", "--exclude-standard", "--", "tfbook"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\n")
        files = [ROOT / f for f in out if f]
    else:
        files = [p for p in PACKAGE.rglob("*") if "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return sorted(p.relative_to(PACKAGE).as_posix() for p in files if p.is_file())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(PACKAGE, src / "tfbook", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run(PIP + ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", tmp / "dist", src])
    (whl,) = (tmp / "dist").glob("tfbook-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("venv")
    env_dir = tmp / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", env_dir])
    python = env_dir / "bin" / "python"
    # pip of .venv installs into the new venv (which has no pip of its own)
    _run(PIP + ["--python", python, "install", "--no-deps", "--no-index", "-q", wheel])
    purelib = _run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    return {"python": python, "site": Path(purelib), "tmp": tmp}


def _wheel_metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(z.read(name).decode())


def _applies(req: Requirement, extras) -> bool:
    return req.marker is None or any(req.marker.evaluate({"extra": e}) for e in {"", *extras})


def closure(wheel: Path, extras) -> dict[str, md.Distribution]:
    """The distributions of .venv that `pip install tfbook[extras]` would install."""
    meta = _wheel_metadata(wheel)
    unknown = set(extras) - set(meta.get_all("Provides-Extra") or [])
    assert not unknown, f"the wheel declares no extra {sorted(unknown)}"
    todo = [Requirement(r) for r in meta.get_all("Requires-Dist") or [] if _applies(Requirement(r), extras)]
    found: dict[str, md.Distribution] = {}
    done: dict[str, set] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in done and set(req.extras) <= done[name]:
            continue
        try:
            dist = found[name] if name in found else md.distribution(req.name)
        except md.PackageNotFoundError:
            pytest.fail(f"{req} is required (via tfbook{list(extras)}) but not installed in .venv")
        found[name] = dist
        done[name] = done.get(name, set()) | set(req.extras)
        todo += [r for r in map(Requirement, dist.requires or []) if _applies(r, done[name])]
    return found


def link_closure(dists: dict[str, md.Distribution], into: Path) -> None:
    """Symlink the top-level files and folders (in site-packages) of ``dists`` into ``into``."""
    into.mkdir()
    for name, dist in sorted(dists.items()):
        assert dist.files is not None, f"{name} has no RECORD: cannot tell its files"
        for top in sorted({f.parts[0] for f in dist.files}):
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue  # scripts and data outside site-packages; shared caches; .pth hooks
            target = Path(dist.locate_file(top))
            link = into / top
            if not link.exists() and target.exists():
                link.symlink_to(target)


CHECK = r"""
import ast, importlib, importlib.resources, importlib.util, json, pkgutil, sys, traceback
from pathlib import Path
args = json.loads(sys.argv[1])
errors = []

def attempt(what, fn):
    try:
        fn()
    except BaseException as e:  # report every failure, not only the first
        errors.append(f"{what}: {type(e).__name__}: {e}")

import tfbook
here = Path(tfbook.__file__).resolve()
if Path(args["site"]).resolve() not in here.parents:
    errors.append(f"tfbook was imported from {here}, not from the installed wheel")

def optional(node, parents):  # inside `try: ... except ImportError`
    for p in parents:
        if isinstance(p, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in p.handlers):
            return True
    return False

def third_party_imports(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    def visit(node, parents):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        for n in names:
            top = n.split(".")[0]
            if top not in sys.stdlib_module_names and top not in ("tfbook", "__future__") \
                    and not optional(node, parents):
                out.append((n, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, parents + [node])
    visit(tree, [])
    return out

extra_modules = []

def walk_error(name):
    # A package of an extra that is not installed must refuse to import with a message that
    # names its extra (tfbook.course: "needs the [course] extra"); its modules are listed
    # from its files instead.
    exc = sys.exc_info()[1]
    if name in args["skip"]:
        extra = args["skip"][name]
        if not (isinstance(exc, ImportError) and f"[{extra}]" in str(exc)):
            errors.append(f"import {name} without the [{extra}] extra: {exc!r} does not name the extra")
        where = importlib.util.find_spec(name).submodule_search_locations
        extra_modules.extend(m.name for m in pkgutil.iter_modules(where, name + "."))
    else:
        errors.append(f"walk {name}: {exc!r}")

modules = ["tfbook"] + [m.name for m in pkgutil.walk_packages(tfbook.__path__, "tfbook.", onerror=walk_error)]
modules += [m for m in extra_modules if m not in modules]
missing = sorted(set(args["expect_modules"]) - set(modules))
if missing:
    errors.append(f"modules missing from the installed package: {missing}")
for mod in modules:
    if mod in args["skip"] or any(mod.startswith(f"{pkg}.") for pkg in args["skip"]):
        continue
    attempt(f"import {mod}", lambda: importlib.import_module(mod))
    spec = importlib.util.find_spec(mod)
    for name, line in third_party_imports(Path(spec.origin)):
        attempt(f"import {name} (in {mod}, line {line})", lambda: importlib.import_module(name))

for name in args["also_import"]:
    attempt(f"import {name}", lambda: importlib.import_module(name))

root = importlib.resources.files("tfbook")
for rel in args["data_files"]:
    if not root.joinpath(rel).is_file():
        errors.append(f"data file not installed: tfbook/{rel}")

if args["load_data"]:
    def load():
        from tfbook import data, tasks
        assert len(data.load_corpus()) > 1000
        for name in tasks.TASKS:                       # every task's shipped weights and history
            getattr(tasks, name).load_pretrained()
        assert data.load_digits_images().X_train.shape[1:] == (1, 8, 8)
        json.loads(root.joinpath("weights/number_words_losses.json").read_text())
    attempt("load the shipped data", load)

print(json.dumps(errors))
"""


def notebook_imports() -> list[str]:
    """Every module imported by a code cell of a chapter notebook."""
    names = set().union(*(imported_modules(p) for p in sorted((ROOT / "notebooks").glob("*.ipynb"))))
    return sorted(n for n in names if n.split(".")[0] not in sys.stdlib_module_names)


def test_wheel_ships_every_package_file(wheel):
    with zipfile.ZipFile(wheel) as z:
        shipped = {n[len("tfbook/"):] for n in z.namelist() if n.startswith("tfbook/")}
    missing = sorted(set(_package_files()) - shipped)
    assert not missing, f"files of tfbook/ missing from the wheel (package-data in pyproject.toml?): {missing}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_installed_wheel_imports_with_declared_dependencies_only(scenario, wheel, venv):
    extras = SCENARIOS[scenario]
    links = venv["tmp"] / f"deps-{scenario}"
    link_closure(closure(wheel, extras), links)
    (venv["site"] / "_tfbook_test_deps.pth").write_text(f"{links}\n")
    skip = {m: extra for m, extra in EXTRA_MODULES.items() if extra not in extras}
    args = {
        "site": str(venv["site"]),
        "skip": skip,
        "expect_modules": [m for m in EXTRA_MODULES],
        "also_import": notebook_imports() if "book" in extras else [],
        "data_files": [f for f in _package_files() if not f.endswith(".py")],
        "load_data": scenario == "core",
    }
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(venv["tmp"]),
           "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([str(venv["python"]), "-I", "-c", CHECK, json.dumps(args)], cwd=venv["tmp"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not errors, f"tfbook{list(extras) or ''} in an empty venv:\n" + "\n".join(errors)
