"""tfbook.glue writes exactly what myst-nb's glue writes, shows nothing, and checks its key.

Mutations it catches: another mime prefix or metadata than myst-nb's (the equality with
myst_nb.glue fails), a quoted string (``{glue:text}`` would show the quotes: the text/plain
check fails), a key without its chapter prefix accepted.
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


def test_same_output_as_myst_nb_and_unquoted(published):
    shell, outputs = published
    assert shell.run_cell('import tfbook; tfbook.glue("ch01-third", 1 / 3, fmt="{:.3f}")').success
    assert shell.run_cell('from myst_nb import glue; from tfbook._glue import _Text\n'
                          'glue("ch01-third", _Text("0.333"), display=False)').success
    assert len(outputs) == 2 and outputs[0] == outputs[1]
    data, _ = outputs[0]
    assert data == {"application/papermill.record/text/plain": "0.333"}  # no quotes around it


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
