"""Every JupyterLab extension in the venv was built for the pinned JupyterLab.

A prebuilt extension's ``remoteEntry.*.js`` states the version range of each shared package it
needs (``requiredVersion:"^4.6.4"``, or ``[1,4,6,4]`` in webpack's compact form). JupyterLab
provides one version of each (its ``static/package.json``, ``resolutions``); where the range does
not hold, Lab prints "Unsatisfied version 4.5.11 ... (required ^4.6.4)" in the browser console
for every such package and runs the extension against a package it was not built for. Measured
in headless Chromium with JupyterLab 4.5.11: nbgrader 0.9.6's extension (built for 4.6.4) and
jupyterlab_widgets 3.0.17's (built for 4.6.2) gave 21 such warnings; nbgrader 0.9.5 (^4.3.4) and
jupyterlab_widgets 3.0.16 (^4.4.6) none. So ipywidgets is pinned to 8.1.8 with jupyterlab_widgets
3.0.16. No nbgrader fits Lab 4.5: 0.9.5's extension needs nothing Lab 4.5 lacks at run time, but
declares @jupyter/ydoc 2 (``jupyter labextension list`` marks it incompatible); 0.9.6's is built for
4.6.4. The course uses nbgrader from the command line only, so ``make venv`` disables 0.9.6's
extension (its instructor panels do not appear), but JupyterLab 4.5 still loads a disabled
extension's module, so its 12 warnings remain in the console (measured): this test reports it as
an expected failure (strict: it fails the day the extension fits). This test reads the installed
files, so it checks the venv that ``make venv`` made.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

SHARE = Path(sys.prefix) / "share" / "jupyter"
LAB_STATIC = SHARE / "lab" / "static" / "package.json"
EXTENSIONS = sorted(p.parent.parent for p in (SHARE / "labextensions").glob("**/static/remoteEntry.*.js"))

# shareKey:"pkg",import:null,requiredVersion:"^4.6.4" (webpack 5's long form) and
# ("pkg", false, [1,4,6,4]) (its compact form)
_LONG = re.compile(r'"(@jupyterlab/[\w-]+|@lumino/[\w-]+)"[^{}"]{0,200}?requiredVersion:"\^(\d+)\.(\d+)\.(\d+)"')
_SHORT = re.compile(r'"(@jupyterlab/[\w-]+|@lumino/[\w-]+)",\s*(?:!1|!0|false|true),\s*\[1,(\d+),(\d+),(\d+)\]')


def required(remote_entry: str) -> dict[str, tuple[int, int, int]]:
    """{shared package: the lowest version of its caret range} that an extension's bundle asks for."""
    out = {}
    for rx in (_LONG, _SHORT):
        for name, *v in rx.findall(remote_entry):
            out[name] = max(out.get(name, (0, 0, 0)), tuple(int(x) for x in v))
    return out


def provided() -> dict[str, tuple[int, int, int]]:
    resolutions = json.loads(LAB_STATIC.read_text())["resolutions"]
    return {k: tuple(int(x) for x in re.sub(r"^[~^]", "", v).split("-")[0].split(".")[:3])
            for k, v in resolutions.items() if re.match(r"^[~^]?\d+\.\d+\.\d+", v)}


def unsatisfied(needs: dict, has: dict) -> list[str]:
    """Caret ranges ``^a.b.c`` (same major, at least a.b.c) that the provided versions miss."""
    return [f"{name} ^{'.'.join(map(str, want))} (Lab has {'.'.join(map(str, has[name]))})"
            for name, want in sorted(needs.items())
            if name in has and not (has[name][0] == want[0] and has[name] >= want)]


def disabled() -> set[str]:
    """Extensions disabled in this environment's JupyterLab page config (sys_prefix level)."""
    cfg = Path(sys.prefix) / "etc" / "jupyter" / "labconfig" / "page_config.json"
    entries = json.loads(cfg.read_text()).get("disabledExtensions", {}) if cfg.is_file() else {}
    return {name for name, off in (entries.items() if isinstance(entries, dict) else ((e, True) for e in entries)) if off}


@pytest.mark.skipif(not LAB_STATIC.is_file(), reason="JupyterLab is not installed in this environment")
@pytest.mark.parametrize("ext", EXTENSIONS, ids=[str(e.relative_to(SHARE / "labextensions")) for e in EXTENSIONS])
def test_extension_is_built_for_the_pinned_lab(ext):
    name = json.loads((ext / "package.json").read_text())["name"]
    entry = next((ext / "static").glob("remoteEntry.*.js")).read_text(encoding="utf-8", errors="replace")
    bad = unsatisfied(required(entry), provided())
    if name in disabled() and bad:
        pytest.xfail(f"{name} is disabled (its panels do not appear) but still loaded: it needs {bad}")
    assert not bad, f"{name} was built for another JupyterLab and is enabled: {bad}"


def test_the_reading_finds_a_mismatch():
    """The parser reads both forms, and a range above what Lab provides is reported."""
    entry = ('{shareScope:"default",shareKey:"@jupyterlab/notebook",import:null,requiredVersion:"^4.6.4",strictVersion:!1}'
             ' loadSingletonVersion("default", "@jupyterlab/services", false, [1,7,4,0])')
    needs = required(entry)
    assert needs == {"@jupyterlab/notebook": (4, 6, 4), "@jupyterlab/services": (7, 4, 0)}
    has = {"@jupyterlab/notebook": (4, 5, 11), "@jupyterlab/services": (7, 5, 11)}
    assert unsatisfied(needs, has) == ["@jupyterlab/notebook ^4.6.4 (Lab has 4.5.11)"]
    assert not unsatisfied({"@jupyterlab/notebook": (4, 3, 4)}, has)
    assert unsatisfied({"@jupyterlab/notebook": (3, 6, 0)}, has)     # another major
