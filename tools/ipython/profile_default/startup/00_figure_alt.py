# Loaded only by the kernels tools/execute_notebooks.py starts (IPYTHONDIR=tools/ipython): every
# figure a cell shows is stored with its alt text in the output's metadata (tools/figure_alt.py).
# Startup files run in the notebook's namespace: this one leaves no name behind.


def _tfbook_install_figure_alt():
    import importlib.util
    from pathlib import Path

    import matplotlib_inline.backend_inline as inline

    spec = importlib.util.spec_from_file_location(
        "tfbook_figure_alt", Path(__file__).resolve().parents[3] / "figure_alt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fetch = inline._fetch_figure_metadata

    def with_alt(fig):
        metadata = dict(fetch(fig) or {})
        try:
            metadata["alt"] = module.describe(fig)
        except Exception:  # an alt text is never worth a failed cell
            pass
        return metadata

    inline._fetch_figure_metadata = with_alt


_tfbook_install_figure_alt()
del _tfbook_install_figure_alt
