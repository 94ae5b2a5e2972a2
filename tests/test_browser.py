"""Every built page, opened offline in headless Chromium, renders as a reader sees it.

Run after the book is built (``make browser`` builds it first and installs Debian's
``chromium`` when it is missing).  The site is served from ``_build/html`` on
127.0.0.1; Chromium runs with background networking off, every host name resolving
to nothing and a proxy on a dead port, so nothing can come from another host.  The
test speaks the DevTools protocol to Chromium over a pipe (``--remote-debugging-pipe``):
no driver, no port, nothing downloaded.

Each page fails on
- a console error (uncaught exception, ``console.error``, a resource that fails to
  load) or a request to another host;
- raw TeX in the text outside math (``\\frac``, ``$$``, ``\\begin{``, ``^{``) or a
  MathJax error (``merror``, or an undefined macro that MathJax shows in red);
- an image that does not load (``naturalWidth`` 0);
- a display equation or a table wider than its column at a 1280 px viewport (it would
  scroll or be cut off);
- a figure without a numbered caption, or whose alt text is missing or a file path;
- a page that scrolls sideways at a 400 px viewport;
- a solution a reader can see before clicking (a sphinx-exercise solution that is not a
  closed dropdown), an exercise without a sphinx-exercise solution, or an exercise or
  solution written outside the directives ("**Exercise 1.**", a code cell that starts
  with "# Solution").

Over the whole book (``test_book_limits``):
- at most 10% of display equations scroll sideways at 400 px;
- at most 600 lines of code are visible without a click (code cell inputs outside
  closed toggles; blank lines not counted).

A screenshot of every page (the full page at 1280 px, in tiles of 16000 px, and the first
screen at 400 px) and a report (``report.txt``, ``report.json``) go to
``_build/screenshots/``, which CI leaves behind.  The report lists every defect, and per
page the equations that scroll at 400 px and the visible code lines, with the book's
totals at the end.
"""

import base64
import fcntl
import functools
import http.server
import json
import os
import re
import select
import shutil
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Another built copy (for instance one built with --path-output) can be checked by
# setting POSENC_SITE to its html folder; its screenshots go beside it.
SITE = Path(os.environ.get("POSENC_SITE", ROOT / "_build" / "html")).resolve()
SHOTS = SITE.parent / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
WIDE, NARROW = 1280, 400
# Book-wide limits (issue 22).
MAX_SCROLLING_SHARE_AT_400PX = 0.10
MAX_VISIBLE_CODE_LINES = 600
MAX_SHOT_HEIGHT = 16000  # taller captures are unreliable in Chromium: tile them
PAGE_TIMEOUT = 90  # seconds for one page to load and typeset (2 busy cores)

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--mute-audio",
    "--force-device-scale-factor=1",
    "--hide-scrollbars",
    # Offline: no name resolves, and anything that still tries goes to a dead port.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=127.0.0.1",
    "--remote-debugging-pipe",
]


# --------------------------------------------------------------------------- pages


def _is_redirect(page):
    return re.search(r'http-equiv="refresh"', page.read_text(encoding="utf-8"), re.I)


def built_pages():
    """Every HTML page of the site (relative paths), redirects and assets left out."""
    if not SITE.is_dir():
        return []
    pages = []
    for page in sorted(SITE.rglob("*.html")):
        rel = page.relative_to(SITE)
        if rel.parts[0].startswith("_") or _is_redirect(page):
            continue
        pages.append(rel.as_posix())
    return pages


# ------------------------------------------------------------- DevTools over a pipe


class DevTools:
    """A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe``."""

    def __init__(self, user_data_dir, log):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def _wire_pipes():  # the browser reads commands on fd 3, answers on fd 4
            high_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(3, 4),
            preexec_fn=_wire_pipes,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events = []

    def _read_message(self, deadline):
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium exited (code {self.proc.poll()})")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method, session=None, timeout=PAGE_TIMEOUT, **params):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, event, timeout=PAGE_TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            for message in self.events:
                if message.get("method") == event:
                    return message
            self.events.append(self._read_message(deadline))

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            os.close(fd)


class Tab:
    """One page target: navigate, evaluate, measure, screenshot, collect errors."""

    def __init__(self, devtools):
        self.dt = devtools
        targets = devtools.send("Target.getTargets")["targetInfos"]
        pages = [t["targetId"] for t in targets if t["type"] == "page"]
        target = pages[0] if pages else devtools.send("Target.createTarget", url="about:blank")
        target = target if isinstance(target, str) else target["targetId"]
        self.session = devtools.send("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    def call(self, method, **params):
        return self.dt.send(method, session=self.session, **params)

    def viewport(self, width, height, mobile):
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=mobile,
        )

    def open(self, url):
        self.dt.events.clear()
        self.call("Page.navigate", url=url)
        self.dt.wait_for("Page.loadEventFired")

    def evaluate(self, expression):
        result = self.call(
            "Runtime.evaluate",
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
            timeout=PAGE_TIMEOUT * 1000,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path, full_page):
        """PNG of the viewport, or of the whole page in tiles of MAX_SHOT_HEIGHT px."""
        if not full_page:
            data = self.call("Page.captureScreenshot", format="png")["data"]
            path.write_bytes(base64.b64decode(data))
            return
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        width, height = int(size["width"]), int(size["height"])
        for part, top in enumerate(range(0, max(height, 1), MAX_SHOT_HEIGHT), start=1):
            clip = {"x": 0, "y": top, "width": width, "scale": 1}
            clip["height"] = min(MAX_SHOT_HEIGHT, height - top)
            data = self.call(
                "Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip
            )["data"]
            tile = path if part == 1 else path.with_name(f"{path.stem}--part{part}.png")
            tile.write_bytes(base64.b64decode(data))

    def problems_logged(self, site_origin):
        """Console errors and requests to other hosts since the last ``open``."""
        errors, foreign = [], []
        for event in self.dt.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                text = details.get("exception", {}).get("description") or details.get("text")
                errors.append(f"uncaught: {text.splitlines()[0]} ({details.get('url', '')})")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in (
                "error",
                "assert",
            ):
                args = [str(a.get("value", a.get("description", ""))) for a in params["args"]]
                errors.append("console.error: " + " ".join(args))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                entry = params["entry"]
                errors.append(f"{entry['source']}: {entry['text']} {entry.get('url', '')}")
            elif method == "Network.requestWillBeSent":
                url = params["request"]["url"]
                parts = urlsplit(url)
                if parts.scheme not in ("data", "blob", "about") and (
                    f"{parts.scheme}://{parts.netloc}" != site_origin
                ):
                    foreign.append(url)
        return errors, foreign


# ------------------------------------------------------------------ in-page checks

# Resolves once MathJax has typeset the page, the fonts are in and every image
# (lazy ones too) has loaded or failed.
SETTLE_JS = r"""
(async () => {
  for (const img of document.images) img.loading = "eager";
  const images = Promise.all([...document.images].map(
    (img) => img.complete ? null : new Promise((ok) => { img.onload = img.onerror = ok; })));
  const start = Date.now();
  while (window.MathJax && !(MathJax.startup && MathJax.startup.promise)
         && Date.now() - start < 30000) {
    await new Promise((ok) => setTimeout(ok, 50));
  }
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await document.fonts.ready;
  await Promise.race([images, new Promise((ok) => setTimeout(ok, 20000))]);
  await new Promise((ok) => requestAnimationFrame(() => requestAnimationFrame(ok)));
  return true;
})()
"""

# Helpers shared by the two check scripts.
HELPERS_JS = r"""
const clip = (s, n = 90) => s.replace(/\s+/g, " ").trim().slice(0, n);
const where = (el) => {
  const sec = el.closest("section[id]");
  return sec ? `#${sec.id}` : "";
};
const describe = (c) => {
  const box = c.closest("div.math, span.math, .math");
  const eqno = box && box.querySelector(".eqno");
  const number = eqno ? " " + clip(eqno.textContent.replace(/#/g, ""), 12) : "";
  return `${(box && box.id) || where(c)}${number}`;
};
const tex = (c) => {
  try {
    const item = MathJax.startup.document.getMathItemsWithin(c)[0];
    return item ? clip(item.math, 70) : "";
  } catch (e) { return ""; }
};
const scrolls = (el) => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
// Shown on load: rendered, and not inside a closed <details> (a folded cell or solution).
const shown = (el) => el.checkVisibility({checkOpacity: true, checkVisibilityCSS: true})
  && el.getClientRects().length > 0 && !el.closest("details:not([open])");
// The typeset formula itself (not MathJax's hidden copy for screen readers).
const formula = (c) => c.querySelector("mjx-math") || c;
// Math a reader cannot see whole: the formula overflows a box that clips instead of
// scrolling, or the box sticks out of an ancestor that clips.  Math that scrolls is fine.
const cutOffMath = () => {
  const found = [];
  for (const c of document.querySelectorAll("mjx-container")) {
    if (!c.offsetParent) continue;  // hidden (e.g. a folded solution)
    const box = c.getAttribute("display") === "true" ? c : (c.closest("span.math") || c);
    const math = formula(c).getBoundingClientRect();
    const rect = box.getBoundingClientRect();
    let cut = !scrolls(box) && getComputedStyle(box).overflowX !== "visible"
      && (math.right > rect.right + 1 || math.left < rect.left - 1);
    const right = scrolls(box) ? rect.right : math.right;
    for (let a = box.parentElement; a && a !== document.body && !cut; a = a.parentElement) {
      if (getComputedStyle(a).overflowX === "visible") continue;
      cut = !scrolls(a) && right > a.getBoundingClientRect().right + 1;
      break;
    }
    if (cut) found.push(`${describe(c)}: ${tex(c)}`);
  }
  return found;
};
"""

# Defects visible at the wide viewport.  Returns lists of short descriptions.
WIDE_CHECKS_JS = (
    "(() => {"
    + HELPERS_JS
    + r"""
  const out = {raw_tex: [], math_errors: [], broken_images: [], wide_equations: [],
               wide_tables: [], cut_off_math: cutOffMath(), uncaptioned_figures: [],
               bad_alt_text: [], solution_visible_before_click: [],
               exercise_without_solution: [], exercise_outside_directive: [],
               info_visible_code: []};

  // Raw TeX in text outside math, code and scripts.
  const SKIP = "script, style, pre, code, kbd, samp, textarea, mjx-container, .highlight";
  // A backslash command (\frac, \begin), $$, a sub/superscript group, or \( \) \[ \].
  const TEX = /\\[a-zA-Z]{2,}|\$\$|[_^]\{|\\[()\[\]]/;
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    const el = node.parentElement;
    if (!el || el.closest(SKIP)) continue;
    const m = node.data.match(TEX);
    if (m) {
      const i = Math.max(0, m.index - 40);
      out.raw_tex.push(`${where(el)} "${clip(node.data.slice(i, m.index + 50))}"`);
    }
  }

  // MathJax errors and undefined macros (shown in red by the noundefined extension).
  for (const c of document.querySelectorAll("mjx-container")) {
    const merror = c.querySelector("mjx-merror");
    const red = c.querySelector('mjx-assistive-mml [mathcolor="red"], mjx-assistive-mml merror');
    if (merror || red) {
      const why = merror ? (merror.getAttribute("data-mjx-error") || "merror")
                         : `undefined ${clip(red.textContent, 30)}`;
      out.math_errors.push(`${describe(c)} ${why}: ${tex(c)}`);
    }
  }

  // Images that did not load.
  for (const img of document.images) {
    if (!img.complete || img.naturalWidth === 0) {
      out.broken_images.push(img.getAttribute("src"));
    }
  }

  // Display equations wider than their box (they scroll, or are cut off).  The number
  // moves under the formula when both do not fit side by side (posenc.css), so the
  // formula's box is the whole column or the column minus the number.
  for (const c of document.querySelectorAll('mjx-container[display="true"]')) {
    if (!c.offsetParent) continue;
    const column = (c.closest("div.math") || c.parentElement).getBoundingClientRect();
    const room = Math.min(c.clientWidth || column.width, column.width);
    const needs = formula(c).getBoundingClientRect().width;
    if (needs > room + 1) {
      out.wide_equations.push(
        `${describe(c)} needs ${Math.round(needs)}px, has ${Math.round(room)}px: ${tex(c)}`);
    }
  }

  // Tables wider than the column they sit in: they scroll inside their box, or are cut.
  const article = document.querySelector("article.bd-article")
    || document.querySelector("[role=main]") || document.body;
  const columnRight = (() => {
    const r = article.getBoundingClientRect(), s = getComputedStyle(article);
    return r.right - parseFloat(s.paddingRight || "0");
  })();
  for (const table of article.querySelectorAll("table")) {
    if (!shown(table)) continue;
    const box = table.parentElement;
    const room = Math.min(box.clientWidth, columnRight - box.getBoundingClientRect().left);
    const needs = Math.max(table.scrollWidth, table.getBoundingClientRect().width);
    if (needs > room + 1) {
      const head = clip([...table.querySelectorAll("th, td")].slice(0, 3)
        .map((c) => c.textContent).join(" | "), 50);
      const how = scrolls(box) ? "scrolls" : "cut off";
      out.wide_tables.push(`${where(table)} needs ${Math.round(needs)}px, ` +
                           `has ${Math.round(room)}px (${how}): ${head}`);
    }
  }

  // Solutions stay folded until clicked, and exercises use the sphinx-exercise directives.
  for (const sol of article.querySelectorAll(".solution")) {
    const title = sol.querySelector(".admonition-title, summary");
    const name = clip((title || sol).textContent, 40);
    const body = [...sol.querySelectorAll(":scope > *, :scope > section > *")]
      .filter((el) => !el.matches(".admonition-title, summary, button, section")
                      && !(title && el.contains(title)));
    const open = (sol.matches("details") && sol.open) || body.some(shown);
    if (open) out.solution_visible_before_click.push(`${where(sol)} #${sol.id}: ${name}`);
  }
  const solved = new Set([...article.querySelectorAll(".solution .admonition-title a[href]")]
    .map((a) => decodeURIComponent(a.getAttribute("href").split("#").pop())));
  for (const ex of article.querySelectorAll(".exercise[id]")) {
    if (!solved.has(ex.id)) {
      out.exercise_without_solution.push(`${where(ex)} #${ex.id}: ${clip(ex.textContent, 60)}`);
    }
  }
  for (const strong of article.querySelectorAll("p > strong:first-child")) {
    if (/^\s*Exercise\s+\d+/i.test(strong.textContent) && !strong.closest(".exercise")) {
      out.exercise_outside_directive.push(
        `${where(strong)} "${clip(strong.parentElement.textContent, 60)}"`);
    }
  }
  for (const pre of article.querySelectorAll(".cell_input pre")) {
    const first = pre.textContent.trimStart().split("\n")[0];
    if (/^#+\s*solution\b/i.test(first) && !pre.closest(".solution")) {
      out.exercise_outside_directive.push(`${where(pre)} code cell "${clip(first, 60)}"`);
    }
  }

  // Code a reader sees without clicking: lines of code cell inputs outside closed toggles
  // (hide-input, hide-cell, folded solutions); removed cells are not in the page.
  out.stats = {visible_code_lines: 0, visible_code_cells: 0};
  for (const pre of article.querySelectorAll(".cell_input pre")) {
    if (!shown(pre)) continue;
    const lines = pre.textContent.split("\n").filter((line) => line.trim()).length;
    out.stats.visible_code_lines += lines;
    out.stats.visible_code_cells += 1;
    out.info_visible_code.push(
      `${where(pre)} ${lines} lines: ${clip(pre.textContent.trim().split("\n")[0], 50)}`);
  }

  // Content images: a figure with a numbered caption, and real alt text.
  const PATHLIKE = /(^|\/)[^\s\/]+\.(png|jpe?g|svg|gif|webp)$|^\.\.?\/|_images\//i;
  for (const img of article.querySelectorAll("img")) {
    const src = (img.getAttribute("src") || "").split("/").pop();
    const fig = img.closest("figure");
    const cap = fig && fig.querySelector("figcaption");
    if (!cap || !cap.textContent.trim()) {
      out.uncaptioned_figures.push(`${where(img)} ${src}: no caption`);
    } else if (!cap.querySelector(".caption-number")) {
      out.uncaptioned_figures.push(`${where(img)} ${src}: caption not numbered`);
    }
    const alt = (img.getAttribute("alt") || "").trim();
    if (!alt || PATHLIKE.test(alt)) {
      out.bad_alt_text.push(`${where(img)} ${src}: alt ${JSON.stringify(clip(alt, 40))}`);
    }
  }
  return out;
})()
"""
)

# At the narrow viewport: math cut off, a page that scrolls sideways (and what sticks
# out), and, for information, inline math that has to scroll within its line.
NARROW_CHECKS_JS = (
    "(() => {"
    + HELPERS_JS
    + r"""
  const out = {cut_off_math_at_400px: cutOffMath(), scrolls_sideways_at_400px: [],
               info_inline_math_scrolls_at_400px: [], info_equations_scroll_at_400px: []};
  // Display equations a reader has to scroll sideways (shown ones: not in a fold).
  out.stats = {display_equations: 0, scrolling_equations_at_400px: 0};
  for (const c of document.querySelectorAll('mjx-container[display="true"]')) {
    if (!shown(c)) continue;
    out.stats.display_equations += 1;
    const needs = formula(c).getBoundingClientRect().width;
    if (needs > c.clientWidth + 1) {
      out.stats.scrolling_equations_at_400px += 1;
      out.info_equations_scroll_at_400px.push(
        `${describe(c)} needs ${Math.round(needs)}px, has ${c.clientWidth}px: ${tex(c)}`);
    }
  }
  for (const span of document.querySelectorAll("span.math")) {
    const c = span.querySelector("mjx-container");
    if (c && span.offsetParent && getComputedStyle(span).display !== "inline"
        && formula(c).getBoundingClientRect().width > span.clientWidth + 1) {
      out.info_inline_math_scrolls_at_400px.push(`${where(span)}: ${tex(c)}`);
    }
  }
  const doc = document.documentElement;
  const width = doc.clientWidth;
  if (doc.scrollWidth <= width + 1) return out;
  const clipped = (el) => {
    for (let a = el.parentElement; a && a !== doc; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.overflowX !== "visible" || s.display === "none") return true;
    }
    return false;
  };
  const culprits = [];
  for (const el of document.body.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.right <= width + 1 || clipped(el)) continue;
    if (el.parentElement && culprits.includes(el.parentElement)) continue;
    culprits.push(el);
  }
  const name = (el) => {
    const cls = el.classList.length ? "." + [...el.classList].slice(0, 2).join(".") : "";
    const math = el.querySelector("mjx-container") || el.closest("mjx-container");
    const text = math ? tex(math) : clip(el.textContent || "", 50);
    return `${where(el)} <${el.tagName.toLowerCase()}${cls}> ` +
      `to ${Math.round(el.getBoundingClientRect().right)}px: "${text}"`;
  };
  out.scrolls_sideways_at_400px = [`page is ${doc.scrollWidth}px wide at ${width}px`,
                                   ...culprits.slice(0, 12).map(name)];
  return out;
})()
"""
)


# --------------------------------------------------------------------- the session


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not SITE.is_dir():
        pytest.fail(f"no built site at {SITE}: run `make book` first")
    if not (shutil.which(CHROMIUM) or os.access(CHROMIUM, os.X_OK)):
        pytest.fail(f"{CHROMIUM} not found: `make browser-deps` installs Debian's chromium")
    work = tmp_path_factory.mktemp("browser")
    # The web root holds the site and the scanner's own test page side by side.
    webroot = work / "root"
    webroot.mkdir()
    (webroot / "site").symlink_to(SITE, target_is_directory=True)
    (webroot / "selftest").mkdir()
    log = open(work / "chromium.log", "wb")  # noqa: SIM115 (closed below)
    # Chromium is started before the server thread: fork only from one thread.
    devtools = DevTools(work / "profile", log)
    handler = functools.partial(_QuietHandler, directory=str(webroot))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield {"tab": Tab(devtools), "origin": origin, "webroot": webroot, "cache": {}}
    finally:
        devtools.close()
        server.shutdown()
        server.server_close()
        log.close()


def inspect(browser, path, shot_name=None):
    """Open ``path`` (under the web root) and return every defect found, by kind."""
    if path in browser["cache"]:
        return browser["cache"][path]
    tab, origin = browser["tab"], browser["origin"]
    tab.viewport(WIDE, 900, mobile=False)
    tab.open(f"{origin}/{path}")
    tab.evaluate(SETTLE_JS)
    found = tab.evaluate(WIDE_CHECKS_JS)
    stats = found.pop("stats")
    if shot_name:
        SHOTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(SHOTS / f"{shot_name}.png", full_page=True)
    tab.viewport(NARROW, 800, mobile=True)
    # Let the theme finish folding its sidebars (a CSS transition) before measuring.
    tab.evaluate("new Promise((ok) => setTimeout(() => requestAnimationFrame(ok), 700))")
    narrow = tab.evaluate(NARROW_CHECKS_JS)
    stats.update(narrow.pop("stats"))
    found.update(narrow)
    if shot_name:
        tab.screenshot(SHOTS / f"{shot_name}--400px.png", full_page=False)
    errors, foreign = tab.problems_logged(origin)
    found["console_errors"] = errors
    found["other_hosts"] = foreign
    found = {kind: items for kind, items in found.items() if items}
    found["stats"] = stats  # counts for the book-wide limits (see book_limits)
    browser["cache"][path] = found
    return found


def defects(found):
    """The kinds of defect found on a page (``info_`` lists and counts left out)."""
    return {k: v for k, v in found.items() if not k.startswith("info_") and k != "stats"}


def book_limits(stats_by_page):
    """The book-wide limits missed, and one line per page with its counts.

    ``stats_by_page`` maps a page to the counts ``inspect`` measured on it.
    """
    lines, total = (
        [],
        dict.fromkeys(
            ("display_equations", "scrolling_equations_at_400px", "visible_code_lines"), 0
        ),
    )
    for page, stats in sorted(stats_by_page.items()):
        for key in total:
            total[key] += stats.get(key, 0)
        lines.append(
            f"{page}: {stats.get('scrolling_equations_at_400px', 0)} of "
            f"{stats.get('display_equations', 0)} display equations scroll at 400 px; "
            f"{stats.get('visible_code_lines', 0)} visible code lines "
            f"in {stats.get('visible_code_cells', 0)} cells"
        )
    share = total["scrolling_equations_at_400px"] / max(total["display_equations"], 1)
    lines.append(
        f"BOOK: {total['scrolling_equations_at_400px']} of {total['display_equations']} "
        f"display equations scroll at 400 px ({share:.1%}, limit "
        f"{MAX_SCROLLING_SHARE_AT_400PX:.0%}); {total['visible_code_lines']} visible code "
        f"lines (limit {MAX_VISIBLE_CODE_LINES})"
    )
    missed = []
    if share > MAX_SCROLLING_SHARE_AT_400PX:
        missed.append(f"{share:.1%} of display equations scroll sideways at 400 px")
    if total["visible_code_lines"] > MAX_VISIBLE_CODE_LINES:
        missed.append(f"{total['visible_code_lines']} code lines visible without a click")
    return missed, lines


def _report(page, found):
    SHOTS.mkdir(parents=True, exist_ok=True)
    report = SHOTS / "report.json"
    data = json.loads(report.read_text()) if report.exists() else {}
    data[page] = found
    report.write_text(json.dumps(data, indent=1, sort_keys=True))


def _shot_name(page):
    return page.removesuffix(".html").replace("/", "__")


PAGES = built_pages()


@pytest.fixture(scope="module", autouse=True)
def _fresh_report():
    (SHOTS / "report.json").unlink(missing_ok=True)


def test_site_has_pages():
    assert PAGES, f"no pages under {SITE}: run `make book` first"


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_cleanly(browser, page):
    found = inspect(browser, f"site/{page}", shot_name=_shot_name(page))
    _report(page, found)
    bad = defects(found)
    lines = [f"{kind}:\n    " + "\n    ".join(items) for kind, items in bad.items()]
    assert not bad, f"{page} has defects (screenshot in {SHOTS}):\n" + "\n".join(lines)


def test_book_limits(browser):
    """Book-wide: equations that scroll at 400 px, and code visible without a click."""
    stats = {}
    for page in PAGES:
        found = inspect(browser, f"site/{page}", shot_name=_shot_name(page))
        _report(page, found)
        stats[page] = found["stats"]
    missed, lines = book_limits(stats)
    _report("BOOK", {"info_per_page": lines})
    assert not missed, "; ".join(missed) + "\n" + "\n".join(lines)


# ------------------------------------------------------- the checks can fail at all

SELFTEST_HEAD = r"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><link rel="icon" href="data:,">
<script>window.MathJax = {};</script>
<script defer src="../site/_static/mathjax/tex-chtml.js"></script>
</head><body><main role="main"><article class="bd-article">
"""
SELFTEST_PAGE = (
    SELFTEST_HEAD
    + r"""<section id="defects">
<p>A proof whose line became a bullet: \frac{1}{2} and \begin{aligned} stay raw.</p>
<div class="math" id="equation-bad">\[\notamacro{x} + 1\]</div>
<div class="math" id="equation-wide">\[%s\]</div>
<p>Inline <span class="math">\(%s\)</span> math.</p>
<figure><img src="../site/_static/images/logo_binder.svg" alt="../_images/abc.png"></figure>
<img src="missing.png" alt="a plot that is not there">
<table><tr><th>scheme</th><td style="white-space: nowrap">%s</td></tr></table>
<div class="exercise admonition" id="ex-shown"><p class="admonition-title">Exercise 1</p>
<section><p>Compute x.</p></section></div>
<div class="solution dropdown admonition" id="sol-shown">
<p class="admonition-title">Solution to<a class="reference internal" href="#ex-shown">
Exercise 1</a></p><section id="solution-content"><p>The answer is 3.</p></section></div>
<div class="exercise admonition" id="ex-alone"><p class="admonition-title">Exercise 2</p>
<section><p>Compute y.</p></section></div>
<p><strong>Exercise 3.</strong> Written as a bold paragraph.</p>
<div class="cell"><details class="hide above-input"><summary>Show code cell source</summary>
<div class="cell_input"><pre># Solution to exercise 3
y = 2</pre></div></details></div>
<div class="cell"><div class="cell_input"><pre>%s</pre></div></div>
<script>console.error("boom from the self-test");</script>
</section></article></main></body></html>
"""
)


def test_checks_catch_each_kind_of_defect(browser):
    wide = " + ".join(f"x_{{{i}}}^{{2}}" for i in range(400))
    code = "\n".join(f"x{i} = {i}" for i in range(MAX_VISIBLE_CODE_LINES + 1))
    page = browser["webroot"] / "selftest" / "defects.html"
    page.write_text(SELFTEST_PAGE % (wide, wide[:4000], "a long cell " * 200, code))
    found = inspect(browser, "selftest/defects.html")
    assert any("frac" in t for t in found.get("raw_tex", [])), found
    assert any("notamacro" in t for t in found.get("math_errors", [])), found
    assert any("equation-wide" in t for t in found.get("wide_equations", [])), found
    assert any("scheme" in t for t in found.get("wide_tables", [])), found
    assert found.get("broken_images") == ["missing.png"], found
    assert any("no caption" in t for t in found.get("uncaptioned_figures", [])), found
    assert any("abc.png" in t for t in found.get("bad_alt_text", [])), found
    assert any("boom" in t for t in found.get("console_errors", [])), found
    assert found.get("scrolls_sideways_at_400px"), found
    assert any("sol-shown" in t for t in found.get("solution_visible_before_click", [])), found
    unsolved = found.get("exercise_without_solution", [])
    assert len(unsolved) == 1 and "ex-alone" in unsolved[0], found
    outside = found.get("exercise_outside_directive", [])
    assert any("Exercise 3." in t for t in outside), found
    assert any("# Solution to exercise 3" in t for t in outside), found
    assert any("equation-wide" in t for t in found.get("info_equations_scroll_at_400px", []))
    # The two display equations, one of which scrolls: over the limit for the book.
    stats = found["stats"]
    assert stats["display_equations"] == 2 and stats["scrolling_equations_at_400px"] == 1
    assert stats["visible_code_lines"] == MAX_VISIBLE_CODE_LINES + 1, stats  # folded: 0
    missed, _ = book_limits({"defects.html": stats})
    assert len(missed) == 2, missed


def test_checks_pass_a_clean_page(browser):
    page = browser["webroot"] / "selftest" / "clean.html"
    page.write_text(
        SELFTEST_HEAD + '<section id="ok"><p>Text with <span class="math">\\(x^2\\)</span>.</p>'
        '<div class="math">\\[\\frac{a}{b}\\]</div>'
        "<table><tr><th>a</th><td>1</td></tr></table>"
        '<div class="exercise admonition" id="ex-ok"><p class="admonition-title">Exercise 1'
        "</p><section><p>Compute x.</p></section></div>"
        '<details class="solution dropdown admonition" id="sol-ok"><summary '
        'class="admonition-title">Solution to <a href="#ex-ok">Exercise 1</a></summary>'
        '<section><p>The answer.</p><div class="cell"><div class="cell_input"><pre>'
        "answer = 3\nassert answer == 3</pre></div></div></section></details>"
        '<div class="cell"><div class="cell_input"><pre>x = 1\n\ny = 2\nz = 3</pre></div></div>'
        "</section></article></main></body></html>"
    )
    found = inspect(browser, "selftest/clean.html")
    assert defects(found) == {}, found
    assert found["stats"]["visible_code_lines"] == 3, found  # blank and folded lines left out
    assert book_limits({"clean.html": found["stats"]})[0] == []


# ------------------------------------------------------------------------- search


def test_search_snippets_show_page_text(browser):
    """Search results quote the chapter text, not the launch buttons above it."""
    tab, origin = browser["tab"], browser["origin"]
    tab.viewport(WIDE, 900, mobile=False)
    tab.open(f"{origin}/site/search.html?q=rotary")
    snippets = tab.evaluate(
        r"""
        (async () => {
          const start = Date.now();
          // Sphinx fills the results one fetched page at a time, then says "finished".
          const items = () => document.querySelectorAll("#search-results li");
          // A page hit gets a snippet (p.context); a hit on an API entry of the reference
          // gets its kind and page instead ("(Python function, in RoPE and its scalings)").
          const shown = (li) => li.querySelector("p.context") || li.querySelector(":scope > span");
          const done = () => /finished|did not match/i.test(
              (document.querySelector("#search-results .search-summary") || {}).textContent)
            && [...items()].every(shown);
          while (!done() && Date.now() - start < 60000) {
            await new Promise((ok) => setTimeout(ok, 100));
          }
          return [...document.querySelectorAll("#search-results li")].map((li) => ({
            page: li.querySelector("a").getAttribute("href"),
            text: (shown(li) || {textContent: ""}).textContent}));
        })()
        """
    )
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(SHOTS / "search--rotary.png", full_page=False)
    assert snippets, "searching for 'rotary' found nothing"
    for hit in snippets:
        text = hit["text"]
        assert text.strip(), f"empty snippet for {hit['page']}"
        for chrome in ("Binder", "Colab", "Launch", ".ipynb", "Contents"):
            assert chrome not in text, f"{hit['page']}: snippet shows page chrome: {text!r}"
    assert any(re.search(r"rotar", h["text"], re.I) for h in snippets), snippets


# ------------------------------------------------------------------ API reference

REFERENCE_PAGES = [p for p in PAGES if p.startswith("book/reference/")]


def _wait_for_search(tab):
    return tab.evaluate(
        r"""
        (async () => {
          const start = Date.now();
          const summary = () => (document.querySelector("#search-results .search-summary")
                                 || {}).textContent || "";
          while (!/finished|did not match/i.test(summary()) && Date.now() - start < 60000) {
            await new Promise((ok) => setTimeout(ok, 100));
          }
          return [...document.querySelectorAll("#search-results li a")].map(
            (a) => a.getAttribute("href"));
        })()
        """
    )


def test_every_reference_page_is_opened_by_the_page_checks():
    # test_page_renders_cleanly opens each of them: no console error, nothing from
    # another host, tables and equations within the column, no sideways scroll at 400 px
    names = {p.rsplit("/", 1)[-1] for p in REFERENCE_PAGES}
    assert {"index.html", "attention.html", "schemes.html", "rope.html", "caches.html",
            "hf.html", "multidim.html", "lab.html"} <= names, REFERENCE_PAGES  # fmt: skip


def test_search_finds_apply_rope(browser):
    tab, origin = browser["tab"], browser["origin"]
    tab.viewport(WIDE, 900, mobile=False)
    tab.open(f"{origin}/site/search.html?q=apply_rope")
    links = _wait_for_search(tab)
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(SHOTS / "search--apply_rope.png", full_page=False)
    assert any(
        link.split("?")[0].endswith("book/reference/rope.html#posenc.apply_rope") for link in links
    ), links
    errors, foreign = tab.problems_logged(origin)
    assert not errors and not foreign, (errors, foreign)


def _chapter_linking(target):
    """A chapter (not a reference page) whose HTML links to ``target``."""
    for page in PAGES:
        if page.startswith("book/reference/") or not page.startswith("book/"):
            continue
        if f'href="reference/{target}"' in (SITE / page).read_text(encoding="utf-8"):
            return page
    return None


@pytest.mark.parametrize("width", [WIDE, NARROW])
def test_a_chapter_link_to_attention_lands_on_its_entry(browser, width):
    chapter = _chapter_linking("attention.html#posenc.attention")
    assert chapter, "no chapter links to posenc.attention ({py:func}`posenc.attention`)"
    tab, origin = browser["tab"], browser["origin"]
    tab.viewport(width, 900, mobile=width == NARROW)
    tab.open(f"{origin}/site/{chapter}")
    tab.evaluate(SETTLE_JS)
    tab.dt.events.clear()
    tab.evaluate(
        """document.querySelector('a[href="reference/attention.html#posenc.attention"]')"""
        ".click()"
    )
    tab.dt.wait_for("Page.loadEventFired")
    tab.evaluate(SETTLE_JS)
    landed = tab.evaluate(
        r"""
        (() => {
          const entry = document.getElementById("posenc.attention");
          const box = entry && entry.getBoundingClientRect();
          return {path: location.pathname, hash: location.hash,
                  text: entry ? entry.textContent.replace(/\s+/g, " ").trim().slice(0, 40) : "",
                  top: box ? box.top : null, height: innerHeight};
        })()
        """
    )
    assert landed["path"].endswith("/book/reference/attention.html"), landed
    assert landed["hash"] == "#posenc.attention", landed
    assert landed["text"].startswith("posenc.attention("), landed
    # the entry is on screen, at the top (below the theme's header), not somewhere above
    assert 0 <= landed["top"] < landed["height"] / 2, landed
    errors, foreign = tab.problems_logged(origin)
    assert not errors and not foreign, (errors, foreign)


# Entries (signature, parameters, summary tables) that stick out of the text column.
ENTRY_WIDTH_JS = r"""
(() => {
  const article = document.querySelector("article.bd-article");
  const r = article.getBoundingClientRect(), s = getComputedStyle(article);
  const left = r.left + parseFloat(s.paddingLeft), right = r.right - parseFloat(s.paddingRight);
  const out = [];
  for (const el of article.querySelectorAll(
      "dl.py > dt, dl.py > dd, dl.field-list, table.autosummary")) {
    if (!el.getClientRects().length) continue;
    const box = el.getBoundingClientRect();
    const wide = Math.max(box.right, box.left + el.scrollWidth);
    if (wide > right + 1) {
      out.push(`${el.tagName.toLowerCase()}.${[...el.classList].join(".")} ` +
               `${(el.id || el.textContent).replace(/\s+/g, " ").trim().slice(0, 50)} ` +
               `to ${Math.round(wide)}px, column ends at ${Math.round(right)}px`);
    }
  }
  return {column: Math.round(right - left), out};
})()
"""


@pytest.mark.parametrize("page", REFERENCE_PAGES)
def test_reference_fits_the_column_and_the_phone(browser, page):
    tab, origin = browser["tab"], browser["origin"]
    for width, mobile in ((WIDE, False), (NARROW, True)):
        tab.viewport(width, 900, mobile=mobile)
        tab.open(f"{origin}/site/{page}")
        tab.evaluate(SETTLE_JS)
        tab.evaluate("new Promise((ok) => setTimeout(() => requestAnimationFrame(ok), 700))")
        found = tab.evaluate(ENTRY_WIDTH_JS)
        assert not found["out"], f"{page} at {width}px:\n" + "\n".join(found["out"])
        if width == WIDE:  # the chapters' 960 px text column (book/_static/posenc.css)
            assert abs(found["column"] - 960) <= 2, (page, found["column"])


def teardown_module():
    # A one-glance summary next to the screenshots.
    report = SHOTS / "report.json"
    if report.exists():
        data = json.loads(report.read_text())
        lines = []
        for page, found in sorted(data.items(), key=lambda item: item[0] == "BOOK"):
            stats = found.get("stats", {})
            items = {kind: v for kind, v in found.items() if kind != "stats"}
            counts = ", ".join(f"{k} {v}" for k, v in stats.items())
            lines.append(f"{page}: {counts or ''}{'' if items else ' (clean)'}".rstrip())
            for kind, entries in items.items():
                lines.append(f"  {kind} ({len(entries)}):")
                lines.extend(f"    {entry}" for entry in entries)
        (SHOTS / "report.txt").write_text("\n".join(lines) + "\n")
