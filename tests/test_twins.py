"""Every public NumPy function has its PyTorch twin in the module of the same name.

``tfbook.numpy`` and ``tfbook.torch.functional`` are packages with one module per topic; the
twin of ``tfbook.numpy.X.f`` is ``tfbook.torch.functional.X.f``, with the same leading
argument names (the torch one may add ``device``). The only exceptions are listed below with
the reason; the last tests show the check fails on a package that breaks the rule.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import tfbook.numpy as tnp
import tfbook.torch.functional as TF

from test_backends_parity import NUMPY_ONLY

# Whole NumPy modules without a module of twins, and why.
MODULE_EXCEPTIONS = {
    "backprop": "the backward passes written out; PyTorch's twin is autograd itself, which "
                "tests/test_training_from_scratch.py compares every function with",
    "optim": "the NumPy optimiser steps; their PyTorch twins are torch.optim.Optimizer classes "
             "(objects that hold their state, as PyTorch's optimisers do) in tfbook.torch.optim, "
             "compared step by step in tests/test_training_from_scratch.py",
}
# Single functions, as "module.name", and why.
FUNCTION_EXCEPTIONS = {
    **{f"efficient.{n}": reason for n, (_, reason) in NUMPY_ONLY.items()},
    **{f"positions.{n}": "one of chapter 7's other position schemes, built once in NumPy and "
                         "shown; no model of the book uses it, so no tensor code needs it"
       for n in ("interleave_permutation", "alibi_slopes", "alibi_bias", "t5_relative_bucket")},
    "positions.rope_self_attention": "chapter 7's one-head illustration of RoPE's relative "
                                     "positions; the twin of rotary attention is "
                                     "tfbook.torch.functional.modern.rope_attention",
}


def topic_modules(package) -> dict[str, types.ModuleType]:
    return {i.name: importlib.import_module(f"{package.__name__}.{i.name}")
            for i in pkgutil.iter_modules(package.__path__) if not i.name.startswith("_")}


def public_functions(module) -> list[str]:
    return [n for n in getattr(module, "__all__", []) if inspect.isfunction(getattr(module, n))]


def missing_twins(np_package, torch_package, module_exceptions=MODULE_EXCEPTIONS,
                  function_exceptions=FUNCTION_EXCEPTIONS) -> list[str]:
    """What breaks the rule, one line each (empty: every function has its twin)."""
    problems = []
    np_mods, torch_mods = topic_modules(np_package), topic_modules(torch_package)
    for mod_name, mod in np_mods.items():
        if mod_name in module_exceptions:
            continue
        twin_mod = torch_mods.get(mod_name)
        if twin_mod is None:
            problems.append(f"{mod.__name__} has no module {torch_package.__name__}.{mod_name}")
            continue
        for name in public_functions(mod):
            if f"{mod_name}.{name}" in function_exceptions:
                continue
            twin = getattr(twin_mod, name, None)
            if name not in getattr(twin_mod, "__all__", []) or not inspect.isfunction(twin):
                problems.append(f"{mod.__name__}.{name} has no twin in {twin_mod.__name__}")
                continue
            a = list(inspect.signature(getattr(mod, name)).parameters)
            b = list(inspect.signature(twin).parameters)
            if b[: len(a)] != a or not set(b[len(a):]) <= {"device"}:
                problems.append(f"{mod.__name__}.{name}{tuple(a)} and its twin{tuple(b)} take other arguments")
    for mod_name, mod in torch_mods.items():  # and the other way round: no twin without its original
        np_mod = np_mods.get(mod_name)
        for name in public_functions(mod):
            if np_mod is None or name not in public_functions(np_mod):
                problems.append(f"{mod.__name__}.{name} has no NumPy original in {np_package.__name__}.{mod_name}")
    return problems


def test_every_numpy_function_has_its_twin_in_the_module_of_the_same_name():
    assert missing_twins(tnp, TF) == []


def test_the_exceptions_are_current():
    np_mods, torch_mods = topic_modules(tnp), topic_modules(TF)
    for mod_name, reason in MODULE_EXCEPTIONS.items():
        assert mod_name in np_mods and mod_name not in torch_mods and reason
    for key, reason in FUNCTION_EXCEPTIONS.items():
        mod_name, name = key.split(".")
        assert name in public_functions(np_mods[mod_name]), key  # still a public NumPy function
        assert not hasattr(torch_mods[mod_name], name), key  # still without a twin
        assert reason


def test_the_packages_reexport_their_modules():
    """``tfbook.numpy.f`` is the function of its topic module (the parity tests pair by name)."""
    for package in (tnp, TF):
        owners = {}
        for mod in topic_modules(package).values():
            for name in public_functions(mod):
                owners.setdefault(name, []).append(mod.__name__)
        for name in package.__all__:
            obj = getattr(package, name)
            assert obj.__module__ in owners.get(name, []), (package.__name__, name, obj.__module__)


def _fake(name, **modules):
    pkg = types.ModuleType(name)
    pkg.__path__ = []
    mods = {}
    for mod_name, funcs in modules.items():
        m = types.ModuleType(f"{name}.{mod_name}")
        for f in funcs:
            setattr(m, f.__name__, f)
        m.__all__ = [f.__name__ for f in funcs]
        mods[mod_name] = m
    return pkg, mods


def test_a_missing_or_misplaced_twin_is_found(monkeypatch):
    """A NumPy function whose twin sits in another module, and a twin with other arguments."""
    def softmax(x, axis=-1): ...
    def causal_mask(T): ...
    def softmax_t(x, dim=-1): ...
    softmax_t.__name__ = "softmax"

    np_pkg, np_mods = _fake("np_side", attention=[softmax, causal_mask])
    t_pkg, t_mods = _fake("t_side", attention=[softmax_t], masks=[causal_mask])
    monkeypatch.setattr(__import__(__name__), "topic_modules",
                        lambda p: np_mods if p is np_pkg else t_mods)
    problems = missing_twins(np_pkg, t_pkg, {}, {})
    assert problems == [
        "np_side.attention.softmax('x', 'axis') and its twin('x', 'dim') take other arguments",
        "np_side.attention.causal_mask has no twin in t_side.attention",
        "t_side.masks.causal_mask has no NumPy original in np_side.masks",
    ]
