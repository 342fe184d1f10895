"""Static checks of the built sites (`make book`, `make course-book`).

No page may load a script, style, font or image from another host (links in <a> are
fine); MathJax is the vendored copy; the numbering and the buttons are what
_config.yml and _toc.yml ask for.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SITES = {"public": ROOT / "_build" / "html", "course": ROOT / "_build" / "course" / "html"}
CHAPTER0 = Path("notebooks/00_setup_and_notation.html")
REMOTE = re.compile(r"^\s*(https?:)?//", re.IGNORECASE)
# <link rel=...> values that make the browser fetch (or connect to) the target
FETCHING_RELS = {"stylesheet", "preload", "prefetch", "modulepreload", "icon", "shortcut",
                 "apple-touch-icon", "manifest", "preconnect", "dns-prefetch", "prerender"}
CSS_URL = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"])\s*((?:https?:)?//[^'")\s]+)""", re.IGNORECASE)


class ResourceFinder(HTMLParser):
    """Collect the URLs a page would fetch: scripts, styles, fonts, images, frames."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.fetched: list[tuple[str, str]] = []  # (tag, url)
        self.scripts: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "img", "iframe", "embed", "source", "audio", "video", "track", "input"):
            for key in ("src", "poster", "data"):
                if a.get(key):
                    self.fetched.append((tag, a[key]))
            if a.get("srcset"):  # "url 1x, url 2x"
                self.fetched.extend((tag, part.split()[0]) for part in a["srcset"].split(",") if part.strip())
            if tag == "script" and a.get("src"):
                self.scripts.append(a["src"])
        elif tag == "object" and a.get("data"):
            self.fetched.append((tag, a["data"]))
        elif tag == "link" and a.get("href"):
            rels = set((a.get("rel") or "").lower().split())
            if rels & FETCHING_RELS:
                self.fetched.append((f"link rel={a.get('rel')}", a["href"]))
        elif tag == "style":
            self._in_style = True
        if a.get("style"):
            self.fetched.extend(("style attribute", u) for u in CSS_URL.findall(a["style"]))

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.fetched.extend(("style element", u) for u in CSS_URL.findall(data))


def remote_resources(html: str) -> list[str]:
    finder = ResourceFinder()
    finder.feed(html)
    return [f"<{tag}> {url}" for tag, url in finder.fetched if REMOTE.match(url)]


def scripts_of(html: str) -> list[str]:
    finder = ResourceFinder()
    finder.feed(html)
    return finder.scripts


def pages(site: Path) -> list[Path]:
    if not (site / "index.html").is_file():
        pytest.fail(f"{site}/index.html is missing: the book build failed or did not run (see its output)")
    return sorted(site.rglob("*.html"))


@pytest.mark.parametrize("edition", sorted(SITES))
def test_no_page_fetches_from_another_host(edition):
    site = SITES[edition]
    offenders = {str(p.relative_to(site)): remote_resources(p.read_text(encoding="utf-8")) for p in pages(site)}
    offenders = {k: v for k, v in offenders.items() if v}
    assert offenders == {}, f"{edition}: pages load from other hosts: {offenders}"


@pytest.mark.parametrize("edition", sorted(SITES))
def test_no_stylesheet_fetches_from_another_host(edition):
    site = SITES[edition]
    pages(site)
    offenders = {}
    for css in sorted((site / "_static").rglob("*.css")):
        # drop comments: licence headers mention their home pages
        text = re.sub(r"/\*.*?\*/", "", css.read_text(encoding="utf-8", errors="replace"), flags=re.S)
        urls = CSS_URL.findall(text)
        if urls:
            offenders[str(css.relative_to(site))] = urls
    assert offenders == {}, f"{edition}: stylesheets fetch from other hosts: {offenders}"


@pytest.mark.parametrize("edition", sorted(SITES))
def test_mathjax_is_the_vendored_copy(edition):
    site = SITES[edition]
    pages(site)
    mathjax = site / "_static" / "mathjax"
    # the components the pages load (_config.yml: mathjax_path and mathjax3_config.loader)
    for component in ("startup.js", "core.js", "input/tex.js", "output/chtml.js",
                      "output/chtml/fonts/tex.js", "a11y/assistive-mml.js"):
        assert (mathjax / component).is_file(), f"vendored MathJax component {component} missing"
    fonts = list((mathjax / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    assert len(fonts) >= 20, f"only {len(fonts)} MathJax fonts vendored"
    page = (site / "book" / "notation.html").read_text(encoding="utf-8")
    mathjax_scripts = [s for s in scripts_of(page) if "mathjax" in s.lower()]
    # exactly one MathJax script: a static folder named _static at the book root would
    # make Jupyter Book add every .js under it (all MathJax components) to every page
    assert len(mathjax_scripts) == 1 and "_static/mathjax/startup.js" in mathjax_scripts[0], mathjax_scripts


@pytest.mark.parametrize("edition", sorted(SITES))
def test_pages_skip_the_heavy_theme_assets(edition):
    """No page loads fontawesome.js (1.5 MB) or, but search.html, the search index."""
    site = SITES[edition]
    offenders = {}
    for p in pages(site):
        if "_static" in p.relative_to(site).parts:  # theme files (webpack-macros.html), not pages
            continue
        scripts = scripts_of(p.read_text(encoding="utf-8"))
        heavy = [s for s in scripts if "fontawesome" in s
                 or (p.name != "search.html" and ("searchindex" in s or "searchtools" in s))]
        if heavy:
            offenders[str(p.relative_to(site))] = heavy
    assert offenders == {}, f"{edition}: {offenders}"


def test_remote_resource_finder_can_fail():
    """The finder flags what it must (so the asserts above can fail) and ignores <a>."""
    page = """<html><head>
      <script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"></script>
      <link rel="stylesheet" href="//fonts.googleapis.com/css?family=Lato">
      <link rel="canonical" href="https://example.org/book/">
      <style>@font-face { src: url('https://fonts.gstatic.com/x.woff2'); }</style>
      </head><body><img src="http://example.org/a.png"><img src="ok.png" srcset="ok2.png 2x, https://example.org/b.png 3x"><a href="https://github.com/">repo</a>
      <div style="background: url(https://example.org/bg.png)"></div>
      <script src="_static/local.js"></script></body></html>"""
    assert remote_resources(page) == [
        "<script> https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js",
        "<link rel=stylesheet> //fonts.googleapis.com/css?family=Lato",
        "<style element> https://fonts.gstatic.com/x.woff2",
        "<img> http://example.org/a.png",
        "<img> https://example.org/b.png",
        "<style attribute> https://example.org/bg.png",
    ]


def test_chapters_are_numbered_from_zero():
    site = SITES["public"]
    pages(site)
    page = (site / CHAPTER0).read_text(encoding="utf-8")
    article = page[page.index('<article class="bd-article"'):]
    title = re.search(r"<h1>(.*?)<a class=\"headerlink\"", article, re.S)
    assert title, "chapter 0 has no title"
    text = re.sub(r"<[^>]+>", "", title.group(1)).strip()
    assert re.match(r"^0\. \D", text), f"chapter 0's title is numbered {text!r}, expected '0. ...' once"


def test_launch_and_download_buttons_follow_the_configured_repository():
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    repo = config["repository"]["url"].rstrip("/")
    owner_name = repo.split("github.com/")[1]
    branch = config["repository"]["branch"]
    page = (SITES["public"] / CHAPTER0).read_text(encoding="utf-8") if pages(SITES["public"]) else ""
    stem = "notebooks/00_setup_and_notation.ipynb"
    assert f"https://colab.research.google.com/github/{owner_name}/blob/{branch}/{stem}" in page
    assert f"https://mybinder.org/v2/gh/{owner_name}/{branch}?urlpath=" in page
    assert f'href="../_sources/{stem}"' in page, "no download button for the notebook"
    assert (SITES["public"] / "_sources" / stem).is_file(), "the downloadable notebook is missing"


def test_course_edition_has_no_links_to_the_solutions():
    """The repository holds the master notebooks: the course site must not launch them."""
    page = (SITES["course"] / CHAPTER0).read_text(encoding="utf-8") if pages(SITES["course"]) else ""
    assert "colab.research.google.com" not in page and "mybinder.org/v2" not in page
    assert 'href="../_sources/notebooks/00_setup_and_notation.ipynb"' in page, "no download button"
