"""What ``grade`` writes besides grades.csv: feedback pages, the per-exercise table and
plot for instructors, and the console summary."""

from __future__ import annotations

import csv
import html
import shutil
import statistics
import sys
from collections import Counter
from pathlib import Path

from tfbook.course import release

ROOT = Path(__file__).resolve().parents[2]
MATHJAX = ROOT / "_vendor" / "mathjax"
EXCERPT = 600  # characters of a test cell's output shown on a feedback page

_CSS = """body{font-family:system-ui,sans-serif;max-width:56rem;margin:2rem auto;padding:0 1rem;
line-height:1.45}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3rem .5rem;
vertical-align:top}.pass{color:#176b1a}.fail{color:#a40e0e}pre{background:#f6f6f6;padding:.5rem;
white-space:pre-wrap;overflow-wrap:anywhere}.task{border-left:3px solid #ddd;padding-left:.8rem}"""


def _markdown(text: str) -> str:
    try:
        from nbconvert.filters.markdown_mistune import markdown2html_mistune

        return markdown2html_mistune(text)
    except Exception:  # noqa: BLE001
        return f"<pre>{html.escape(text)}</pre>"


def _excerpt(text: str) -> str:
    text = text or ""
    if len(text) > EXCERPT:
        text = text[:EXCERPT] + f"\n… ({len(text) - EXCERPT} more characters not shown)"
    return html.escape(text)


def feedback_page(row, plan, mathjax_src: str | None) -> str:
    head = [f"<meta charset='utf-8'><title>{html.escape(row.assignment)}: {html.escape(row.student)}"
            "</title>", f"<style>{_CSS}</style>"]
    if mathjax_src:
        head.append("<script>window.MathJax={tex:{inlineMath:[['$','$'],['\\\\(','\\\\)']]},"
                    "options:{processHtmlClass:'task'}};</script>")
        head.append(f"<script id='MathJax-script' async src='{html.escape(mathjax_src)}'></script>")
    body = [f"<h1>{html.escape(row.assignment)}</h1>",
            f"<p>Student: <b>{html.escape(row.student)}</b>. Score: <b>{row.score:g} / "
            f"{row.max_score:g}</b> ({html.escape(row.status)}).</p>"]
    if row.reason:
        body.append(f"<p>Notes: {html.escape(row.reason)}</p>")
    for ex in row.exercises:
        t = plan.test(ex["gid"])
        cls = "pass" if ex["passed"] else "fail"
        body.append(f"<h2 class='{cls}'>{html.escape(ex['gid'])}: {ex['score']:g} / {ex['points']:g}</h2>")
        if t.task:
            body.append(f"<div class='task'>{_markdown(t.task)}</div>")
        body.append("<p>" + ("All checks passed." if ex["passed"] else
                             f"What failed: {html.escape(ex['diagnosis'])}") + "</p>")
        body.append("<p>The visible checks printed (an excerpt):</p>"
                    f"<pre>{_excerpt(ex['visible_out'])}</pre>")
        if "HIDDEN TESTS" in t.source:
            body.append("<p><i>(hidden tests: not shown)</i></p>")
    return "<!DOCTYPE html><html><head>" + "".join(head) + "</head><body>" + "\n".join(body) + \
        "</body></html>"


def write_feedback(rows, masters, plans, root: Path) -> None:
    mathjax_ok = (MATHJAX / "tex-chtml.js").is_file()
    if mathjax_ok and any(r.exercises for r in rows):
        shutil.copytree(MATHJAX, root / "_mathjax", dirs_exist_ok=True)
    for row in rows:
        if not row.exercises:
            continue
        page = feedback_page(row, plans[row.assignment], "../../_mathjax/tex-chtml.js" if mathjax_ok else None)
        leaks = release.find_leaks(masters[row.assignment], release.html_text(page), kinds=("hidden",))
        if leaks:  # defence in depth: never hand out a page that shows hidden tests
            row.reason = "; ".join(filter(None, [row.reason, "feedback withheld (it showed test code)"]))
            continue
        dest = root / row.student / row.assignment / f"{row.assignment}.html"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(page, encoding="utf-8")


def exercise_table(rows, plans) -> list[dict]:
    out = []
    for a, plan in plans.items():
        for t in plan.tests:
            got = [e for r in rows if r.assignment == a for e in r.exercises if e["gid"] == t.gid]
            diagnoses = Counter(e["diagnosis"] for e in got if not e["passed"] and e["diagnosis"])
            common = diagnoses.most_common(1)
            out.append({
                "assignment": a, "exercise": t.gid, "points": f"{t.points:g}", "graded": len(got),
                "mean_score": f"{statistics.mean(e['score'] for e in got):.2f}" if got else "",
                "share_passing": f"{sum(e['passed'] for e in got) / len(got):.2f}" if got else "",
                "most_common_diagnosis": (f"{common[0][0]} ({common[0][1]}x)" if common else ""),
            })
    return out


def write_exercise_table(rows, plans, out: Path) -> list[dict]:
    table = exercise_table(rows, plans)
    fields = ["assignment", "exercise", "points", "graded", "mean_score", "share_passing",
              "most_common_diagnosis"]
    with open(out / "exercises.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(table)
    shown = [r for r in table if r["graded"]]
    if shown:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 0.35 * len(shown) + 1.2))
        labels = [r["exercise"] for r in shown]
        share = [float(r["share_passing"]) * 100 for r in shown]
        ax.barh(labels, share, color="tab:green")
        ax.set_xlim(0, 100)
        ax.invert_yaxis()
        ax.set_xlabel("submissions passing (%)")
        ax.set_title("Share of submissions passing each exercise")
        for y, r in enumerate(shown):
            ax.text(101, y, f"mean {r['mean_score']}/{r['points']}", va="center", fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "exercises.png", dpi=100)
        plt.close(fig)
    return table


def print_summary(rows, seconds: float, warning: str, judged: dict | None = None, stream=None) -> None:
    stream = stream or sys.stdout
    if warning:
        print("!" * 78 + f"\n{warning}\n" + "!" * 78, file=stream)
    w = max([len(r.student) for r in rows] + [7])
    wa = max([len(r.assignment) for r in rows] + [10])
    print(f"{'student':<{w}}  {'assignment':<{wa}}  {'score':>9}  {'status':<18}  {'time':>6}  reason",
          file=stream)
    for r in rows:
        t = f"{r.seconds:.1f}s" if r.seconds else "-"
        print(f"{r.student:<{w}}  {r.assignment:<{wa}}  {r.score:>4g}/{r.max_score:<4g}  {r.status:<18}  "
              f"{t:>6}  {r.reason}", file=stream)
    ts = [r.seconds for r in rows if r.seconds]
    if ts:
        print(f"{len(rows)} rows; {len(ts)} notebooks run: median {statistics.median(ts):.1f} s, "
              f"max {max(ts):.1f} s per notebook; {seconds:.1f} s in all", file=stream)
    for a, t in (judged or {}).items():
        if t is not None:
            print(f"{a}: the master notebook ran once in the judge, {t:.1f} s", file=stream)
