"""Show that every check can fail: run each chapter's checks under their mutations.

    python tools/mutations.py notebooks/03_why_scale.ipynb [more.ipynb ...] [--json out.json]

A code cell that asserts a claim names, in its metadata, the small changes to the thing
checked under which it must raise (CONTRIBUTING.md, "Every check is shown to fail")::

    "metadata": {"tfbook": {"mutations": [
        {"fails_if": "the scores are not divided by √D_K",
         "replace": [["/ np.sqrt(D_K)", ""]]},
        {"fails_if": "one weight of W_Q is perturbed by 1e-6",
         "before": "W_Q = W_Q.copy(); W_Q[0, 0] += 1e-6",
         "raises": "AssertionError"}]}}

This script executes the notebook top to bottom in one IPython shell (in this process,
with the notebook's folder as the working directory, as Jupyter and nbval do). Just
before a cell with mutations runs, it forks once per mutation: the child holds exactly
the state the notebook had reached, runs the mutated cell (``before`` first, then the
source with every ``replace`` pair applied; each ``old`` must occur in the source) with
its output discarded, and reports the exception it raised; the parent, untouched, then
runs the cell itself. A mutation is *caught* when the mutated cell raises ``raises``
(default ``AssertionError``, which ``tfbook.checks.CheckFailed`` is) or a subclass of it;
a mutation that only causes a ``NameError`` or a ``TypeError`` is not a caught one.

It also lists the *uncovered* cells: code cells outside the exercises' nbgrader cells
that assert (``assert``, a ``check_...(`` call, ``raise``) or whose stored output shows a
``✔``, and that carry neither mutations nor ``"illustration": "<why>"``; and the
illustration cells that print a ``✔`` anyway.

Exit code 0 when every mutation was caught and nothing is uncovered, else 1. With
``--json`` the full report (one record per mutation) is written for the tests.

What a mutation changes (issue 32). A mutation should simulate a bug: it changes *code* (a
line of the cell or a function it defines), a *library* function (a module's or class's
attribute replaced), *weights*, the *inputs*, or a random *seed*. One that only overwrites the
value the cell asserts, a result an earlier cell computed, or a field of a loaded record is
*value-only*: it shows that a tolerance is tight, not that a bug would be caught. ::

    python tools/mutations.py --classify notebooks/*.ipynb

classifies every mutation statically (the AST of the cell, of ``before`` and of the cell with
its ``replace`` pairs applied, and where each edited name was last assigned in the earlier
cells; nothing is executed), prints per chapter the checks, simulated-bug mutations,
value-only ones and record guards, lists the value-only ones, and exits 1 if one sits outside
a record guard. A cell whose whole point is to guard a shipped record (the numbers of a run
that cannot be redone on the page) declares ``"record": "<why>"`` in its ``tfbook`` metadata;
its value-only mutations are then allowed, and the built book shows the reader that the cell
guards a record instead of checking a claim (tools/stage_book.py). A mutation may declare
``"kind"`` (one of the simulated kinds); it is taken between simulated kinds, never over a
value-only finding. ``tests/test_mutation_kinds.py`` runs the classification on every
chapter in CI.
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import json
import os
import re
import select
import signal
import sys
import time
from pathlib import Path

import nbformat  # noqa: E402

TICK = "✔"
ASSERTING = re.compile(r"(^|[^\w.])assert\b|\bcheck_\w+\s*\(|(^|\s)raise\b", re.MULTILINE)
DEFAULT_RAISES = "AssertionError"


def cell_meta(cell) -> dict:
    return cell.get("metadata", {}).get("tfbook", {}) or {}


def is_nbgrader(cell) -> bool:
    nbg = cell.get("metadata", {}).get("nbgrader", {}) or {}
    return bool(nbg.get("solution") or nbg.get("grade"))


def shows_tick(cell) -> bool:
    for out in cell.get("outputs", []):
        text = out.get("text", "")
        if isinstance(text, list):
            text = "".join(text)
        data = out.get("data", {}).get("text/plain", "")
        if isinstance(data, list):
            data = "".join(data)
        if TICK in text or TICK in data:
            return True
    return False


def is_asserting(cell) -> bool:
    """A code cell that checks a claim (and so must name its mutations)."""
    if cell.cell_type != "code" or is_nbgrader(cell):
        return False
    if "raises-exception" in cell.get("metadata", {}).get("tags", []):
        return False  # fails on purpose: the failure is what it shows
    return bool(ASSERTING.search(cell.source)) or shows_tick(cell)


def mutated_source(source: str, mutation: dict) -> str:
    """The cell's source under ``mutation``; ValueError when the mutation does not apply."""
    unknown = set(mutation) - {"fails_if", "replace", "before", "raises", "kind"}
    if unknown:
        raise ValueError(f"unknown mutation keys {sorted(unknown)}")
    if not str(mutation.get("fails_if", "")).strip():
        raise ValueError("mutation has no 'fails_if' text")
    if mutation.get("kind") is not None and mutation["kind"] not in KINDS:
        raise ValueError(f"kind {mutation['kind']!r} is not one of {KINDS}")
    if not mutation.get("replace") and not mutation.get("before"):
        raise ValueError("mutation has neither 'replace' nor 'before': it changes nothing")
    for pair in mutation.get("replace", []):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise ValueError(f"replace entry {pair!r} is not an [old, new] pair of strings")
        old, new = pair
        if old not in source:
            raise ValueError(f"replace: {old!r} does not occur in the cell")
        source = source.replace(old, new)
    before = mutation.get("before", "")
    return (before + "\n" + source) if before else source


# ---- what a mutation changes (issue 32) ------------------------------------------------
# A mutation should simulate a bug: a change to code, to a library function, to weights, to
# the inputs or to a random seed. One that only overwrites the value the cell asserts, or a
# field of a loaded record, shows that a tolerance is tight, not that a bug would be caught:
# "value-only". Such mutations are allowed only in a cell that declares itself a guard of a
# shipped record ("record": "<why>" in its tfbook metadata). The classification is static: it
# reads the AST of the cell, of the mutation's ``before`` and of the cell as mutated, and the
# assignments of the earlier cells (where each name the mutation edits came from).


KINDS = ("code", "library", "weights", "inputs", "seed", "value")
SIMULATED = ("code", "library", "weights", "inputs", "seed")
PRIORITY = ("library", "seed", "weights", "inputs", "code")  # the most specific kind names a mutation
RECORD_LOADER = re.compile(
    r"^(json_?load|loads?|read_json|load_json|load_(results?|scores?|records?|curves?|history|histories|"
    r"logs?|runs?|summary|sweep|table|ablation|orders|search|early|warmup_curves|long_scores|lora_scores|"
    r"window_search|finetune_results|shipped_\w+)|\w*_results?|\w*_record)$")
WEIGHT_LOADER = re.compile(r"^(load_pretrained|load_state_dict|load_finetuned|load_checkpoint|load_model|"
                           r"load_warmup_models|load_long|load_seed0|make_model|from_pretrained|from_torch|"
                           r"from_conv|parameters|named_parameters|state_dict)$")
DATA_SOURCE = re.compile(r"^(normal|randn|rand|randint|random|uniform|standard_normal|permutation|choice|"
                         r"integers|shuffle|load_text|load_corpus|load_digits_images|\w*_batch|make_\w*data\w*|"
                         r"eye|arange|linspace|zeros|ones|full|empty|randn_like|rand_like)$")
SEED_CALL = re.compile(r"^(manual_seed|seed|default_rng|RandomState|Generator|set_seed|seed_everything|PCG64)$")
WEIGHT_NAME = re.compile(r"^(W_?\w*|w_\w+|b_[A-Za-z]\w*|\w*weights?|\w*params|\w*_param|\w*models?\w*|\w*_lm|lm_?\w*|emb\w*|"
                         r"theta|gamma|beta_ln|state)$")
WEIGHT_ATTR = re.compile(r"^(weight|bias|W_?\w*|b_[A-Za-z]\w*|data|params?)$")
MUTATING_METHODS = {"append", "extend", "insert", "update", "pop", "clear", "setdefault", "sort",
                    "reverse", "remove", "add", "discard", "fill_", "zero_", "copy_", "normal_",
                    "uniform_", "add_", "mul_", "sub_", "div_", "__setitem__", "setflags", "itemset"}
CHECK_CALL = re.compile(r"^(check_\w*|print|glue|display|Markdown|assert_\w+|assert_allclose|"
                        r"assert_close|assert_array_equal|assert_equal|tick|report)$")
TRIVIAL_ROOTS = {"np", "numpy", "math", "torch", "F", "statistics", "json", "copy", "itertools",
                 "collections", "functools", "operator", "re", "scipy", "dataclasses", "random"}
TRIVIAL_BUILTINS = {"abs", "max", "min", "sum", "len", "round", "float", "int", "list", "dict", "tuple",
                    "set", "frozenset", "sorted", "reversed", "all", "any", "zip", "range", "enumerate",
                    "isinstance", "str", "repr", "format", "bool", "map", "filter", "deepcopy", "copy",
                    "iter", "next", "divmod", "pow", "complex", "getattr", "hasattr", "type", "__import__"}


def _parse(text: str):
    try:
        return ast.parse(text)
    except SyntaxError:
        try:  # IPython magics and shell lines: drop them, keep the Python
            return ast.parse("\n".join("" if l.lstrip().startswith(("%", "!")) else l for l in text.splitlines()))
        except SyntaxError:
            return None


def _root(node):
    """The name an attribute/subscript/call chain hangs from (``a`` in ``a.b[0].c()``)."""
    while True:
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return node.id if isinstance(node, ast.Name) else None


def _func_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else "")


def _chain_calls(node) -> list[str]:
    """The names of the calls along ``node``'s own chain (``a.load(x).double()`` -> double, load),
    not of calls nested in its arguments."""
    out = []
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Call):
            out.append(_func_name(node))
            node = node.func
        else:
            node = node.value
    return out


def _names_read(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _calls(node):
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def _targets(stmt) -> list:
    if isinstance(stmt, ast.Assign):
        return stmt.targets
    if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        return [stmt.target]
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [stmt.target]
    if isinstance(stmt, ast.Delete):
        return stmt.targets
    return []


def _target_names(target) -> set[str]:
    """Root names a target writes (``a``, ``a[0]``, ``a.b`` and tuples of them)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*[_target_names(t) for t in target.elts]) if target.elts else set()
    r = _root(target)
    return {r} if r else set()


def _written(stmt) -> set[str]:
    """Names a statement (with its body) binds or mutates in place."""
    out = set()
    for node in ast.walk(stmt):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.Delete)):
            for t in _targets(node):
                out |= _target_names(t)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            out |= _target_names(node.optional_vars)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in MUTATING_METHODS:
            r = _root(node.func.value)
            if r:
                out.add(r)
    return out


class NotebookContext:
    """What the notebook's cells define, for the classifier: imported names (modules, library
    functions and classes), names defined by ``def``/``class``, and each name's assignments."""

    def __init__(self, cells: list[str]):
        self.trees = [_parse(src) for src in cells]
        self.imported: set[str] = set()
        self.defined: set[str] = set()
        self.seeds: set[str] = set().union(*[_seed_parts(t) for t in self.trees if t is not None] or [set()])
        for tree in self.trees:
            if tree is None:
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    for a in node.names:
                        self.imported.add((a.asname or a.name).split(".")[0])
                elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node in tree.body:
                    self.defined.add(node.name)

    def is_book_call(self, call: ast.Call) -> bool:
        """A call into code under test (the book's package, a library's model, a notebook def)."""
        root = _root(call.func)
        name = _func_name(call)
        if isinstance(call.func, ast.Attribute) and not isinstance(call.func.value, (ast.Name, ast.Attribute)):
            return False  # a method of a computed value (``x.sum()``)
        if root in TRIVIAL_ROOTS:
            return root == "torch" and isinstance(call.func, ast.Attribute) and \
                isinstance(call.func.value, ast.Attribute) and call.func.value.attr in {"nn", "optim"}
        if root is None:
            return False
        if isinstance(call.func, ast.Name):
            return name not in TRIVIAL_BUILTINS  # a function or module the notebook made or imported
        if root in self.imported or root in self.defined:
            return True
        return name not in {"copy", "item", "tolist", "numpy", "detach", "clone", "double", "float", "astype",
                            "reshape", "transpose", "mean", "sum", "get", "items", "keys", "values",
                            "index", "replace", "format", "cpu", "to", "view", "flatten", "ravel"}

    def origin(self, name: str, before_cell: int, prefix: list | None = None) -> str:
        """Where ``name``'s value came from, by its last top-level assignment before the cell:
        'record' (a shipped record loaded from disk), 'weights', 'inputs' (drawn, literal or read
        data), 'result' (computed by the notebook) or 'unknown'; ``prefix``: the statements of the
        cell itself that run before the one asked about."""
        for stmt in reversed(prefix or []):
            if name in _written(stmt):
                return self._origin_of(stmt, name, before_cell)
        for tree in reversed(self.trees[:before_cell]):
            if tree is None:
                continue
            for stmt in reversed(tree.body):
                if name in _written(stmt):
                    return self._origin_of(stmt, name, before_cell)
        return "unknown"

    def _origin_of(self, stmt, name, before_cell) -> str:
        value = getattr(stmt, "value", None)
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
            return "code"
        if isinstance(stmt, ast.Assign) and value is not None:
            # in a tuple target from a weight loader, the first name is the model, the rest records
            tgt = stmt.targets[0]
            calls = [_func_name(c) for c in _calls(value)]
            if any(RECORD_LOADER.match(c) for c in calls):
                return "record"
            if any(WEIGHT_LOADER.match(c) for c in _chain_calls(value)):
                if isinstance(tgt, ast.Tuple) and tgt.elts and _target_names(tgt.elts[0]) != {name}:
                    return "record"
                return "weights"
            if WEIGHT_NAME.match(name):
                return "weights"
            if any(DATA_SOURCE.match(c) for c in calls) or not (
                    _names_read(value) - TRIVIAL_BUILTINS - {"np", "torch", "numpy", "math"}):
                return "inputs"  # drawn, read, or written out as literals
            if isinstance(value, ast.Call) and _func_name(value) in {"array", "asarray", "tensor", "as_tensor"} \
                    and not _names_read(value) - {"np", "torch", "numpy"}:
                return "inputs"
            read = _names_read(value) - {name}
            subs = [n for n in ast.walk(value) if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)]
            if subs and not _calls(value) and all(
                    self.origin(s.value.id, before_cell) == "record" for s in subs):
                return "record"  # a field of a record (``curves = rec["curves"]``)
            if not _calls(value) and read and all(self.origin(r, before_cell) == "record" for r in read):
                return "record"
        elif WEIGHT_NAME.match(name):
            return "weights"
        return "result"


def _check_only_names(tree, ctx: NotebookContext) -> set[str]:
    """Names the cell reads only where it checks or shows (asserts, ``check_*``/print/glue
    calls, figures' labels), directly or through plain arithmetic into such a name."""
    if tree is None:
        return set()
    reads_in_check, reads_in_work = set(), set()
    feeds: dict[str, set[str]] = {}
    for stmt in tree.body:
        if _is_check_stmt(stmt):
            fed = set()  # names handed to code under test inside the check (``assert f(x) == y``)
            for c in _calls(stmt):
                if ctx.is_book_call(c) and not CHECK_CALL.match(_func_name(c)):
                    fed |= set().union(*[_names_read(a) for a in c.args + [k.value for k in c.keywords]] or [set()])
            reads_in_check |= _names_read(stmt) - fed
            reads_in_work |= fed
            continue
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and not any(
                ctx.is_book_call(c) for c in _calls(stmt)):
            for t in _targets(stmt):
                for w in _target_names(t):
                    feeds.setdefault(w, set()).update(_names_read(stmt.value) if stmt.value else set())
            continue
        reads_in_work |= _names_read(stmt)
    # a name read only by plain assignments whose targets are check-only is check-only too
    check_only = set()
    changed = True
    candidates = (reads_in_check | set().union(*feeds.values()) if feeds else reads_in_check) - reads_in_work
    while changed:
        changed = False
        for n in candidates - check_only:
            users = {t for t, srcs in feeds.items() if n in srcs and t != n}
            if n in reads_in_check or users:
                if all(u in check_only for u in users) and (n in reads_in_check or users):
                    check_only.add(n)
                    changed = True
    return check_only


def _is_check_stmt(stmt) -> bool:
    if isinstance(stmt, ast.Assert):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return bool(CHECK_CALL.match(_func_name(stmt.value)))
    if isinstance(stmt, ast.If) and all(isinstance(s, ast.Raise) for s in stmt.body):
        return True  # ``if bad: raise ...``
    return False


def _book_calls(node, ctx) -> set[str]:
    return {ast.dump(c) for c in _calls(node) if ctx.is_book_call(c)}


def _seed_parts(node) -> set[str]:
    out = set()
    for c in _calls(node):
        if SEED_CALL.match(_func_name(c)):
            out.add(ast.dump(c))
        out |= {ast.dump(k) for k in c.keywords if k.arg in {"seed", "random_state", "generator"}}
    return out


DATA_NAME = re.compile(r"^\w*(ids|tokens|text|corpus|images|imgs|batch|inputs|_data|dataset)$")
LITERAL_MAKERS = {"array", "asarray", "tensor", "as_tensor", "dict", "list", "tuple", "set", "float", "int",
                  "complex", "str", "frozenset"}
INPLACE_WRITE = re.compile(r"^(normal_|uniform_|copy_|fill_|zero_|add_|mul_|sub_|div_|clamp_|"
                           r"index_fill_|masked_fill_|set_|requires_grad_)$")


def _classify_stmt(stmt, ctx, index, check_only, mode, state, removed) -> list[tuple[str, str, str]]:
    """[(kind, why, name)] for one changed statement. ``mode`` is 'before' (run before the cell),
    'added' (a statement the replacement adds) or 'modified' (one that replaces a statement of
    the cell, ``removed`` being the statements it replaces). ``state`` carries what earlier
    statements of the same mutation made of each name (``state['origin'][name]``)."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
        return []
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [("code", f"defines {stmt.name}", stmt.name)]
    if isinstance(stmt, (ast.With, ast.If, ast.Try)):  # each statement of the block on its own
        inner = [st for part in ("body", "orelse", "finalbody") for st in getattr(stmt, part, [])]
        kept = {ast.dump(st) for r in removed for node in ast.walk(r) if isinstance(node, ast.stmt)
                for st in [node]}
        inner = [st for st in inner if ast.dump(st) not in kept]  # lines the replacement left alone
        return [k for st in inner for k in _classify_stmt(st, ctx, index, check_only, mode, state, removed)]
    if isinstance(stmt, ast.For) and not _book_calls(stmt, ctx) and _root(stmt.iter):
        # a loop that edits the items of a collection (``for r in rec["runs"]: r["test"] += 1``)
        items = {n for n in _written(stmt) if n in _target_names(stmt.target)}
        if items:
            root = _root(stmt.iter)
            origin = state["origin"].get(root) or ctx.origin(root, index, state.get("prefix", []))
            if root in state["computed"]:
                return [("code", f"part of recomputing {root}", root)]
            if origin in ("record", "result", "unknown") and not WEIGHT_NAME.match(root):
                return [("value", f"edits the items of {root}, " + (
                    "a loaded record" if origin == "record" else "a result computed earlier"), root)]
            return [("inputs", f"changes the items of the input {root}", root)]
    compound = isinstance(stmt, (ast.For, ast.While, ast.With, ast.If, ast.Try))
    written = _written(stmt) if compound else (
        {n for t in _targets(stmt) for n in _target_names(t)} | _written(stmt))

    def every(kind, why):  # a kind that holds for every name the statement writes
        return [(kind, why, n) for n in sorted(written)] or [(kind, why, "")]

    if mode != "before" and _is_check_stmt(stmt):
        old_calls = set().union(*[_book_calls(r, ctx) for r in removed]) if removed else set()
        if _book_calls(stmt, ctx) - old_calls:
            return [("code", "changes what the check computes (a call into the code under test)", "")]
        return [("value", "changes the check itself (its asserted expression)", "")]
    # a seed the notebook never uses (``before``), or one the replacement changed
    old_seeds = set().union(*[_seed_parts(r) for r in removed]) if removed else (
        ctx.seeds if mode == "before" else set())
    if _seed_parts(stmt) - old_seeds:
        return every("seed", "changes a random seed")
    for c in _calls(stmt):
        if _func_name(c) == "exec":
            return every("library" if len(c.args) > 1 else "code", "re-executes a changed function's source")
        if INPLACE_WRITE.match(_func_name(c)):
            return every("weights", f"writes a tensor in place ({_func_name(c)})")
    out = []
    for t in _targets(stmt):
        if isinstance(t, ast.Attribute):
            root = _root(t)
            value = getattr(stmt, "value", None)
            callable_ = isinstance(value, (ast.Lambda, ast.Name, ast.Attribute)) or (
                isinstance(value, ast.Call) and _func_name(value) in {"partial", "MethodType"})
            if t.attr == "grad":
                out.append(("value", f"overwrites the computed gradient {ast.unparse(t)}", root or ""))
            elif callable_:
                out.append(("code" if root in ctx.defined else "library", f"replaces {ast.unparse(t)}", root or ""))
            elif WEIGHT_ATTR.match(t.attr):
                out.append(("weights", f"sets {ast.unparse(t)}", root or ""))
            else:
                out.append(("code", f"changes the setting {ast.unparse(t)}", root or ""))
        elif isinstance(t, ast.Subscript) and re.search(r"\.(weight|bias|data)\b|\[['\"](W_|b_)", ast.unparse(t)):
            out.append(("weights", f"changes {ast.unparse(t)}", _root(t) or ""))
    if out:
        return out
    value = getattr(stmt, "value", None)
    book = _book_calls(stmt, ctx)
    calls = [_func_name(c) for c in _calls(stmt)]
    for name in sorted(written):
        origin = state["origin"].get(name) or ctx.origin(name, index, state.get("prefix", []))
        reads_self = name in _names_read(stmt) or isinstance(stmt, ast.AugAssign) or any(
            not isinstance(t, (ast.Name, ast.Tuple, ast.List)) for t in _targets(stmt)) or (
            isinstance(stmt, ast.Expr))
        constant = value is not None and not (_names_read(value) - TRIVIAL_BUILTINS - {"np", "torch", "math"}) \
            and all(_func_name(c) in LITERAL_MAKERS for c in _calls(value))
        drawn = any(DATA_SOURCE.match(c) for c in calls)
        if isinstance(stmt, ast.Assign) and isinstance(value, (ast.Name, ast.Attribute)) and name.startswith("_"):
            continue  # keeps the original (``_f = module.f``) for the patch that follows
        if isinstance(stmt, ast.Assign) and isinstance(value, (ast.Name, ast.Subscript, ast.Attribute)) \
                and not _calls(value) and _root(value) and _root(value) != name:
            root = _root(value)  # an alias of (a part of) another value: it inherits that one's origin
            state["origin"][name] = state["origin"].get(root) or ctx.origin(root, index, state.get("prefix", []))
            continue
        if isinstance(value, ast.Lambda) or (origin == "code" and isinstance(value, (ast.Name, ast.Attribute))):
            out.append(("library" if name in ctx.imported else "code", f"replaces the function {name}", name))
        elif not book and not compound and (reads_self or constant):
            if mode == "modified" and not constant:
                out.append(("inputs" if drawn else "code", f"changes how {name} is computed", name))
            elif name in state["computed"]:
                out.append(("code", f"part of recomputing {name}", name))
            elif WEIGHT_NAME.match(name) or origin == "weights":
                out.append(("weights", f"changes {name}", name))
            elif origin == "inputs" or drawn or DATA_NAME.match(name) and origin != "record":
                out.append(("inputs", f"changes the input {name}", name))
            elif origin == "record":
                out.append(("value", f"edits {name}, a loaded record", name))
            elif name in check_only:
                out.append(("value", f"overwrites {name}, which the cell only checks", name))
            elif origin == "inputs":
                out.append(("inputs", f"changes the input {name}", name))
            else:
                out.append(("value", f"overwrites {name}, a result computed earlier", name))
        elif not book and not compound:
            out.append(("inputs" if drawn else "code", f"computes {name} with a changed formula", name))
        elif any(RECORD_LOADER.match(c) for c in calls) and all(
                RECORD_LOADER.match(_func_name(c)) or not ctx.is_book_call(c) for c in _calls(stmt)):
            state["origin"][name] = "record"
        elif any(WEIGHT_LOADER.match(c) for c in calls) or WEIGHT_NAME.match(name):
            out.append(("weights", f"changes {name} (weights)", name))
        elif any(DATA_SOURCE.match(c) for c in calls) and not any(
                ctx.is_book_call(c) and not DATA_SOURCE.match(_func_name(c)) for c in _calls(stmt)):
            out.append(("inputs", f"changes the input {name}", name))
        else:
            out.append(("code", f"computes {name} with changed code", name))
    if not written and (book or calls or mode != "before"):
        out.append(("code", "runs changed code", ""))
    for kind, _, name in out:
        if name and kind == "code":
            state["computed"].add(name)
    return out


def _changed_statements(original: list, mutated: list) -> list[tuple[object, list, list]]:
    """[(statement, removed, prefix)]: the statements of ``mutated`` not in ``original``, each
    with the original statements it replaces (those of ``original`` missing from ``mutated``)
    and the statements of ``mutated`` before it; recursing into a compound statement whose
    header is unchanged (a changed line inside a ``for`` loop is that line)."""
    kept = collections.Counter(ast.dump(s) for s in mutated)
    removed_all = []
    for s in original:
        d = ast.dump(s)
        if kept[d] > 0:
            kept[d] -= 1
        else:
            removed_all.append(s)
    present = collections.Counter(ast.dump(s) for s in original)
    unpaired = list(removed_all)
    out = []
    for i, s in enumerate(mutated):
        d = ast.dump(s)
        if present[d] > 0:
            present[d] -= 1
            continue
        twin = next((r for r in removed_all if hasattr(s, "body") and hasattr(r, "body")
                     and _header(r) == _header(s)), None)
        if twin is not None and not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = _changed_statements(twin.body, s.body) + _changed_statements(
                getattr(twin, "orelse", []), getattr(s, "orelse", []))
            out.extend([(st, rem, mutated[:i] + pre) for st, rem, pre in inner] or [(s, [twin], mutated[:i])])
        else:  # pair it with the removed statement that wrote the same names, else the next one
            written = _written(s)
            removed = [r for r in unpaired if _written(r) & written][:1] or unpaired[:1]
            for r in removed:
                unpaired.remove(r)
            out.append((s, removed, mutated[:i]))
    return out


def _header(stmt) -> str:
    def dump(v):
        if isinstance(v, ast.AST):
            return ast.dump(v)
        return [dump(x) for x in v] if isinstance(v, list) else v
    parts = {k: v for k, v in ast.iter_fields(stmt) if k not in ("body", "orelse", "finalbody", "handlers")}
    return type(stmt).__name__ + repr({k: dump(v) for k, v in parts.items()})


def classify_mutation(cell_source: str, mutation: dict, ctx: NotebookContext | None = None,
                      index: int | None = None) -> dict:
    """What ``mutation`` changes: ``{"kind", "why", "declared"}``, kind one of KINDS.

    ``ctx`` is the notebook (a ``NotebookContext`` of its code cells' sources) and ``index`` the
    cell's place among them, for where the names a mutation edits came from; without them the
    cell stands alone. A declared ``kind`` is taken between simulated kinds, never over a
    value-only finding."""
    if ctx is None:
        ctx, index = NotebookContext([cell_source]), 0
    tree = _parse(cell_source)
    check_only = _check_only_names(tree, ctx)
    found: list[tuple[str, str, str]] = []
    state = {"origin": {}, "computed": set()}
    before = mutation.get("before", "")
    if before:
        btree = _parse(before)
        stmts = btree.body if btree else []
        for i, stmt in enumerate(stmts):
            kinds = _classify_stmt(stmt, ctx, index, check_only, "before", state, [])
            # a name set to a value and then fed to code the mutation runs is that code's input
            later = [_names_read(s) for s in stmts[i + 1:] if _book_calls(s, ctx)]
            fresh = isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets) \
                and not (_names_read(stmt.value) & _written(stmt))
            found += [("code", f"an input of the recomputation of {n}", n)
                      if k == "value" and n and fresh and any(n in r for r in later) else (k, w, n)
                      for k, w, n in kinds]
    if mutation.get("replace"):
        src = cell_source
        for old, new in mutation["replace"]:
            src = src.replace(old, new)
        mtree = _parse(src)
        if tree is not None and mtree is not None:
            changed = _changed_statements(tree.body, mtree.body)
            for stmt, removed, prefix in changed:
                state["prefix"] = prefix
                mode = "modified" if removed and not _is_check_stmt(stmt) else ("added" if not removed else "modified")
                found += _classify_stmt(stmt, ctx, index, check_only, mode, state, removed)
            if not changed:
                found.append(("code", "changes only a comment or the layout", ""))
        elif mtree is None:
            found.append(("code", "makes the cell's code invalid", ""))
    # what each name ends as: the last statement that wrote it decides
    last: dict[str, tuple[str, str]] = {}
    rest = []
    for kind, why, name in found:
        if name:
            last[name] = (kind, why)
        else:
            rest.append((kind, why))
    final = list(last.values()) + rest
    kinds = [k for k, _ in final]
    hard = [(k, w) for k, w in final if k == "value" and ("only checks" in w or "check itself" in w
                                                         or "gradient" in w)]
    if hard:
        kind, why = hard[0]
    elif "value" in kinds and not any(k in SIMULATED for k in kinds):
        kind, why = next((k, w) for k, w in final if k == "value")
    else:
        sim = sorted([(k, w) for k, w in final if k in SIMULATED], key=lambda kw: PRIORITY.index(kw[0]))
        kind, why = sim[0] if sim else ("code", "changes the cell's code")
    declared = mutation.get("kind")
    if declared in SIMULATED and kind in SIMULATED:
        kind = declared  # the author's word, between simulated kinds
    return {"kind": kind, "why": why, "declared": declared}


def classify_notebook(path: Path) -> dict:
    """Every mutation of ``path`` with its kind, and the record guards (no execution)."""
    nb = nbformat.read(str(path), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    ctx = NotebookContext([c.source for c in code])
    report = {"notebook": Path(path).name, "checks": 0, "mutations": [], "record_guards": []}
    ci = -1
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        ci += 1
        meta = cell_meta(cell)
        muts = meta.get("mutations") or []
        if meta.get("record"):
            report["record_guards"].append({"cell": index, "id": cell.get("id"), "record": meta["record"]})
        if not muts:
            continue
        report["checks"] += 1
        for number, m in enumerate(muts):
            c = classify_mutation(cell.source, m, ctx, ci)
            report["mutations"].append({"cell": index, "id": cell.get("id"), "mutation": number,
                                        "fails_if": m.get("fails_if", ""), "guard": bool(meta.get("record")),
                                        **c})
    return report


def kind_table(reports: list[dict]) -> str:
    rows = ["| chapter | checks | mutations | simulated bugs | value-only | record guards | value-only outside guards |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    tot = collections.Counter()
    for r in reports:
        muts = r["mutations"]
        value = [m for m in muts if m["kind"] == "value"]
        row = {"checks": r["checks"], "mutations": len(muts), "simulated": len(muts) - len(value),
               "value": len(value), "guards": len(r["record_guards"]),
               "outside": sum(not m["guard"] for m in value)}
        tot.update(row)
        rows.append(f"| {r['notebook'][:2]} | " + " | ".join(str(row[k]) for k in
                    ("checks", "mutations", "simulated", "value", "guards", "outside")) + " |")
    rows.append("| all | " + " | ".join(str(tot[k]) for k in
                ("checks", "mutations", "simulated", "value", "guards", "outside")) + " |")
    return "\n".join(rows)


def _raised_names(exc: BaseException | None) -> list[str]:
    return [] if exc is None else [k.__name__ for k in type(exc).__mro__]


def _close_figures() -> None:
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close("all")


def run_mutation(shell, source: str, timeout: float) -> dict:
    """Fork; the child runs ``source`` in the shell's current state and reports what it raised."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: discard output, run, report, leave without cleanup
        try:
            os.close(read_fd)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            result = shell.run_cell(source, store_history=False, silent=True)
            exc = result.error_before_exec or result.error_in_exec
            report = {"raised": _raised_names(exc),
                      "message": (str(exc).splitlines() or [""])[0][:200] if exc else "",
                      "before_exec": result.error_before_exec is not None}
        except BaseException as exc:  # noqa: BLE001 - anything the child hits is the report
            report = {"raised": _raised_names(exc), "message": str(exc)[:200], "before_exec": False}
        try:
            os.write(write_fd, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    chunks, deadline = [], time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_fd)
            return {"raised": [], "message": f"timed out after {timeout:.0f} s", "timeout": True}
        ready, _, _ = select.select([read_fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return {"raised": [], "message": f"child died (status {status})", "died": True}
    return json.loads(b"".join(chunks).decode())


def _log(line: str) -> None:
    print(line, file=sys.__stdout__, flush=True)


def run_notebook(path: Path, timeout: float = 300.0, log=_log, verbose: bool = False) -> dict:
    """Execute ``path`` and every mutation of its checks; return the report."""
    from IPython.core.interactiveshell import InteractiveShell

    path = Path(path).resolve()
    nb = nbformat.read(str(path), as_version=4)
    report = {"notebook": path.name, "mutations": [], "uncovered": [], "illustration_ticks": [],
              "error": None}
    old_cwd = os.getcwd()
    os.chdir(path.parent)
    sys.path.insert(0, str(path.parent))
    shell = InteractiveShell.instance()
    shell.reset(new_session=False)  # a fresh namespace, as a fresh kernel has (the shell is a singleton)
    # multiprocessing's spawn start method reads __main__.__spec__; IPython's module lacks it.
    if not hasattr(shell.user_module, "__spec__"):
        shell.user_module.__spec__ = None
    start = time.perf_counter()
    kinds_ctx = NotebookContext([c.source for c in nb.cells if c.cell_type == "code"])
    try:
        code_index = 0
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            code_index += 1
            meta = cell_meta(cell)
            mutations = meta.get("mutations") or []
            if is_asserting(cell) and not mutations and not meta.get("illustration"):
                report["uncovered"].append({"cell": index, "id": cell.get("id"),
                                            "first_line": cell.source.strip().splitlines()[0][:80]})
            if meta.get("illustration") and shows_tick(cell):
                report["illustration_ticks"].append({"cell": index, "id": cell.get("id")})
            for number, mutation in enumerate(mutations):
                record = {"cell": index, "id": cell.get("id"), "mutation": number,
                          "fails_if": mutation.get("fails_if", ""),
                          "raises": mutation.get("raises", DEFAULT_RAISES)}
                try:  # what it changes (--classify); value-only outside a record guard is flagged
                    record["kind"] = classify_mutation(cell.source, mutation, kinds_ctx, code_index - 1)["kind"]
                except Exception:  # noqa: BLE001 - the classification never stops the run
                    record["kind"] = "code"
                record["guard"] = bool(meta.get("record"))
                try:
                    source = mutated_source(cell.source, mutation)
                except ValueError as exc:
                    record.update(status="bad", message=str(exc))
                else:
                    outcome = run_mutation(shell, source, timeout)
                    caught = record["raises"] in outcome.get("raised", [])
                    record.update(status="caught" if caught else "missed",
                                  raised=(outcome.get("raised") or ["nothing"])[0],
                                  message=outcome.get("message", ""))
                report["mutations"].append(record)
                value_only = record["kind"] == "value" and not record["guard"]
                log(f"  cell {index:3d} mutation {number}: {record['status'].upper():6s} "
                    + ("[VALUE-ONLY] " if value_only else "")
                    + f"{record['fails_if'][:70]}" + ("" if record["status"] == "caught"
                                                    else f"  [{record.get('raised', '')}: {record['message'][:90]}]"))
            if verbose:
                result = shell.run_cell(cell.source, store_history=True)
            else:  # the cells' own output is nbval's business, not this report's
                with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), \
                        contextlib.redirect_stderr(null):
                    result = shell.run_cell(cell.source, store_history=True)
            _close_figures()
            exc = result.error_before_exec or result.error_in_exec
            if exc is not None and "raises-exception" not in cell.get("metadata", {}).get("tags", []):
                report["error"] = f"cell {index} raised {type(exc).__name__}: {str(exc)[:200]}"
                break
    finally:
        os.chdir(old_cwd)
        sys.path.remove(str(path.parent))
    report["seconds"] = round(time.perf_counter() - start, 1)
    return report


def summary(report: dict) -> str:
    muts = report["mutations"]
    caught = sum(m["status"] == "caught" for m in muts)
    cells = len({m["cell"] for m in muts})
    value = sum(m.get("kind") == "value" and not m.get("guard") for m in muts)
    return (f"{report['notebook']}: {cells} checked cells, {len(muts)} mutations, {caught} caught, "
            f"{len(muts) - caught} not caught, {len(report['uncovered'])} asserting cells without "
            f"mutations, {value} value-only outside record guards ({report['seconds']} s)" + (f"; ERROR {report['error']}" if report["error"] else ""))


def _quiet_environment() -> None:
    """One thread per pool (forked children and thread pools do not mix) and no GUI backend.

    Set by the command line only, never on import: ``tests/test_mutations_tool.py`` imports this
    module into a pytest worker whose later nbval kernels inherit ``os.environ`` (a kernel started
    with ``MPLBACKEND=Agg`` shows no figure, and every figure cell would differ)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("MPLBACKEND", "Agg")


def value_only_lines(report: dict) -> list[str]:
    return [f"{report['notebook'][:2]} {m['id']} mutation {m['mutation']}"
            f"{' (record guard)' if m['guard'] else ''}: {m['why']} | fails if {m['fails_if']}"
            for m in report["mutations"] if m["kind"] == "value"]


def classify_main(paths: list[Path], json_path: Path | None = None) -> int:
    reports = [classify_notebook(p) for p in paths]
    print(kind_table(reports))
    lines = [line for r in reports for line in value_only_lines(r)]
    if lines:
        print("\nvalue-only mutations (they overwrite a checked value or a loaded record):")
        print("\n".join("  " + line for line in lines))
    if json_path:
        json_path.write_text(json.dumps(reports, indent=1, ensure_ascii=False))
    outside = sum(m["kind"] == "value" and not m["guard"] for r in reports for m in r["mutations"])
    return int(outside > 0)


def main(argv: list[str] | None = None) -> int:
    _quiet_environment()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, help="write the full report here")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutated cell")
    parser.add_argument("--verbose", action="store_true", help="show the cells' own output too")
    parser.add_argument("--classify", action="store_true",
                        help="no execution: classify every mutation (code, library, weights, inputs, seed "
                             "or value-only), print the per-chapter table and each value-only mutation; "
                             "exit 1 if one sits outside a record guard")
    args = parser.parse_args(argv)
    if args.classify:
        return classify_main(args.notebooks, args.json)
    if len(args.notebooks) > 1:
        # One shell per process: run each notebook in its own child so chapters cannot leak state.
        reports = []
        for path in args.notebooks:
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                rep = run_notebook(path, args.timeout, verbose=args.verbose)
                with os.fdopen(write_fd, "w") as fh:
                    json.dump(rep, fh)
                os._exit(0)
            os.close(write_fd)
            with os.fdopen(read_fd) as fh:
                data = fh.read()
            os.waitpid(pid, 0)
            reports.append(json.loads(data) if data else {"notebook": path.name, "mutations": [],
                                                          "uncovered": [], "illustration_ticks": [],
                                                          "error": "runner died", "seconds": 0})
    else:
        reports = [run_notebook(args.notebooks[0], args.timeout, verbose=args.verbose)]
    bad = 0
    for rep in reports:
        print(summary(rep))
        for cell in rep["uncovered"]:
            print(f"  cell {cell['cell']:3d} UNCOVERED {cell['first_line']}")
        for cell in rep["illustration_ticks"]:
            print(f"  cell {cell['cell']:3d} is an illustration but prints a ✔")
        bad += (any(m["status"] != "caught" for m in rep["mutations"]) or bool(rep["uncovered"])
                or bool(rep["illustration_ticks"]) or bool(rep["error"]))
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1, ensure_ascii=False))
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(main())
