"""The built book in a real browser: math renders offline, nothing leaves 127.0.0.1.

Needs the site from `make book` (`_build/html`) and Debian's Chromium at
/usr/bin/chromium (`make test` builds the one and installs the other). The site is
served from a thread on 127.0.0.1 and driven over the Chrome DevTools Protocol;
screenshots land in `_build/screenshots/` for a person to look at.
"""

from __future__ import annotations

import base64
import functools
import json
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import websocket

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run",
]
CHAPTER0 = "notebooks/00_setup_and_notation.html"
TIMEOUT = 60.0  # seconds for any one page: load, typeset, fonts (a cold start takes ~2 s)

# Text nodes outside code and outside rendered math that still hold TeX delimiters,
# and .math elements that MathJax did not replace: both mean math was left raw.
# `overflow`: displayed equations wider than their box at the 1280x1000 viewport set in
# the `page` fixture; such an equation runs under its number "(N)" and is clipped
# (1 px of slack for sub-pixel rounding of the two widths).
RAW_MATH_JS = r"""
(() => {
  const root = document.querySelector('article') || document.body;
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const raw = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement.closest('pre, code, script, style, mjx-container, .highlight')) continue;
    const t = n.textContent;
    if (t.includes('$$') || t.includes('\\(') || t.includes('\\[')) raw.push(t.trim().slice(0, 80));
  }
  const untypeset = [...document.querySelectorAll('.math')]
    .filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.trim().slice(0, 80));
  return JSON.stringify({
    containers: document.querySelectorAll('mjx-container').length,
    merrors: [...document.querySelectorAll('mjx-merror')].map(e => e.textContent.slice(0, 80)),
    raw: raw, untypeset: untypeset,
    overflow: [...document.querySelectorAll('mjx-container[display="true"]')]
      .filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent.slice(0, 40)),
    title: document.title,
  });
})()
"""
TYPESET_DONE_JS = """
new Promise((resolve, reject) => {
  const t0 = Date.now();
  (function poll() {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(() => document.fonts.ready).then(() => resolve('ok'), reject);
    } else if (Date.now() - t0 > 20000) {
      reject(new Error('MathJax never started (script missing or blocked?)'));
    } else { setTimeout(poll, 50); }
  })();
})
"""


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def server():
    if not (SITE / "index.html").is_file():
        pytest.fail(f"{SITE}/index.html is missing: `make book` did not build the site (see its output)")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # port 0: a free port
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class DevTools:
    """A minimal Chrome DevTools Protocol client for one page."""

    def __init__(self, ws_url: str):
        self.ws = websocket.create_connection(ws_url, timeout=TIMEOUT, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params):
        self.next_id += 1
        call_id = self.next_id
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, event: str, after: int, timeout: float = TIMEOUT) -> dict:
        """Wait for `event` among the events received after index `after`."""
        deadline = time.monotonic() + timeout
        while True:
            for message in self.events[after:]:
                if message.get("method") == event:
                    return message
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {event} within {timeout} s")
            self.events.append(json.loads(self.ws.recv()))

    def evaluate(self, expression: str, await_promise: bool = False):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=await_promise, timeout=int(TIMEOUT * 1000))
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self):
        self.ws.close()


@pytest.fixture(scope="module")
def page():
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: `make chromium` (part of `make test`) installs it")
    profile = Path(tempfile.mkdtemp(prefix="tfbook-chromium-"))
    proc = subprocess.Popen(
        [str(CHROMIUM), *CHROMIUM_FLAGS, "--remote-debugging-port=0",
         f"--user-data-dir={profile}", "--window-size=1280,1000", "--hide-scrollbars", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + TIMEOUT
        while not (port_file.is_file() and port_file.read_text().count("\n") >= 1):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Chromium did not start (exit status {proc.poll()})")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            targets = [t for t in json.load(resp) if t["type"] == "page"]
        devtools = DevTools(targets[0]["webSocketDebuggerUrl"])
        for domain in ("Page", "Network", "Runtime"):
            devtools.call(f"{domain}.enable")
        devtools.call("Emulation.setDeviceMetricsOverride", width=1280, height=1000,
                      deviceScaleFactor=1, mobile=False)
        yield devtools
        devtools.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)


def visit(page: DevTools, url: str) -> tuple[dict, list[str], list[str]]:
    """Load `url`, wait for math and fonts; return (math report, request URLs, failures)."""
    start = len(page.events)
    page.call("Page.navigate", url=url)
    page.wait_for("Page.loadEventFired", after=start)
    page.evaluate(TYPESET_DONE_JS, await_promise=True)
    report = json.loads(page.evaluate(RAW_MATH_JS))
    events = page.events[start:]
    requests = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
    failures = [
        f"{e['params']['response']['status']} {e['params']['response']['url']}"
        for e in events
        if e.get("method") == "Network.responseReceived" and e["params"]["response"]["status"] >= 400
    ] + [
        f"{e['params'].get('errorText')} (request {e['params']['requestId']})"
        for e in events
        if e.get("method") == "Network.loadingFailed" and not e["params"].get("canceled")
    ]
    failures = [f for f in failures if "/favicon.ico" not in f]  # the browser asks for it on its own
    return report, requests, failures


def screenshot(page: DevTools, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    data = page.call("Page.captureScreenshot", format="png")["data"]
    path = SHOTS / f"{name}.png"
    path.write_bytes(base64.b64decode(data))
    return path


def off_host(requests: list[str]) -> list[str]:
    """Requests to anything but the local test server (data: and blob: URLs stay in the page)."""
    return [u for u in requests
            if urlsplit(u).scheme not in ("data", "blob", "about") and urlsplit(u).hostname != "127.0.0.1"]


def toc_chapters() -> list[str]:
    """Every notebook listed in _toc.yml, as its page path in the site."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part.get("chapters", [])]
    return [f"{f}.html" for f in files if f.startswith("notebooks/")]


@pytest.mark.parametrize(
    "path, shot, min_containers",
    [
        ("book/intro.html", "landing", 1),          # one displayed equation on the landing page
        (CHAPTER0, "chapter00", 1),
        ("book/notation.html", "notation", 15),     # the notation table is mostly math
    ] + [  # every other chapter: each one has math in its derivation
        (path, Path(path).stem, 1) for path in toc_chapters() if path != CHAPTER0
    ],
)
def test_page_renders_math_offline(server, page, path, shot, min_containers):
    report, requests, failures = visit(page, f"{server}/{path}")
    png = screenshot(page, shot)
    assert png.stat().st_size > 10_000, f"{png} is suspiciously small: blank page?"
    assert report["containers"] >= min_containers, f"{path}: MathJax rendered {report['containers']} formulas"
    assert report["merrors"] == [], f"{path}: MathJax errors {report['merrors']}"
    assert report["untypeset"] == [], f"{path}: math left untypeset {report['untypeset']}"
    assert report["raw"] == [], f"{path}: raw TeX delimiters in the text {report['raw']}"
    assert report["overflow"] == [], \
        f"{path}: displayed equations wider than the column (break them with aligned) {report['overflow']}"
    assert any(u.endswith("tex-chtml.js") or "/mathjax/tex-chtml.js" in u for u in requests), \
        f"{path}: the vendored MathJax was not loaded"
    assert off_host(requests) == [], f"{path}: requests left 127.0.0.1: {off_host(requests)}"
    assert failures == [], f"{path}: failed requests {failures}"


def test_site_root_opens_the_landing_page(server, page):
    """`/` (index.html, a redirect written by Jupyter Book) ends on the landing page."""
    start = len(page.events)
    page.call("Page.navigate", url=f"{server}/")
    deadline = time.monotonic() + TIMEOUT
    while True:
        navigated = [e["params"]["frame"]["url"] for e in page.events[start:]
                     if e.get("method") == "Page.frameNavigated" and "parentId" not in e["params"]["frame"]]
        if navigated and navigated[-1].endswith("/book/intro.html"):
            break
        assert time.monotonic() < deadline, f"/ did not lead to book/intro.html (went to {navigated})"
        page.events.append(json.loads(page.ws.recv()))
    page.wait_for("Page.loadEventFired", after=len(page.events) - 1)
    assert "Transformers, Derived and Checked" in page.evaluate("document.title")


def test_solution_toggle_opens(server, page):
    """Chapter 0's first solution is folded behind "Show solution" and opens on click."""
    visit(page, f"{server}/{CHAPTER0}")
    state = json.loads(page.evaluate(r"""
    (() => {
      const d = [...document.querySelectorAll('.tag_hide-input details')][0];
      if (!d) return JSON.stringify({found: false});
      const before = d.open;
      d.scrollIntoView();
      d.querySelector('summary').click();
      return JSON.stringify({found: true, before: before, after: d.open,
                             prompt: d.querySelector('summary').innerText.trim()});
    })()
    """))
    assert state["found"], "no folded solution cell in chapter 0"
    assert state["before"] is False and state["after"] is True, state
    assert "solution" in state["prompt"].lower(), state
    page.evaluate("window.scrollBy(0, -120)")
    time.sleep(0.6)  # let the toggle's fade-in animation finish before the screenshot
    screenshot(page, "chapter00_solution_open")


def test_off_host_filter_can_fail():
    """The request filter used above flags foreign hosts (so its assert can fail)."""
    assert off_host(["https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js",
                     "http://127.0.0.1:8000/index.html", "data:font/woff2;base64,AAAA"]) == [
        "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"]
