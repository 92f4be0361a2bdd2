"""``sluice view``'s index over crafted captures, in-process (no server, no
browser): what a capture full of names the wire chose, or a damaged record,
does to it."""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sluice.recording import format as fmt
from sluice.view import live as live_module
from sluice.view.index import Filter, Index, Reading
from sluice.view.live import LiveIndex, live_url, watch
from sluice.view.server import serve


def capture(directory: Path, records: list[Any], protocol: str = "pulsar") -> Path:
    """A capture of one proxied connection and then ``records``."""
    t0, w0 = time.monotonic_ns(), time.time_ns()
    head: list[Any] = [
        fmt.header(capture="c1", segment=1, started_ns=w0, payloads=fmt.PayloadPolicy.HASH,
                   sluice_version="x", protocol=protocol),
        {"k": "conn", "c": 1, "t": t0, "w": w0, "client": "10.0.0.1:5000",
         "broker": "b:6650", "kind": "proxied", "listener": "plain"},
    ]  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "a.sluice").write_bytes(fmt.dumps(head + records))
    return directory


def frame(n: int, cmd: str, **summary: Any) -> dict[str, Any]:
    t0 = time.monotonic_ns()
    return {"k": "frame", "c": 1, "d": n % 2, "t": t0 + 1000 + n, "w": time.time_ns(), "n": 10,
            "raw": b"", "p": [10], "s": {"cmd": cmd, **summary}}  # fmt: skip


def test_more_distinct_commands_and_errors_than_16_bits_hold(tmp_path: Path) -> None:
    """A Cursus client names its commands (any upper-case word in an
    envelope) and a broker its error codes: 70,000 different ones are a
    capture the view reads whole, not one it calls damaged at the 65,536th."""
    many = 70_000
    index = Index(tmp_path)
    reading = Reading(0, "c1")
    index.take({"k": "conn", "c": 1, "t": 1, "w": 0, "client": "10.0.0.1:5000"}, reading, 0)
    for n in range(many):
        index.take(frame(n, f"CMD{n}", error=f"E{n}"), reading, n)
    assert index.frames == many
    last = index.page(Filter(), many - 1, 1)["rows"][0]
    assert last["cmd"] == f"CMD{many - 1}" and last["problem"] == f"E{many - 1}"
    assert index.page(Filter(cmd=f"CMD{many - 2}"), 0, 10)["total"] == 1


def test_an_http_record_of_the_wrong_shape_is_said_damaged(tmp_path: Path) -> None:
    """An ``http`` record whose request is not a map (a crafted capture):
    the view says the file is damaged there and shows what came before, as
    for any other record it cannot take, rather than stopping the reading
    with an exception and nothing said."""
    t0, w0 = time.monotonic_ns(), time.time_ns()
    records = [
        frame(0, "SEND", topic="t", pid=0, seq=0),
        {"k": "http", "h": 1, "x": 1, "t": t0, "w": w0, "te": t0 + 10, "status": 200,
         "client": "10.0.0.1:1", "method": "GET", "path": "/admin", "kind": "admin",
         "req": [1, 2]},
        frame(1, "SEND_RECEIPT", pid=0, seq=0),
    ]  # fmt: skip
    index = Index(capture(tmp_path / "c", records))
    index.build()
    assert "damaged after" in index.error and "cannot take" in index.error, index.error
    assert index.frames == 1 and not index.building


class Recorder(ThreadingHTTPServer):
    """An HTTP server that notes each request's path and Authorization, and
    answers ``status`` (with ``location``, if given)."""

    def __init__(self, status: int, location: str = "") -> None:
        self.seen: list[tuple[str, str]] = []
        self.status, self.location = status, location

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def answer(self) -> None:
                server = self.server
                assert isinstance(server, Recorder)
                server.seen.append((self.path, self.headers.get("Authorization", "")))
                self.send_response(server.status)
                if server.location:
                    self.send_header("Location", server.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = answer

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


def test_the_admin_token_goes_to_the_admin_endpoint_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sluice view --live`` sends the proxy's admin token to the admin
    address it was given, and nowhere else: not through the HTTP proxy the
    environment names (``http_proxy``, set for the user's browsing), and not
    to where an answer redirects it."""
    elsewhere = Recorder(403)  # a host a redirect names, or the environment's HTTP proxy
    admin = Recorder(302, f"http://{elsewhere.address}/stolen")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", f"http://{elsewhere.address}")
    monkeypatch.setenv("HTTP_PROXY", f"http://{elsewhere.address}")
    stop = threading.Event()
    index = LiveIndex(admin.address)
    watcher = threading.Thread(target=watch, args=(index, live_url(admin.address), "s3cret", stop))
    watcher.start()
    try:
        deadline = time.monotonic() + 4
        while not index.live_error:  # (an answer taken: followed, or not, by now)
            assert time.monotonic() < deadline, "the view got no answer"
            time.sleep(0.01)
    finally:
        stop.set()
        watcher.join(5)
        for server in (admin, elsewhere):
            server.shutdown()
            server.server_close()
    assert admin.seen[:1] == [("/live", "Bearer s3cret")], admin.seen
    assert elsewhere.seen == []
    assert "302" in index.live_error and "s3cret" not in index.live_error


def test_the_page_is_not_framed_by_another_site_nor_its_answers_sniffed(tmp_path: Path) -> None:
    """Another site's page may load the view's address in a frame (it is
    the page's own Host) and have the user click "save" under its own
    content; the page says no browser may frame it, and no answer is read
    as another type than it says."""
    index = Index(capture(tmp_path / "c", [frame(0, "SEND", topic="t")]))
    index.build()
    server = serve(index, "127.0.0.1", 0, build=False)
    port = int(server.server_address[1])
    try:
        for path in ("/", "/app.js", "/api/frames"):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", path)
            answer = connection.getresponse()
            answer.read()
            connection.close()
            assert answer.status == 200, path
            assert answer.getheader("X-Frame-Options") == "DENY", path
            assert answer.getheader("X-Content-Type-Options") == "nosniff", path
            policy = answer.getheader("Content-Security-Policy") or ""
            directives = [d.strip() for d in policy.split(";")]
            assert "frame-ancestors 'none'" in directives, (path, policy)
            assert "script-src 'self'" in directives, (path, policy)  # nothing evaluated
    finally:
        server.shutdown()
        server.server_close()


def test_a_capture_of_many_problems_draws_a_bounded_timeline(tmp_path: Path) -> None:
    """Every problem was a mark: 20,000 failed sends were 20,000 marks to
    send and draw, however few ``marks`` asked for. Now problems are sampled
    too, past that many, and the answer says so."""
    index = Index(tmp_path)
    reading = Reading(0, "c1")
    index.take({"k": "conn", "c": 1, "t": 1, "w": 0, "client": "10.0.0.1:5000"}, reading, 0)
    for n in range(20_000):
        index.take(frame(n, "SEND_ERROR", error="ServiceNotReady"), reading, n)
    for n in range(20_000, 20_100):
        index.take(frame(n, "SEND"), reading, n)
    timeline = index.timeline(Filter(), marks=500)
    assert 400 <= len(timeline["marks"]) <= 1000
    assert timeline["sampled"] and timeline["problems_sampled"]
    assert timeline["problems"] == 20_000 and timeline["frames"] == 20_100
    few = index.timeline(Filter(cmd="SEND"), marks=500)
    assert len(few["marks"]) == 100 and not few["sampled"] and few["problems"] == 0


def test_an_answer_that_is_no_admin_endpoints_is_said_and_the_watch_goes_on() -> None:
    """Another service on the admin port answering JSON of its own: the
    watching thread died (TypeError) and the page showed a live view that
    never changed, with nothing said. Now the page says so, and the view
    asks again."""

    class Elsewhere(ThreadingHTTPServer):
        def __init__(self) -> None:
            class Handler(BaseHTTPRequestHandler):
                def log_message(self, format: str, *args: Any) -> None:
                    pass

                def do_POST(self) -> None:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"[]")

            super().__init__(("127.0.0.1", 0), Handler)
            threading.Thread(target=self.serve_forever, daemon=True).start()

    server = Elsewhere()
    address = f"127.0.0.1:{server.server_address[1]}"
    stop = threading.Event()
    index = LiveIndex(address)
    watcher = threading.Thread(target=watch, args=(index, live_url(address), "t", stop))
    watcher.start()
    try:
        deadline = time.monotonic() + 4
        while not index.live_error:
            assert time.monotonic() < deadline, "nothing said"
            time.sleep(0.01)
        assert "not what a Sluice admin endpoint answers" in index.live_error
        assert watcher.is_alive()
    finally:
        stop.set()
        watcher.join(5)
        server.shutdown()
        server.server_close()


def test_a_service_answering_without_end_is_read_no_further_than_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another service on the port, answering ``/live`` with a body that
    never ends: the view read it all (its memory growing without bound, and
    the page never told); it reads up to its bound, says so, and asks again."""
    monkeypatch.setattr(live_module, "MAX_ANSWER", 1024 * 1024, raising=False)
    chunk = b"x" * 65536

    class Endless(ThreadingHTTPServer):
        daemon_threads = True

        def __init__(self) -> None:
            class Handler(BaseHTTPRequestHandler):
                def log_message(self, format: str, *args: Any) -> None:
                    pass

                def do_POST(self) -> None:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    try:
                        while True:  # (no length: until the view hangs up)
                            self.wfile.write(chunk)
                    except OSError:
                        pass

            super().__init__(("127.0.0.1", 0), Handler)
            threading.Thread(target=self.serve_forever, daemon=True).start()

    server = Endless()
    address = f"127.0.0.1:{server.server_address[1]}"
    stop = threading.Event()
    index = LiveIndex(address)
    watcher = threading.Thread(
        target=watch, args=(index, live_url(address), "t", stop), daemon=True
    )
    watcher.start()
    try:
        deadline = time.monotonic() + 4
        while not index.live_error:
            assert time.monotonic() < deadline, "nothing said"
            time.sleep(0.01)
        assert index.live_error.endswith(f"(an answer of more than {1024 * 1024} bytes)")
        assert watcher.is_alive() and index.frames == 0
    finally:
        stop.set()
        watcher.join(5)
        server.shutdown()
        server.server_close()


def test_the_view_serves_on_ipv6_loopback(tmp_path: Path) -> None:
    """--listen [::1]:PORT: the server was made for IPv4 only, and could not
    bind an IPv6 address."""
    import urllib.request

    index = Index(capture(tmp_path, [frame(0, "PING")]))
    server = serve(index, "::1", 0, build=False)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://[::1]:{port}/", timeout=10) as answer:
            assert answer.status == 200 and b"<html" in answer.read().lower()
    finally:
        server.shutdown()
        server.server_close()
