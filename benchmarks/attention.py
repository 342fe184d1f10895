"""Attention forward: tfbook.numpy against PyTorch on this CPU, and the memory of tiled attention.

Run: ``python benchmarks/attention.py`` (about 1-2 minutes on 2 cores) or with
``--quick`` for a smaller run. Prints plain-text tables:

1. the machine's matmul ceiling (a large float32 ``np.matmul`` and ``torch.matmul``);
2. forward time of ``tfbook.numpy.scaled_dot_product_attention`` (which also returns
   ``P``) and ``torch.nn.functional.scaled_dot_product_attention`` at
   ``(B, H, T, D_K) = (4, 8, T, 64)`` float32, median of a few repeats, with the
   achieved GFLOP/s counting only the two matrix products, ``4 B H T^2 D_K`` FLOPs;
3. the peak extra memory (tracemalloc) of NumPy ``tiled_attention`` against naive
   NumPy attention for one head.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import tracemalloc

import numpy as np
import torch

import tfbook.numpy as tnp

B, H, D_K = 4, 8, 64


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up: allocations, thread pools, BLAS buffers
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_ceiling(n: int, repeats: int) -> tuple[float, float]:
    g = np.random.default_rng(0)
    a, b = g.standard_normal((n, n), dtype=np.float32), g.standard_normal((n, n), dtype=np.float32)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    flops = 2 * n**3
    t_np = median_time(lambda: np.matmul(a, b), repeats)
    t_t = median_time(lambda: torch.matmul(ta, tb), repeats)
    return flops / t_np / 1e9, flops / t_t / 1e9


def attention_times(T: int, repeats: int) -> tuple[float, float]:
    g = np.random.default_rng(T)
    Q, K, V = (g.standard_normal((B, H, T, D_K), dtype=np.float32) for _ in range(3))
    tQ, tK, tV = (torch.from_numpy(x) for x in (Q, K, V))
    with torch.inference_mode():
        t_torch = median_time(lambda: torch.nn.functional.scaled_dot_product_attention(tQ, tK, tV), repeats)
    t_np = median_time(lambda: tnp.scaled_dot_product_attention(Q, K, V), repeats)
    # the two agree (float32 round-off), so the timings compare the same computation
    Z, _ = tnp.scaled_dot_product_attention(Q[:1, :1], K[:1, :1], V[:1, :1])
    ref = torch.nn.functional.scaled_dot_product_attention(tQ[:1, :1], tK[:1, :1], tV[:1, :1]).numpy()
    assert np.abs(Z - ref).max() < 1e-4, "NumPy and torch attention disagree"
    return t_np, t_torch


def peak_extra_bytes(fn) -> int:
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    out = fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del out
    return peak - base


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    args = ap.parse_args(argv)

    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    Ts = (256, 1024) if args.quick else (256, 1024, 4096)
    repeats = 3 if args.quick else 5
    mem_Ts = (1024, 4096) if args.quick else (1024, 4096, 16384)

    print(f"torch {torch.__version__}, numpy {np.__version__}; torch threads set to the core count: "
          f"{torch.get_num_threads()} (os.cpu_count() = {cores})")
    n = 2048 if args.quick else 4096
    g_np, g_t = matmul_ceiling(n, 3)
    print(f"\nmatmul ceiling, float32 ({n} x {n}) @ ({n} x {n}), 2 n^3 FLOPs:")
    print(f"  np.matmul    {g_np:8.1f} GFLOP/s")
    print(f"  torch.matmul {g_t:8.1f} GFLOP/s")

    print(f"\nattention forward, (B, H, T, D_K) = ({B}, {H}, T, {D_K}) float32, median of {repeats}; "
          f"GFLOP/s from 4*B*H*T^2*D_K (QK^T and PV)")
    print(f"{'T':>6} {'numpy ms':>10} {'torch ms':>10} {'np/torch':>9} {'numpy GFLOP/s':>14} {'torch GFLOP/s':>14}")
    ratio_1024 = None
    for T in Ts:
        reps = repeats if T <= 1024 else 3
        t_np, t_t = attention_times(T, reps)
        flops = 4 * B * H * T * T * D_K
        ratio = t_np / t_t
        if T == 1024:
            ratio_1024 = ratio
        print(f"{T:>6} {t_np * 1e3:>10.1f} {t_t * 1e3:>10.1f} {ratio:>9.2f} {flops / t_np / 1e9:>14.1f} "
              f"{flops / t_t / 1e9:>14.1f}")
    print(f"ratio numpy/torch at T=1024: {ratio_1024:.2f} (target <= 2; numpy also returns P, "
          f"{B * H * 1024 * 1024 * 4 / 2**20:.0f} MiB)")

    print("\npeak extra memory (tracemalloc), one head, D_K = 64, float32, output included:")
    print(f"{'T':>6} {'naive MiB':>10} {'tiled MiB':>10} {'S alone MiB':>12} {'tiled s':>8}")
    g = np.random.default_rng(0)
    for T in mem_Ts:
        Q, K, V = (g.standard_normal((T, D_K), dtype=np.float32) for _ in range(3))
        t0 = time.perf_counter()
        tiled = peak_extra_bytes(lambda: tnp.tiled_attention(Q, K, V, block_size=128))
        t_tiled = time.perf_counter() - t0
        s_mib = T * T * 4 / 2**20
        if T <= 4096:
            naive = f"{peak_extra_bytes(lambda: tnp.scaled_dot_product_attention(Q, K, V)) / 2**20:10.1f}"
        else:
            naive = f"{'skipped':>10}"
        print(f"{T:>6} {naive} {tiled / 2**20:>10.1f} {s_mib:>12.0f} {t_tiled:>8.2f}")
    if 16384 in mem_Ts:
        print("naive at T=16384 skipped: S alone would need 1 GiB (and P another 1 GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
