"""tools/check_notebooks.py refuses a cell source with a control character: a backslash that a
Python string ate when the cell was written ("\\binom" typed as "\binom" is a backspace and
"inom"), which the book would show as a MathJax "Math input error"."""

import importlib.util
from pathlib import Path

import nbformat

spec = importlib.util.spec_from_file_location("check_notebooks", Path(__file__).parents[1] / "tools" / "check_notebooks.py")
check_notebooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_notebooks)


def _notebook(tmp_path, markdown):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(markdown)])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_a_lost_backslash_is_refused(tmp_path):
    found = check_notebooks.problems(_notebook(tmp_path, "chance $2/\binom{10}{5} \approx 0.8\\%$"))
    assert len(found) == 1 and "U+0007, U+0008" in found[0], found


def test_the_same_text_written_right_passes(tmp_path):
    assert check_notebooks.problems(_notebook(tmp_path, "chance $2/\\binom{10}{5} \\approx 0.8\\%$")) == []


def _glued(key):
    return nbformat.v4.new_output("display_data", data={"application/papermill.record/text/plain": "1"},
                                  metadata={"scrapbook": {"name": key, "mime_prefix": "application/papermill.record/"}})


def _glue_notebook(tmp_path, keys, text):
    cell = nbformat.v4.new_code_cell("tfbook.glue(...)", execution_count=1)
    cell.outputs = [_glued(k) for k in keys]
    nb = nbformat.v4.new_notebook(cells=[cell, nbformat.v4.new_markdown_cell(text)])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_a_key_glued_twice_is_refused(tmp_path):
    found = check_notebooks.problems(_glue_notebook(tmp_path, ["ch02-x", "ch02-x"], "{glue:text}`ch02-x` MiB"))
    assert len(found) == 1 and "stored again" in found[0], found


def test_a_key_the_text_uses_but_no_cell_glues_is_refused(tmp_path):
    found = check_notebooks.problems(_glue_notebook(tmp_path, ["ch02-x"], "{glue:text}`ch02-y:.2f` MiB"))
    assert len(found) == 1 and "'ch02-y'" in found[0], found


def test_each_key_glued_once_and_used_passes(tmp_path):
    assert check_notebooks.problems(_glue_notebook(tmp_path, ["ch02-x", "ch02-y"], "{glue:text}`ch02-x` and {glue}`ch02-y`")) == []
