"""Numbers in the prose come from the code: a thin wrapper over myst-nb's ``glue``.

A chapter computes a figure, then ``tfbook.glue("ch13-kn-bits", bits, fmt="{:.3f}")``
stores the *formatted string* under that key; the markdown writes
``{glue:text}`ch13-kn-bits``` and the built book shows exactly that string, so the text and
the code cannot disagree (the strict build fails on a missing key). Nothing is displayed in
the notebook. It writes the output myst-nb's ``glue(key, value, display=False)`` writes (a
display_data whose mime types carry myst-nb's prefix and whose metadata names the key), with
IPython alone, so the stored outputs are the same whether or not myst-nb is installed (nbval
compares them); outside IPython it does nothing.

The stored ``text/plain`` is the string's Python repr (``'2,448'``, quotes included), as
IPython writes it for any ``str``: myst-nb's ``{glue:text}`` role literal-evaluates that text
to remove the quotes. Stored bare, ``2,448`` evaluated to the tuple ``(2, 448)``, ``0.10`` to
``0.1`` and ``+0.056`` to ``0.056`` in the built book.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["glue"]

_GLUE_PREFIX = "application/papermill.record/"  # myst_nb.ext.glue.GLUE_PREFIX
_KEY = re.compile(r"^ch(\d\d|A)-[a-z0-9][a-z0-9-]*$")


def glue(key: str, value: Any, fmt: str = "{}") -> None:
    """Store ``fmt.format(value)`` under ``key`` for ``{glue:text}`` roles (returns nothing, so a
    cell ending with it shows nothing).

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
        from IPython import get_ipython
        from IPython.core.formatters import format_display_data
        from IPython.display import display
    except ImportError:  # plain Python: nothing to store
        return None
    if get_ipython() is None:
        return None
    mimebundle, metadata = format_display_data(text)
    metadata["scrapbook"] = {"name": key, "mime_prefix": _GLUE_PREFIX}
    display({_GLUE_PREFIX + k: v for k, v in mimebundle.items()}, raw=True, metadata=metadata)
    return None
