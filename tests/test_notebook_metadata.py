"""Opening a chapter in JupyterLab does not change it: the kernel metadata is what Lab writes.

When JupyterLab starts a notebook's kernel it writes ``metadata.kernelspec`` from the kernel's
spec (``name``, ``display_name``, ``language``) and ``metadata.language_info`` from the kernel's
info reply; a value that differs from the file's marks the notebook modified. With the pinned
ipykernel the spec's display name is "Python 3 (ipykernel)" (nbclient, which executes the
chapters, keeps whatever the file had: "Python 3" before). ``tools/execute_notebooks.py`` writes
both entries (``--metadata-only`` rewrites just them). The Python version in ``language_info``
is the one that executed the book; a reader's Lab on another Python rewrites that one field.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _tool():
    spec = importlib.util.spec_from_file_location("execute_notebooks", ROOT / "tools" / "execute_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected() -> dict:
    """What JupyterLab writes with the pinned ipykernel, taken from ipykernel itself."""
    from ipykernel.ipkernel import IPythonKernel
    from ipykernel.kernelspec import get_kernel_dict

    spec = get_kernel_dict()
    return {"kernelspec": {"display_name": spec["display_name"], "language": spec["language"], "name": "python3"},
            "language_info": dict(IPythonKernel.language_info)}


def mismatches(metadata: dict, want: dict) -> list[str]:
    out = [f"kernelspec {metadata.get('kernelspec')} != {want['kernelspec']}"] \
        if metadata.get("kernelspec") != want["kernelspec"] else []
    info = dict(metadata.get("language_info") or {})
    version = info.pop("version", "")
    want_info = {k: v for k, v in want["language_info"].items() if k != "version"}
    if info != want_info:
        out.append(f"language_info {info} != {want_info}")
    if not re.fullmatch(r"3\.\d+\.\d+", version):
        out.append(f"language_info.version {version!r} is not a Python 3 version")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_kernel_metadata_is_what_jupyterlab_writes(path):
    metadata = json.loads(path.read_text(encoding="utf-8"))["metadata"]
    assert not mismatches(metadata, expected()), \
        f"{path.name}: {mismatches(metadata, expected())}; run tools/execute_notebooks.py --metadata-only {path}"


def test_the_check_and_the_tool(tmp_path):
    want = expected()
    assert want["kernelspec"]["display_name"] == "Python 3 (ipykernel)"   # the pinned ipykernel's spec
    # the check fails on what nbclient kept before (display name "Python 3")
    old = {"kernelspec": {**want["kernelspec"], "display_name": "Python 3"}, "language_info": want["language_info"]}
    assert mismatches(old, want)
    # the tool rewrites only the notebook-level metadata: every cell, output and count stays
    src = NOTEBOOKS[0]
    nb = json.loads(src.read_text(encoding="utf-8"))
    nb["metadata"]["kernelspec"]["display_name"] = "Python 3"
    path = tmp_path / src.name
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tool = _tool()
    assert tool.rewrite_metadata(path) is True
    after = json.loads(path.read_text(encoding="utf-8"))
    assert after["cells"] == nb["cells"]
    assert not mismatches(after["metadata"], want)
    assert tool.rewrite_metadata(path) is False          # a second run changes nothing
