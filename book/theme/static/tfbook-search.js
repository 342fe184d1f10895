/* tfbook: the search page (book/theme/templates/search.html) runs Pagefind's UI.
 * The index lives in pagefind/ beside search.html; result URLs are stored from the site's
 * root ("/notebooks/03_why_scale.html"), so the site's own folder is their base: the site
 * works at a host's root and under a project path alike. */
window.addEventListener("DOMContentLoaded", () => {
  const box = document.getElementById("tfbook-search");
  if (!box || typeof PagefindUI === "undefined") return;
  const base = new URL(".", window.location.href).pathname;
  const ui = new PagefindUI({
    element: "#tfbook-search",
    bundlePath: new URL(box.dataset.bundle, window.location.href).pathname,
    baseUrl: base,
    showSubResults: true,
    // a long chapter that teaches a term must not lose to a short page that only mentions it:
    // Pagefind's page-length normalisation lowered from 0.75 (with the weights of
    // book/_ext/tfbook_search.py, each of the browser test's queries finds its chapter first)
    ranking: { pageLength: 0.3 },
    showImages: false,
    excerptLength: 24,
    resetStyles: false,
    autofocus: true,
    translations: { placeholder: "Search the book" },
  });
  const query = new URLSearchParams(window.location.search).get("q");
  if (query) ui.triggerSearch(query);
  // keep the words in the address: back from a result returns to the same results
  box.addEventListener("input", (event) => {
    if (!event.target.matches("input")) return;
    const url = new URL(window.location.href);
    if (event.target.value) url.searchParams.set("q", event.target.value);
    else url.searchParams.delete("q");
    history.replaceState(null, "", url);
  });
});
