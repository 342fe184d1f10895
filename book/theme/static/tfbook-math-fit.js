/* tfbook: displayed equations that fit the column (added by book/_ext/tfbook_theme.py).
 *
 * On a narrow screen a displayed equation can be wider than the column. Each such equation is
 * typeset smaller, just enough to fit (its font size times column / equation width), down to
 * MIN of the text's size; an equation that would need less keeps MIN and scrolls in its box
 * (tfbook.css draws the cue). Run once MathJax has typeset the page, and again when the width
 * changes (a phone turned, a window resized): each equation starts from its own size then.
 * The desktop column fits every equation at full size (the browser test checks it), so this
 * only acts on narrow screens. */
(() => {
  const MIN = 0.6;  // the smallest size, as a fraction of the text's (about 10 px on a phone)
  const SELECTOR = 'div.math > mjx-container[jax="CHTML"][display="true"]';

  function fit() {
    for (const box of document.querySelectorAll(SELECTOR)) {
      box.style.fontSize = '';
      const base = parseFloat(getComputedStyle(box).fontSize);
      let size = base;
      for (let k = 0; k < 4 && box.scrollWidth > box.clientWidth + 1 && size > base * MIN; k++) {
        size = Math.max(base * MIN, size * (box.clientWidth - 1) / box.scrollWidth);
        box.style.fontSize = size.toFixed(2) + 'px';
      }
      box.classList.toggle('tfbook-math-fitted', size < base);
    }
    document.documentElement.dataset.tfbookMathFit = 'done';
  }

  let width = 0;
  function refit() {
    if (window.innerWidth === width) return;
    width = window.innerWidth;
    fit();
  }

  function start() {
    const ready = window.MathJax && window.MathJax.startup && window.MathJax.startup.promise;
    if (!ready) { setTimeout(start, 50); return; }
    ready.then(() => { width = 0; refit(); window.addEventListener('resize', refit); });
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
