"""Issue 38: the reader's environment check, ``python -m tfbook.doctor``."""

from __future__ import annotations

import json
import subprocess
import sys

import tfbook.doctor as doctor


def test_doctor_runs_and_says_ready_here():
    out = subprocess.run([sys.executable, "-m", "tfbook.doctor"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PyTorch build" in out.stdout and "ready to run the book" in out.stdout


def test_doctor_json_rows():
    out = subprocess.run([sys.executable, "-m", "tfbook.doctor", "--json"], capture_output=True, text=True,
                         timeout=120)
    rows = json.loads(out.stdout)
    assert {r["what"] for r in rows} >= {"Python", "torch", "numpy", "PyTorch build", "devices", "threads", "7zz"}
    assert all(r["status"] in (doctor.OK, doctor.WARN, doctor.FAIL) for r in rows)


def test_missing_or_other_versions_are_reported(monkeypatch):
    """A missing NumPy is a failure (exit 1); another torch version a warning naming the pin."""
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda n: None if n == "numpy" else
                        ("9.9.9" if n == "torch" else real(n)))
    rows = {r["what"]: r for r in doctor.checks()}
    assert rows["numpy"]["status"] == doctor.FAIL and "requirements-reader.txt" in rows["numpy"]["advice"]
    assert rows["torch"]["status"] == doctor.WARN and "pins" in rows["torch"]["found"]
    assert doctor.main([]) == 1
