"""Deprecated alias: chapter 11's task lives in :mod:`tfbook.tasks.number_words`.

Only :func:`load_pretrained` is kept (it returns the model alone, as it used to).
"""

from __future__ import annotations

__all__ = ["load_pretrained"]


def load_pretrained():
    """The shipped model; ``tfbook.tasks.number_words.load_pretrained()`` also gives its history."""
    from .tasks import number_words

    return number_words.load_pretrained()[0]
