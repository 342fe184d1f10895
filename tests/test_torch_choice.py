"""Issue 25 item 1: which PyTorch build `make venv` installs (tools/torch_choice.py), the Python
floor, and the reader's requirements. The decision is tested, never the download: nothing here
contacts a package index."""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "torch_choice.py"
spec = importlib.util.spec_from_file_location("torch_choice", TOOL)
tc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tc)
PIN = "torch==2.13.0"


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s#;]+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


@pytest.mark.parametrize("variant, gpu, system, expected", [
    ("default", None, "Linux", []),                      # CI and the project's machines: nothing changes
    ("default", True, "Linux", []),
    ("auto", False, "Linux", ["--index-url", tc.CPU_INDEX, PIN]),   # no GPU: the CPU build (index reachable)
    ("auto", True, "Linux", []),                         # a GPU: PyPI's wheel, the CUDA build
    ("auto", False, "Darwin", []),                       # PyPI's macOS wheel is the CPU build
    ("cpu", None, "Linux", ["--index-url", tc.CPU_INDEX, PIN]),
    ("cpu", None, "Windows", []),
    ("cuda", None, "Linux", []),
])
def test_decision(variant, gpu, system, expected):
    args, why = tc.choose(variant, gpu=gpu, system=system, torch_pin=PIN)
    assert args == expected, why
    assert why.startswith(f"TORCH_VARIANT={variant}")


def test_auto_falls_back_to_default_where_the_cpu_index_is_unreachable():
    """make venv's default is auto; on a machine that cannot reach PyTorch's index (CI's
    mirror-only network) it must install from pip's configured index, not leave pip retrying."""
    args, why = tc.choose("auto", gpu=False, system="Linux", torch_pin=PIN, reachable=False)
    assert args == [] and "cannot be reached" in why
    # an explicit cpu is what the user asked for: kept
    assert tc.choose("cpu", gpu=None, system="Linux", torch_pin=PIN, reachable=False)[0][-1] == PIN


def test_index_probe_can_be_answered_without_the_network(monkeypatch):
    monkeypatch.setenv("TFBOOK_TORCH_INDEX_REACHABLE", "0")
    assert tc.index_reachable() is False
    monkeypatch.setenv("TFBOOK_TORCH_INDEX_REACHABLE", "1")
    assert tc.index_reachable() is True


def test_cuda_where_pypi_has_none_and_unknown_variants_are_refused():
    with pytest.raises(ValueError, match="no CUDA build of torch on PyPI for Darwin"):
        tc.choose("cuda", gpu=None, system="Darwin", torch_pin=PIN)
    with pytest.raises(ValueError, match="TORCH_VARIANT='gpu'"):
        tc.choose("gpu", gpu=None, system="Linux", torch_pin=PIN)


def test_the_pin_is_read_from_requirements(tmp_path):
    assert tc.pinned_torch() == f"torch=={_pins(ROOT / 'requirements.txt')['torch']}"
    req = tmp_path / "r.txt"
    req.write_text("numpy==1\ntorch == 9.9.9  # comment\n")
    assert tc.pinned_torch(req) == "torch==9.9.9"


def _fake_nvidia_smi(folder: Path, *, ok: bool, marker: Path) -> None:
    exe = folder / "nvidia-smi"
    out = "GPU 0: NVIDIA H100 (UUID: GPU-0)" if ok else ""
    exe.write_text(f"#!/bin/sh\ntouch {marker}\necho '{out}'\nexit {0 if ok else 9}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("variant, gpu_ok, reachable, expect_probe, expected", [
    (None, True, "1", True, ""),      # TORCH_VARIANT unset: auto, a GPU: PyPI's wheel
    (None, False, "1", True, f"--index-url {tc.CPU_INDEX} {PIN}"),   # unset, no GPU: the CPU build
    (None, False, "0", True, ""),     # unset, no GPU, index unreachable: as default
    ("default", False, "1", False, ""),
    ("auto", True, "1", True, ""),
    ("auto", False, "1", True, f"--index-url {tc.CPU_INDEX} {PIN}"),
    ("cpu", True, "0", False, f"--index-url {tc.CPU_INDEX} {PIN}"),
])
def test_command_line_detects_only_when_asked(tmp_path, variant, gpu_ok, reachable, expect_probe, expected):
    if sys.platform != "linux":
        pytest.skip("the CPU index route is Linux's")
    marker = tmp_path / "probed"
    _fake_nvidia_smi(tmp_path, ok=gpu_ok, marker=marker)
    env = {k: v for k, v in os.environ.items() if k != "TORCH_VARIANT"}
    env["PATH"] = f"{tmp_path}{os.pathsep}{env.get('PATH', '')}"
    env["TFBOOK_TORCH_INDEX_REACHABLE"] = reachable
    if variant is not None:
        env["TORCH_VARIANT"] = variant
    out = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected.replace("2.13.0", _pins(ROOT / "requirements.txt")["torch"])
    assert marker.exists() == expect_probe
    assert "torch_choice: TORCH_VARIANT=" in out.stderr


def test_makefile_venv_uses_the_choice_and_checks_the_floor():
    text = (ROOT / "Makefile").read_text()
    assert re.search(r"^TORCH_VARIANT \?= auto$", text, flags=re.M)
    dry = subprocess.run(["make", "-n", "-B", "venv"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    steps = dry.stdout
    choice = steps.index("tools/torch_choice.py")
    assert steps.index("sys.version_info >= (3, 11)") < steps.index("-m venv") < choice
    assert choice < steps.index("pip install --quiet -r requirements.txt")
    assert "TORCH_VARIANT=auto" in steps
    assert "TORCH_VARIANT=default" in subprocess.run(["make", "-n", "-B", "venv", "TORCH_VARIANT=default"], cwd=ROOT,
                                                  capture_output=True, text=True, timeout=60).stdout


def test_old_python_is_refused_with_a_hint(tmp_path):
    """The floor check of the venv rule, run with a stand-in 'python' that reports 3.10."""
    fake = tmp_path / "python3.10"
    fake.write_text("#!/bin/sh\ncase \"$1\" in -V) echo 'Python 3.10.14';; *) exit 1;; esac\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    work = tmp_path / "w"
    work.mkdir()
    for name in ("Makefile", "requirements.txt", "pyproject.toml"):
        (work / name).write_bytes((ROOT / name).read_bytes())
    (work / "tools").mkdir()
    (work / "tools" / "torch_choice.py").write_bytes(TOOL.read_bytes())
    out = subprocess.run(["make", "venv", f"PYTHON={fake}"], cwd=work, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "needs Python >= 3.11" in out.stderr and "Python 3.10.14" in out.stderr
    assert "PYTHON=python3.12" in out.stderr
    assert not (work / ".venv").exists()


def test_requires_python_is_the_floor():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^requires-python = ">=3\.11"$', text, flags=re.M)


def test_reader_requirements_are_a_subset_with_the_same_pins():
    full, reader = _pins(ROOT / "requirements.txt"), _pins(ROOT / "requirements-reader.txt")
    assert reader and all(full.get(k) == v for k, v in reader.items()), \
        {k: (v, full.get(k)) for k, v in reader.items() if full.get(k) != v}
    # no test, build or grading tools
    assert not set(reader) & {"pytest", "pytest-xdist", "nbval", "hypothesis", "jupyter-book", "nbgrader",
                              "websocket-client", "sphinx-book-theme", "myst-nb"}
    # everything the package and the chapters need at run time is there
    assert {"torch", "numpy", "matplotlib", "scipy", "threadpoolctl", "tqdm", "scikit-learn",
            "ipykernel", "ipywidgets", "jupyterlab", "jupyterlab-myst"} <= set(reader)
