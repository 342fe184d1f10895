"""``python -m tfbook.course``: the command line (see :mod:`tfbook.course`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tfbook.course import __doc__ as course_doc
from tfbook.course import check, grade, release, sandbox, shards

ROOT = release.ROOT

CHECK_HELP = """\
Run your notebook from the top, as the grader will, and print for each exercise:

  Exercise 0.1: not answered yet (0/3 points)     the answer cell still raises NotImplementedError
  Exercise 0.2: 1/1 points                        the visible checks passed, with their ✔ lines
  Exercise 0.3: 0/2 points                        a check failed; the ✘ line names the likely mistake
      ✘ scores: ...
  Total: 1/7 points from the visible checks

The notebook runs here, with your rights (it is your own code), in a fresh Python process: the
file on disk is what runs, so save it first. Only the visible tests run: the grader also runs
hidden tests, so the total is the most you can score. Exit status: 0 when every exercise passed
its visible checks, 1 otherwise, 2 when the notebook could not be checked."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfbook.course", description=course_doc.split("\n\n")[0],
        epilog="Students: `python -m tfbook.course check NOTEBOOK` (see `check --help`).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_rel = sub.add_parser("release", help="build student notebooks from the chapter notebooks")
    p_rel.add_argument("notebooks", nargs="*", type=Path,
                       help="chapter notebooks (default: every notebooks/*.ipynb with graded cells)")
    p_rel.add_argument("--out", type=Path, default=ROOT / "_build" / "release")
    p_rel.add_argument("--install", default=None, metavar="REQUIREMENT",
                       help="what the notebooks' Colab cell pip-installs (default: the package, with its "
                            "book and check extras, from where the chapter's own Colab cell gets it)")
    p_gr = sub.add_parser("grade", help="autograde a folder of submissions, each in a sandbox")
    p_gr.add_argument("submissions", type=Path,
                      help="folder laid out as <student>/<assignment>/<assignment>.ipynb")
    p_gr.add_argument("--out", type=Path, default=ROOT / "_build" / "grades")
    p_gr.add_argument("--timeout", type=float, default=60,
                      help="per-cell limit in CPU seconds (default 60); a cell that sleeps or blocks is "
                           "stopped after 3 times as many wall-clock seconds not spent waiting for a CPU, "
                           "so a loaded machine shortens neither")
    p_gr.add_argument("--total-timeout", type=float, default=900.0,
                      help="limit for one student's whole notebook in CPU seconds, with the same "
                           "backstop (default 900)")
    p_gr.add_argument("--jobs", "-j", type=int, default=None,
                      help="submissions graded at once (default: the number of cores)")
    p_gr.add_argument("--memory", type=float, default=4.0,
                      help="memory limit of a submission in GiB (default 4)")
    p_gr.add_argument("--no-sandbox", action="store_true",
                      help="grade without bubblewrap (UNSAFE: student code gets your rights)")
    p_gr.add_argument("--shard", default=None, metavar="K/N",
                      help="grade only the K-th of N parts of the class (join the parts with `merge`)")
    p_gr.add_argument("--plan", type=Path, default=None,
                      help="the shard plan made by `plan` (the class fixed once for every shard; without "
                           "it each shard splits the folder as it finds it, and `merge` refuses parts "
                           "that found different classes)")
    p_pl = sub.add_parser("plan", help="fix the class and its split into shards once, before `grade --shard`")
    p_pl.add_argument("submissions", type=Path)
    p_pl.add_argument("--shards", type=int, required=True, metavar="N")
    p_pl.add_argument("--out", type=Path, required=True, help="the plan file to write (JSON)")
    p_mg = sub.add_parser("merge", help="join the output folders of `grade --shard K/N` runs")
    p_mg.add_argument("parts", nargs="+", type=Path, help="the --out folders of the shards")
    p_mg.add_argument("--out", type=Path, default=ROOT / "_build" / "grades")
    p_ch = sub.add_parser(
        "check", help="students: run your notebook's visible tests and see your points",
        description=CHECK_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p_ch.add_argument("notebook", type=Path, help="your copy of the assignment, e.g. 00_setup_and_notation.ipynb")
    p_ch.add_argument("--timeout", type=float, default=60,
                      help="limit of one cell in CPU seconds (default 60; 3 times as many seconds for "
                           "a cell that sleeps)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        if args.command == "release":
            written = release.release(args.notebooks or None, out=args.out, install=args.install)
            print(f"released {len(written)} notebook(s) to {args.out} in {time.perf_counter() - start:.1f} s")
        elif args.command == "check":
            failed = check.check_notebook(args.notebook, timeout=args.timeout)
            return 1 if failed else 0
        elif args.command == "merge":
            try:
                shards.merge(args.parts, args.out)
            except shards.MergeError as exc:
                print(f"merge: {exc}", file=sys.stderr)
                return 1
        elif args.command == "plan":
            manifest = shards.make_plan(args.submissions, release.NOTEBOOKS, args.shards, args.out)
            print(f"shard plan {manifest['digest'][:12]}: {len(manifest['work'])} rows in {args.shards} "
                  f"shard(s), written to {args.out}; grade each with --shard K/{args.shards} --plan {args.out}")
        else:
            if args.jobs is not None and args.jobs < 1:
                parser.error("--jobs must be at least 1")
            if not args.no_sandbox and sandbox.available():
                print(f"bubblewrap: {sandbox.available()}; trying apt-get install bubblewrap",
                      file=sys.stderr)
                sandbox.install_bwrap()
            limits = sandbox.Limits(memory_bytes=int(args.memory * 2**30),
                                           cpu_seconds=int(args.total_timeout) + 30)
            rows = grade.grade(args.submissions, out=args.out, timeout=args.timeout,
                                      total_timeout=args.total_timeout, jobs=args.jobs,
                                      use_sandbox=False if args.no_sandbox else None, limits=limits,
                                      shard=args.shard, plan=args.plan)
            print(f"graded {len(rows)} submission(s) in {time.perf_counter() - start:.1f} s: "
                  f"{args.out / 'grades.csv'}, {args.out / 'exercises.csv'}, feedback in "
                  f"{args.out / 'feedback'}")
    except (ValueError, RuntimeError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
