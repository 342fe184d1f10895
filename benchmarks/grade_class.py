"""What grading a class costs on this machine: wall time, CPU time, peak memory, per submission.

Run from the repository root::

    python benchmarks/grade_class.py                 # 40 submissions, --jobs 2, 5 s cell limits
    python benchmarks/grade_class.py --students 12   # a smaller class

It builds a class on the synthetic chapter of :mod:`tfbook.course.demo` (three exercises,
3 points, as ``tests/test_grader_robust.py`` builds its own), with a mix an instructor meets:
correct notebooks, wrong answers, broken ones (syntax errors, exceptions, unanswered, a
corrupt or empty file), slow but honest ones (seconds of CPU or of sleep within the limits)
and stalling ones (an endless loop, one that ignores the interrupt, one that sleeps forever).
The mix is listed in ``MIX``; every row's expected score and status is checked, so the
figures are those of a run that graded the class right.

The grader runs as a child process (``python -m tfbook.course grade``, sandboxed where
bubblewrap is available) while this script samples its whole process tree every 0.2 s:

* wall time, and CPU time (user + system) of the grader and every process it starts: from
  the kernel where this script may make a control group (root, cgroup v1: ``cpuacct.usage``
  of a group the grader runs in; its sandboxes' slot groups nest inside), and as sampled per
  process every 0.2 s (a process's last 0.2 s can be missed). ``RUSAGE_CHILDREN`` is printed
  too but misses the sandboxes: they are killed, and no one waits for the driver inside;
* peak memory: the group's ``memory.max_usage_in_bytes`` (page cache included), the largest
  sum over the tree of resident memory (RSS, shared pages counted once per process, so an
  upper bound) and of private memory (RSS less shared pages), and the largest single process
  (``ru_maxrss``);
* per submission: the seconds the grader's ``rows.json`` gives each (wall clock, sandbox
  start to judged), as median / 90th percentile / max, per kind of submission.

This is a measurement, not a test: the machine may be loaded (the load average is printed
with the figures), and nothing asserts a time. The one bound it checks is the ratio the
grader promises: no stalling submission holds its slot for more than its wall backstop.
Figures for the record go into the commit message and the issue's note.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402
import psutil  # noqa: E402

from benchmarks._common import cpu_name  # noqa: E402
from tfbook.course import demo  # noqa: E402
from tfbook.course import budget, submission  # noqa: E402

A = demo.SYNTH  # the synthetic chapter's assignment name
OK = "def double(x):\n    return 2 * x\n"
MIX = {
    # kind: (how many of 40, {grade id: answer} or a special, expected score of 3, expected status)
    "correct": (16, {}, 3, "graded"),
    "wrong": (6, {"ex99-2-third": "def third(x):\n    return x / 4\n"}, 2, "graded"),
    "inplace": (2, {"ex99-1-double": "def double(x):\n    x *= 2\n    return x\n"}, 2, "graded"),
    "unanswered": (2, {"ex99-3-push": "def push(cache, x):\n    # YOUR CODE HERE\n"
                                      "    raise NotImplementedError()\n"}, 2, "graded"),
    "syntax": (2, {"ex99-1-double": "def double(x)\n    return 2 * x\n"}, 2, "graded"),
    "raises": (2, {"ex99-2-third": "def third(x):\n    return x.third()\n"}, 2, "graded"),
    "corrupt": (1, "corrupt", 0, "unreadable"),
    "empty": (1, "empty", 0, "unreadable"),
    # honest but slow: about 2 CPU seconds, or 2 s asleep, once (the limits are 5 s of CPU a cell)
    "slow_cpu": (2, {"ex99-1-double": "_t = sum(i * i for i in range(12_000_000))\n" + OK}, 3, "graded"),
    "slow_sleep": (2, {"ex99-1-double": "import time\ntime.sleep(2)\n" + OK}, 3, "graded"),
    # stalling: each costs the exercise it stalls, never the others
    "loop": (2, {"ex99-2-third": "def third(x):\n    while True:\n        pass\n"}, 2, "timeout"),
    "ignore_interrupt": (1, {"ex99-2-third": "import signal\ndef third(x):\n"
                                            "    for _s in (signal.SIGINT, signal.SIGALRM, signal.SIGPROF):\n"
                                            "        signal.signal(_s, signal.SIG_IGN)\n"
                                            "    while True:\n        pass\n"}, 2, "timeout"),
    "sleep_forever": (1, {"ex99-3-push": "import time\ndef push(cache, x):\n    time.sleep(10**6)\n"}, 2, "timeout"),
}


def build_class(root: Path, students: int) -> dict[str, tuple[str, float, str]]:
    """The master in root/notebooks, the class in root/subs; {student: (kind, score, status)}."""
    master = demo.synthetic_master()
    (root / "notebooks").mkdir(parents=True)
    nbformat.write(master, str(root / "notebooks" / f"{A}.ipynb"))
    left = {k: n for k, (n, *_) in MIX.items()}
    kinds = []  # round robin over the kinds, so that a smaller class still has each kind
    while len(kinds) < students:
        for k in MIX:
            if left[k] > 0 or sum(left.values()) <= 0:
                kinds.append(k)
                left[k] -= 1
    kinds = kinds[:students]
    expected = {}
    for i, kind in enumerate(kinds):
        _, answers, score, status = MIX[kind]
        name = f"s{i:02d}_{kind}"
        if answers == "corrupt":
            nb = '{"cells": [ this is not JSON'
        elif answers == "empty":
            nb = ""
        else:
            nb = demo._synthetic_student(master, answers)
        demo._write(root / "subs", name, A, nb)
        expected[name] = (kind, float(score), status)
    return expected


def tree_sample(proc: psutil.Process, cpu: dict) -> tuple[int, int, int]:
    """(sum of RSS, sum of RSS less shared pages, processes) over proc and its descendants now;
    ``cpu[(pid, start)]``: each process's own CPU seconds (user + system), its latest reading."""
    rss = private = n = 0
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return 0, 0, 0
    for p in procs:
        try:
            with p.oneshot():
                m, t, born = p.memory_info(), p.cpu_times(), p.create_time()
        except psutil.Error:
            continue
        rss += m.rss
        private += m.rss - getattr(m, "shared", 0)
        cpu[(p.pid, born)] = max(cpu.get((p.pid, born), 0.0), t.user + t.system)
        n += 1
    return rss, private, n


def bench_cgroups() -> dict[str, Path]:
    """Fresh cgroup-v1 ``memory`` and ``cpuacct`` groups under this process's own, as the grader's
    slots make theirs (root only; {} elsewhere): the kernel's CPU time of every process the grader
    starts (sandboxes killed before anyone waited for them included) and its peak memory (page
    cache included; the slots' groups nest inside)."""
    groups: dict[str, Path] = {}
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return groups
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return groups
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        for c in ("memory", "cpuacct"):
            base = Path("/sys/fs/cgroup") / c
            if c in ctrls.split(",") and base.is_dir() and c not in groups:
                where = base / path.lstrip("/") / f"tfbook-bench-{os.getpid()}"
                try:
                    where.mkdir()
                except OSError:
                    continue
                if c == "memory" and (where / "memory.use_hierarchy").read_text().strip() != "1":
                    where.rmdir()  # the slots' groups would not count in it
                    continue
                groups[c] = where
    return groups


def remove_cgroups(groups: dict[str, Path]) -> None:
    for where in groups.values():
        for _ in range(50):
            for sub in sorted(where.glob("*/"), reverse=True):
                if (sub / "cgroup.procs").exists():
                    try:
                        sub.rmdir()
                    except OSError:
                        pass
            try:
                where.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--students", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=5.0, help="per-cell CPU limit (s)")
    ap.add_argument("--total-timeout", type=float, default=60.0, help="per-notebook CPU limit (s)")
    ap.add_argument("--keep", type=Path, default=None, help="build and grade here (kept) instead of a temporary folder")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="tfbook-bench-grade-") as tmp:
        root = args.keep or Path(tmp)
        expected = build_class(root, args.students)
        # the CLI takes its masters from notebooks/: call grade() with this class's master instead
        child = [sys.executable, "-c",
                 "import sys\nfrom pathlib import Path\nfrom tfbook.course.grade import grade\n"
                 "grade(Path(sys.argv[1]), out=Path(sys.argv[2]), timeout=float(sys.argv[3]), "
                 "total_timeout=float(sys.argv[4]), jobs=int(sys.argv[5]), notebooks_dir=Path(sys.argv[6]), "
                 "specs=Path(sys.argv[7]), verbose=True)\n",
                 str(root / "subs"), str(root / "out"), str(args.timeout), str(args.total_timeout),
                 str(args.jobs), str(root / "notebooks"), str(root)]
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        load0 = os.getloadavg()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        groups = bench_cgroups()

        def enter():
            for where in groups.values():
                (where / "cgroup.procs").write_text(str(os.getpid()))

        proc = subprocess.Popen(child, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                preexec_fn=enter)
        ps = psutil.Process(proc.pid)
        peak = {"rss": 0, "private": 0, "procs": 0}
        per_process: dict = {}
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                rss, private, n = tree_sample(ps, per_process)
                peak["rss"], peak["private"] = max(peak["rss"], rss), max(peak["private"], private)
                peak["procs"] = max(peak["procs"], n)
                stop.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        console = proc.communicate()[0].decode("utf-8", "replace")
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        load1 = os.getloadavg()
        kernel = {}
        try:
            if "cpuacct" in groups:
                kernel["cpu"] = int((groups["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
            if "memory" in groups:
                kernel["peak"] = int((groups["memory"] / "memory.max_usage_in_bytes").read_text())
        finally:
            remove_cgroups(groups)
        if proc.returncode:
            print(console[-4000:])
            print(f"the grader exited {proc.returncode}")
            return 1
        rows = {r["student"]: r for r in json.loads((root / "out" / "rows.json").read_text())}

    wrong = [(s, (rows[s]["score"], rows[s]["status"]), e[1:]) for s, e in expected.items()
             if (float(rows[s]["score"]), rows[s]["status"]) != e[1:]]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    secs = sorted(r["seconds"] for r in rows.values() if r["seconds"])
    by_kind: dict[str, list[float]] = {}
    for s, (kind, *_) in expected.items():
        by_kind.setdefault(kind, []).append(rows[s]["seconds"])

    def q(xs, p):
        return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]

    mib = 2**20
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, load {load0[0]:.1f} at start, {load1[0]:.1f} at end")
    counts = {k: sum(1 for e in expected.values() if e[0] == k) for k in MIX}
    print(f"class: {len(expected)} submissions of {A} ({', '.join(f'{n} {k}' for k, n in counts.items() if n)}), "
          f"--jobs {args.jobs}, limits {args.timeout:g} s a cell / {args.total_timeout:g} s a notebook (CPU)")
    print(f"rows as expected: {len(expected) - len(wrong)}/{len(expected)}" + (f"; wrong: {wrong}" if wrong else ""))
    sampled = sum(per_process.values())
    best = kernel.get("cpu", sampled)
    print(f"wall {wall:.1f} s; CPU {best:.1f} s ({'the kernel, cgroup cpuacct' if 'cpu' in kernel else 'sampled'}; "
          f"sampled per process every 0.2 s: {sampled:.1f} s; waited-for children only, RUSAGE_CHILDREN: {cpu:.1f} s); "
          f"CPU per submission {best / len(expected):.2f} s")
    print(f"peak memory of the whole tree: "
          + (f"cgroup {kernel['peak'] / mib:.0f} MiB (page cache included); " if "peak" in kernel else "")
          + f"RSS sum {peak['rss'] / mib:.0f} MiB, private (RSS - shared) sum "
          f"{peak['private'] / mib:.0f} MiB, {peak['procs']} processes at most; largest single process "
          f"{after.ru_maxrss / 1024:.0f} MiB")
    print(f"per submission (wall s, rows.json): median {statistics.median(secs):.2f}, p90 {q(secs, 0.9):.2f}, "
          f"max {secs[-1]:.2f}, sum {sum(secs):.1f}")
    for kind, xs in by_kind.items():
        xs = sorted(xs)
        print(f"  {kind:17s} n={len(xs):2d}  median {statistics.median(xs):6.2f}  max {xs[-1]:6.2f}")
    # the grader's promise, with headroom (a ratio, not a timing): no submission holds its slot
    # longer than the notebook's wall-clock backstop
    backstop = budget.WALL_FACTOR * args.total_timeout + 2 * budget.GRACE * submission.MAX_ATTEMPTS
    over = {s: r["seconds"] for s, r in rows.items() if r["seconds"] > backstop}
    print(f"slowest submission / the notebook's wall backstop ({backstop:.0f} s): {secs[-1] / backstop:.2f}"
          + (f"; over it: {over}" if over else ""))
    return 1 if wrong or over else 0


if __name__ == "__main__":
    raise SystemExit(main())
