"""Attention time and memory against T: naive NumPy, tiled NumPy and PyTorch on this CPU.

Run from the repository root::

    python benchmarks/scaling.py           # T = 256 ... 65536; about 5-10 minutes on 2 cores
    python benchmarks/scaling.py --quick   # T = 256, 1024, 4096; under a minute

It prints one table and writes ``_build/benchmarks/scaling.png`` (time and memory
against T, log-log) and ``_build/benchmarks/scaling.csv``. Every row is one head,
``(T, D_K) = (T, 64)``, float64 unless ``--dtype float32``, measured in the same run:

* **naive NumPy**: ``tfbook.numpy.scaled_dot_product_attention``, which returns (so
  holds) the ``(T, T)`` weight matrix ``P``. Skipped, with the reason printed, where
  ``P`` alone would not fit in this machine's memory (at T = 65536 in float64 it
  needs 32 GiB).
* **tiled NumPy**: ``tfbook.numpy.tiled_attention``: the online softmax over key
  blocks; never holds a ``(T, T)`` matrix.
* **PyTorch**: ``torch.nn.functional.scaled_dot_product_attention`` on
  ``(1, 1, T, D_K)``, PyTorch's own (fused, tiled) CPU kernel.

Time is the median wall-clock time of a few calls (one call for T > 4096) with
every core in use, as a user would run it; GFLOP/s counts the two matrix products,
``4 T^2 D_K`` FLOPs. The ceiling is the machine's own matrix-product rate, a large
square ``np.matmul`` and ``torch.matmul`` in the same dtype: attention cannot beat
it. Peak extra memory leaves out the inputs and the output ``Z`` (``T x D_V``, which
every method must return): for NumPy it is measured with ``tracemalloc`` (for the tiled
version above T = 16384 on the first few query blocks against all keys, as each worker
holds one query block at a time); for PyTorch
(whose allocations ``tracemalloc`` cannot see) it is the rise of the peak resident
memory of a fresh process (Linux only; ``n/a`` elsewhere).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import torch

import tfbook.numpy as tnp

ROOT = Path(__file__).resolve().parents[1]
D_K = 64
MiB = 2**20


def median_seconds(fn, repeats: int, warm_up: bool = True) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` calls, after an untimed warm-up call
    (first calls allocate buffers and start thread pools)."""
    if warm_up:
        fn()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_ceiling(dtype: str, n: int = 2048, repeats: int = 3) -> tuple[float, float]:
    """GFLOP/s of a square ``(n, n) @ (n, n)`` product in NumPy and in PyTorch (``2 n^3`` FLOPs)."""
    g = np.random.default_rng(0)
    a, b = (g.standard_normal((n, n)).astype(dtype) for _ in range(2))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    flops = 2 * n**3
    return (flops / median_seconds(lambda: a @ b, repeats) / 1e9,
            flops / median_seconds(lambda: ta @ tb, repeats) / 1e9)


def numpy_peak_extra(fn, output_bytes: int) -> tuple[float, int]:
    """(seconds, peak bytes beyond what existed before, minus ``output_bytes``) of one call."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del result
    return seconds, peak - before - output_bytes


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _torch_child(T: int, dtype: str) -> None:
    """In a fresh process: print the seconds of one torch call and the rise of peak resident
    memory during it (output excluded)."""
    torch.set_num_threads(os.cpu_count() or 1)
    g = torch.Generator().manual_seed(T)
    Q, K, V = (torch.randn(1, 1, T, D_K, generator=g, dtype=getattr(torch, dtype)) for _ in range(3))
    torch.nn.functional.scaled_dot_product_attention(Q[..., :64, :], K[..., :64, :], V[..., :64, :])  # load kernels
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak resident set (VmHWM) to the current one
    before = _status_kib("VmRSS")
    t0 = time.perf_counter()
    with torch.inference_mode():
        Z = torch.nn.functional.scaled_dot_product_attention(Q, K, V)
    seconds = time.perf_counter() - t0
    peak = _status_kib("VmHWM")
    print(seconds, (peak - before) * 1024 - Z.numel() * Z.element_size())


def torch_child(T: int, dtype: str) -> tuple[float, float]:
    """(seconds, peak extra bytes) of one torch call in a fresh process; NaNs where unsupported."""
    if not Path("/proc/self/clear_refs").exists():
        return float("nan"), float("nan")
    try:
        out = subprocess.run([sys.executable, __file__, "--torch-child", str(T), "--dtype", dtype],
                             capture_output=True, text=True, timeout=3600, check=True)
        seconds, extra = out.stdout.split()[-2:]
        return float(seconds), max(0.0, float(extra))
    except (subprocess.SubprocessError, ValueError, OSError):
        return float("nan"), float("nan")


def memory_bytes() -> int:
    """Physical memory of this machine in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def measure(T: int, dtype: str, block_size: int, repeats: int, ram: int) -> dict:
    g = np.random.default_rng(T)
    Q, K, V = (g.standard_normal((T, D_K)).astype(dtype) for _ in range(3))
    itemsize = np.dtype(dtype).itemsize
    z_bytes = T * D_K * itemsize
    reps = repeats if T <= 4096 else 1
    row = {"T": T, "P_MiB": T * T * itemsize / MiB}

    def time_and_memory(fn, traced_fn=None):
        """(seconds, peak extra bytes): memory from one traced call, time from untraced calls
        (tracemalloc serialises the worker threads' allocations, so a traced call is slower)."""
        _, extra = numpy_peak_extra(traced_fn or fn, z_bytes)  # also the warm-up
        return median_seconds(fn, reps, warm_up=False), extra

    def tiled():
        return tnp.tiled_attention(Q, K, V, block_size=block_size)

    def naive():
        return tnp.scaled_dot_product_attention(Q, K, V)

    # Above T = 16384 the traced call runs on the first few query blocks only, against all T keys:
    # each worker thread holds one query block at a time, so the peak does not depend on T_q.
    q_rows = min(T, 4 * (os.cpu_count() or 1) * block_size)

    def tiled_few_queries():
        return tnp.tiled_attention(Q[:q_rows], K, V, block_size=block_size)

    row["tiled_s"], extra = time_and_memory(tiled, tiled_few_queries if T > 16384 else None)
    if T > 16384:
        extra -= (q_rows - T) * D_K * itemsize  # z_bytes assumed T output rows; this call made q_rows
    row["tiled_MiB"] = extra / MiB

    # naive NumPy: only where P (plus a margin for the rest) fits in memory
    need = T * T * itemsize
    if need * 1.25 < 0.8 * ram:
        row["naive_s"], extra = time_and_memory(naive)
        row["naive_MiB"] = extra / MiB
        if T <= 4096:  # the two agree, so the timings compare the same computation
            err = np.abs(naive()[0] - tiled()).max()
            tol = 1e-12 if dtype == "float64" else 1e-5  # round-off of two summation orders
            assert err < tol, f"tiled and naive attention disagree at T={T}: {err:.2e}"
        row["naive_note"] = ""
    else:
        row["naive_s"] = row["naive_MiB"] = float("nan")
        row["naive_note"] = f"P alone needs {need / 2**30:.1f} GiB; this machine has {ram / 2**30:.1f} GiB"

    # PyTorch, fused kernel
    # (memory, and above T = 4096 the single timed call too, in a fresh process)
    child_s, child_bytes = torch_child(T, dtype)
    row["torch_MiB"] = child_bytes / MiB
    if T > 4096 and math.isfinite(child_s):
        row["torch_s"] = child_s
    else:
        tQ, tK, tV = (torch.from_numpy(x).view(1, 1, T, D_K) for x in (Q, K, V))
        with torch.inference_mode():
            row["torch_s"] = median_seconds(
                lambda: torch.nn.functional.scaled_dot_product_attention(tQ, tK, tV), reps, warm_up=T <= 4096)
    return row


def fmt(x, spec):
    return f"{'-':>{len(format(1.0, spec))}}" if x is None or (isinstance(x, float) and math.isnan(x)) \
        else format(x, spec)


def plot(rows, ceiling, dtype, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T = np.array([r["T"] for r in rows], dtype=float)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    style = {"naive": ("tab:orange", "o", "naive NumPy"), "tiled": ("tab:red", "s", "tiled NumPy"),
             "torch": ("tab:blue", "^", "PyTorch F.scaled_dot_product_attention")}
    for key, (color, marker, label) in style.items():
        t = np.array([r[f"{key}_s"] for r in rows], dtype=float)
        m = np.array([r[f"{key}_MiB"] for r in rows], dtype=float)
        ok = np.isfinite(t)
        ax1.loglog(T[ok], t[ok], marker + "-", color=color, label=label)
        ok = np.isfinite(m)
        ax2.loglog(T[ok], np.maximum(m[ok], 1e-2), marker + "-", color=color, label=label)
    best = max(ceiling)
    ax1.loglog(T, 4 * T**2 * D_K / (best * 1e9), "k--", lw=1,
               label=f"at the matmul ceiling ({best:.0f} GFLOP/s)")
    ax1.set_xlabel("sequence length T (tokens)")
    ax1.set_ylabel("time per call (s)")
    ax1.set_title(f"Attention time against T (one head, D_K = {D_K}, {dtype})")
    ax1.legend(fontsize=8)
    ax2.loglog(T, T**2 * np.dtype(dtype).itemsize / MiB, "k--", lw=1, label="one T x T matrix")
    ax2.set_xlabel("sequence length T (tokens)")
    ax2.set_ylabel("peak extra memory (MiB, output excluded)")
    ax2.set_title("Peak extra memory against T")
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.set_xticks(T, [str(int(t)) for t in T])
        ax.minorticks_off()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="T = 256, 1024, 4096 only")
    ap.add_argument("--sizes", type=int, nargs="+", help="the lengths T to measure (overrides --quick)")
    ap.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    ap.add_argument("--block-size", type=int, default=256, help="tile size of tiled_attention (default 256)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per size up to T = 4096")
    ap.add_argument("--out", type=Path, default=ROOT / "_build" / "benchmarks", help="folder for the plot and CSV")
    ap.add_argument("--torch-child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.torch_child:
        _torch_child(args.torch_child, args.dtype)
        return 0

    sizes = args.sizes or ([256, 1024, 4096] if args.quick else [256, 1024, 4096, 16384, 65536])
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    ram = memory_bytes()
    print(f"torch {torch.__version__}, numpy {np.__version__}; {cores} cores, {ram / 2**30:.1f} GiB; "
          f"one head, D_K = {D_K}, {args.dtype}; tiled block_size = {args.block_size}")
    ceiling = matmul_ceiling(args.dtype, n=1024 if args.sizes else 2048)
    print(f"matmul ceiling ({args.dtype}, square product, all cores): np.matmul {ceiling[0]:.1f} GFLOP/s, "
          f"torch.matmul {ceiling[1]:.1f} GFLOP/s")
    print(f"time: median of {args.repeats} calls up to T = 4096, one call above; GFLOP/s from 4 T^2 D_K; "
          "memory: peak extra MiB, output excluded")

    head = (f"{'T':>6} | {'naive s':>8} {'tiled s':>8} {'torch s':>8} {'tiled/naive':>11} | "
            f"{'naive GF/s':>10} {'tiled GF/s':>10} {'torch GF/s':>10} | "
            f"{'naive MiB':>10} {'tiled MiB':>9} {'torch MiB':>9} {'P alone MiB':>11}")
    print(head)
    print("-" * len(head))
    rows = []
    for T in sizes:
        r = measure(T, args.dtype, args.block_size, args.repeats, ram)
        rows.append(r)
        flops = 4 * T * T * D_K
        ratio = r["tiled_s"] / r["naive_s"] if np.isfinite(r["naive_s"]) else float("nan")
        print(f"{T:>6} | {fmt(r['naive_s'], '8.3f')} {r['tiled_s']:8.3f} {r['torch_s']:8.3f} {fmt(ratio, '11.2f')} | "
              f"{fmt(flops / r['naive_s'] / 1e9, '10.1f')} {flops / r['tiled_s'] / 1e9:10.1f} "
              f"{flops / r['torch_s'] / 1e9:10.1f} | {fmt(r['naive_MiB'], '10.1f')} {r['tiled_MiB']:9.2f} "
              f"{fmt(r['torch_MiB'], '9.2f')} {r['P_MiB']:11.1f}"
              + (f"   naive skipped: {r['naive_note']}" if r["naive_note"] else ""), flush=True)

    print()
    by_T = {r["T"]: r for r in rows}
    if 4096 in by_T and np.isfinite(by_T[4096]["naive_s"]):
        ratio = by_T[4096]["tiled_s"] / by_T[4096]["naive_s"]
        print(f"tiled / naive time at T = 4096: {ratio:.2f} (target <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'})")
    for r in rows:
        if r["naive_note"]:
            print(f"T = {r['T']}: tiled NumPy ran in {r['tiled_s']:.1f} s with {r['tiled_MiB']:.2f} MiB extra; "
                  f"naive skipped ({r['naive_note']})")
    if any(T > 16384 for T in sizes):
        print(f"(tiled memory above T = 16384: one traced call on the first {4 * cores * args.block_size} query "
              "rows against all T keys; each worker holds one query block at a time)")
    tiled = [r["tiled_MiB"] for r in rows]
    print(f"tiled peak extra memory over T = {sizes[0]} ... {sizes[-1]}: {min(tiled):.2f} to {max(tiled):.2f} MiB "
          f"while one T x T matrix grows {rows[-1]['P_MiB'] / rows[0]['P_MiB']:.0f}-fold")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scaling.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot(rows, ceiling, args.dtype, out / "scaling.png")
    print(f"wrote {out / 'scaling.png'} and {out / 'scaling.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
