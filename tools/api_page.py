"""Generate the package reference page of the book, ``book/api.md``, from the package itself.

Every public module of ``tfbook`` gets a list of the names in its ``__all__`` (in that
order): the signature, without type annotations and with default values as written in the
source, and the first paragraph of the docstring. The functions of ``tfbook.numpy`` and
``tfbook.torch.functional`` share one list that says which backends have each.
Modules are found by walking the package, so a new module appears without editing this
file (``PREFERRED`` only fixes the order of the known ones). Usage::

    python tools/api_page.py            # (re)write book/api.md
    python tools/api_page.py --check    # write nothing; exit 1 if book/api.md is out of date
    python tools/api_page.py --stdout   # print the page

The output depends only on the package's source: no addresses, no absolute paths, no values
computed on this machine (a default that is a module constant shows the constant's name).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import sys
import textwrap
import types
from pathlib import Path, PurePath

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout: the package next to tools/
os.environ.setdefault("OMP_NUM_THREADS", "1")

PAGE = ROOT / "book" / "api.md"
COMMAND = "python tools/api_page.py"

# Known modules in reading order; any other public module found in the package follows them
# (alphabetically). The two function modules of the backends are merged into one list.
BACKENDS = ("tfbook.numpy", "tfbook.torch.functional")
PREFERRED = (
    "tfbook",
    "tfbook.torch.modules", "tfbook.torch.models", "tfbook.torch.training",
    "tfbook.torch.optim", "tfbook.torch.modern",
    "tfbook.data", "tfbook.bpe", "tfbook.numpy.backprop", "tfbook.numpy.optim",
    "tfbook.tasks",
    "tfbook.numpy.positions", "tfbook.numpy.vision", "tfbook.torch.functional.vision",
    "tfbook.iosim", "tfbook.cost",
    "tfbook.measure", "tfbook.parallel", "tfbook.checks",
)
# Modules that only re-export others: described in the text, not listed.
AGGREGATES = ("tfbook.torch",)
# Old paths kept for the chapters that import them (each re-exports a module listed here).
SHIMS: tuple = ()
UNDOCUMENTED = "(undocumented)"
BOTH = "NumPy and PyTorch"
COURSE_PREFIX = "tfbook.course"  # the grading tools: one short list, module by module


# ---------------------------------------------------------------- discovering the package

def public_modules() -> list[str]:
    """Every importable public module of tfbook (no path component starting with ``_``)."""
    import tfbook

    names = {"tfbook"}
    for info in pkgutil.walk_packages(tfbook.__path__, "tfbook."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.add(info.name)
    return sorted(names)


def task_modules() -> list[str]:
    """The task modules of ``tfbook.tasks`` (every public submodule), sorted."""
    import tfbook.tasks

    return sorted(f"tfbook.tasks.{i.name}" for i in pkgutil.iter_modules(tfbook.tasks.__path__)
                  if not i.name.startswith("_"))


def member(module, name: str):
    """``module.name``; a name in ``__all__`` that the module lacks stops the generator."""
    try:
        return getattr(module, name)
    except AttributeError:
        raise SystemExit(f"{module.__name__}.__all__ lists {name!r}, which the module does not define") from None


def public_names(module) -> tuple[list[str], bool]:
    """``(names, from_all)``: the module's ``__all__``, or, when it has none, the public
    functions and classes defined in it and its upper-case constants, in definition order."""
    if hasattr(module, "__all__"):
        return list(module.__all__), True
    names = []
    for name, obj in vars(module).items():
        if name.startswith("_") or name == "main" or isinstance(obj, types.ModuleType):
            continue
        if inspect.isfunction(obj) or inspect.isclass(obj):
            if obj.__module__ == module.__name__:
                names.append(name)
        elif name.isupper():
            names.append(name)
    return names, False


# ---------------------------------------------------------------- signatures

def _segment(source: str, node) -> str:
    text = ast.get_source_segment(source, node) or ast.unparse(node)
    return " ".join(text.split())


def _source_params(func, drop_first: bool) -> str | None:
    """The parameter list of ``func`` as written in its source, annotations left out."""
    try:
        source = textwrap.dedent(inspect.getsource(inspect.unwrap(func)))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if node is None or node.name != inspect.unwrap(func).__name__:
        return None
    a = node.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    parts = []
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        if i == 0 and drop_first:
            continue
        parts.append(arg.arg if default is None else f"{arg.arg}={_segment(source, default)}")
        if a.posonlyargs and arg is a.posonlyargs[-1]:
            parts.append("/")
    if a.vararg:
        parts.append(f"*{a.vararg.arg}")
    elif a.kwonlyargs:
        parts.append("*")
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        parts.append(arg.arg if default is None else f"{arg.arg}={_segment(source, default)}")
    if a.kwarg:
        parts.append(f"**{a.kwarg.arg}")
    return ", ".join(parts)


def _clean_repr(value) -> str:
    """A default value's repr with nothing machine-dependent in it."""
    if isinstance(value, PurePath):
        return "Path(...)"
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))
    return re.sub(r"(['\"])(/|[A-Za-z]:\\)[^'\"]*\1", "'...'", text)


def _inspect_params(obj) -> str | None:
    """Fallback: ``inspect.signature`` without annotations, defaults cleaned."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = [p.replace(annotation=inspect.Parameter.empty,
                        default=(p.default if p.default is inspect.Parameter.empty else _Raw(_clean_repr(p.default))))
              for p in sig.parameters.values()]
    text = str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))
    return text[1:-1]


class _Raw:
    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _dataclass_params(cls) -> str:
    """The fields of a dataclass, defaults as written in the class body."""
    written = {}
    try:
        source = textwrap.dedent(inspect.getsource(cls))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                written[node.target.id] = _segment(source, node.value)
    except (OSError, TypeError, SyntaxError):
        pass
    parts = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            parts.append(f.name)
        elif f.name in written and not written[f.name].startswith(("field(", "dataclasses.field(")):
            parts.append(f"{f.name}={written[f.name]}")
        elif f.default_factory is not dataclasses.MISSING:
            factory = f.default_factory
            plain = factory.__module__ == "builtins" and inspect.isclass(factory)
            parts.append(f"{f.name}={factory.__name__}()" if plain else f"{f.name}=...")
        elif f.default is not dataclasses.MISSING:
            parts.append(f"{f.name}={_clean_repr(f.default)}")
        else:
            parts.append(f"{f.name}=...")
    return ", ".join(parts)


def _own_init(cls):
    """The nearest ``__init__`` written in tfbook for ``cls`` (None: inherited from outside)."""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            return init if getattr(init, "__module__", "").startswith("tfbook") else None
    return None


def signature(name: str, obj) -> str:
    """What the first column shows: a call signature, a constant, or a module name."""
    if isinstance(obj, types.ModuleType):
        return f"{obj.__name__} (module)"
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj):
            params = _dataclass_params(obj)
        elif issubclass(obj, tuple) and hasattr(obj, "_fields"):
            params = ", ".join(obj._fields)
        else:
            init = _own_init(obj)
            params = None if init is None else (_source_params(init, drop_first=True) or
                                                 _inspect_params(obj))
        return f"class {name}" + ("" if params is None else f"({params})")
    if callable(obj):
        params = None
        if inspect.isfunction(inspect.unwrap(obj)):
            params = _source_params(obj, drop_first=False)
        if params is None:
            params = _inspect_params(obj)
        return f"{name}({params if params is not None else '...'})"
    return constant(name, obj)


_SCALARS = (bool, int, float, str)
HIDDEN_METHODS = {"extra_repr"}  # nn.Module's printing hook: not something a reader calls


def constant(name: str, value) -> str:
    """``NAME = value`` for a short plain value, else ``NAME`` and its type."""
    plain = isinstance(value, _SCALARS) or (
        isinstance(value, (tuple, list)) and all(isinstance(v, _SCALARS) for v in value))
    text = repr(value)
    if plain and len(text) <= 60 and "/" not in text and "\\" not in text:
        return f"{name} = {text}"
    return f"{name}: {_type_name(value)}"


def _type_name(value) -> str:
    if isinstance(value, PurePath):
        return "Path"
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


# ---------------------------------------------------------------- docstrings to MyST

_ROLE = re.compile(r"``(?P<lit>.+?)``|:(?P<role>[a-z]+(?::[a-z]+)?):`(?P<target>[^`]+)`|`(?P<interp>[^`]+)`")
_ESCAPE = set("\\`*_[]<>${}#&~^!|")
_EMPHASIS = re.compile(r"(?<![\w*\\])\*(?=[^\s*])([^*]+?)(?<=\S)\*(?![\w*])")


def escape(text: str) -> str:
    """Plain text that MyST shows as written (every markup character escaped), except
    reST emphasis ``*word*``, which stays emphasis."""
    out, pos = [], 0
    for m in _EMPHASIS.finditer(text):
        out += [_escape_all(text[pos:m.start()]), "*", _escape_all(m.group(1)), "*"]
        pos = m.end()
    return "".join(out + [_escape_all(text[pos:])])


def _escape_all(text: str) -> str:
    return "".join("\\" + c if c in _ESCAPE else c for c in text)


def code(text: str) -> str:
    """An inline code span around ``text``."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _role_text(role: str, target: str) -> str:
    m = re.fullmatch(r"(.*?)\s*<(.+)>", target, flags=re.S)
    if m and m.group(1):
        return m.group(1)
    target = m.group(2) if m else target
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return target + ("()" if role in ("func", "meth", "py:func", "py:meth") else "")


def rst_to_myst(text: str) -> str:
    """One paragraph of a reST docstring as MyST: literals and roles become code spans,
    everything else is escaped."""
    out, pos = [], 0
    for m in _ROLE.finditer(text):
        out.append(escape(text[pos:m.start()]))
        if m.group("lit") is not None:
            out.append(code(m.group("lit")))
        elif m.group("role") is not None:
            out.append(code(_role_text(m.group("role"), m.group("target"))))
        else:
            out.append(code(m.group("interp")))
        pos = m.end()
    out.append(escape(text[pos:]))
    return "".join(out)


def first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    doc = inspect.cleandoc(doc)
    para = " ".join(re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0].split())
    # reST: "text::" introduces a literal block (not part of this paragraph) and reads "text:"
    return re.sub(r"\s*::$", "", para) if re.search(r"\s::$", para) else re.sub(r"::$", ":", para)


def own_doc(obj) -> str | None:
    """The object's own docstring (a class's never comes from a base class)."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
        generated = dataclasses.is_dataclass(obj) or (issubclass(obj, tuple) and hasattr(obj, "_fields"))
        if doc and generated and doc.startswith(f"{obj.__name__}("):
            return None  # the text dataclass and namedtuple write from the fields
        return doc
    return inspect.getdoc(obj)


def constant_comment(module, name: str) -> str:
    """The ``#:`` comment lines right above the assignment of ``name`` in ``module``."""
    try:
        lines = inspect.getsource(module).splitlines()
    except (OSError, TypeError):
        return ""
    pattern = re.compile(rf"^(?:[A-Za-z_][A-Za-z0-9_]*\s*,\s*)*{re.escape(name)}\b[^=]*=")
    for i, line in enumerate(lines):
        if pattern.match(line):
            comment = []
            j = i - 1
            while j >= 0 and lines[j].lstrip().startswith("#:"):
                comment.insert(0, lines[j].lstrip()[2:].strip())
                j -= 1
            return " ".join(comment)
    return ""


def methods(cls) -> list[str]:
    """Public methods and properties written in the class itself, in definition order."""
    if dataclasses.is_dataclass(cls) or (issubclass(cls, tuple) and hasattr(cls, "_fields")):
        return []
    out = []
    for name, member in cls.__dict__.items():
        if name.startswith("_") or name in HIDDEN_METHODS:
            continue
        if isinstance(member, (staticmethod, classmethod, property)) or inspect.isfunction(member):
            out.append(name)
    return out


def summary(module, name: str, obj) -> str:
    """The second column: the first paragraph of the docstring, as MyST."""
    if not (callable(obj) or isinstance(obj, types.ModuleType)):
        text = rst_to_myst(constant_comment(module, name))
    else:
        text = rst_to_myst(first_paragraph(own_doc(obj)))
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj) and not text:
            text = "A dataclass; its fields are the arguments."
        extra = methods(obj)
        if extra:
            text += (" " if text else "") + "Methods: " + ", ".join(code(m) for m in extra) + "."
        if _own_init(obj) is None and not dataclasses.is_dataclass(obj) and not issubclass(obj, tuple):
            bases = [b for b in obj.__bases__ if b is not object]
            if bases:
                text += (" " if text else "") + "Subclass of " + ", ".join(
                    code(b.__name__ if b.__module__ == "builtins" else f"{b.__module__}.{b.__qualname__}")
                    for b in bases) + "."
    return text or UNDOCUMENTED


# ---------------------------------------------------------------- the page

def definitions(items: list[tuple[str, str]]) -> list[str]:
    """A MyST definition list: each term (a code span) on its line, its text below.

    A list rather than a table: a signature is one long unbreakable word at its name, and a
    table of them is wider than a phone (390 px) and than the desktop column; a list wraps."""
    lines = []
    for term, text in items:
        lines += [term, ": " + _block_safe(text), ""]
    return lines


def _block_safe(text: str) -> str:
    """Text that cannot open a block (list, quote) at the start of its line."""
    if text[:1] in "-+":
        return "\\" + text
    return re.sub(r"^(\d+)([.)])", r"\1\\\2", text)


def _heading(module_name: str) -> str:
    # plain text, not a code span: a monospace heading is a third wider, and a module name
    # does not wrap; `tfbook.torch.training` in code filled a 390 px phone
    return f"## {escape(module_name)}"


def module_section(module, skip_modules: bool = False, shown: frozenset = frozenset()) -> list[str]:
    names, from_all = public_names(module)
    if skip_modules:  # listed in a list of their own
        names = [n for n in names if not isinstance(member(module, n), types.ModuleType)]
    names = [n for n in names if n not in shown]  # a backend module's functions are in the shared list
    lines = [_heading(module.__name__), ""]
    intro = first_paragraph(module.__doc__)
    if intro:
        lines += [rst_to_myst(intro), ""]
    if not from_all:
        lines += [f"This module has no {code('__all__')}: listed are the functions, classes and "
                  "upper-case constants defined in it.", ""]
    if not names:
        return lines + ["Nothing public yet.", ""]
    return lines + definitions([(code(signature(n, member(module, n))), summary(module, n, member(module, n)))
                                for n in names])


def backends_section() -> list[str]:
    import tfbook.numpy as tnp
    import tfbook.torch.functional as tf

    np_names, torch_names = list(tnp.__all__), list(tf.__all__)
    order = np_names + [n for n in torch_names if n not in np_names]
    rows = []
    for name in order:
        in_np, in_torch = name in np_names, name in torch_names
        where = BOTH if in_np and in_torch else ("NumPy only" if in_np else "PyTorch only")
        first = member(tnp if in_np else tf, name)
        sig = signature(name, first)
        text = summary(tnp if in_np else tf, name, first)
        if in_np and in_torch:
            other = signature(name, member(tf, name))
            if other != sig:
                text += f" PyTorch: {code(other)}."
        rows.append((code(sig), f"*{where}.* {text}"))
    lines = [
        "## Functions in both backends", "",
        f"The functions of {code('tfbook.numpy')} and {code('tfbook.torch.functional')} (also importable "
        f"from {code('tfbook.torch')}), listed once: each says which backends have it, then "
        "gives the first paragraph of the NumPy docstring. The signature is the NumPy one; "
        "where the PyTorch function takes other arguments (a `device`, a default dtype), its "
        "signature follows.", "",
    ]
    return lines + definitions(rows) + topics_section()


def topics_section() -> list[str]:
    """The backends' modules by topic: the same file names on both sides, each NumPy module
    with its twin in the PyTorch module of the same name."""
    import tfbook.numpy as tnp
    import tfbook.torch.functional as tf

    rows = []
    for pkg in (tnp, tf):
        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name.startswith("_"):
                continue
            name = f"{pkg.__name__}.{info.name}"
            mod = importlib.import_module(name)
            text = rst_to_myst(first_paragraph(mod.__doc__)) or UNDOCUMENTED
            twin = f"{(tf if pkg is tnp else tnp).__name__}.{info.name}"
            if importlib.util.find_spec(twin) is not None:
                text += f" Twin: {code(twin)}."
            rows.append((code(name), text))
    return ["### The backends' modules", "",
            "Both backends keep their functions in modules of the same names, one per topic; a "
            "function's twin is in the module of the same name on the other side "
            "(`tests/test_twins.py` checks it and lists the exceptions).", ""] + definitions(rows)


def shims_section() -> list[str]:
    """Old module paths that stay importable for the chapters."""
    rows = []
    for name in SHIMS:
        if importlib.util.find_spec(name) is None:
            continue
        mod = importlib.import_module(name)
        doc = mod.__doc__ if mod.__name__ == name else f"The module {code(mod.__name__)} itself."
        rows.append((code(name), rst_to_myst(first_paragraph(doc)) or UNDOCUMENTED))
    if not rows:
        return []
    return ["## Old module paths", "", "Kept so that the chapters' imports keep working; new code "
            "imports the module each points to.", ""] + definitions(rows)


def tasks_section() -> list[str]:
    lines = []
    rows = []
    for name in task_modules():
        mod = importlib.import_module(name)
        names, _ = public_names(mod)
        rows.append((code(name), (rst_to_myst(first_paragraph(mod.__doc__)) or UNDOCUMENTED)
                     + " Names: " + ", ".join(code(n) for n in names) + "."))
    if rows:
        verbs = ("data", "config", "RECIPE", "train", "evaluate", "load_pretrained", "save", "main")
        lines += ["The task modules, each imported on first use (`tfbook.tasks.addition`) and "
                  "run as `python -m tfbook.tasks.NAME`. Every one has the same verbs ("
                  + ", ".join(code(v) for v in verbs) + f"; {code('help(tfbook.tasks)')} says what each "
                  f"does); each entry lists everything in the module's {code('__all__')}.", ""]
        lines += definitions(rows)
    return lines


def course_section(names: list[str]) -> list[str]:
    rows = []
    for name in names:
        mod = importlib.import_module(name)
        rows.append((code(name), rst_to_myst(first_paragraph(mod.__doc__)) or UNDOCUMENTED))
    return [
        "## The course tools", "",
        "The modules behind the graded exercises (releasing student notebooks, grading "
        f"submissions in a sandbox, feedback), driven by {code('python -m tfbook.course')}. "
        "A reader of the book does not call them; they are listed module by module, without "
        "their functions.", "",
    ] + definitions(rows)


def _error_example() -> str:
    """A real error message of the package, so the page cannot misquote it."""
    import numpy as np

    import tfbook.numpy as tnp

    try:
        tnp.scaled_dot_product_attention(np.zeros((2, 5, 64)), np.zeros((2, 7, 32)), np.zeros((2, 7, 32)))
    except ValueError as e:
        return str(e)
    raise AssertionError("tfbook.numpy.scaled_dot_product_attention accepted Q and K of different widths")


def intro() -> list[str]:
    return [
        f"% Generated by `{COMMAND}` from the package: do not edit by hand.",
        "",
        "# Package reference",
        "",
        "Everything the chapters compute comes from one Python package, `tfbook`. Each "
        "component is written twice, with the same name and the same arguments:",
        "",
        "- `tfbook.numpy` holds the reference versions: plain NumPy functions that take their "
        "parameters as explicit dictionaries (`params[\"W_Q\"]`, `params[\"ffn\"][\"W_1\"]`) and "
        "keep no state, short enough to read next to the derivation;",
        "- `tfbook.torch` holds the same functions for `torch.Tensor` (differentiable, on any "
        "device, in `tfbook.torch.functional`), and around them the `nn.Module` classes that own "
        "parameters, the small models built from them and the one training loop.",
        "",
        "The tests hold the two backends to each other and both to PyTorch's own layers with "
        "copied weights. Both follow the same conventions, in the symbols of the "
        "{doc}`notation page <notation>`:",
        "",
        "- **Row vectors.** A sequence of $T$ tokens of width $D$ is `X` of shape `(..., T, D)`, "
        "where `...` is any number of leading batch axes, and a projection multiplies from the "
        "right, `Q = X @ W_Q` with `W_Q` of shape `(D, D_K)`. (`nn.Linear` stores the transpose; "
        "`from_torch` and `numpy_params` convert.)",
        "- **Masks are boolean and `True` means \"may attend\"**, as in "
        "`F.scaled_dot_product_attention`; a mask broadcasts to the scores, `(..., T_q, T_k)`. A "
        "query that may attend to nothing gets a zero row of weights and a zero output, not "
        "NaN. `nn.MultiheadAttention` and the `nn.Transformer*Layer` classes use the opposite "
        "convention (`True` = blocked).",
        "- **dtypes are preserved**: float32 in, float32 out; float64 in, float64 out. The tests "
        "compare in float64. Where the twins differ, they differ as their libraries do, and say so: "
        "the NumPy twin promotes as NumPy does (integer and boolean input becomes float64; "
        "float32 with float64 gives float64), the PyTorch twin refuses both with a `ValueError` "
        "naming the argument and its dtype (a silent cast would copy tensors on the device).",
        "- **Attention returns `(Z, P)`** in both twins: the outputs `Z (..., T_q, D_V)` and the "
        "weights `P (..., T_q, T_k)`, so that a chapter can look at what it attended to; take "
        "`Z, _ = ...` where only the outputs matter. (PyTorch's fused kernel, "
        "`F.scaled_dot_product_attention`, returns `Z` alone and never forms `P`.)",
        "- **Empty input is refused**: no keys (`T_k = 0`), a zero width (`D_K = 0`) or a "
        "softmax over an empty axis raise a `ValueError` in both twins, not a reduction error.",
        "- **NaN is not checked**: a NaN in the input propagates to the outputs it touches, in "
        "both twins, as in NumPy and PyTorch (checking every call would cost a pass over the "
        "data); `tfbook.checks.check_finite(x, name)` says where one appeared.",
        "- **Bad input raises `ValueError`** with a message that names the argument and shows "
        "the shapes, never a broadcasting error from deep inside; for instance, keys narrower "
        f"than the queries give {code(_error_example())}.",
        "- **Devices**: `tfbook.device()` picks cuda, then mps, then cpu (or what "
        "`TFBOOK_DEVICE` says).",
        "",
        "Each section below lists a module's public names in the order of its `__all__`: the "
        "signature, with default values as written in the source and without type "
        "annotations, then the first paragraph of the docstring; `help()` on any name prints "
        "all of it. Classes list their own public methods. Everything in "
        "`tfbook.torch.functional`, `modules`, `models` and `training` (and the other "
        "submodules of `tfbook.torch`) can also be imported from `tfbook.torch` directly.",
        "",
        f"This page is generated from the package by `{COMMAND}`, and a test fails when it "
        "falls behind the code.",
        "",
    ]


def generate() -> str:
    modules = public_modules()
    course = [m for m in modules if m.startswith(COURSE_PREFIX)]
    tasks = set(task_modules())
    skip = set(BACKENDS) | set(AGGREGATES) | set(SHIMS) | set(course) | tasks
    rest = [m for m in modules if m not in skip]
    # a topic module of a backend shows only what its package does not re-export (the shared
    # list has the rest); one with nothing else is not listed
    in_backends = set().union(*(importlib.import_module(b).__all__ for b in BACKENDS))

    def in_backend(m):
        return any(m.startswith(b + ".") for b in BACKENDS)

    rest = [m for m in rest if not in_backend(m)
            or set(public_names(importlib.import_module(m))[0]) - in_backends]
    ordered = [m for m in PREFERRED if m in rest] + sorted(m for m in rest if m not in PREFERRED)
    lines = intro() + backends_section()
    for name in ordered:
        lines += module_section(importlib.import_module(name), skip_modules=name == "tfbook.tasks",
                                shown=frozenset(in_backends) if in_backend(name) else frozenset())
        if name == "tfbook.tasks":
            lines += tasks_section()
    # anything re-exported by tfbook.torch that no submodule listed
    import tfbook.torch

    shown = set()
    for name in list(BACKENDS) + ordered:
        shown.update(public_names(importlib.import_module(name))[0])
    stray = [n for n in tfbook.torch.__all__ if n not in shown]
    if stray:
        lines += ["## Other names of `tfbook.torch`", ""]
        lines += definitions([(code(signature(n, getattr(tfbook.torch, n))),
                                summary(tfbook.torch, n, getattr(tfbook.torch, n))) for n in stray])
    lines += shims_section()
    if course:
        lines += course_section(course)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is out of date")
    parser.add_argument("--stdout", action="store_true", help="print the page instead of writing it")
    parser.add_argument("--out", type=Path, default=PAGE, help=f"default: {PAGE.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    text = generate()
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current == text:
            return 0
        diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(),
                                         f"{args.out} (committed)", f"{args.out} (generated)", lineterm="", n=0))
        shown = "\n".join(diff[:40]) + ("\n..." if len(diff) > 40 else "")
        print(f"{args.out} is out of date with the package: run `{COMMAND}`\n{shown}", file=sys.stderr)
        return 1
    if not args.out.exists() or args.out.read_text(encoding="utf-8") != text:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
