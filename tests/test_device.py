"""tfbook.device(): the order of preference, the TFBOOK_DEVICE override and its errors.

No GPU is needed: the availability of CUDA and MPS is simulated by patching the two
functions PyTorch answers it with, so every branch runs on any machine (the device
fixture of conftest.py runs the numerical tests on the real devices where present).
"""

from __future__ import annotations

import pytest
import torch

import tfbook


@pytest.fixture
def machine(monkeypatch):
    """Pretend this machine has the given device types (CPU is always there)."""
    monkeypatch.delenv(tfbook.DEVICE_ENV, raising=False)

    def have(*types):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: "cuda" in types)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: "mps" in types)

    return have


@pytest.mark.parametrize("present, best", [((), "cpu"), (("mps",), "mps"), (("cuda",), "cuda"),
                                           (("cuda", "mps"), "cuda")])
def test_best_available_first(machine, present, best):
    machine(*present)
    assert tfbook.device() == torch.device(best)


@pytest.mark.parametrize("present", [(), ("cuda",), ("mps",), ("cuda", "mps")])
def test_environment_variable_overrides_the_choice(machine, monkeypatch, present):
    machine(*present)
    monkeypatch.setenv("TFBOOK_DEVICE", "cpu")
    assert tfbook.device() == torch.device("cpu")
    monkeypatch.setenv("TFBOOK_DEVICE", " CPU ")              # case and spaces forgiven
    assert tfbook.device() == torch.device("cpu")


def test_environment_variable_picks_a_present_gpu(machine, monkeypatch):
    machine("cuda", "mps")
    monkeypatch.setenv("TFBOOK_DEVICE", "mps")
    assert tfbook.device() == torch.device("mps")


def test_empty_environment_variable_is_ignored(machine, monkeypatch):
    machine("mps")
    monkeypatch.setenv("TFBOOK_DEVICE", "")
    assert tfbook.device() == torch.device("mps")


def test_argument_wins_over_the_environment(machine, monkeypatch):
    machine("cuda")
    monkeypatch.setenv("TFBOOK_DEVICE", "cuda")
    assert tfbook.device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("value, message", [
    ("cuda", r"environment variable TFBOOK_DEVICE='cuda' is not available here \(available: \['cpu'\]\)"),
    ("gpu", r"TFBOOK_DEVICE='gpu' is not a device type; use one of \['cpu', 'cuda', 'mps'\]"),
])
def test_bad_environment_variable_is_a_clear_error(machine, monkeypatch, value, message):
    machine()
    monkeypatch.setenv("TFBOOK_DEVICE", value)
    with pytest.raises(ValueError, match=message):
        tfbook.device()


def test_bad_argument_is_a_clear_error(machine):
    machine()
    with pytest.raises(ValueError, match=r"prefer='mps' is not available here"):
        tfbook.device("mps")
    with pytest.raises(ValueError, match=r"prefer='tpu' is not a device type"):
        tfbook.device("tpu")
