/* tfbook: output figures open full size (added by book/_ext/tfbook_theme.py).
 *
 * In the column a figure is scaled to fit (no sideways scrolling); a tap or click (or Enter)
 * opens it in a full-screen view at the largest size that fits the screen, at most its natural
 * size. On a phone held upright a wide figure is turned a quarter turn to use the screen's long
 * side (390 x 844 px: a 911 px wide figure at 90 % instead of 41 %); turning the phone shows
 * it upright at the same size. Escape, a tap or the close button closes the view. */
(() => {
  "use strict";
  const PAD = 8;  // px around the figure in the full view

  function layout(dialog) {
    const img = dialog.querySelector("img");
    const w = img.naturalWidth, h = img.naturalHeight;
    if (!w || !h) return;
    const vw = dialog.clientWidth - 2 * PAD, vh = dialog.clientHeight - 2 * PAD;
    const upright = Math.min(1, vw / w, vh / h);
    const turned = Math.min(1, vh / w, vw / h);
    const turn = vh > vw && turned > upright * 1.02;  // turned whenever that shows it larger
    const scale = turn ? turned : upright;
    img.style.width = `${w * scale}px`;
    img.style.height = `${h * scale}px`;
    img.style.transform = `translate(-50%, -50%)${turn ? " rotate(90deg)" : ""}`;
    dialog.dataset.turned = turn ? "1" : "0";
    dialog.dataset.scale = scale.toFixed(3);
  }

  function viewer() {
    let dialog = document.querySelector("dialog.tfbook-figure-view");
    if (dialog) return dialog;
    dialog = document.createElement("dialog");
    dialog.className = "tfbook-figure-view";
    dialog.setAttribute("aria-label", "Figure, full size");
    dialog.innerHTML = '<img alt=""><button type="button" class="tfbook-figure-close" aria-label="Close the figure">×</button>';
    dialog.addEventListener("click", () => dialog.close());
    dialog.querySelector("img").addEventListener("load", () => layout(dialog));
    window.addEventListener("resize", () => { if (dialog.open) layout(dialog); });
    document.body.appendChild(dialog);
    return dialog;
  }

  function open(img) {
    const dialog = viewer();
    const big = dialog.querySelector("img");
    big.alt = img.alt;
    dialog.showModal();
    if (big.src !== img.src) big.src = img.src; else layout(dialog);
    layout(dialog);
  }

  function wrap(img) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "tfbook-figure";
    button.title = "Open the figure full size";
    button.setAttribute("aria-haspopup", "dialog");
    img.replaceWith(button);
    button.appendChild(img);
    const hint = document.createElement("span");
    hint.className = "tfbook-figure-open";
    hint.setAttribute("aria-hidden", "true");
    hint.innerHTML = '<i class="fa-solid fa-expand"></i>';
    button.appendChild(hint);
    button.addEventListener("click", () => open(img));
  }

  function init() {
    document.querySelectorAll("div.cell_output img").forEach(wrap);
    // Sphinx's old search highlighting kept its words here and re-applied them on later pages
    try { localStorage.removeItem("sphinx_highlight_terms"); } catch (e) { /* storage off */ }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
