"""The built documentation site, opened page by page in one headless Chromium.

Debian's ``chromium`` package (``apt-get install -y chromium``; the project's
set-up installs it, see ``tests/support/install_chromium.sh``), driven over
the Chrome DevTools Protocol with ``websocket-client``. One browser process
and one tab serve every page; for each page the checker records what a
reader would see go wrong:

- the page is wider than the window (1280 px), or a table wider than the
  text around it;
- an image that did not load;
- a console error, an uncaught exception, or a failed request (a missing
  stylesheet or script shows here);
- a request to another host (the site must work offline: nothing from a CDN);
- a raw reStructuredText role (``:class:`X```) in the text;
- a link to a page of the site that does not exist, or to an anchor the
  page does not have.
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = "chromium"
INSTALL = "apt-get update && apt-get install -y chromium (tests/support/install_chromium.sh)"
WIDTH, HEIGHT = 1280, 900
# No sandbox: the tests run as root in containers, where Chromium's sandbox
# cannot start. The rest keep the browser from reaching out on its own.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-dev-shm-usage", "--mute-audio",
         f"--window-size={WIDTH},{HEIGHT}")

# Run in the page once it has loaded: what the checks need, as JSON.
_INSPECT = r"""
(() => {
  const doc = document.documentElement;
  const tables = [...document.querySelectorAll("table")]
    .filter(t => t.getBoundingClientRect().right
                 > t.parentElement.getBoundingClientRect().right + 1)
    .map(t => (t.querySelector("th") || t).textContent.trim().slice(0, 40));
  const images = [...document.images]
    .filter(i => !i.complete || i.naturalWidth === 0).map(i => i.getAttribute("src"));
  const roles = (document.body.innerText.match(
    /:(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj|ref):`[^`]*`/g) || []);
  const links = [...document.querySelectorAll("a[href]")].map(a => a.href);
  const ids = [...document.querySelectorAll("[id]")].map(e => e.id)
    .concat([...document.querySelectorAll("a[name]")].map(a => a.name));
  return JSON.stringify({width: doc.scrollWidth, viewport: window.innerWidth,
                         tables, images, roles, links, ids});
})()
"""


def chromium() -> str:
    """The browser's path; fails saying how to install it (never skips)."""
    path = shutil.which(CHROMIUM)
    if path is None:
        raise RuntimeError(f"{CHROMIUM} is not installed, and the docs are checked in it: "
                           f"{INSTALL}")
    return path


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """An HTTP server of ``root`` on 127.0.0.1 (a free port) in a daemon
    thread, and its base URL."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


@dataclass
class PageReport:
    url: str
    problems: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)


class Browser:
    """One headless Chromium with one tab, spoken to over its DevTools socket."""

    def __init__(self, profile: Path, timeout: float = 30.0):
        import websocket  # websocket-client: the docs extra

        self.timeout = timeout
        self._proc = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("Chromium did not start: "
                                   + self._proc.stderr.read().decode(errors="replace")[-2000:])
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self._ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout)
        self._next = 0
        self._events: list[dict] = []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params) -> dict:
        self._next += 1
        ident = self._next
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._events.append(message)

    def _wait_for(self, method: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not any(e.get("method") == method for e in self._events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {self.timeout} s")
            self._events.append(json.loads(self._ws.recv()))

    def open(self, url: str, origin: str) -> PageReport:
        """Load ``url`` and report what went wrong on it."""
        self._events = []
        self.call("Page.navigate", url=url)
        self._wait_for("Page.loadEventFired")
        # Settle: late requests (the search index) and console messages.
        self.call("Runtime.evaluate", expression="new Promise(r => setTimeout(r, 100))",
                  awaitPromise=True)
        found = json.loads(self.call("Runtime.evaluate", expression=_INSPECT,
                                     returnByValue=True)["result"]["value"])
        report = PageReport(url, links=found["links"], ids=set(found["ids"]))
        problems = report.problems
        if found["width"] > found["viewport"]:
            problems.append(f"the page is {found['width']} px wide in a {found['viewport']} px "
                            "window")
        problems += [f"a table wider than the text (first heading: {t!r})" for t in found["tables"]]
        problems += [f"image not loaded: {src}" for src in found["images"]]
        problems += [f"raw role: {role}" for role in found["roles"]]
        for event in self._events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                problems.append("uncaught exception: " + details.get("exception", {}).get(
                    "description", details.get("text", "")))
            elif method == "Runtime.consoleAPICalled" and params["type"] == "error":
                problems.append("console error: " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in params["args"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                problems.append(f"console error: {params['entry']['text']} "
                                f"({params['entry'].get('url', '')})")
            elif method == "Network.requestWillBeSent":
                target = params["request"]["url"]
                if target.startswith(("http:", "https:")) and not target.startswith(origin):
                    problems.append(f"loads from another host: {target}")
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                problems.append(f"request failed: {params.get('errorText')}")
        return report

    def close(self) -> None:
        ws = getattr(self, "_ws", None)
        if ws is not None:
            ws.close()
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def pages(site: Path) -> list[str]:
    """Every page of a built site, as paths relative to its root."""
    return sorted(str(p.relative_to(site)).replace(os.sep, "/") for p in site.rglob("*.html"))


def check_site(site: Path, base: str, profile: Path) -> tuple[dict[str, list[str]], int]:
    """Open every page of ``site`` (served at ``base``); returns the problems
    found, by page, and the number of pages opened."""
    names = pages(site)
    found: dict[str, list[str]] = {}
    reports: dict[str, PageReport] = {}
    with Browser(profile) as browser:
        for name in names:
            reports[name] = browser.open(base + name, base)
    for name, report in reports.items():
        problems = list(report.problems)
        for link in report.links:
            if not link.startswith(base):
                continue
            target, _, anchor = urllib.parse.unquote(link[len(base):]).partition("#")
            file = target + "index.html" if target.endswith("/") or not target else target
            if file not in reports and not (site / file).is_file():
                problems.append(f"broken link: {link}")
            elif anchor and file in reports and anchor not in reports[file].ids:
                problems.append(f"link to a missing anchor: {link}")
        if problems:
            found[name] = sorted(set(problems))
    return found, len(names)
