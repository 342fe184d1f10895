"""The site's search: a Pagefind index built when the HTML build finishes (issue 25, item 2).

Sphinx's own search built each result's snippet from the page's HTML in the browser: it looked
for the *stemmed* word ("rotari"), failed, and fell back to the start of the page (the launch
buttons: "...Binder"), and it showed math as raw TeX (``\\(N\\)``). It also stored the search
words in localStorage, so old highlights came back on chapter pages opened later.

Pagefind (``pagefind[bin]`` pinned in requirements.txt: a Rust binary in a wheel, MIT, made by
CloudCannon) indexes the built pages once, at build time, and serves its index as static files
from ``_build/html/pagefind/``; the search page fetches only those files from the site's own
host (nothing leaves it, nothing is downloaded at build time). Its snippets are the sentence
around the matched words, with the words marked.

What is indexed, per page: the article only (not the navigation, header buttons or the page's
table of contents), with
* inline math turned into plain text (``\\(\\sqrt{D_K}\\)`` -> ``√D_K``) by :func:`tex_to_text`,
  so a snippet reads as text and never shows TeX;
* displayed equations, equation numbers, heading permalinks (``#``), code cells and their
  outputs left out (a snippet cut from code is no help; inline code in the prose and the package
  reference's signatures stay);
* each section's id copied onto its heading, so a result also lists the sections that match,
  each linking to its anchor.

``search.html`` (``book/theme/templates/search.html``) runs Pagefind's default UI with the query
of ``?q=``, which the theme's search box submits. Sphinx's ``sphinx_highlight.js`` is dropped from
every page (no stale highlights); ``searchindex.js`` is still written by Sphinx but no page loads it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from sphinx.util import logging

LOGGER = logging.getLogger(__name__)

# pages that are not content: the search page itself, the redirect and the empty index
SKIP = {"search.html", "genindex.html", "index.html"}
# never indexed: displayed equations, equation numbers, permalinks, code cells and their outputs
# (a snippet cut from code read "ax1.set_title(\"Learned weights $p_j(x_i)$\") fig.colorbar(...");
# names in the prose (inline code) and the package reference's signatures stay searchable)
DROP = ("div.math, span.eqno, a.headerlink, div.cell_input, div.cell_output, script, style, "
        ".tfbook-figure-open")

GREEK = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "varepsilon": "ε",
    "zeta": "ζ", "eta": "η", "theta": "θ", "iota": "ι", "kappa": "κ", "lambda": "λ", "mu": "μ",
    "nu": "ν", "xi": "ξ", "pi": "π", "rho": "ρ", "sigma": "σ", "tau": "τ", "phi": "φ",
    "varphi": "φ", "chi": "χ", "psi": "ψ", "omega": "ω", "Gamma": "Γ", "Delta": "Δ",
    "Theta": "Θ", "Lambda": "Λ", "Pi": "Π", "Sigma": "Σ", "Phi": "Φ", "Psi": "Ψ", "Omega": "Ω",
    "ell": "ℓ",
}
SYMBOLS = {
    "cdot": "·", "times": "×", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠",
    "neq": "≠", "approx": "≈", "sim": "~", "in": "∈", "to": "→", "rightarrow": "→",
    "leftarrow": "←", "mapsto": "↦", "infty": "∞", "sum": "Σ", "prod": "Π", "partial": "∂",
    "nabla": "∇", "top": "ᵀ", "ldots": "…", "cdots": "…", "dots": "…", "pm": "±", "mid": "|",
    "lVert": "‖", "rVert": "‖", "Vert": "‖", "lvert": "|", "rvert": "|", "langle": "⟨",
    "rangle": "⟩", "odot": "⊙", "otimes": "⊗", "oplus": "⊕", "propto": "∝", "log": "log",
    "exp": "exp", "max": "max", "min": "min", "sin": "sin", "cos": "cos", "lse": "lse",
    "quad": " ", "qquad": " ", "star": "⋆", "circ": "∘", "forall": "∀", "exists": "∃",
}
# commands whose braced argument is kept as it is (fonts, text, decorations)
KEEP_ARG = re.compile(r"\\(?:mathrm|mathbf|mathit|mathsf|mathtt|mathcal|mathbb|boldsymbol|bm|text|"
                      r"textrm|textbf|textit|operatorname|hat|tilde|bar|overline|vec|widehat|"
                      r"widetilde|underline|left|right|big|Big|bigg|Bigg)\b\s*")


def tex_to_text(tex: str) -> str:
    """Inline TeX as plain text for search snippets: ``\\frac{1}{\\sqrt{D_K}}`` -> ``1/√D_K``."""
    s = tex.strip()
    for a, b in (("\\(", ""), ("\\)", ""), ("$", "")):
        s = s.replace(a, b)
    s = re.sub(r"\\(?:,|;|:|!| )", " ", s)
    s = KEEP_ARG.sub("", s)
    for _ in range(4):  # innermost first: \frac{1}{\sqrt{D_K}}
        s = re.sub(r"\\sqrt\s*\{([^{}]*)\}", r"√\1", s)
        s = re.sub(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"(\1)/(\2)", s)
    s = re.sub(r"\\sqrt\b", "√", s)
    s = re.sub(r"\^\s*\{?\\top\}?", "ᵀ", s)
    s = re.sub(r"\\([A-Za-z]+)", lambda m: GREEK.get(m.group(1), SYMBOLS.get(m.group(1), m.group(1))), s)
    s = s.replace("\\{", "{").replace("\\}", "}").replace("\\", "")
    s = re.sub(r"([_^])\{([^{}]*)\}", r"\1\2", s)  # D_{K} -> D_K
    s = s.replace("{", "").replace("}", "")
    # (a)/(b) -> a/b where a or b is one symbol: 1/√D_K, not 1/(√D_K)
    s = re.sub(r"\(([^\s()+\-/]+)\)/", r"\1/", s)
    s = re.sub(r"/\(([^\s()+\-/]+)\)", r"/\1", s)
    return re.sub(r"\s+", " ", s).strip()


def page_for_index(html: str, path: str | None = None) -> str | None:
    """The part of a built page that the index reads, or None for a page without an article.
    ``path``: the page's path in the site (``book/api.html``), which says whether it is one of
    the reference pages (:data:`REFERENCE_PAGES`), weighed less."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    article = soup.select_one("article.bd-article")
    if article is None:
        return None
    for el in article.select(DROP):
        el.decompose()
    for el in article.select("span.math"):
        el.replace_with(" " + tex_to_text(el.get_text()) + " ")
    for section in article.select("section[id]"):
        heading = section.find(re.compile(r"^h[1-6]$"), recursive=False)
        if heading is not None and not heading.get("id"):
            heading["id"] = section["id"]
    title = soup.title.get_text() if soup.title else ""
    weight = f' data-pagefind-weight="{REFERENCE_WEIGHT}"' if path in REFERENCE_PAGES else ""
    if weight:  # a reference page: every word, headings included, counts less than a chapter's
        for heading in article.find_all(re.compile(r"^h[1-6]$")):
            heading["data-pagefind-weight"] = str(REFERENCE_WEIGHT)
    terms = INTRODUCES.get(Path(path).stem if path else "", ())
    intro = (f'<p data-pagefind-weight="{INTRODUCES_WEIGHT}">This chapter introduces {", ".join(terms)}.</p>'
             if terms else "")
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"</head><body><main data-pagefind-body{weight}>{article}{intro}</main></body></html>")


# The package reference (book/api.md) names every function of every chapter, and the notation
# page lists every symbol: they came second for "induction head" (on `num_heads`), "beam search",
# "flash attention"... A reader searching a term wants the chapter that teaches it first, so the
# words of these pages weigh less (Pagefind's data-pagefind-weight; 1 is a chapter's text).
REFERENCE_PAGES = ("book/api.html", "book/notation.html", "book/bibliography.html")
REFERENCE_WEIGHT = 0.1

# The terms each chapter introduces (book/../BOOK.md's plan): its page gets one indexed sentence
# naming them, weighed more than its text, so that a search for a term lists first the chapter
# that teaches it ("rotary" found chapter 7, where RoPE is derived, fifth: chapters that only use
# rotary positions, the history and the serving chapter, say "rotary" more densely). The sentence
# is in the index only (the page is unchanged); a result may show it as its snippet.
INTRODUCES = {
    "00_setup_and_notation": ["the notation", "device selection"],
    "01_tokens_and_embeddings": ["tokens", "tokenisation", "byte pair encoding (BPE)", "embeddings",
                                 "image patches", "audio frames", "receptive fields"],
    "02_attention_as_averaging": ["attention as a weighted average", "softmax", "queries and keys",
                                  "additive (Bahdanau) attention", "dot-product (Luong) attention"],
    "03_why_scale": ["scaled dot-product attention", "the 1/√D_K scale", "softmax saturation"],
    "04_self_attention": ["self-attention", "queries, keys and values", "attention maps"],
    "05_multi_head_attention": ["multi-head attention", "attention heads", "W_O"],
    "06_permutation_equivariance": ["permutation equivariance", "attention as message passing"],
    "07_positional_information": ["positional encoding", "sinusoidal positions", "learned positions",
                                  "rotary position embedding (RoPE)", "2D positions"],
    "08_mlp_residuals_layernorm": ["the MLP (feed-forward network)", "GELU", "residual connections",
                                   "layer normalisation (LayerNorm)", "Pre-LN and Post-LN"],
    "09_encoder": ["the transformer block", "the encoder"],
    "10_training_from_scratch": ["cross-entropy", "backpropagation", "AdamW", "learning-rate warm-up",
                                 "gradient clipping", "mixed precision (bf16)", "Muon (Newton-Schulz)"],
    "11_decoders": ["the decoder", "the causal mask", "teacher forcing", "sampling and temperature",
                    "top-k and nucleus sampling", "the KV cache"],
    "12_encoder_decoder": ["cross-attention", "encoder-decoder (seq2seq)", "beam search"],
    "13_language_model": ["the language model", "bits per character", "Kneser-Ney n-grams",
                          "compression", "dynamic evaluation", "mixing with a count model (kNN-LM, infini-gram)"],
    "14_modern_decoder": ["the modern decoder", "RMSNorm", "SwiGLU", "grouped-query attention (GQA)",
                          "Llama", "QK-norm", "the RoPE base"],
    "15_vision_transformer": ["the Vision Transformer (ViT)", "patch embedding", "the class token",
                              "attention rollout"],
    "16_cost": ["FLOPs", "the cost of attention", "memory", "MFU"],
    "17_efficient_attention": ["efficient attention", "online softmax", "FlashAttention (tiled attention)",
                               "sliding-window attention", "linear attention"],
    "18_parallel_training": ["parallel training", "data parallelism (DDP)", "ZeRO", "FSDP",
                             "tensor parallelism", "pipeline parallelism", "ring attention"],
    "19_experts_and_adapters": ["mixture of experts (MoE)", "routers", "load balancing",
                                "auxiliary-loss-free balancing (router bias)", "router z-loss",
                                "low-rank adaptation (LoRA)"],
    "20_serving": ["multi-head latent attention (MLA)", "context extension (PI, NTK, YaRN)",
                   "attention sinks", "quantisation (int8, int4, GPTQ)", "paged KV cache",
                   "continuous batching", "speculative decoding"],
    "21_induction_heads": ["induction heads", "previous-token heads", "the phase change"],
    "22_in_context_learning": ["in-context learning", "in-context linear regression"],
    "23_attention_as_recurrence": ["attention as a recurrence", "the delta rule (DeltaNet)",
                                   "Gated DeltaNet", "state-space duality (Mamba-2)", "hybrid models"],
    "24_instruction_tuning": ["instruction tuning", "chat templates", "loss masking", "packing"],
    "25_evaluation": ["evaluation", "verifiers", "pass@k", "confidence intervals", "contamination"],
    "26_preferences": ["preferences", "reward models (Bradley-Terry)", "direct preference optimisation (DPO)",
                       "the KL-regularised objective", "RLHF"],
    "27_rl_verifiable_rewards": ["reinforcement learning with verifiable rewards (RLVR)", "REINFORCE",
                                 "GRPO", "the k3 KL estimator", "rejection sampling", "self-consistency",
                                 "best-of-N", "inference-time compute"],
}
INTRODUCES_WEIGHT = 10.0


def build_index(outdir: Path) -> int:
    """Write the Pagefind index of the built site in ``outdir`` into ``outdir/pagefind``.

    The pages as the index should read them (:func:`page_for_index`) are written to a
    temporary copy of the site, which Pagefind's command line indexes in one process that
    exits when every file is written (its Python API's service wrote pagefind-entry.json
    empty once, under load, when it was closed). Returns the number of pages indexed."""
    import json
    import subprocess
    import sys
    import tempfile

    outdir = Path(outdir)
    bundle = outdir / "pagefind"
    pages = 0
    with tempfile.TemporaryDirectory(prefix="tfbook-pagefind-") as tmp:
        for path in sorted(outdir.rglob("*.html")):
            rel = path.relative_to(outdir)
            if rel.as_posix() in SKIP or rel.parts[0] in ("_static", "_sources", "_images", "pagefind"):
                continue
            content = page_for_index(path.read_text(encoding="utf-8"), rel.as_posix())
            if content is None:
                continue
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / rel).write_text(content, encoding="utf-8")
            pages += 1
        subprocess.run([sys.executable, "-m", "pagefind", "--site", tmp, "--output-path", str(bundle),
                        "--force-language", "en", "--quiet"], check=True)
    entry = json.loads((bundle / "pagefind-entry.json").read_text(encoding="utf-8"))
    if not entry.get("languages") or not (bundle / "pagefind-ui.js").is_file():
        raise RuntimeError(f"tfbook_search: Pagefind wrote no usable index in {bundle}")
    return pages


def _build_finished(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    start = time.perf_counter()
    pages = build_index(Path(app.outdir))
    LOGGER.info(f"tfbook_search: Pagefind indexed {pages} pages in {time.perf_counter() - start:.1f} s")


def _drop_highlight_script(app, pagename, templatename, context, doctree):
    """No sphinx_highlight.js: it re-highlighted old search words kept in localStorage."""
    scripts = context.get("script_files")
    if scripts:
        scripts[:] = [js for js in scripts
                      if not str(getattr(js, "filename", js) or "").endswith("sphinx_highlight.js")]


def setup(app):
    app.connect("build-finished", _build_finished)
    app.connect("html-page-context", _drop_highlight_script, priority=901)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
