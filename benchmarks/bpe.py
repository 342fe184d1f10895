"""BPE training speed: the byte-level tokenizer against the character one, on real English.

Run from the repository root::

    python benchmarks/bpe.py            # 500 merges on the first 130 KB of the KJV corpus
    python benchmarks/bpe.py --quick    # 8 KB, 50 merges: a smoke test, a few seconds

The text is the first ``--bytes`` bytes (default 133,120 = 130 KiB) of
``tfbook/corpus/kjv_prose.txt.gz`` (ASCII, so bytes = characters). Two trainers learn
``--merges`` merges from it:

* ``byte-bpe``: :meth:`tfbook.bpe.ByteBPETokenizer.train`, pre-tokenized by GPT-2's pattern,
  pairs counted once and updated incrementally (only the pieces that hold the merged pair
  are recounted; a heap gives the best pair);
* ``char-bpe``: :meth:`tfbook.data.BPETokenizer.train`, the character tokenizer of chapter 1,
  which recounts every pair of every distinct word after each merge.

"Seconds on one core" is the CPU time of the training call (``time.process_time``): both
trainers are single-threaded Python, and the process is pinned to one CPU where the system
allows, so a busy machine (other programs on the other cores) changes wall time but hardly
the CPU time. The byte trainer's time is the median of ``--repeats`` calls, after one
warm-up call that also builds the pre-tokenizing pattern (0.1-0.2 s, once per process); the
character trainer runs ``--old-repeats`` times (median). Bytes per token: the training text's
length in bytes over its length in tokens, each tokenizer encoding its own training text.

Prints a table and writes one CSV row per trainer to ``benchmarks/results/bpe-epyc-2core.csv``
(``--out`` to choose), each with a description of the machine.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import os
import platform
import statistics
import sys
import time
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks._common import cpu_name  # noqa: E402
from tfbook.bpe import ByteBPETokenizer, pretokenize  # noqa: E402
from tfbook.data import BPETokenizer  # noqa: E402

FIELDS = ["benchmark", "variant", "corpus_bytes", "merges", "cpu_seconds", "wall_seconds",
          "bytes_per_token", "speedup", "note", "machine"]
TARGET_SECONDS = 1.5  # the bar: 500 merges from 130 KB in under 1.5 s on one core


def corpus_bytes(n: int) -> str:
    """The first ``n`` bytes of the KJV corpus, as text (it is ASCII)."""
    with (resources.files("tfbook") / "corpus" / "kjv_prose.txt.gz").open("rb") as f:
        raw = gzip.decompress(f.read())
    if not 0 < n <= len(raw):
        raise ValueError(f"n must be in 1..{len(raw)}, got {n}")
    return raw[:n].decode("ascii")


def machine() -> str:
    """One line describing this machine: CPU model, cores, Python."""
    cpu = cpu_name()
    return f"{cpu}; {os.cpu_count()} cores; Python {platform.python_version()}; {platform.system()} {platform.machine()}"


def pin_one_core() -> str:
    """Pin this process to one CPU where possible; say what was done."""
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"pinned to CPU {cpu}"
    return "not pinned (no sched_setaffinity)"


def timed(fn, repeats: int, warm_up: bool):
    """``(result, median CPU seconds, median wall seconds)`` of ``fn()``."""
    if warm_up:
        fn()
    cpu, wall, out = [], [], None
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return out, statistics.median(cpu), statistics.median(wall)


def run(n_bytes: int = 133_120, merges: int = 500, repeats: int = 5, old_repeats: int = 1) -> list[dict]:
    """Train both tokenizers; one row per trainer."""
    text = corpus_bytes(n_bytes)
    size = len(text.encode("utf-8"))
    new, cpu_new, wall_new = timed(lambda: ByteBPETokenizer.train(text, num_merges=merges), repeats, True)
    old, cpu_old, wall_old = timed(lambda: BPETokenizer.train(text, merges), old_repeats, False)
    ids_new, ids_old = new.encode(text), old.encode(text)
    assert new.decode(ids_new) == text and old.decode(ids_old) == text  # lossless, both
    assert len(new.merges) == merges and len(old.merges) == merges, (len(new.merges), len(old.merges))
    pieces = len(set(pretokenize(text)))
    rows = [
        dict(benchmark="bpe-train", variant="byte-bpe", corpus_bytes=size, merges=merges,
             cpu_seconds=cpu_new, wall_seconds=wall_new, bytes_per_token=size / len(ids_new),
             speedup=cpu_old / cpu_new,
             note=f"tfbook.bpe.ByteBPETokenizer.train; median of {repeats}; {pieces} distinct pieces"),
        dict(benchmark="bpe-train", variant="char-bpe", corpus_bytes=size, merges=merges,
             cpu_seconds=cpu_old, wall_seconds=wall_old, bytes_per_token=size / len(ids_old),
             speedup=1.0, note=f"tfbook.data.BPETokenizer.train; median of {old_repeats}"),
    ]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=133_120, help="corpus prefix in bytes (default 133120 = 130 KiB)")
    ap.add_argument("--merges", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5, help="timed calls of the byte trainer")
    ap.add_argument("--old-repeats", type=int, default=1, help="timed calls of the character trainer")
    ap.add_argument("--quick", action="store_true", help="8 KB and 50 merges")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bpe-epyc-2core.csv")
    args = ap.parse_args(argv)
    if args.quick:
        args.bytes, args.merges, args.repeats = 8192, 50, 2
    pinned = pin_one_core()
    rows = run(args.bytes, args.merges, args.repeats, args.old_repeats)
    desc = f"{machine()}; {pinned}"
    print(f"BPE training, {args.merges} merges, first {args.bytes} bytes of the KJV corpus ({pinned})")
    print(f"{'tokenizer':<10} {'corpus bytes':>12} {'merges':>7} {'s, one core':>12} {'wall s':>8} "
          f"{'bytes/token':>12} {'speed-up':>9}")
    for r in rows:
        print(f"{r['variant']:<10} {r['corpus_bytes']:>12} {r['merges']:>7} {r['cpu_seconds']:>12.3f} "
              f"{r['wall_seconds']:>8.3f} {r['bytes_per_token']:>12.2f} {r['speedup']:>8.1f}x")
    verdict = "meets" if rows[0]["cpu_seconds"] < TARGET_SECONDS else "MISSES"
    print(f"byte-bpe {verdict} the bar of {TARGET_SECONDS} s on one core")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "machine": desc})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
