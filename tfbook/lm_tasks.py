"""Deprecated alias: chapter 12's tasks live in :mod:`tfbook.tasks.addition` and
:mod:`tfbook.tasks.corpus` (the same recipes, through the one training loop).

Only :func:`load_model` is kept, for code written against the old name.
"""

from __future__ import annotations

__all__ = ["load_model"]


def load_model(name: str, path=None):
    """``tfbook.tasks.addition.load_pretrained`` or ``tfbook.tasks.corpus.load_pretrained``."""
    from .tasks import addition, corpus

    tasks = {"addition": addition, "corpus": corpus}
    if name not in tasks:
        raise ValueError(f"name must be one of {sorted(tasks)}, got {name!r}")
    return tasks[name].load_pretrained(path)
