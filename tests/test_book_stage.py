"""The staging and search helpers of the book build, without building it (fast).

tools/stage_book.py gives every output figure an alt text and links the PDF only when it
exists; book/_ext/tfbook_search.py turns inline TeX into the plain text of search snippets.
The built site is checked in tests/test_book_browser.py."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import stage_book  # noqa: E402
from tfbook_search import page_for_index, tex_to_text  # noqa: E402

PNG = "iVBORw0KGgo="  # the bytes do not matter here


def figure_cell(source: str, **tfbook) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.outputs = [nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"})]
    if tfbook:
        cell.metadata["tfbook"] = tfbook
    return cell


def alt_of(cell) -> str:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A chapter\n## Its section"), cell])
    stage_book.add_alt_texts(nb)
    return nb.cells[1].metadata["mystnb"]["image"]["alt"]


@pytest.mark.parametrize("tex, text", [
    (r"\(N\)", "N"),
    (r"\(\sqrt{D_K}\)", "√D_K"),
    (r"\(\frac{1}{\sqrt{D_K}}\)", "1/√D_K"),
    (r"\(Q K^\top\)", "Q Kᵀ"),
    (r"\(\mathrm{softmax}(S)\,V\)", "softmax(S) V"),
    (r"\(D_{\mathrm{ff}} \le 4D\)", "D_ff ≤ 4D"),
    (r"\(\alpha, \beta \in \mathbb{R}\)", "α, β ∈ R"),
])
def test_tex_to_text(tex, text):
    assert tex_to_text(tex) == text


def test_page_for_index_keeps_the_article_without_math_markup():
    html = ('<html><head><title>3. Why scale</title></head><body><nav>Binder Repository</nav>'
            '<article class="bd-article"><section id="why"><h2>Why<a class="headerlink" href="#why">#</a></h2>'
            '<p>Divide by <span class="math notranslate nohighlight">\\(\\sqrt{D_K}\\)</span> here.</p>'
            '<div class="math notranslate nohighlight">\\[S = QK^\\top\\]</div>'
            '<div class="cell_output"><pre>0.123</pre></div></section></article></body></html>')
    out = page_for_index(html)
    assert "Binder" not in out and "\\(" not in out and "\\[" not in out and "0.123" not in out
    assert "Divide by  √D_K  here." in out
    assert '<h2 id="why">Why</h2>' in out
    assert page_for_index("<html><body><p>no article</p></body></html>") is None


def test_alt_text_from_titles_and_labels():
    alt = alt_of(figure_cell(
        'fig, (ax1, ax2) = plt.subplots(1, 2)\n'
        'ax1.set(xlabel="step", ylabel="loss (nats)", title="Training")\n'
        'ax2.set_title(f"Error, T = {T}")\nax2.set_xlabel("key width $D_K$")\nax2.set_ylabel("error")\n'))
    assert alt == ("Figure: 2 panels. Left: Training (loss (nats) against step). "
                   "Right: Error, T = … (error against key width D_K).")


def test_alt_text_of_the_author_wins_and_a_cell_without_titles_is_listed():
    assert alt_of(figure_cell('ax.set_title("x axis")', alt="Heat map of P: each row sums to one")) \
        == "Heat map of P: each row sums to one"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Chapter\n## Section two"),
                                         figure_cell("plot_it(data)")])
    assert stage_book.add_alt_texts(nb) == [f"cell 1 ({nb.cells[1].id})"]
    alt = nb.cells[1].metadata["mystnb"]["image"]["alt"]
    assert alt == "Figure in “Chapter”, section “Section two”" and ".png" not in alt


def test_alt_text_read_from_the_figure_has_its_values():
    """tools/figure_alt.py reads titles, labels, ranges and legends from the Figure itself, so a
    title set as f"T = {T}" reads "T = 64" (the source-made text could only say "…")."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import figure_alt

    T = 64
    fig, (left, right) = plt.subplots(1, 2)
    left.plot(range(T), [t * t for t in range(T)], label="squares")
    left.set(title=f"T = {T}", xlabel="position $p$", ylabel="loss", yscale="log", xlim=(0, 63))
    left.legend()
    right.imshow([[0.0] * 7] * 5)
    right.set_xlabel("key position")
    fig.colorbar(right.images[0], ax=right)
    text = figure_alt.describe(fig)
    plt.close(fig)
    assert text.startswith("Figure: 2 panels. Left: T = 64; loss (from ") and "log scale" in text
    assert "against position p (from 0 to 63); legend: squares." in text
    assert text.endswith("Right: image of 5 x 7 cells, rows down, key position across.")


def test_alt_text_read_at_execution_beats_the_source_and_the_author_beats_both():
    cell = figure_cell('ax.set_title(f"T = {T}")')
    cell.outputs[0]["metadata"] = {"alt": "Figure: T = 64; y (from 0 to 1) against x (from 0 to 9)."}
    assert alt_of(cell) == "Figure: T = 64; y (from 0 to 1) against x (from 0 to 9)."
    cell = figure_cell('ax.set_title(f"T = {T}")', alt="Heat map of P: each row sums to one")
    cell.outputs[0]["metadata"] = {"alt": "Figure: T = 64."}
    assert alt_of(cell) == "Heat map of P: each row sums to one"


def test_every_committed_figure_gets_an_alt_text_from_its_cell():
    """Each figure of the chapters has an alt text from its author or its titles (no fallback)."""
    missing = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cells = stage_book.add_alt_texts(nb)
        if cells:
            missing[path.name] = cells
    assert missing == {}, f"figure cells with neither tfbook.alt nor a literal title or label: {missing}"


def test_purge_css_drops_only_rules_no_page_can_match():
    """book/_ext/tfbook_theme.py drops a theme rule only when a class or id it requires is on no
    page and in no script; ':not(.x)' requires nothing, @font-face and @keyframes stay whole."""
    from tfbook_theme import purge_css

    css = (".used{color:red}.unused{color:blue}.used .unused,.used p{margin:0}"
           "p:not(.unused){padding:0}#nav,#gone{top:0}"
           "@media (max-width:500px){.unused{x:1}.used{y:2}}@media print{.unused{z:3}}"
           "@font-face{font-family:F;src:url(f.woff)}@keyframes spin{to{transform:rotate(1turn)}}")
    out = purge_css(css, {"used", "nav", "p"})
    assert out == (".used{color:red}.used p{margin:0}p:not(.unused){padding:0}#nav{top:0}"
                   "@media (max-width:500px){.used{y:2}}"
                   "@font-face{font-family:F;src:url(f.woff)}@keyframes spin{to{transform:rotate(1turn)}}")


def test_every_chapter_names_the_terms_it_introduces_for_search():
    """book/_ext/tfbook_search.py's INTRODUCES ranks the teaching chapter first for its terms:
    every numbered chapter in _toc.yml has an entry (a new chapter without one ranks by density)."""
    from tfbook_search import INTRODUCES

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    chapters = [Path(c["file"]).stem for part in toc["parts"] if part.get("numbered")
                for c in part["chapters"] if c["file"].startswith("notebooks/")]
    assert chapters and [c for c in chapters if not INTRODUCES.get(c)] == []


def test_pdf_is_linked_only_when_it_exists(tmp_path):
    config = tmp_path / "_config.yml"
    config.write_text(yaml.safe_dump({"sphinx": {"config": {"html_context": {"default_mode": "auto"}}}}))
    assert stage_book.link_pdf(config, tmp_path / "missing.pdf", tmp_path) is False
    assert "tfbook_pdf" not in config.read_text()
    pdf = tmp_path / "book.pdf"
    pdf.write_bytes(b"%PDF-1.5\n" + b"0" * 2_000_000)
    assert stage_book.link_pdf(config, pdf, tmp_path) is True
    sphinx = yaml.safe_load(config.read_text())["sphinx"]["config"]
    assert sphinx["html_context"] == {"default_mode": "auto", "tfbook_pdf": "tfbook.pdf", "tfbook_pdf_mb": "2.0"}
    assert sphinx["html_extra_path"] == ["_pdf"]
    assert (tmp_path / "_pdf" / "tfbook.pdf").read_bytes()[:5] == b"%PDF-"


def test_latex_chapters_numbered_as_on_the_site():
    """tfbook_latex: front and appendix chapters unnumbered, unnumbered parts, chapter 0."""
    from tfbook_latex import rewrite

    def chapter(title, doc):
        return f"\\chapter{{{title}}}\n\\label{{\\detokenize{{{doc}:x}}}}body\n"

    tex = (chapter("How to read it", "book/intro") + chapter("Running", "book/running")
           + chapter("Setup", "notebooks/00_setup") + chapter("Tokens", "notebooks/01_tokens")
           + chapter("History", "notebooks/A_history"))
    parts = [("Start here", False, ["book/running"]), ("Foundations", True, ["notebooks/00_setup", "notebooks/01_tokens"]),
             ("Appendix", False, ["notebooks/A_history"])]
    out = rewrite(tex, parts)
    lines = [line for line in out.splitlines() if line.startswith("\\") and "label" not in line]
    assert lines == [
        "\\addtocounter{secnumdepth}{-10}",
        "\\chapter*{How to read it}\\addcontentsline{toc}{chapter}{How to read it}",
        "\\part*{Start here}\\addcontentsline{toc}{part}{Start here}",
        "\\chapter*{Running}\\addcontentsline{toc}{chapter}{Running}",
        "\\part*{Foundations}\\addcontentsline{toc}{part}{Foundations}",
        "\\setcounter{chapter}{-1}",
        "\\addtocounter{secnumdepth}{10}",
        "\\chapter{Setup}",
        "\\chapter{Tokens}",
        "\\part*{Appendix}\\addcontentsline{toc}{part}{Appendix}",
        "\\addtocounter{secnumdepth}{-10}",
        "\\chapter*{History}\\addcontentsline{toc}{chapter}{History}",
    ], lines


def test_site_workflow_publishes_the_pdf():
    """Issue 38: the published site carries the PDF. The pages workflow builds it (make pdf)
    before the book, so make book copies it into the site and links it from every page."""
    flow = (ROOT / ".github" / "workflows" / "pages.yml").read_text()
    assert "run: make pdf" in flow and "run: make book" in flow
    assert flow.index("run: make pdf") < flow.index("run: make book")
    assert "tfbook.pdf" in (ROOT / "README.md").read_text()


def test_figures_are_palette_pngs_that_look_the_same():
    """Issue 39 (page weight): the web editions' figures are re-encoded as 256-colour palette
    PNGs: same size, mean absolute difference under 2/255 per channel, and fewer bytes, on a
    real chapter figure (chapter 10's training curves: 5 seeds x 4 recipes, the most colours)."""
    import base64
    import io

    import nbformat
    import numpy as np
    from PIL import Image

    nb = nbformat.read(ROOT / "notebooks" / "10_training_from_scratch.ipynb", as_version=4)
    pngs = [o["data"]["image/png"] for c in nb.cells for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})]
    assert pngs
    originals = [base64.b64decode(p) for p in pngs]
    before, after = stage_book.compress_figures(nb)
    assert before == sum(map(len, originals)) and after < 0.6 * before, (before, after)
    new = [base64.b64decode(o["data"]["image/png"]) for c in nb.cells for o in c.get("outputs", [])
           if "image/png" in o.get("data", {})]
    for a, b in zip(originals, new):
        A, B = Image.open(io.BytesIO(a)), Image.open(io.BytesIO(b))
        assert A.size == B.size
        diff = np.abs(np.asarray(A.convert("RGBA"), float) - np.asarray(B.convert("RGBA"), float))
        assert diff.mean() < 2.0, diff.mean()  # of 255: 1.7 at worst over the book's 76 figures


def test_index_weighs_reference_pages_less_and_names_what_a_chapter_introduces():
    """Issue 38 (search ranking): the package reference's words weigh less than a chapter's;
    a chapter's indexed copy gains one weighted sentence naming the terms it introduces."""
    html = ('<html><head><title>T</title></head><body><article class="bd-article"><section id="s">'
            "<h1>Title</h1><p>rotary positions</p></section></article></body></html>")
    api = page_for_index(html, "book/api.html")
    assert 'data-pagefind-body data-pagefind-weight="0.1"' in api and '<h1 data-pagefind-weight="0.1"' in api
    ch7 = page_for_index(html, "notebooks/07_positional_information.html")
    assert "This chapter introduces" in ch7 and "rotary position embedding (RoPE)" in ch7
    assert "data-pagefind-weight" not in page_for_index(html, "notebooks/99_none.html")
    assert page_for_index(html) == page_for_index(html, None)
