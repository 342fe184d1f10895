"""The book as one PDF (``make pdf``, issue 25 item 4): chapters numbered as on the site.

Sphinx's LaTeX builder numbers every ``\\chapter`` from 1, the landing page's sections
included ("How to read it" became chapter 1 and "Setup and notation" chapter 4). When the LaTeX
build finishes (before Jupyter Book runs latexmk on it), this extension rewrites ``tfbook.tex``
from ``_toc.yml``:

* the landing page's sections and the chapters of unnumbered parts ("Start here", "Appendix")
  are unnumbered chapters (``\\chapter*``, still in the table of contents), as on the site;
* each part of the table of contents starts with an unnumbered ``\\part*{caption}``;
* the chapter counter starts at 0 before the first numbered chapter (``00_setup_and_notation``
  is chapter 0, its equations (0.1), ...), as ``chapter_zero`` numbers the site.

Fonts: the monospaced font is DejaVu Sans Mono (``latex_elements.fontpkg`` below): FreeMono,
Sphinx's default, has no ✘ (U+2718), which the checks print.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)

FONTPKG = r"""
\setmainfont{FreeSerif}[Extension=.otf, UprightFont=*, ItalicFont=*Italic, BoldFont=*Bold,
  BoldItalicFont=*BoldItalic]
\setsansfont{FreeSans}[Extension=.otf, UprightFont=*, ItalicFont=*Oblique, BoldFont=*Bold,
  BoldItalicFont=*BoldOblique]
\setmonofont{DejaVuSansMono}[Extension=.ttf, UprightFont=*, ItalicFont=*-Oblique,
  BoldFont=*-Bold, BoldItalicFont=*-BoldOblique, Scale=0.85]
"""
CHAPTER = re.compile(r"\\chapter\{(?P<title>(?:[^{}]|\{[^{}]*\})*)\}\n\\label\{\\detokenize\{(?P<doc>[^:}]+):")


def _parts(toc_path: Path) -> list[tuple[str, bool, list[str]]]:
    toc = yaml.safe_load(toc_path.read_text(encoding="utf-8"))
    return [(p.get("caption", ""), bool(p.get("numbered")), [c["file"] for c in p.get("chapters", [])])
            for p in toc.get("parts", [])]


def rewrite(tex: str, parts: list[tuple[str, bool, list[str]]]) -> str:
    """tfbook.tex with parts, unnumbered chapters and chapter 0 (see the module docstring)."""
    part_of = {doc: (i, numbered) for i, (_, numbered, docs) in enumerate(parts) for doc in docs}
    first_of_part = {docs[0]: caption for caption, _, docs in parts if docs}
    first_numbered = next((docs[0] for _, numbered, docs in parts if numbered and docs), None)
    seen_docs = set()
    state = {"numbered": True}

    def chapter(m: re.Match) -> str:
        doc, title = m.group("doc"), m.group("title")
        head = ""
        if doc not in seen_docs:
            seen_docs.add(doc)
            if doc in first_of_part:  # unnumbered, as on the site
                caption = first_of_part[doc]
                head += f"\\part*{{{caption}}}\\addcontentsline{{toc}}{{part}}{{{caption}}}\n"
            if doc == first_numbered:
                head += "\\setcounter{chapter}{-1}\n"
        numbered = part_of.get(doc, (None, False))[1]
        # sections of an unnumbered chapter are unnumbered too (not "18.1" after chapter 18)
        if numbered != state["numbered"]:
            head += f"\\addtocounter{{secnumdepth}}{{{10 if numbered else -10}}}\n"
            state["numbered"] = numbered
        if numbered:
            return head + m.group(0)
        label = m.group(0)[len(f"\\chapter{{{title}}}"):]
        return head + f"\\chapter*{{{title}}}\\addcontentsline{{toc}}{{chapter}}{{{title}}}" + label

    return CHAPTER.sub(chapter, tex)


def _build_finished(app, exception):
    if exception is not None or app.builder.name != "latex":
        return
    toc = Path(app.srcdir) / "_toc.yml"
    for tex_path in Path(app.outdir).glob("*.tex"):
        tex = tex_path.read_text(encoding="utf-8")
        if "\\begin{document}" not in tex:
            continue
        new = rewrite(tex, _parts(toc))
        tex_path.write_text(new, encoding="utf-8")
        LOGGER.info(f"tfbook_latex: {tex_path.name}: {new.count(chr(92) + 'part*{')} parts, "
                    f"{new.count(chr(92) + 'chapter{')} numbered chapters")


def _configure(app, config):
    config.latex_elements = {**(config.latex_elements or {}), "fontpkg": FONTPKG}


def setup(app):
    app.connect("config-inited", _configure)
    app.connect("build-finished", _build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
