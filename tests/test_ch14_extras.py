"""benchmarks/scaling.py (chapter 14's benchmark) runs end to end at tiny sizes.

Speed is not tested here (that is what the benchmark itself reports); these tests check
that one command prints the table, writes the CSV and the plot, and skips naive
attention, saying why, where its (T, T) matrix would not fit in memory.
"""

from __future__ import annotations

import csv
import importlib.util
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def scaling():
    spec = importlib.util.spec_from_file_location("scaling_benchmark", ROOT / "benchmarks" / "scaling.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_table_csv_and_plot(scaling, tmp_path, capsys):
    assert scaling.main(["--sizes", "64", "128", "--repeats", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "matmul ceiling" in out and "tiled peak extra memory" in out
    with open(tmp_path / "scaling.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["T"]) for r in rows] == [64, 128]
    for r in rows:
        T = int(r["T"])
        assert float(r["P_MiB"]) == T * T * 8 / 2**20  # float64 by default
        assert float(r["naive_s"]) > 0 and float(r["tiled_s"]) > 0 and float(r["torch_s"]) > 0
        # naive attention returns P, so it holds at least one (T, T) matrix beyond the output
        assert float(r["naive_MiB"]) >= float(r["P_MiB"])
    assert (tmp_path / "scaling.png").stat().st_size > 10_000


def test_naive_skipped_where_it_cannot_fit(scaling, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(scaling, "memory_bytes", lambda: 100_000)  # a machine with 100 kB of memory
    monkeypatch.setattr(scaling, "torch_child", lambda T, dtype: (math.nan, math.nan))
    assert scaling.main(["--sizes", "128", "--repeats", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "naive skipped: P alone needs" in out
    with open(tmp_path / "scaling.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert math.isnan(float(row["naive_s"])) and float(row["tiled_s"]) > 0
