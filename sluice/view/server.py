"""``sluice view``: the page and its JSON, served from this process.

A small threaded HTTP server on loopback (the standard library's: one user,
a handful of requests a second) over an ``Index`` that is built in a thread
meanwhile. The page itself is plain HTML, CSS and JavaScript from
``sluice/view/static``; ``--export`` writes the same page into one file with
the data inside.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import ipaddress
import json
import logging
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

from sluice.addresses import names_this_server
from sluice.view.index import CONNECTIONS_SHOWN, Filter, HttpFilter, Index, LetGo
from sluice.view.live import LiveIndex, NothingReceived

log = logging.getLogger("sluice.view")

STATIC = resources.files("sluice.view") / "static"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}  # fmt: skip
PAGE_LIMIT = 1000


def static(name: str) -> bytes:
    return (STATIC / name).read_bytes()


class ViewServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], index: Index, save_dir: Path = Path()) -> None:
        if ":" in address[0]:  # an IPv6 address (--listen [::1]:PORT): not the class's IPv4
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)
        self.index = index
        self.save_dir = save_dir  # where "save" writes (a live view's)
        self.listen_host = address[0]  # as given (a name, where one was)


# What the page's own script sends with a POST: a header no other site's
# page can send without asking first (a CORS preflight, which this server
# never allows).
SAVE_HEADER = "X-Sluice"


# What the page may load and run: its own script and style, nothing inline
# but style attributes (a recorded name that got past escaping into the
# page could run nothing: no inline handler, no script from elsewhere), and
# no network but this server (an exported file: none at all). No eval: the
# page evaluates nothing (tests that drive it give Playwright functions,
# which it calls without eval, never bare expressions).
_POLICY = (
    "default-src 'none'; script-src {script}; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src {connect}; base-uri 'none'; form-action 'none'"
)

# Sent with every answer: no other site's page may frame this one (and have
# the user click "save" under its own content), and no answer is read as
# another type than it says.
_HARDENING = (
    ("X-Frame-Options", "DENY"),
    (
        "Content-Security-Policy",
        _POLICY.format(script="'self'", connect="'self'") + "; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
)


# What a browser says (``Sec-Fetch-Site``) of a request from another
# origin's page. Such a page cannot read the answers, but each request to
# /api/ was served all the same, and in a live view kept it watching (the
# proxy's frames through its slow path) while that page stayed open. The
# page's own requests say ``same-origin``, a link followed or an address
# typed leads to the page itself (not /api/), and tools send no such header.
_OTHER_SITES = ("cross-site", "same-site")


class Handler(BaseHTTPRequestHandler):
    server: ViewServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _refused(self) -> bool:
        """Refuse (403) a request that is not the page's own: for a name
        other than this server's (another site's page, by DNS rebinding), to
        /api/ from another site's page (``_OTHER_SITES``) or, a POST, from
        another origin or without ``SAVE_HEADER``."""
        host = self.headers.get("Host", "")
        port = int(self.server.server_address[1])
        if not names_this_server(host, port, self.server.listen_host):
            self._json({"error": f"not served to Host {host!r}: open the page by its address"}, 403)
            return True
        site = self.headers.get("Sec-Fetch-Site", "").strip().lower()
        if site in _OTHER_SITES and urllib.parse.urlsplit(self.path).path.startswith("/api/"):
            self._json({"error": "not served to another site's page: open the page itself"}, 403)
            return True
        if self.command == "POST":
            origin = self.headers.get("Origin")
            if origin is not None and origin.lower() != f"http://{host.strip().lower()}":
                self._json({"error": f"not saved for a page from {origin!r}"}, 403)
                return True
            if SAVE_HEADER not in self.headers:
                self._json({"error": f"a POST needs the {SAVE_HEADER} header (the page sends it)"},
                           403)  # fmt: skip
                return True
        return False

    def do_GET(self) -> None:
        if self._refused():
            return
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        index = self.server.index
        if isinstance(index, LiveIndex) and url.path.startswith("/api/"):
            index.asked_now()  # (a page is open: watching goes on)
        try:
            if url.path in ("/", "/index.html"):
                self._send(200, static("index.html"), _TYPES[".html"])
            elif url.path in ("/app.js", "/app.css"):
                kind = ".css" if url.path.endswith(".css") else ".js"
                self._send(200, static(url.path[1:]), _TYPES[kind])
            elif url.path == "/api/status":
                self._json(index.status())
            elif url.path == "/api/connections":
                shown = query.get("limit")
                self._json(index.connections_json(None if shown is None else max(1, int(shown))))
            elif url.path == "/api/frames":
                offset = max(0, int(query.get("offset", "0")))
                limit = min(PAGE_LIMIT, max(1, int(query.get("limit", "200"))))
                self._json(index.page(Filter.from_query(query), offset, limit))
            elif url.path.startswith("/api/frame/"):
                self._json(index.detail(int(url.path.rsplit("/", 1)[1])))
            elif url.path == "/api/http":
                offset = max(0, int(query.get("offset", "0")))
                limit = min(PAGE_LIMIT, max(1, int(query.get("limit", "200"))))
                self._json(index.http_page(HttpFilter.from_query(query), offset, limit))
            elif url.path == "/api/summary":
                self._json(index.summary())
            elif url.path == "/api/sequence":
                offset = max(0, int(query.get("offset", "0")))
                self._json(index.sequence(Filter.from_query(query), offset))
            elif url.path == "/api/timeline":
                self._json(index.timeline(Filter.from_query(query)))
            else:
                self._json({"error": f"no such page: {url.path}"}, 404)
        except LetGo as exc:
            self._json({"error": str(exc)}, 410)
        except KeyError:
            self._json({"error": "no such frame"}, 404)
        except ValueError as exc:
            self._json({"error": str(exc)}, 400)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # one bad request never stops the viewer
            log.error("view: %s failed: %r", self.path, exc, exc_info=exc)
            self._json({"error": f"internal error: {exc!r}"}, 500)

    def do_POST(self) -> None:
        """``/api/save``: a live view's buffer written as a capture."""
        if self._refused():
            return
        save = getattr(self.server.index, "save", None)
        if urllib.parse.urlsplit(self.path).path != "/api/save" or save is None:
            self._json({"error": "only POST /api/save, in a live view"}, 404)
            return
        try:
            directory = save(self.server.save_dir)
        except NothingReceived as exc:
            self._json({"error": str(exc)}, 409)
            return
        except OSError as exc:
            self._json({"error": f"could not save: {exc.strerror or exc}"}, 500)
            return
        log.info("view: saved %s", directory)
        self._json({"path": str(directory)}, 201)

    def _json(self, data: Any, status: int = 200) -> None:
        self._send(status, json.dumps(data).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in _HARDENING:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as ``--listen`` gives it) is this machine's alone."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(
    index: Index, host: str, port: int, build: bool = True, save_dir: Path = Path()
) -> ViewServer:
    """Start serving (in a thread) and building the index (in another,
    unless ``build`` is off: a live index is fed instead). A live view is
    served on loopback only: what it shows needs the proxy's admin token,
    which a page open to the network would hand to anyone who asks."""
    if isinstance(index, LiveIndex) and not is_loopback(host):
        raise PermissionError(
            errno.EACCES,
            f"a live view is served on loopback only (127.0.0.1, ::1, localhost), not "
            f"{host}: what it shows needs the proxy's admin token, which this page does not "
            "ask for",
        )
    server = ViewServer((host, port), index, save_dir)
    if build:
        threading.Thread(target=index.build, name="view-index", daemon=True).start()
    threading.Thread(target=server.serve_forever, name="view-http", daemon=True).start()
    return server


def script_safe(text: str) -> str:
    """JSON text made safe inside a ``<script>`` element: no ``<``, ``>`` or
    ``&`` is left to open a comment or a tag (JSON reads the escapes back)."""
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def export(index: Index, f: Filter, limit: int, details: int) -> str:
    """One self-contained HTML file: the page, and the (filtered) capture's
    data in it, at most ``limit`` frames and the detail of the first
    ``details`` of them."""
    page = index.page(f, 0, limit)
    rows = page["rows"]
    data = {
        "status": index.status(),
        "connections": index.connections_json(CONNECTIONS_SHOWN),
        "summary": index.summary(),
        "timeline": index.timeline(f),
        "sequence": index.sequence(f),
        "frames": rows,
        "total": page["total"],
        "http": index.http_page(HttpFilter(), 0, limit)["rows"],
        "details": {str(r["i"]): index.detail(r["i"]) for r in rows[:details]},
        "filter": {k: v for k, v in vars(f).items() if v not in (None, "", False)},
        "left_out": max(0, page["total"] - len(rows)),
    }
    text = script_safe(json.dumps(data))
    html = static("index.html").decode()
    code = f"\n{static('app.js').decode()}\n"
    digest = base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()
    policy = _POLICY.format(script=f"'sha256-{digest}'", connect="'none'")
    html = html.replace('<meta charset="utf-8">',
                        f'<meta charset="utf-8">\n<meta http-equiv="Content-Security-Policy" '
                        f'content="{policy}">')  # fmt: skip
    html = html.replace('<link rel="stylesheet" href="app.css">',
                        f"<style>\n{static('app.css').decode()}\n</style>")  # fmt: skip
    html = html.replace(
        '<script src="app.js"></script>',
        f'<script id="sluice-data" type="application/json">{text}</script>\n'
        f"<script>{code}</script>",
    )
    return html
