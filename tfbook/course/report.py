"""What ``grade`` writes: grades.csv (and rows.json, for ``merge``), feedback pages, the
per-exercise table and plot for instructors, and the console summary.

Student-controlled text (a student's name, what a notebook printed, a value it returned) is
written for its medium: HTML-escaped inside elements MathJax ignores (``tex2jax_ignore``),
with terminal control characters removed in the console, and as CSV cells that a spreadsheet
cannot read as formulas."""

from __future__ import annotations

import csv
import html
import json
import os
import re
import traceback
import urllib.parse
import shutil
import statistics
import sys
from collections import Counter
from pathlib import Path

from tfbook.course import release

ROOT = Path(__file__).resolve().parents[2]
MATHJAX = ROOT / "_vendor" / "mathjax"
EXCERPT = 600  # characters of a test cell's output shown on a feedback page
ROWS_FILE = "rows.json"  # every row with its exercises: what ``merge`` joins
# ``student``: the folder's name for reading (bytes that are not UTF-8 shown as \\xNN escapes);
# ``student_id``: the folder's exact bytes, percent-encoded (RFC 3986: letters, digits and -._~
# as they are, every other byte as %XX), so two folders never share one and the name is
# recovered exactly (:func:`name_bytes`)
CSV_FIELDS = ["student", "assignment", "score", "max_score", "status", "reason", "student_id"]
NO_MATH = "tex2jax_ignore mathjax_ignore"  # MathJax never typesets inside these elements

_CSS = """body{font-family:system-ui,sans-serif;max-width:56rem;margin:2rem auto;padding:0 1rem;
line-height:1.45}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3rem .5rem;
vertical-align:top}.pass{color:#176b1a}.fail{color:#a40e0e}pre{background:#f6f6f6;padding:.5rem;
white-space:pre-wrap;overflow-wrap:anywhere}.task{border-left:3px solid #ddd;padding-left:.8rem}"""


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def terminal(text) -> str:
    """``text`` fit for one console line: control characters (ANSI and OSC escapes, bidi
    overrides, newlines) replaced by a space."""
    return _CONTROL.sub(" ", str(text))


def display_name(name) -> str:
    """A folder name (read with surrogate escapes: any bytes) as text that can be written
    anywhere: bytes that are not UTF-8 become ``\\xNN``."""
    return os.fsencode(str(name)).decode("utf-8", "backslashreplace")


def name_id(name) -> str:
    """A folder name's exact bytes, percent-encoded (unambiguous, reversible, plain ASCII)."""
    return urllib.parse.quote_from_bytes(os.fsencode(str(name)), safe="")


def name_bytes(name_id_: str) -> bytes:
    """The folder name's bytes from :func:`name_id` (``os.fsdecode`` gives the folder's name)."""
    return urllib.parse.unquote_to_bytes(name_id_)


def csv_cell(text) -> str:
    """A CSV cell a spreadsheet shows as text: a leading =, +, -, @ (or a tab or carriage
    return) would make it a formula, so such a cell gets a leading apostrophe."""
    text = _CONTROL.sub(" ", str(text))
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def _markdown(text: str) -> str:
    try:
        from nbconvert.filters.markdown_mistune import markdown2html_mistune

        return markdown2html_mistune(text)
    except Exception:  # noqa: BLE001
        return f"<pre>{html.escape(text)}</pre>"


_ROLE = re.compile(r"\{([a-z]+)(?::[a-z:]+)?\}`([^`]*)`")
_TARGET = re.compile(r"^(.*?)\s*<([^<>]+)>$", re.S)


def _equations(master) -> dict[str, str]:
    """{label: LaTeX} of the master's labelled equations (```{math} with :label:, and $$...$$ (label))."""
    out = {}
    for cell in getattr(master, "cells", []) or []:
        if cell.get("cell_type") != "markdown":
            continue
        src = cell.get("source", "")
        for m in re.finditer(r"```\{math\}\s*\n\s*:label:\s*(\S+)\s*\n(.*?)```", src, re.S):
            out[m.group(1)] = m.group(2).strip()
        for m in re.finditer(r"\$\$(.+?)\$\$\s*\(([\w:-]+)\)", src, re.S):
            out[m.group(2)] = m.group(1).strip()
    return out


def _headings(master) -> dict[str, str]:
    """{target: heading text} for the master's ``(target)=`` labels followed by a heading."""
    out = {}
    for cell in getattr(master, "cells", []) or []:
        if cell.get("cell_type") == "markdown":
            for m in re.finditer(r"^\(([\w:-]+)\)=\s*\n#+\s*(.+)$", cell.get("source", ""), re.M):
                out[m.group(1)] = m.group(2).strip()
    return out


def render_roles(text: str, master=None) -> str:
    """The book's MyST roles in an exercise's text as a reader outside the book can read them:
    {eq} as the equation itself (typeset), {ref} and {doc} as their text or the target's heading,
    {cite} as the keys in brackets, {glue} as "the value in the chapter"; the book's text only."""
    eqs = _equations(master) if master is not None else {}
    heads = _headings(master) if master is not None else {}

    def one(m):
        role, content = m.group(1), m.group(2).strip()
        shown = _TARGET.match(content)
        if role == "eq":
            return (f"${' '.join(eqs[content].split())}$" if content in eqs
                    else f"equation ‘{content}’ of the chapter")
        if role in ("ref", "numref", "doc", "term"):
            if shown:
                return shown.group(1)
            return heads.get(content, content.replace("-", " ").replace("_", " "))
        if role == "cite":
            return "[" + "; ".join(k.strip() for k in content.split(",")) + "]"
        if role == "glue":
            return "(a value computed in the chapter)"
        return content

    return _ROLE.sub(one, text)


def _excerpt(text: str) -> str:
    text = terminal_keep_lines(text or "")
    if len(text) > EXCERPT:
        text = text[:EXCERPT] + f"\n… ({len(text) - EXCERPT} more characters not shown)"
    return html.escape(text)


def terminal_keep_lines(text: str) -> str:
    return "\n".join(terminal(line) for line in text.splitlines())


def _student(text) -> str:
    """Student-controlled text for a page: escaped, and in an element MathJax leaves alone."""
    return f"<span class='{NO_MATH}'>{html.escape(str(text))}</span>"


def feedback_page(row, plan, mathjax_src: str | None, master=None) -> str:
    head = [f"<meta charset='utf-8'><title>{html.escape(row.assignment)}: "
            f"{html.escape(terminal(display_name(row.student)))}"
            "</title>", f"<style>{_CSS}</style>"]
    if mathjax_src:
        # only the exercises' own text (class "task", from the chapter notebook) is typeset; the
        # whole body is ignored otherwise, so a student's printed $...$ stays text
        head.append("<script>window.MathJax={tex:{inlineMath:[['$','$'],['\\\\(','\\\\)']]},"
                    "options:{ignoreHtmlClass:'tex2jax_ignore',processHtmlClass:'task'}};</script>")
        head.append(f"<script id='MathJax-script' async src='{html.escape(mathjax_src)}'></script>")
    body = [f"<h1>{html.escape(row.assignment)}</h1>",
            f"<p>Student: <b>{_student(display_name(row.student))}</b>. Score: <b>{row.score:g} / "
            f"{row.max_score:g}</b> ({html.escape(row.status)}).</p>"]
    if row.reason:
        body.append(f"<p>Notes: {_student(row.reason)}</p>")
    for ex in row.exercises:
        t = plan.test(ex["gid"])
        cls = "pass" if ex["passed"] else "fail"
        if ex.get("label") and ex["label"] != ex["gid"]:
            body.append(f"<p class='exercise-name'><b>{html.escape(ex['label'])}</b></p>")
        body.append(f"<h2 class='{cls}'>{html.escape(ex['gid'])}: {ex['score']:g} / {ex['points']:g}</h2>")
        if t.task:
            body.append(f"<div class='task'>{_markdown(render_roles(t.task, master))}</div>")
        body.append("<p>" + ("All checks passed." if ex["passed"] else
                             f"What failed: {_student(ex['diagnosis'])}") + "</p>")
        if ex.get("checks_out"):
            body.append("<p>The visible checks, as the grader ran them on your results:</p>"
                        f"<pre class='{NO_MATH}'>{_excerpt(ex['checks_out'])}</pre>")
        body.append("<p>What the visible test cell printed in your notebook (an excerpt; not used "
                    f"for the score):</p><pre class='{NO_MATH}'>{_excerpt(ex['visible_out'])}</pre>")
        if "HIDDEN TESTS" in t.source:
            body.append("<p><i>(hidden tests: not shown)</i></p>")
    return (f"<!DOCTYPE html><html><head>{''.join(head)}</head><body class='{NO_MATH}'>"
            + "\n".join(body) + "</body></html>")


def write_feedback(rows, masters, plans, root: Path, log: Path | None = None) -> None:
    """Each row's page; a row whose page cannot be made or written says so in its reason (and
    its traceback goes to ``log``), and costs no other row its page."""
    mathjax_ok = (MATHJAX / "tex-chtml.js").is_file()
    if mathjax_ok and any(r.exercises for r in rows):
        shutil.copytree(MATHJAX, root / "_mathjax", dirs_exist_ok=True)
    for row in rows:
        if not row.exercises:
            continue
        try:
            page = feedback_page(row, plans[row.assignment], "../../_mathjax/tex-chtml.js" if mathjax_ok else None,
                                 master=masters.get(row.assignment))
            leaks = release.find_leaks(masters[row.assignment], release.html_text(page), kinds=("hidden",))
            if leaks:  # defence in depth: never hand out a page that shows hidden tests
                row.reason = "; ".join(filter(None, [row.reason, "feedback withheld (it showed test code)"]))
                continue
            dest = root / row.student / row.assignment / f"{row.assignment}.html"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(page.encode("utf-8", "backslashreplace"))
        except Exception:  # noqa: BLE001  (one row's page never costs another row)
            row.reason = "; ".join(filter(None, [str(getattr(row, "reason", "")),
                                                 "feedback page could not be written (a grader fault: see the log)"]))
            grader_fault(log, f"feedback page of {name_id(row.student)}/{row.assignment}")


def grader_fault(log: Path | None, what: str) -> None:
    """The grader's own traceback (never student text) appended to the instructor's log."""
    if log is None:
        return
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8", errors="backslashreplace") as f:
            f.write(f"--- grader fault: {what}\n{traceback.format_exc()}\n")
    except OSError:
        pass


def as_dict(row) -> dict:
    """A row as plain data (what rows.json holds)."""
    if isinstance(row, dict):
        return row
    return {"student": row.student, "assignment": row.assignment, "score": row.score,
            "max_score": row.max_score, "status": row.status, "reason": row.reason,
            "seconds": round(row.seconds, 3),
            "exercises": [{**{k: e[k] for k in ("gid", "points", "score", "passed", "diagnosis")},
                           "label": e.get("label", e["gid"])} for e in row.exercises]}


def _csv_row(r: dict) -> list[str]:
    return [csv_cell(display_name(r["student"])), csv_cell(display_name(r["assignment"])), f"{float(r['score']):g}",
            f"{float(r['max_score']):g}", csv_cell(r["status"]), csv_cell(display_name(r["reason"])),
            name_id(r["student"])]


def _fallback(row) -> dict:
    """A row that could not be reported as it was: its name, and why (no score is invented)."""
    student = getattr(row, "student", None) if not isinstance(row, dict) else row.get("student")
    assignment = getattr(row, "assignment", None) if not isinstance(row, dict) else row.get("assignment")
    return {"student": str(student), "assignment": str(assignment), "score": 0.0, "max_score": 0.0,
            "status": "error", "reason": "grader: this row could not be reported (see the log)",
            "seconds": 0.0, "exercises": []}


def write_grades(rows, out: Path, log: Path | None = None) -> None:
    """grades.csv (formula-safe cells; every name shown safely and kept exactly) and rows.json
    (names kept exactly: JSON escapes the bytes that are not UTF-8). A row that cannot be
    written is written as an error row; every other row is written as it is."""
    data, lines = [], []
    for row in rows:
        try:
            d = as_dict(row)
            line = _csv_row(d)
            json.dumps(d)
        except Exception:  # noqa: BLE001  (one row never costs the others their rows)
            grader_fault(log, "a row of grades.csv")
            d = _fallback(row)
            line = _csv_row(d)
        data.append(d)
        lines.append(line)
    with open(out / "grades.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_FIELDS)
        writer.writerows(lines)
    (out / ROWS_FILE).write_text(json.dumps(data, ensure_ascii=True, indent=0), encoding="ascii")


def exercise_table(rows) -> list[dict]:
    data = []
    for r in rows:
        try:
            data.append(as_dict(r))
        except Exception:  # noqa: BLE001  (reported as an error row in grades.csv)
            pass
    order: dict[tuple[str, str], float] = {}
    labels: dict[tuple[str, str], str] = {}
    for r in sorted(data, key=lambda r: r["assignment"]):
        for e in r["exercises"]:
            order.setdefault((r["assignment"], e["gid"]), e["points"])
            labels.setdefault((r["assignment"], e["gid"]), e.get("label", e["gid"]))
    out = []
    for (a, gid), points in order.items():
        got = [e for r in data if r["assignment"] == a for e in r["exercises"] if e["gid"] == gid]
        diagnoses = Counter(e["diagnosis"] for e in got if not e["passed"] and e["diagnosis"])
        common = diagnoses.most_common(1)
        out.append({
            "assignment": a, "exercise": gid, "name": labels[(a, gid)], "points": f"{points:g}", "graded": len(got),
            "mean_score": f"{statistics.mean(e['score'] for e in got):.2f}" if got else "",
            "share_passing": f"{sum(e['passed'] for e in got) / len(got):.2f}" if got else "",
            "most_common_diagnosis": csv_cell(f"{common[0][0]} ({common[0][1]}x)") if common else "",
        })
    return out


def write_exercise_table(rows, out: Path) -> list[dict]:
    table = exercise_table(rows)
    fields = ["assignment", "exercise", "name", "points", "graded", "mean_score", "share_passing",
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
        labels = [f"{r['name']} ({r['assignment'][:2]})" if r["name"] != r["exercise"] else r["exercise"]
                  for r in shown]
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
    """Every row on one line (control characters removed), then the times per notebook (each
    notebook's sandbox runs and its judging)."""
    stream = stream or sys.stdout
    data = []
    for r in rows:
        try:
            data.append(as_dict(r))
        except Exception:  # noqa: BLE001
            data.append(_fallback(r))
    if warning:
        print("!" * 78 + f"\n{warning}\n" + "!" * 78, file=stream)
    w = min(max([len(r["student"]) for r in data] + [7]), 40)
    wa = max([len(r["assignment"]) for r in data] + [10])
    print(f"{'student':<{w}}  {'assignment':<{wa}}  {'score':>9}  {'status':<18}  {'time':>6}  reason",
          file=stream)
    for r in data:
        try:
            t = f"{r['seconds']:.1f}s" if r.get("seconds") else "-"
            name = terminal(display_name(r["student"]))
            name = name if len(name) <= w else name[: w - 1] + "…"
            print(terminal(display_name(f"{name:<{w}}  {r['assignment']:<{wa}}  {r['score']:>4g}/{r['max_score']:<4g}  "
                                        f"{r['status']:<18}  {t:>6}  {r['reason']}")), file=stream)
        except Exception:  # noqa: BLE001
            print(f"{name_id(r.get('student', '?'))}: this row could not be printed (see grades.csv)", file=stream)
    ts = [r["seconds"] for r in data if r.get("seconds")]
    if ts:
        print(f"{len(data)} rows; {len(ts)} notebooks run: median {statistics.median(ts):.1f} s, "
              f"max {max(ts):.1f} s per notebook (its sandbox runs and its judging); "
              f"{seconds:.1f} s in all", file=stream)
    for a, t in (judged or {}).items():
        if t is not None:
            print(f"{a}: the master notebook ran once in the judge, {t:.1f} s", file=stream)
