"""benchmarks/gpu_train_step.py at toy sizes on the CPU: nanoGPT with DecoderLM's weights is the same
function (and a weight left uncopied is caught), a row runs and fills its columns, an error in one
row is reported in that row. No timing is asserted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TOY = dict(B=2, T=16, layers=2, d=32, heads=4, vocab=11)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmarks_gpu_train_step", ROOT / "benchmarks" / "gpu_train_step.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look the module up
    spec.loader.exec_module(mod)
    return mod


def test_nanogpt_with_copied_weights_is_decoderlm(bench):
    ours, ref, name, note = bench.build_pair("decoder", bench.Shape("toy", **TOY))
    assert name == "nanoGPT" and "same function" in note
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    idx = torch.randint(0, 11, (3, 16))
    with torch.no_grad():
        torch.testing.assert_close(ref(idx), ours(idx), atol=1e-5, rtol=0)  # float32 round-off
        ref.h[1].c_fc.bias.add_(0.01)  # one weight not copied: the check sees it
        assert (ref(idx) - ours(idx)).abs().max() > 1e-4


def test_a_row_runs_and_a_failing_row_says_why(bench, monkeypatch):
    row = bench.run_row("decoder", bench.Shape("toy", **TOY), "cpu", warm_up=0, timed=1)
    assert row["book_ms"] > 0 and row["baseline_ms"] > 0 and row["ratio"] > 0, row
    llama = bench.run_row("llama", bench.Shape("toy", **TOY, kv_heads=2, d_ff=48), "cpu", warm_up=0, timed=1)
    assert llama["book_ms"] > 0 and (llama.get("baseline_ms") or "skipped" in llama["note"]), llama
    monkeypatch.setattr(bench, "copy_decoderlm_into_nanogpt", lambda ours, ref: None)  # random nanoGPT weights
    bad = bench.run_row("decoder", bench.Shape("toy", **TOY), "cpu", warm_up=0, timed=1)
    assert bad["note"].startswith("error: AssertionError") and "book_ms" not in bad
    bench.print_table([row, llama, bad], "cpu")
