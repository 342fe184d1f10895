"""Stage the book sources for one of its two builds.

    python tools/stage_book.py --mode public --out _stage/public
    python tools/stage_book.py --mode course --out _stage/course
    python tools/stage_book.py --mode pdf --out _stage/pdf

(``--pdf _build/pdf/tfbook.pdf`` in public mode: serve and link the book's PDF if it exists.)

Copies ``_config.yml``, ``_toc.yml``, ``book/``, ``notebooks/`` and the vendored
MathJax (``_vendor/``, made by ``tools/vendor_mathjax.sh``) into ``--out`` (emptied
first) and rewrites each staged chapter notebook, which is also the nbgrader master
notebook of its assignment (in both modes a chapter number typed into the title is
removed, since the table of contents numbers the chapters):

public
    solution cells keep their code (without the nbgrader marker comments) and
    outputs but are folded behind a "Show solution" toggle (myst-nb
    ``hide-input`` tag and per-cell prompt);
    hidden-test regions are removed from the test cells (nbgrader's
    ``ClearHiddenTests``); the visible tests and their outputs stay.
course
    solutions are replaced by nbgrader's stub (``ClearSolutions``), hidden-test
    regions are removed (``ClearHiddenTests``), and every code cell from the
    ``## Exercises`` heading onwards loses its outputs, so no output of a solution
    cell, a test cell or a cell that reveals a "predict, then verify" answer is shown;
    the site has no launch, repository or issue buttons (the repository holds the
    solutions), only the download button for the staged notebook, and the first
    code cell loses its Colab install snippet (tools/colab_cell.py), which names the
    repository.

pdf
    as public, for ``make pdf`` (Sphinx's LaTeX builder).

Every output figure gets an alt text (:func:`add_alt_texts`).

``jupyter-book build`` of the stage then renders the site. The sources in the
repository are never modified.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import sys
from pathlib import Path

import nbformat
import yaml
from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tfbook._colab import strip_badge, strip_snippet  # noqa: E402

sys.path.insert(0, str(ROOT / "book" / "_ext"))
from tfbook_search import tex_to_text  # noqa: E402  (TeX in titles -> text, as in search snippets)

SOLUTION_PROMPT_SHOW = "Show solution"
SOLUTION_PROMPT_HIDE = "Hide solution"
TITLE_NUMBER = re.compile(r"^(#\s+)\d{1,2}\.?\s+(?=\S)")
SOLUTION_MARKER = re.compile(r"^\s*#*\s*(BEGIN|END) SOLUTION\s*$")
EXERCISES_HEADING = re.compile(r"^#{1,6}\s+Exercises\b", re.MULTILINE)


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def is_solution_cell(cell) -> bool:
    return bool(_nbgrader(cell).get("solution", False))


def is_test_cell(cell) -> bool:
    return bool(_nbgrader(cell).get("grade", False)) and not is_solution_cell(cell)


def _add_tag(cell, tag: str) -> None:
    tags = cell.metadata.setdefault("tags", [])
    if tag not in tags:
        tags.append(tag)


def _clear_outputs(cell) -> None:
    if cell.cell_type == "code":
        cell.outputs = []
        cell.execution_count = None


HIDDEN_CASE_LINE = re.compile(r"^[\u2714\u2718] hidden case\b")


def _drop_hidden_case_lines(cell) -> None:
    """Remove the lines that hidden tests printed (CONTRIBUTING.md: hidden checks are
    named "hidden case X"): the hidden code is gone from the page, so its results go too."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            lines = out["text"].splitlines(keepends=True)
            out["text"] = "".join(l for l in lines if not HIDDEN_CASE_LINE.match(l))
    cell["outputs"] = [o for o in cell.get("outputs", [])
                       if not (o.get("output_type") == "stream" and not o["text"])]


def strip_title_number(nb):
    """Remove a chapter number typed into the title ("# 3. Why scale" -> "# Why scale").

    The table of contents numbers the chapters, so a number in the title would show
    twice. Appendix letters ("# A. History") are kept: the appendix is not numbered.
    """
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("# "):
            cell.source = TITLE_NUMBER.sub(r"\1", cell.source.lstrip(), count=1)
            break
    return nb


def transform_public(nb):
    """Fold solutions behind a toggle and strip hidden tests (in place)."""
    nb, _ = ClearHiddenTests().preprocess(nb, {})
    for cell in nb.cells:
        if is_test_cell(cell):
            _drop_hidden_case_lines(cell)
        if not is_solution_cell(cell):
            continue
        # the marker comments are for nbgrader, not for the reader
        cell.source = "\n".join(
            line for line in cell.source.split("\n") if not SOLUTION_MARKER.search(line)
        )
        if cell.cell_type == "code":
            _add_tag(cell, "hide-input")
            mystnb = cell.metadata.setdefault("mystnb", {})
            mystnb["code_prompt_show"] = SOLUTION_PROMPT_SHOW
            mystnb["code_prompt_hide"] = SOLUTION_PROMPT_HIDE
        else:  # a written answer: fold it into a dropdown (sphinx-design)
            cell.source = f":::{{dropdown}} {SOLUTION_PROMPT_SHOW}\n{cell.source}\n:::"
    return nb


def transform_course(nb):
    """Replace solutions by stubs, strip hidden tests, clear exercise outputs (in place)."""
    nb, _ = ClearHiddenTests().preprocess(nb, {})
    nb, _ = ClearSolutions().preprocess(nb, {})
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = strip_snippet(cell.source)
    in_exercises = False
    for cell in nb.cells:
        if cell.cell_type == "markdown" and EXERCISES_HEADING.search(cell.source):
            in_exercises = True
        if in_exercises or is_solution_cell(cell) or is_test_cell(cell):
            _clear_outputs(cell)
    return nb


def course_config(path: Path) -> None:
    """Drop the links to the repository from the course site's configuration.

    The repository holds the master notebooks (solutions and hidden tests), so the
    course site gets no Colab/Binder launch buttons and no repository or issue
    buttons; the download button stays (it serves the staged, solution-free notebook).
    """
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config.pop("launch_buttons", None)
    html = config.setdefault("html", {})
    html["use_repository_button"] = False
    html["use_issues_button"] = False
    html["use_edit_page_button"] = False
    config["title"] = f"{config.get('title', '')} (course edition)"
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")


FAILS_IF_PROMPT = "Fails if"
RECORD_PROMPT = "Guards a shipped record"


def add_fails_if(nb):
    """Under each check, fold what it catches: the ``fails_if`` of its mutations (in place).

    A code cell whose metadata names mutations (``tfbook.mutations``, CONTRIBUTING.md, "Every
    check is shown to fail") gets a markdown cell after it with a dropdown listing them, so the
    reader sees what the check would catch; tests/test_mutations_*.py shows each one does.
    """
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        mutations = (cell.get("metadata", {}).get("tfbook", {}) or {}).get("mutations") or []
        if cell.cell_type != "code" or not mutations:
            continue
        items = "\n".join(f"- {m['fails_if'].strip()}" for m in mutations)
        record = (cell.get("metadata", {}).get("tfbook", {}) or {}).get("record")
        prompt, lead = FAILS_IF_PROMPT, ""
        if record:  # a guard of a shipped record, not a check of a claim (tools/mutations.py --classify)
            prompt = RECORD_PROMPT
            lead = (f"This cell guards a shipped record; it does not check a claim on the page: "
                    f"{record.strip()}\n\nIt fails if\n\n")
        note = nbformat.v4.new_markdown_cell(
            f":::{{dropdown}} {prompt}\n:class-container: fails-if\n\n{lead}{items}\n:::")
        note.id = f"{cell.get('id', 'cell')}-fails-if"[:64]
        cells.append(note)
    nb.cells = cells
    return nb


# ---- alt texts of output figures ------------------------------------------------------
# A figure's alt text says what it shows, for a reader who cannot see it (screen readers,
# images off, search). Chapter authors write it in the figure cell's metadata,
#     "metadata": {"tfbook": {"alt": "Line plot: softmax weight against temperature ..."}}
# and the stage passes it to myst-nb (cell metadata mystnb.image.alt). A cell without one
# gets a text made from its plotting calls' literal strings (titles, axis labels), e.g.
# "Figure, 2 panels. Left: Activation functions (output against input x). Right: ...";
# parts computed at run time (f-string fields) read "…". Never a file name. A figure executed by
# tools/execute_notebooks.py carries a better one, read from the figure itself with its values
# (tools/figure_alt.py), which the stage uses before the one made from the source.
TITLE_CALLS = {"set_title": "title", "title": "title", "suptitle": "suptitle",
               "set_xlabel": "x", "xlabel": "x", "set_ylabel": "y", "ylabel": "y"}
PANEL_NAMES = {2: ("Left", "Right"), 3: ("Left", "Middle", "Right")}


def _literal_text(node) -> str | None:
    """A string literal or f-string as text (fields as "…"), TeX dollars and newlines removed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr):
        text = "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    else:
        return None
    text = tex_to_text(text)
    # a text that is mostly run-time fields ("… …: …") says nothing
    return text if len(re.findall(r"[^\W\d_]", text)) >= 4 else None


def figure_texts(source: str) -> dict:
    """The literal titles and axis labels of a plotting cell, in the order they are set.

    Returns {"suptitle": [...], "panels": [{"title", "x", "y"}, ...]}: a new panel starts
    where a title or label that the current panel already has is set again."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {"suptitle": [], "panels": []}
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and isinstance(n.func, (ast.Attribute, ast.Name))),
                   key=lambda n: (n.lineno, n.col_offset))
    suptitle, panels = [], []
    for call in calls:
        name = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id
        fields = {}
        if name in TITLE_CALLS and call.args:
            text = _literal_text(call.args[0])
            if text:
                fields[TITLE_CALLS[name]] = text
        elif name == "set":
            for kw in call.keywords:
                if kw.arg in ("title", "xlabel", "ylabel"):
                    text = _literal_text(kw.value)
                    if text:
                        fields[{"title": "title", "xlabel": "x", "ylabel": "y"}[kw.arg]] = text
        if not fields:
            continue
        if "suptitle" in fields:
            suptitle.append(fields["suptitle"])
            continue
        # a new panel starts where a field of the current one would be set again
        if not panels or any(k in panels[-1] for k in fields):
            panels.append({})
        panels[-1].update(fields)
    return {"suptitle": suptitle, "panels": [p for p in panels if p]}


def _panel_text(panel: dict) -> str:
    axes = ""
    if panel.get("y") and panel.get("x"):
        axes = f"{panel['y']} against {panel['x']}"
    elif panel.get("x") or panel.get("y"):
        axes = panel.get("x") or panel.get("y")
    if panel.get("title") and axes:
        return f"{panel['title']} ({axes})"
    return panel.get("title") or axes


def generated_alt(source: str, n_axes: int | None = None) -> str | None:
    """An alt text from the cell's titles and axis labels, or None if it sets none."""
    texts = figure_texts(source)
    panels = [_panel_text(p) for p in texts["panels"]][:6]
    if not panels and not texts["suptitle"]:
        return None
    parts = []
    if texts["suptitle"]:
        parts.append(texts["suptitle"][0].rstrip(".") + ".")
    if len(panels) == 1:
        parts.append(f"{panels[0]}.")
    elif panels:
        names = PANEL_NAMES.get(len(panels)) or [f"Panel {i + 1}" for i in range(len(panels))]
        parts.append(f"{len(panels)} panels.")
        parts += [f"{name}: {text}." for name, text in zip(names, panels)]
    text = "Figure: " + " ".join(parts)
    return text if len(text) <= 600 else text[:597].rsplit(" ", 1)[0] + " …"


FIGURE_SIZE = re.compile(r"with (\d+) Axes")


def add_alt_texts(nb) -> list[str]:
    """Set the alt text of every output figure (in place); return the cells that had no source for one.

    The author's ``tfbook.alt`` wins; then the text read from the figure itself when the cell was
    executed (``tools/figure_alt.py``: titles and labels with their values, the axes' ranges,
    legend entries; in the output's metadata); otherwise :func:`generated_alt`; a cell with none
    gets "Figure of <chapter title>, output of the cell after '<preceding heading>'" and is
    listed (stage_book prints the list: chapter authors should add ``tfbook.alt`` there)."""
    missing, heading, title = [], "", ""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            found = re.findall(r"^#{1,6}\s+(.+)$", cell.source, re.MULTILINE)
            if found:
                heading = found[-1].strip()
                title = title or found[0].strip()
            continue
        if cell.cell_type != "code":
            continue
        images = [o for o in cell.get("outputs", []) if "image/png" in o.get("data", {})
                  or "image/svg+xml" in o.get("data", {})]
        if not images:
            continue
        alt = ((cell.metadata.get("tfbook") or {}).get("alt") or "").strip()
        if not alt:  # read from the figure when it was executed (tools/figure_alt.py)
            alt = (images[0].get("metadata", {}).get("alt") or "").strip()
        if not alt:
            alt = generated_alt(cell.source)
        if not alt:
            alt = f"Figure in “{title}”, section “{heading}”"
            missing.append(f"cell {i} ({cell.get('id', '?')})")
        image = cell.metadata.setdefault("mystnb", {}).setdefault("image", {})
        image.setdefault("alt", alt)
    return missing


# pdf: the public edition, staged for `make pdf` (Sphinx's LaTeX builder)
TRANSFORMS = {"public": transform_public, "course": transform_course, "pdf": transform_public}
PDF_NAME = "tfbook.pdf"


def compress_figures(nb, colours: int = 256) -> tuple[int, int]:
    """Re-encode every PNG output as a palette PNG (in place): (bytes before, bytes after).

    Matplotlib writes 32-bit RGBA PNGs, most of whose colours are the anti-aliased edges of a
    few lines; a 256-colour palette (fast octree, no dithering) keeps every figure visually
    the same (mean absolute difference under 2/255 per channel, tested; 1.7 at worst over the
    book's 76 figures, which shrink from 4.33 MB to 1.15 MB) at about a quarter of
    the bytes, which are most of a chapter page's weight. A figure whose palette version is not
    smaller is left as it was. Width and height are unchanged.
    """
    import base64
    import io

    from PIL import Image

    before = after = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            png = data.get("image/png")
            if not png:
                continue
            raw = base64.b64decode(png if isinstance(png, str) else "".join(png))
            image = Image.open(io.BytesIO(raw))
            pal = image.convert("RGBA").quantize(colours, method=Image.Quantize.FASTOCTREE,
                                                 dither=Image.Dither.NONE)
            buf = io.BytesIO()
            pal.save(buf, "PNG", optimize=True)
            new = buf.getvalue()
            before += len(raw)
            if len(new) < len(raw):
                data["image/png"] = base64.b64encode(new).decode("ascii")
                after += len(new)
            else:
                after += len(raw)
    return before, after


def link_pdf(path: Path, pdf: Path, out: Path) -> bool:
    """Put the book's PDF (from `make pdf`) into the site and link it from every page.

    The PDF is copied to the stage's ``_pdf/`` (served at the site's root as tfbook.pdf,
    Sphinx's html_extra_path) and the template ``tfbook-pdf.html`` (the primary sidebar's end)
    shows the link only when ``html_context.tfbook_pdf`` is set, so the site never links a
    PDF it does not hold. Returns whether the PDF was there."""
    if not pdf.is_file():
        return False
    (out / "_pdf").mkdir(exist_ok=True)
    shutil.copy2(pdf, out / "_pdf" / PDF_NAME)
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    sphinx_config = config.setdefault("sphinx", {}).setdefault("config", {})
    sphinx_config["html_extra_path"] = list(sphinx_config.get("html_extra_path", [])) + ["_pdf"]
    context = sphinx_config.setdefault("html_context", {})
    context["tfbook_pdf"] = PDF_NAME
    context["tfbook_pdf_mb"] = f"{pdf.stat().st_size / 1e6:.1f}"
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return True

# Blocks of the prose pages in book/ written for one edition only, between
# `<!-- public-only -->` and `<!-- /public-only -->` (or course-only): the other
# edition's stage drops them, markers included.
EDITION_BLOCK = re.compile(r"<!-- (public|course)-only -->\n.*?<!-- /\1-only -->\n?", re.DOTALL)


def keep_edition(text: str, mode: str) -> str:
    """``text`` without the blocks written for the other edition."""
    return EDITION_BLOCK.sub(lambda m: m.group(0) if m.group(1) == mode else "", text)


def stage(mode: str, out: Path, notebooks: Path, root: Path = ROOT, pdf: Path | None = None) -> list[Path]:
    """Build the stage folder; return the staged notebooks."""
    vendor = root / "_vendor"
    if not (vendor / "mathjax" / "tex-chtml.js").is_file():
        raise SystemExit("stage_book: _vendor/mathjax is missing; run tools/vendor_mathjax.sh first")
    out = out.resolve()
    if out == root or root.is_relative_to(out):
        raise SystemExit(f"stage_book: refusing to empty {out}")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(root / name, out / name)
    if mode == "course":
        course_config(out / "_config.yml")
    if mode == "public" and pdf is not None:
        link_pdf(out / "_config.yml", Path(pdf), out)
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "_build")
    shutil.copytree(root / "book", out / "book", ignore=ignore)
    for page in (out / "book").rglob("*.md"):
        page.write_text(keep_edition(page.read_text(encoding="utf-8"), "public" if mode == "pdf" else mode),
                        encoding="utf-8")
    shutil.copytree(vendor, out / "_vendor", ignore=ignore)
    shutil.copytree(notebooks, out / "notebooks", ignore=ignore)

    transform = TRANSFORMS[mode]
    staged = sorted((out / "notebooks").glob("*.ipynb"))
    for path in staged:
        nb = nbformat.read(path, as_version=4)
        strip_badge(nb)  # the notebook's own "Open in Colab" link: the site has launch buttons
        try:
            nb = add_fails_if(transform(strip_title_number(nb)))
            for cell in add_alt_texts(nb):
                print(f"stage_book: {path.name} {cell}: a figure without tfbook.alt or titles", file=sys.stderr)
            if mode != "pdf":  # the web editions: what a reader's link carries (the PDF keeps full colour)
                compress_figures(nb)
        except RuntimeError as err:  # nbgrader: unbalanced markers, region outside its cell type
            raise SystemExit(f"stage_book: {path.name}: {err}") from err
        nbformat.write(nb, path)
    return staged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(TRANSFORMS), required=True)
    parser.add_argument("--out", type=Path, required=True, help="stage folder (emptied first)")
    parser.add_argument(
        "--notebooks", type=Path, default=ROOT / "notebooks",
        help="folder of chapter notebooks to stage (default: notebooks/)",
    )
    parser.add_argument(
        "--pdf", type=Path, default=None,
        help="public mode: the book's PDF (make pdf); if the file exists the site serves and links it",
    )
    args = parser.parse_args(argv)
    staged = stage(args.mode, args.out, args.notebooks, pdf=args.pdf)
    linked = args.mode == "public" and args.pdf is not None and args.pdf.is_file()
    print(f"stage_book: {args.mode} stage in {args.out} ({len(staged)} notebooks)"
          + (f", linking {args.pdf}" if linked else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
