"""Deprecated alias: chapter 13's task lives in :mod:`tfbook.tasks.digits`.

Only :func:`load` is kept: ``(model, losses)`` of a shipped variant, as it used to return.
"""

from __future__ import annotations

__all__ = ["load"]


def load(variant: str = "cls-1d"):
    """``tfbook.tasks.digits.load_pretrained(variant)``, with the history as a list of losses."""
    from .tasks import digits

    model, history = digits.load_pretrained(variant)
    return model, history.loss
