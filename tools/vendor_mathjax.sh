#!/usr/bin/env bash
# Vendor MathJax 3 for the offline book.
#
#   tools/vendor_mathjax.sh [DEST]      (default DEST: _vendor/mathjax)
#
# Installs mathjax@3.2.2 from npm into .cache/mathjax-npm (outside the book sources;
# skipped when already there), then copies a trimmed es5/ into DEST: the components the
# pages load (startup, core, input/tex, output/chtml and its font data, a11y/assistive-mml:
# 0.76 MB; _config.yml's mathjax3_config lists them), the TeX extensions input/tex may
# autoload (\boldsymbol, \cancel, ...) and the CHTML woff-v2 fonts. The combined
# tex-chtml component (1.16 MB, of which 0.43 MB is the right-click menu) is kept for the
# Makefile, which uses it as the stamp of this step, and the menu components with it; no
# page loads them.
# _config.yml lists _vendor in html_static_path, so DEST ends up in _static/mathjax.
# _vendor must not be renamed to _static: Jupyter Book 1 would then add every .js in it
# as a <script> tag to every page.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=3.2.2
CACHE=.cache/mathjax-npm
DEST=${1:-_vendor/mathjax}
PKG=$CACHE/node_modules/mathjax

have=$(node -p "require('./$PKG/package.json').version" 2>/dev/null || true)
if [[ "$have" != "$VERSION" ]]; then
    command -v npm >/dev/null || { echo "vendor_mathjax: npm is required (apt-get install npm)" >&2; exit 1; }
    mkdir -p "$CACHE"
    npm install --prefix "$CACHE" --no-audit --no-fund --no-save --silent "mathjax@$VERSION"
fi

ES5=$PKG/es5
rm -rf "$DEST"
mkdir -p "$DEST/input/tex" "$DEST/output/chtml/fonts"
cp "$ES5/tex-chtml.js" "$ES5/startup.js" "$ES5/core.js" "$DEST/"
cp "$ES5/input/tex.js" "$DEST/input/"
cp "$ES5/output/chtml.js" "$DEST/output/"
cp "$ES5/output/chtml/fonts/tex.js" "$DEST/output/chtml/fonts/"
cp -r "$ES5/input/tex/extensions" "$DEST/input/tex/"
cp -r "$ES5/output/chtml/fonts/woff-v2" "$DEST/output/chtml/fonts/"
cp -r "$ES5/ui" "$ES5/a11y" "$DEST/"
cp "$PKG/LICENSE" "$DEST/"
echo "vendor_mathjax: MathJax $VERSION in $DEST ($(du -sh "$DEST" | cut -f1))"
