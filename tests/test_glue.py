"""tfbook.glue writes exactly what myst-nb's glue writes, shows nothing, and checks its key.

Mutations it catches: another mime prefix or metadata than myst-nb's (the equality with
myst_nb.glue fails), a bare unquoted text/plain (myst-nb's ``{glue:text}`` literal-evaluates it:
``2,448`` renders as ``(2, 448)`` and ``0.10`` as ``0.1``; the rendering test fails, and the
notebook test fails on any stored output written that way), a key without its chapter prefix
accepted.
"""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell


@pytest.fixture()
def published():
    shell = InteractiveShell.instance()
    outputs, original = [], shell.display_pub.publish
    shell.display_pub.publish = lambda data, metadata=None, **kw: outputs.append((data, metadata))
    yield shell, outputs
    shell.display_pub.publish = original


def test_same_output_as_myst_nb(published):
    shell, outputs = published
    assert shell.run_cell('import tfbook; tfbook.glue("ch01-third", 1 / 3, fmt="{:.3f}")').success
    assert shell.run_cell('from myst_nb import glue; glue("ch01-third", "0.333", display=False)').success
    assert len(outputs) == 2 and outputs[0] == outputs[1]
    data, _ = outputs[0]
    assert data == {"application/papermill.record/text/plain": "'0.333'"}


# what a chapter formats, and what the built page must show: thousands separators, trailing
# zeros, signs, several figures in one key, exponents, words
RENDERED = [(2448, "{:,}", "2,448"), (10_000, "{:,.0f}", "10,000"), (0.1, "{:.2f}", "0.10"),
            (0.056, "{:+.3f}", "+0.056"), ((1, 1, 2), "{0[0]}, {0[1]}, {0[2]}", "1, 1, 2"),
            (6.99e-4, "{:.2e}", "6.99e-04"), (-0.0, "{:.2f}", "-0.00"), ("the 5-gram", "{}", "the 5-gram"),
            (3, "{}", "3"), ("it's", "{}", "it's")]


@pytest.mark.parametrize("value, fmt, shown", RENDERED)
def test_the_built_page_shows_the_formatted_string(published, value, fmt, shown):
    # myst-nb's {glue:text} role renders the stored text/plain through format_plain_text
    from myst_nb.core.variables import format_plain_text

    shell, outputs = published
    shell.user_ns["_value"] = value
    assert shell.run_cell(f'import tfbook; tfbook.glue("ch01-x", _value, fmt={fmt!r})').success
    (data, _), = outputs
    assert format_plain_text(data["application/papermill.record/text/plain"], "") == shown


def _glued_outputs():
    import json
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            for out in cell.get("outputs", []):
                text = out.get("data", {}).get("application/papermill.record/text/plain")
                if text is not None:
                    yield path.name, out["metadata"]["scrapbook"]["name"], "".join(text)


def test_every_stored_glue_renders_as_a_string():
    # a notebook executed with a glue that stored bare text (or a glue of a number, not a
    # formatted string) shows whatever literal_eval makes of it: every stored value must be
    # a quoted Python string, which the role shows without its quotes
    import ast

    outputs = list(_glued_outputs())
    assert len(outputs) > 400
    bad = []
    for name, key, text in outputs:
        try:
            ok = isinstance(ast.literal_eval(text), str)
        except (SyntaxError, ValueError):
            ok = False
        if not ok:
            bad.append(f"{name}: {key} = {text}")
    assert not bad, "glued values stored unquoted (re-execute the notebook): " + "; ".join(bad[:10])


def test_nothing_is_displayed(published):
    shell, outputs = published
    result = shell.run_cell('import tfbook; tfbook.glue("chA-x", 3)')
    assert result.result is None  # a cell ending with glue(...) has no Out[]


@pytest.mark.parametrize("key", ["x", "ch1-x", "ch01_x", "ch01-", "CH01-x", "chB-x", 7])
def test_bad_keys(key):
    import tfbook
    with pytest.raises(ValueError, match="key="):
        tfbook.glue(key, 1.0)


def test_bad_format():
    import tfbook
    with pytest.raises(ValueError, match="fmt="):
        tfbook.glue("ch01-x", "text", fmt="{:.3f}")
