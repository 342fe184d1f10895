"""The alt text of a Matplotlib figure, read from the figure itself: titles, axis labels with
the ranges the axes show, legend entries, images' sizes.

``tools/execute_notebooks.py`` starts each chapter's kernel with ``tools/ipython`` as its IPython
directory; the startup file there wraps matplotlib-inline's ``_fetch_figure_metadata`` so that
every figure a cell shows is stored with ``{"alt": describe(fig)}`` in its output's metadata.
``tools/stage_book.py`` gives that text to the page's ``<img>`` (an author's ``tfbook.alt`` in the
cell's metadata still wins). So a title written ``f"T = {T}"`` reads "T = 64" in the alt text,
with the values the figure shows, where a text made from the cell's source could only say "…".
Readers' kernels never load this: it changes nothing a chapter prints.
"""

from __future__ import annotations

import re

LIMIT = 600
PANEL_NAMES = {2: ("Left", "Right"), 3: ("Left", "Middle", "Right")}


GREEK = {"alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "eta": "η", "theta": "θ",
         "lambda": "λ", "mu": "μ", "pi": "π", "rho": "ρ", "sigma": "σ", "tau": "τ", "phi": "φ", "omega": "ω",
         "Delta": "Δ", "Sigma": "Σ", "cdot": "·", "times": "×", "sqrt": "√", "le": "≤", "ge": "≥", "approx": "≈"}


def _clean(text: str) -> str:
    """Matplotlib mathtext as plain words: dollars and backslash commands dropped, one line."""
    text = re.sub(r"\\(mathrm|mathbf|mathit|text|operatorname)\{([^}]*)\}", r"\2", text or "")
    text = re.sub(r"\\[,;:! ]", " ", text)
    text = re.sub(r"\\([A-Za-z]+)", lambda m: GREEK.get(m.group(1), m.group(1)), text)
    text = text.replace("$", "").replace("{", "").replace("}", "")
    return " ".join(text.split())


def _num(x: float) -> str:
    return f"{x:.3g}".replace("e+0", "e").replace("e-0", "e-")


def _axis(ax, which: str) -> str:
    axis = ax.xaxis if which == "x" else ax.yaxis
    label = _clean(axis.get_label().get_text())
    lo, hi = ax.get_xlim() if which == "x" else ax.get_ylim()
    scale = axis.get_scale()
    rng = f"from {_num(min(lo, hi))} to {_num(max(lo, hi))}" + (f", {scale} scale" if scale != "linear" else "")
    return f"{label or which} ({rng})"


def describe_axes(ax) -> str:
    """One panel: its title, what is plotted against what with the shown ranges, legend entries."""
    parts = []
    title = _clean(ax.get_title()) or _clean(ax.get_title("left")) or _clean(ax.get_title("right"))
    if title:
        parts.append(title)
    images = ax.get_images()
    if images:
        rows, cols = images[0].get_array().shape[:2]
        down = _clean(ax.get_ylabel()) or "rows"
        across = _clean(ax.get_xlabel()) or "columns"
        parts.append(f"image of {rows} x {cols} cells, {down} down, {across} across")
    elif ax.has_data():
        parts.append(f"{_axis(ax, 'y')} against {_axis(ax, 'x')}")
    legend = ax.get_legend()
    if legend is not None:
        names = [_clean(t.get_text()) for t in legend.get_texts() if t.get_text()]
        if names:
            parts.append("legend: " + ", ".join(names[:8]) + (", …" if len(names) > 8 else ""))
    return "; ".join(parts)


def describe(fig) -> str:
    """The alt text of ``fig``: "Figure: <suptitle>. N panels. Left: ...", at most 600 characters."""
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.get_visible()
              and (ax.has_data() or ax.get_title())]
    texts = [t for t in (describe_axes(ax) for ax in panels) if t]
    head = []
    suptitle = getattr(fig, "_suptitle", None)
    if suptitle is not None and suptitle.get_text():
        head.append(_clean(suptitle.get_text()).rstrip(".") + ".")
    if len(texts) == 1:
        head.append(texts[0] + ".")
    elif texts:
        names = PANEL_NAMES.get(len(texts)) or [f"Panel {i + 1}" for i in range(len(texts))]
        head.append(f"{len(texts)} panels.")
        head += [f"{name}: {text}." for name, text in zip(names, texts)]
    text = "Figure: " + " ".join(head) if head else "Figure"
    return text if len(text) <= LIMIT else text[:LIMIT - 3].rsplit(" ", 1)[0] + " …"
