"""Numbers in the prose come from the code: a thin wrapper over myst-nb's ``glue``.

A chapter computes a figure, then ``tfbook.glue("ch13-kn-bits", bits, fmt="{:.3f}")``
stores the *formatted string* under that key; the markdown writes
``{glue:text}`ch13-kn-bits``` and the built book shows exactly that string, so the text and
the code cannot disagree (the strict build fails on a missing key). Nothing is displayed in
the notebook. Without myst-nb (a reader's plain Jupyter, Colab) it does nothing but return
the formatted string.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["glue"]

_KEY = re.compile(r"^ch(\d\d|A)-[a-z0-9][a-z0-9-]*$")


class _Text(str):
    """A string whose ``repr`` is itself, so ``{glue:text}`` shows it without quotes."""

    def __repr__(self) -> str:
        return str(self)


def glue(key: str, value: Any, fmt: str = "{}") -> str:
    """Store ``fmt.format(value)`` under ``key`` for ``{glue:text}`` roles; return that string.

    ``key`` must look like ``ch07-bucket-start`` (``ch<NN>-`` or ``chA-``, then lower-case
    letters, digits and hyphens), so that keys of different chapters cannot collide.
    """
    if not isinstance(key, str) or not _KEY.match(key):
        raise ValueError(f"key={key!r} must look like 'ch07-some-name' (ch<NN>- or chA-, then [a-z0-9-])")
    if not isinstance(fmt, str):
        raise ValueError(f"fmt must be a format string like '{{:.3f}}', got {type(fmt).__name__}")
    try:
        text = fmt.format(value)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise ValueError(f"fmt={fmt!r} cannot format value {value!r} ({type(exc).__name__}: {exc})") from None
    try:
        from myst_nb import glue as _myst_glue
    except ImportError:  # a reader without myst-nb: nothing to store
        return text
    _myst_glue(key, _Text(text), display=False)
    return text
