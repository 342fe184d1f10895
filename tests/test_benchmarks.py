"""benchmarks/run.py at toy sizes: every variant computes the reference's Z, the two training
models are the same architecture, and one command writes the CSV (with the machine) and the plot.

No timing is asserted: speed is what the benchmark reports, not what a test can promise.
"""

from __future__ import annotations

import csv
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import tfbook.numpy as tnp
from tfbook.torch.modules import EncoderBlock

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmarks_run", ROOT / "benchmarks" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("T_q,T_k", [(1, 1), (37, 37), (300, 517)])
def test_every_variant_equals_the_reference(bench, T_q, T_k):
    g = np.random.default_rng(T_q)
    Q, K, V = 3 * g.standard_normal((T_q, 64)), g.standard_normal((T_k, 64)), g.standard_normal((T_k, 64))
    outs = bench.attention_outputs(Q, K, V, block_size=64)
    assert set(outs) == set(bench.VARIANTS)
    Z_ref, _ = tnp.scaled_dot_product_attention(Q, K, V)
    for name, Z in outs.items():
        np.testing.assert_allclose(Z, Z_ref, rtol=0, atol=1e-12, err_msg=name)  # float64 round-off


def test_attention_rows_fields_and_agreement(bench):
    rows = bench.attention_rows(512, repeats=1, torch_memory=False, block_size=64, dtype=np.float64)
    assert [r["variant"] for r in rows] == list(bench.VARIANTS)
    for r in rows:
        assert set(r) <= set(bench.FIELDS)
        assert r["seconds"] > 0 and r["gflops"] > 0
        assert r["max_abs_err"] < 1e-12  # float64 round-off against the reference
    mem = {r["variant"]: r["peak_extra_MiB"] for r in rows}
    P = 512 * 512 * 8 / 2**20
    assert mem["reference"] >= 3 * P  # S, S - max and exp(S - max) at once
    assert P <= mem["blocked"] < mem["reference"]  # P itself, plus a few blocks
    assert mem["tiled"] < P


def test_variants_skipped_where_they_cannot_fit(bench):
    rows = bench.attention_rows(128, repeats=1, ram=100_000, torch_memory=False)  # a 100 kB machine
    by = {r["variant"]: r for r in rows}
    for v in ("reference", "blocked"):
        assert math.isnan(by[v]["seconds"]) and "skipped" in by[v]["note"] and "would need" in by[v]["note"]
    assert by["tiled"]["seconds"] > 0 and by["torch"]["seconds"] > 0


def test_training_models_are_the_same_architecture(bench):
    ours, theirs = bench.train_models(2, 16, 64, 2)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    # copy PyTorch's weights into DecoderLM: the logits must agree, so the two differ only in code
    ours, theirs = ours.double(), theirs.double()
    with torch.no_grad():
        ours.W_E.copy_(theirs.W_E)
        ours.pos.weight.copy_(theirs.pos)
        for i, layer in enumerate(theirs.layers):
            # weights only: ours keeps its own configuration (Pre-LN, GELU), which must be theirs too
            ours.blocks[i].load_state_dict(EncoderBlock.from_torch(layer).state_dict())
        ours.norm.gamma.copy_(theirs.norm.weight)
        ours.norm.beta.copy_(theirs.norm.bias)
        idx = torch.randint(0, bench.VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(ours(idx), theirs(idx), rtol=0, atol=1e-10)  # float64 round-off, 2 layers


def test_train_step_rows(bench):
    rows = bench.train_step_rows(2, 8, 64, 1, steps=1, warm_up=0)
    assert [r["variant"] for r in rows] == ["tfbook DecoderLM", "nn.TransformerEncoderLayer LM"]
    assert rows[0]["params"] == rows[1]["params"] > 0
    assert rows[0]["ratio"] == pytest.approx(rows[0]["seconds"] / rows[1]["seconds"])


def test_main_writes_csv_with_machine_and_plot(bench, tmp_path, capsys):
    out = tmp_path / "toy.csv"
    assert bench.main(["--sizes", "64", "--train-shapes", "2,8,64,1", "--out", str(out),
                       "--plots", str(tmp_path), "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert "matmul ceiling" in printed and "attention against T" in printed and "training step" in printed
    with open(out, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == bench.FIELDS
        rows = list(reader)
    assert {r["benchmark"] for r in rows} == {"matmul", "attention", "train_step"}
    assert {r["variant"] for r in rows if r["benchmark"] == "attention"} == set(bench.VARIANTS)
    assert all(r["machine"] and "cores" in r["machine"] and "numpy" in r["machine"] for r in rows)
    assert all(float(r["max_abs_err"]) < 1e-5 for r in rows if r["benchmark"] == "attention")  # float32
    assert (tmp_path / "attention.png").stat().st_size > 10_000
