"""Issue 25 items 1 and 8: the README and the book's "Running the book" page tell a reader the
same things about installing and about where the chapters compute, and nothing stale."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = {"README.md": ROOT / "README.md", "book/running.md": ROOT / "book" / "running.md"}

SAME = [
    "Python 3.11 or newer",                                   # the floor (pyproject's requires-python)
    "pip install $(python tools/torch_choice.py auto)",       # the torch choice for a reader
    "pip install -r requirements-reader.txt && pip install --no-deps -e .",
    "jupyter lab --allow-root notebooks/",                    # as root
    "TORCH_VARIANT=auto",
    "nvidia-smi -L",
    "compute everything they print on the CPU",               # where the chapters compute
    "TFBOOK_DEVICE",                                          # the one switch
    'device="auto"',                                          # how training uses it
    "model.cpu()",
]
STALE = [r"3\.10\+", r"3\.10 or newer", r"pins? (select|pin) the CPU build", r"PyTorch code runs on\s+`tfbook\.device\(\)`"]


def _text(path: Path) -> str:
    return re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", DOCS)
def test_says_what_a_reader_needs(name):
    text = _text(DOCS[name])
    missing = [phrase for phrase in SAME if phrase not in text]
    assert not missing, f"{name} does not say: {missing}"


@pytest.mark.parametrize("name", DOCS)
def test_says_nothing_stale(name):
    text = _text(DOCS[name])
    found = [p for p in STALE if re.search(p, text)]
    assert not found, f"{name} still says {found}"


def test_the_floor_is_the_one_pyproject_declares():
    m = re.search(r'^requires-python = ">=(\d+\.\d+)"$', (ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert m and f"Python {m.group(1)} or newer" in SAME
