"""The book's benchmarks on this machine: every table in one run.

Run from the repository root::

    python benchmarks/run.py            # the full run: about 80 s on an idle 2-core machine, minutes on a busy one
    python benchmarks/run.py --quick    # small sizes, under a minute

It prints three tables and writes one CSV row per measurement to
``benchmarks/results/<machine>.csv`` (``--out`` to choose the file; every row carries a
description of the machine: CPU, cores, memory, torch, numpy and BLAS versions) and a
plot to ``_build/benchmarks/attention.png``:

1. **matmul ceiling**: GFLOP/s of a large square float32 ``np.matmul`` and
   ``torch.matmul`` (``2 n^3`` FLOPs), the rate no attention can beat.
2. **attention against T**, one head, ``D_K = D_V = 64``, float32, four ways that
   compute the same ``Z``:

   * ``reference``: ``tfbook.numpy.scaled_dot_product_attention``, the equation written
     out; holds three ``T x T`` arrays at its peak.
   * ``blocked``: ``tfbook.numpy.blocked_attention``, the same result ``(Z, P)`` by query
     blocks kept in cache, on a thread pool; holds ``P`` plus a few blocks.
   * ``tiled``: ``tfbook.numpy.tiled_attention``, the online softmax; returns ``Z`` only
     and never holds a ``T x T`` array.
   * ``torch``: ``torch.nn.functional.scaled_dot_product_attention`` on ``(1, 1, T, 64)``,
     PyTorch's fused CPU kernel.

   Time is the median wall-clock time of a few calls (one call above T = 4096) with every
   core in use; GFLOP/s counts the two matrix products, ``4 T^2 D_K``. Peak extra memory
   is :func:`tfbook.measure.peak_extra_bytes`: the most bytes held at once beyond what
   existed before the call, *including the result* (``Z``, and ``P`` for the reference and
   blocked). For PyTorch, whose allocations ``tracemalloc`` cannot see, it is the rise of
   the peak resident memory of a fresh process (Linux only). A variant is skipped, with
   the reason, where its ``T x T`` arrays would not fit in half this machine's memory.
   Every variant's ``Z`` is compared with the reference up to T = 4096.
3. **a training step**: ``tfbook.torch.models.DecoderLM`` against an LM of the same
   shape and parameter count built from PyTorch's own ``nn.TransformerEncoderLayer``
   (Pre-LN, GELU, causal mask with ``is_causal=True``, so its attention is fused):
   forward, backward and an AdamW step, median of several steps after warm-up, the two
   models alternating step by step in the same process.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks._common import cpu_name  # noqa: E402
import tfbook.numpy as tnp  # noqa: E402
from tfbook.measure import median_seconds, peak_extra_bytes, threads  # noqa: E402
from tfbook.torch.models import DecoderLM, DecoderLMConfig, num_params  # noqa: E402

D_K = 64
MiB = 2**20
VARIANTS = ("reference", "blocked", "tiled", "torch")
FIELDS = ["benchmark", "variant", "shape", "T", "dtype", "seconds", "gflops", "peak_extra_MiB",
          "max_abs_err", "params", "ratio", "note", "machine"]
# training-step shapes: (B, T, D, layers); heads H = D / 64, D_ff = 4 D, vocabulary 65 (characters)
TRAIN_SHAPES_FULL = [(16, 256, 256, 4), (8, 512, 256, 4), (32, 128, 256, 4)]
TRAIN_SHAPES_QUICK = [(4, 64, 128, 2)]
VOCAB = 65


# ---------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------


def memory_bytes() -> int:
    """Physical memory of this machine in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def machine() -> str:
    """One line describing this machine: CPU model, cores, memory, torch, numpy and BLAS."""
    cpu = cpu_name()
    try:
        from threadpoolctl import threadpool_info

        blas = ", ".join(sorted({f"{i['internal_api']} {i.get('version') or ''}".strip()
                                 for i in threadpool_info() if i["user_api"] == "blas"})) or "unknown"
    except ImportError:  # pragma: no cover
        blas = "unknown"
    return (f"{cpu}; {os.cpu_count()} cores; {memory_bytes() / 2**30:.0f} GiB; torch {torch.__version__}; "
            f"numpy {np.__version__}; BLAS {blas}; {platform.system()} {platform.machine()}")


# ---------------------------------------------------------------------------
# 1. Matmul ceiling
# ---------------------------------------------------------------------------


def matmul_ceiling(n: int = 2048, repeats: int = 3) -> dict[str, float]:
    """GFLOP/s of a float32 ``(n, n) @ (n, n)`` product in NumPy and in PyTorch (``2 n^3`` FLOPs)."""
    g = np.random.default_rng(0)
    a, b = (g.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    flops = 2 * n**3
    return {"numpy": flops / median_seconds(lambda: a @ b, repeats) / 1e9,
            "torch": flops / median_seconds(lambda: ta @ tb, repeats) / 1e9}


# ---------------------------------------------------------------------------
# 2. Attention against T
# ---------------------------------------------------------------------------


def attention_fns(Q, K, V, block_size: int = 256) -> dict:
    """Variant -> a call computing ``Z`` for one head ``Q, K, V (T, D)`` (NumPy arrays)."""
    tQ, tK, tV = (torch.from_numpy(np.ascontiguousarray(x))[None, None] for x in (Q, K, V))

    def torch_sdpa():
        with torch.inference_mode():
            return torch.nn.functional.scaled_dot_product_attention(tQ, tK, tV)[0, 0]

    return {
        "reference": lambda: tnp.scaled_dot_product_attention(Q, K, V),
        "blocked": lambda: tnp.blocked_attention(Q, K, V),
        "tiled": lambda: tnp.tiled_attention(Q, K, V, block_size=block_size),
        "torch": torch_sdpa,
    }


def attention_outputs(Q, K, V, block_size: int = 256) -> dict[str, np.ndarray]:
    """Variant -> its ``Z`` (NumPy) for one head: what the comparison with the reference uses."""
    out = {}
    for name, fn in attention_fns(Q, K, V, block_size).items():
        r = fn()
        Z = r[0] if isinstance(r, tuple) else r
        out[name] = Z.numpy() if isinstance(Z, torch.Tensor) else Z
    return out


def _needed_bytes(variant: str, T: int, itemsize: int) -> int:
    """The ``T x T`` arrays a variant holds at its peak."""
    return {"reference": 3, "blocked": 1}.get(variant, 0) * T * T * itemsize


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _torch_child(T: int, n_threads: int) -> None:
    """In a fresh process: print the seconds of one torch call and the rise of its peak resident
    memory, result included."""
    torch.set_num_threads(n_threads)
    g = torch.Generator().manual_seed(T)
    Q, K, V = (torch.randn(1, 1, T, D_K, generator=g) for _ in range(3))
    torch.nn.functional.scaled_dot_product_attention(Q[..., :64, :], K[..., :64, :], V[..., :64, :])  # load kernels
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak resident set (VmHWM) to the current one
    before = _status_kib("VmRSS")
    t0 = time.perf_counter()
    with torch.inference_mode():
        Z = torch.nn.functional.scaled_dot_product_attention(Q, K, V)
    seconds = time.perf_counter() - t0
    print(seconds, (_status_kib("VmHWM") - before) * 1024, Z.shape[-2])


def torch_child(T: int) -> tuple[float, float]:
    """(seconds, peak extra bytes) of one torch call in a fresh process; NaNs where unsupported."""
    if not Path("/proc/self/clear_refs").exists():
        return math.nan, math.nan
    try:
        out = subprocess.run([sys.executable, __file__, "--torch-child", str(T),
                              "--threads", str(torch.get_num_threads())],
                             capture_output=True, text=True, timeout=3600, check=True)
        seconds, extra, _ = out.stdout.split()[-3:]
        return float(seconds), max(0.0, float(extra))
    except (subprocess.SubprocessError, ValueError, OSError):
        return math.nan, math.nan


def attention_rows(T: int, repeats: int = 3, ram: int | None = None, torch_memory: bool = True,
                   block_size: int = 256, dtype=np.float32) -> list[dict]:
    """One row per variant at length ``T``: seconds, GFLOP/s, peak extra MiB, max |Z - Z_reference|."""
    ram = memory_bytes() if ram is None else ram
    dtype = np.dtype(dtype)
    g = np.random.default_rng(T)
    Q, K, V = (g.standard_normal((T, D_K)).astype(dtype) for _ in range(3))
    fns = attention_fns(Q, K, V, block_size)
    reps = repeats if T <= 4096 else 1
    flops = 4 * T * T * D_K
    check = T <= 4096
    Z_ref = None
    rows = []
    for name in VARIANTS:
        row = {"benchmark": "attention", "variant": name, "shape": f"T={T} D_K={D_K}", "T": T,
               "dtype": dtype.name, "seconds": math.nan, "gflops": math.nan, "peak_extra_MiB": math.nan,
               "max_abs_err": math.nan, "note": ""}
        need = _needed_bytes(name, T, dtype.itemsize)
        if need > 0.5 * ram:
            k = need // (T * T * dtype.itemsize)
            row["note"] = (f"skipped: {k} T x T array{'s' if k > 1 else ''} would need {need / 2**30:.0f} GiB; "
                           f"this machine has {ram / 2**30:.0f} GiB")
            rows.append(row)
            continue
        if name == "torch":
            seconds, extra = torch_child(T) if torch_memory else (math.nan, math.nan)
            row["peak_extra_MiB"] = extra / MiB
            if T > 4096 and math.isfinite(seconds):
                row["seconds"] = seconds
            else:
                row["seconds"] = median_seconds(fns[name], reps, warm_up=T <= 4096)
        else:
            fn = fns[name]
            if name == "tiled" and T > 16384:
                # the traced call on the first query blocks only, against all T keys: each worker holds
                # one query block at a time, so the working memory does not depend on T_q
                q_rows = min(T, 4 * (os.cpu_count() or 1) * block_size)
                _, extra = peak_extra_bytes(tnp.tiled_attention, Q[:q_rows], K, V, block_size=block_size)
                extra += (T - q_rows) * D_K * dtype.itemsize  # the full result has T rows
                row["note"] = f"memory traced on the first {q_rows} query rows against all {T} keys"
            else:
                _, extra = peak_extra_bytes(fn)  # also the warm-up call
            row["peak_extra_MiB"] = extra / MiB
            # time from untraced calls (tracemalloc serialises the worker threads' allocations)
            row["seconds"] = median_seconds(fn, reps, warm_up=False)
        row["gflops"] = flops / row["seconds"] / 1e9
        if check:
            r = fns[name]()
            Z = r[0] if isinstance(r, tuple) else r
            Z = Z.numpy() if isinstance(Z, torch.Tensor) else Z
            if Z_ref is None:
                Z_ref = Z
            row["max_abs_err"] = float(np.abs(Z - Z_ref).max())
            tol = 1e-12 if dtype == np.float64 else 1e-5  # round-off of another summation order
            assert row["max_abs_err"] < tol, f"{name} differs from the reference at T={T}: {row['max_abs_err']:.2e}"
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------
# 3. A training step
# ---------------------------------------------------------------------------


class TorchLM(nn.Module):
    """A decoder-only LM from PyTorch's own layers, the shape of :class:`DecoderLM`:
    token table (tied with the output head), learned positions, Pre-LN GELU blocks
    (``nn.TransformerEncoderLayer``, causal, fused attention), a final LayerNorm."""

    def __init__(self, vocab_size: int, block_size: int, d_model: int, num_heads: int, d_ff: int,
                 num_layers: int):
        super().__init__()
        self.W_E = nn.Parameter(0.02 * torch.randn(vocab_size, d_model))  # (V, D)
        self.pos = nn.Parameter(0.02 * torch.randn(block_size, d_model))  # (block_size, D)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, num_heads, d_ff, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        X = self.W_E[idx] + self.pos[:T]  # (B, T, D)
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=idx.device)  # -inf above the diagonal
        for layer in self.layers:
            X = layer(X, src_mask=mask, is_causal=True)
        return self.norm(X) @ self.W_E.T  # (B, T, V)


def train_models(B: int, T: int, D: int, layers: int, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """(DecoderLM, TorchLM) of the same shape; raises if their parameter counts differ."""
    torch.manual_seed(seed)
    cfg = DecoderLMConfig(vocab_size=VOCAB, block_size=T, d_model=D, num_heads=max(1, D // 64),
                          num_layers=layers, d_ff=4 * D, norm_first=True, activation="gelu")
    ours = DecoderLM(cfg)
    theirs = TorchLM(VOCAB, T, D, cfg.num_heads, cfg.d_ff, layers)
    if num_params(ours) != num_params(theirs):
        raise ValueError(f"parameter counts differ: DecoderLM {num_params(ours)}, TorchLM {num_params(theirs)}")
    return ours, theirs


def train_step_rows(B: int, T: int, D: int, layers: int, steps: int = 5, warm_up: int = 2) -> list[dict]:
    """Median seconds of forward + backward + AdamW step for both models, alternating step by step."""
    ours, theirs = train_models(B, T, D, layers)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, VOCAB, (B, T), generator=g)
    y = torch.randint(0, VOCAB, (B, T), generator=g)
    models = {"tfbook DecoderLM": ours, "nn.TransformerEncoderLayer LM": theirs}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-3) for k, m in models.items()}
    times = {k: [] for k in models}
    for i in range(warm_up + steps):
        for k, m in models.items():
            t0 = time.perf_counter()
            loss = nn.functional.cross_entropy(m(idx).flatten(0, 1), y.flatten())
            opts[k].zero_grad(set_to_none=True)
            loss.backward()
            opts[k].step()
            if i >= warm_up:
                times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["tfbook DecoderLM"] / med["nn.TransformerEncoderLayer LM"]
    H = max(1, D // 64)
    return [{"benchmark": "train_step", "variant": k, "shape": f"B={B} T={T} D={D} L={layers} H={H} V={VOCAB}",
             "T": T, "dtype": "float32", "seconds": med[k], "params": num_params(m),
             "ratio": ratio if k == "tfbook DecoderLM" else 1.0,
             "note": f"median of {steps} steps after {warm_up} warm-up; forward + backward + AdamW"}
            for k, m in models.items()]


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def fmt(x, spec: str) -> str:
    width = len(format(1.0, spec))
    if x is None or x == "" or (isinstance(x, float) and math.isnan(x)):
        return f"{'-':>{width}}"
    return format(x, spec)


def write_csv(rows: list[dict], path: Path, machine_line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            cells = {k: r.get(k, "") for k in FIELDS}
            cells = {k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in cells.items()}
            w.writerow(cells | {"machine": machine_line})


def plot(rows: list[dict], ceiling: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    att = [r for r in rows if r["benchmark"] == "attention"]
    Ts = np.array(sorted({r["T"] for r in att}), dtype=float)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    style = {"reference": ("tab:orange", "o"), "blocked": ("tab:purple", "D"), "tiled": ("tab:red", "s"),
             "torch": ("tab:blue", "^")}
    labels = {"reference": "reference (tfbook.numpy)", "blocked": "blocked (tfbook.numpy)",
              "tiled": "tiled (tfbook.numpy)", "torch": "F.scaled_dot_product_attention"}
    for v, (color, marker) in style.items():
        pts = sorted((r["T"], r["seconds"], r["peak_extra_MiB"]) for r in att if r["variant"] == v)
        T = np.array([p[0] for p in pts], float)
        for ax, col in ((ax1, 1), (ax2, 2)):
            y = np.array([p[col] for p in pts], float)
            ok = np.isfinite(y)
            ax.loglog(T[ok], y[ok], marker + "-", color=color, label=labels[v])
    ax1.loglog(Ts, 4 * Ts**2 * D_K / (ceiling * 1e9), "k--", lw=1, label=f"at the matmul ceiling ({ceiling:.0f} GFLOP/s)")
    ax1.set_ylabel("time per call (s)")
    ax1.set_title(f"Attention time against T (one head, D_K = {D_K}, float32)")
    ax2.loglog(Ts, Ts**2 * 4 / MiB, "k--", lw=1, label="one T x T float32 matrix")
    ax2.set_ylabel("peak extra memory (MiB, result included)")
    ax2.set_title("Peak extra memory against T")
    for ax in (ax1, ax2):
        ax.set_xlabel("sequence length T (tokens)")
        ax.set_xticks(Ts, [str(int(t)) for t in Ts])
        ax.minorticks_off()
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "machine"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    ap.add_argument("--out", type=Path, help="CSV file (default benchmarks/results/<machine>.csv)")
    ap.add_argument("--plots", type=Path, default=ROOT / "_build" / "benchmarks", help="folder for the plot")
    ap.add_argument("--sizes", type=int, nargs="+", help="attention lengths T (overrides the defaults)")
    ap.add_argument("--train-shapes", type=str, nargs="*",
                    help="training shapes B,T,D,L (overrides the defaults; none: skip the training table)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads for PyTorch and BLAS (default: every core)")
    ap.add_argument("--torch-child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.torch_child:
        _torch_child(args.torch_child, args.threads)
        return 0

    cores = args.threads
    quick = args.quick
    sizes = args.sizes or ([256, 1024] if quick else [256, 1024, 4096, 16384, 65536])
    if args.train_shapes is not None:
        shapes = [tuple(int(x) for x in s.split(",")) for s in args.train_shapes]
    else:
        shapes = TRAIN_SHAPES_QUICK if quick else TRAIN_SHAPES_FULL
    desc = machine() + f"; {cores} threads"
    print(f"machine: {desc}")
    rows: list[dict] = []
    with threads(cores):
        n = 1024 if quick or args.sizes else 2048
        ceil = matmul_ceiling(n)
        print(f"\n1. matmul ceiling, float32 ({n} x {n}) @ ({n} x {n}), 2 n^3 FLOPs, {cores} threads:")
        for lib, gf in ceil.items():
            print(f"  {lib + '.matmul':<13} {gf:8.1f} GFLOP/s")
            rows.append({"benchmark": "matmul", "variant": lib, "shape": f"{n}x{n}x{n}", "dtype": "float32",
                         "gflops": gf, "seconds": 2 * n**3 / gf / 1e9})

        print(f"\n2. attention against T, one head, D_K = D_V = {D_K}, float32; time: median of 3 calls up to "
              f"T = 4096, one above; GFLOP/s from 4 T^2 D_K; memory: peak extra MiB, result included")
        head = (f"{'T':>6} | " + " ".join(f"{v + ' s':>11}" for v in VARIANTS) + " | "
                + " ".join(f"{v[:8] + ' GF/s':>13}" for v in VARIANTS) + " | "
                + " ".join(f"{v[:8] + ' MiB':>12}" for v in VARIANTS))
        print(head)
        print("-" * len(head))
        notes = []
        for T in sizes:
            r = attention_rows(T)
            rows += r
            by = {x["variant"]: x for x in r}
            print(f"{T:>6} | " + " ".join(fmt(by[v]["seconds"], "11.4f") for v in VARIANTS) + " | "
                  + " ".join(fmt(by[v]["gflops"], "13.1f") for v in VARIANTS) + " | "
                  + " ".join(fmt(by[v]["peak_extra_MiB"], "12.2f") for v in VARIANTS), flush=True)
            notes += [f"  T = {T}, {x['variant']}: {x['note']}" for x in r if x["note"]]
        errs = [x["max_abs_err"] for x in rows if x["benchmark"] == "attention" and not math.isnan(x["max_abs_err"])]
        print(f"every variant's Z equals the reference up to T = {min(max(sizes), 4096)} "
              f"(max |error| {max(errs):.1e}, float32)" if errs else "no comparison made (no T <= 4096)")
        print("\n".join(notes))

        if shapes:
            print("\n3. training step (forward + backward + AdamW), float32, median seconds; vocabulary 65, "
                  "H = D / 64, D_ff = 4 D, Pre-LN GELU, causal")
            print(f"{'shape':<28} {'params':>9} {'tfbook DecoderLM s':>19} {'nn.TransformerEncoderLayer s':>29} "
                  f"{'ratio':>6}")
            for B, T, D, L in shapes:
                r = train_step_rows(B, T, D, L, steps=3 if quick else 7, warm_up=1 if quick else 2)
                rows += r
                print(f"{r[0]['shape']:<28} {r[0]['params']:>9,} {r[0]['seconds']:>19.3f} {r[1]['seconds']:>29.3f} "
                      f"{r[0]['ratio']:>6.2f}", flush=True)
            print("ratio = tfbook / PyTorch time (target <= 1.10)")

    out = args.out or ROOT / "benchmarks" / "results" / f"{_slug(desc.split(';')[0])}-{os.cpu_count()}core.csv"
    write_csv(rows, out, desc)
    png = args.plots / "attention.png"
    plot(rows, max(ceil.values()), png)
    print(f"\nwrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
