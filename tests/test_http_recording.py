"""The HTTP listener's traffic in a recording, against Apache Pulsar 4.0.8.

One ``sluice proxy --record --http-listen`` session in front of a broker
with its WebSocket service on, reached through a web service that answers
every request with a 307 to the broker (so Sluice follows a redirect for
each): admin REST calls (one with ``Authorization: Bearer``, one with a
``?token=`` query), an HTTP lookup, an error answer, and a WebSocket
producer and consumer. Then the capture itself (exact records, no secret
anywhere in its bytes), ``sluice inspect``, ``sluice view``'s JSON and
``sluice analyze``'s ``http`` table.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import random
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
import websocket
from playwright.sync_api import Browser

from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.protocols.http import Hop, RedirectError, Redirects, parse_http_url, recorded
from sluice.protocols.http.recorded import redact_body, redact_headers, redact_target
from sluice.protocols.http.websocket import FrameReader
from sluice.proxy.http_recording import MAX_PENDING, Body, HttpRecording
from sluice.recording import format as fmt
from sluice.recording.writer import Recorder, RecorderConfig
from tests.helpers.support import SLUICE
from tests.test_analyze import analyze, rows_of
from tests.test_http import Redirector, start_web_proxy
from tests.test_view import Viewer, browser, console_errors  # noqa: F401 - browser: a fixture
from tests.test_websocket import to_send

BEARER = "bearer-" + uuid.uuid4().hex  # in an Authorization header
QUERY_TOKEN = "query-" + uuid.uuid4().hex  # in a ?token= query
WS_TOKEN = "ws-" + uuid.uuid4().hex  # in a WebSocket upgrade's ?token=
COOKIE = "cookie-" + uuid.uuid4().hex
SECRETS = (BEARER, QUERY_TOKEN, WS_TOKEN, COOKIE)
N = 3  # WebSocket messages
TIMEOUT = 30


@dataclass
class Session:
    record: Path
    tenant: str
    topic: str
    broker_http: str
    records: list[dict[str, Any]]


def call(base: str, method: str, path: str, body: object = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:  # fmt: skip
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.fixture(scope="module")
def http_capture(ws_broker: ApachePulsar, tmp_path_factory: pytest.TempPathFactory) -> Session:
    tmp = tmp_path_factory.mktemp("http-rec")
    record = tmp / "rec"
    redirector = Redirector(ws_broker.http_url)
    thread = threading.Thread(target=redirector.serve_forever, daemon=True)
    thread.start()
    web = start_web_proxy(
        ws_broker, tmp, redirector.url, "--allow-broker", "127.0.0.1", "--record", str(record),
        "--record-payloads", "full", "--record-flush-interval", "0.1",
    )  # fmt: skip
    tenant = f"rec-{uuid.uuid4().hex[:8]}"
    name = f"rec-{uuid.uuid4().hex[:8]}"
    topic = f"persistent/public/default/{name}"
    try:
        base = web.url
        status, _ = call(base, "PUT", f"/admin/v2/tenants/{tenant}",
                         {"adminRoles": [], "allowedClusters": ["standalone"]},
                         {"Authorization": f"Bearer {BEARER}"})  # fmt: skip
        assert status == 204
        status, _ = call(base, "PUT", f"/admin/v2/namespaces/{tenant}/ns?token={QUERY_TOKEN}")
        assert status == 204
        status, text = call(base, "GET", f"/admin/v2/namespaces/{tenant}")
        assert (status, json.loads(text)) == (200, [f"{tenant}/ns"])
        assert call(base, "GET", f"/admin/v2/namespaces/{tenant}/missing/messageTTL")[0] == 404
        status, text = call(base, "GET", f"/lookup/v2/topic/{topic}")
        assert status == 200, text
        ws = f"ws://127.0.0.1:{web.http_port}/ws/v2"
        consumer = websocket.create_connection(
            f"{ws}/consumer/{topic}/sub?subscriptionType=Exclusive&token={WS_TOKEN}",
            timeout=TIMEOUT, cookie=f"session={COOKIE}",
        )  # fmt: skip
        producer = websocket.create_connection(f"{ws}/producer/{topic}", timeout=TIMEOUT)
        try:
            for i in range(N):
                producer.send(to_send(str(i), f"message {i}".encode()))
            assert [json.loads(producer.recv())["result"] for _ in range(N)] == ["ok"] * N
            for _ in range(N):
                message = json.loads(consumer.recv())
                consumer.send(json.dumps({"messageId": message["messageId"]}))
        finally:
            producer.close()
            consumer.close()
        assert web.proxy.terminate() == 0  # drained: every record written
    finally:
        web.proxy.kill()
        redirector.shutdown()
        redirector.server_close()
        thread.join(timeout=10)
    assert "Traceback" not in web.proxy.log(), web.proxy.log()
    records = [r for path in fmt.recording_files(record) for r in fmt.read_records(path)]
    return Session(record, tenant, topic, ws_broker.http_url, records)


def of_kind(http_capture: Session, kind: str) -> list[dict[str, Any]]:
    return [r for r in http_capture.records if r["k"] == kind]


def header_of(part: dict[str, Any], name: str) -> str | None:
    return next((v for n, v in part["h"] if n.lower() == name), None)


def test_each_exchange_is_one_record(http_capture: Session) -> None:
    exchanges = of_kind(http_capture, "http")
    tenant, topic = http_capture.tenant, http_capture.topic
    shown = [(r["method"], r["path"], r["status"], r["kind"]) for r in exchanges]
    assert shown == [
        ("PUT", f"/admin/v2/tenants/{tenant}", 204, "admin"),
        ("PUT", f"/admin/v2/namespaces/{tenant}/ns?token=<redacted>", 204, "admin"),
        ("GET", f"/admin/v2/namespaces/{tenant}", 200, "admin"),
        ("GET", f"/admin/v2/namespaces/{tenant}/missing/messageTTL", 404, "admin"),
        ("GET", f"/lookup/v2/topic/{topic}", 200, "lookup"),
        (
            "GET",
            f"/ws/v2/consumer/{topic}/sub?subscriptionType=Exclusive&token=<redacted>",
            101,
            "websocket",
        ),
        ("GET", f"/ws/v2/producer/{topic}", 101, "websocket"),
    ], shown
    for r in exchanges:
        assert r["t"] <= r["ta"] <= r["te"], r  # request, answer, end
        assert r["client"].startswith("127.0.0.1:")
        assert "ended" not in r and "refused" not in r
        # The 307 each went through first: the broker it was sent on to.
        assert r["hops"] == [[http_capture.broker_http, r["path"]]], r
    put = exchanges[0]
    assert header_of(put["req"], "authorization") == "<redacted>"
    assert put["redacted"] is True
    body = json.loads(put["req"]["raw"])  # --record-payloads full: bodies whole
    assert body == {"adminRoles": [], "allowedClusters": ["standalone"]}
    assert put["req"]["n"] == len(put["req"]["raw"]) and put["res"]["n"] == 0
    listed = exchanges[2]
    assert json.loads(listed["res"]["raw"]) == [f"{tenant}/ns"]
    assert header_of(listed["res"], "content-type") == "application/json"
    assert "redacted" not in listed
    lookup = json.loads(exchanges[4]["res"]["raw"])
    assert lookup["httpUrl"].startswith("http://127.0.0.1:")  # as the client got it: Sluice's
    assert header_of(exchanges[5]["req"], "cookie") == "<redacted>"


def test_websocket_frames_are_recorded_in_their_session(http_capture: Session) -> None:
    exchanges = of_kind(http_capture, "http")
    consumer, producer = exchanges[5]["h"], exchanges[6]["h"]
    frames = of_kind(http_capture, "ws")

    def ops(conn: int, direction: int) -> list[str]:
        return [f["op"] for f in frames if f["h"] == conn and f["d"] == direction]

    assert ops(producer, 0) == ["text"] * N + ["close"]
    assert ops(producer, 1) == ["text"] * N + ["close"]
    assert ops(consumer, 0) == ["text"] * N + ["close"]
    assert ops(consumer, 1) == ["text"] * N + ["close"]
    sent = [f for f in frames if f["h"] == producer and f["d"] == 0 and f["op"] == "text"]
    assert [json.loads(f["raw"])["context"] for f in sent] == ["0", "1", "2"]
    assert [f["n"] for f in sent] == [len(to_send(str(i), f"message {i}".encode()))
                                      for i in range(N)]  # fmt: skip
    got = [f for f in frames if f["h"] == consumer and f["d"] == 1 and f["op"] == "text"]
    assert [base64.b64decode(json.loads(f["raw"])["payload"]) for f in got] == [
        f"message {i}".encode() for i in range(N)
    ]
    assert all(f["close"] == 1000 for f in frames if f["op"] == "close")
    ends = of_kind(http_capture, "ws_end")
    assert sorted((e["h"], e["reason"]) for e in ends) == sorted(
        [(consumer, "closed"), (producer, "closed")]
    )


def test_no_credential_is_in_the_capture(http_capture: Session) -> None:
    files = fmt.recording_files(http_capture.record)
    assert files
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, (path, secret)


def run_sluice(*args: str) -> str:
    done = subprocess.run([*SLUICE, *args], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_inspect_shows_the_exchanges_and_frames(http_capture: Session) -> None:
    text = run_sluice("inspect", str(http_capture.record))
    http = [line for line in text.splitlines() if " HTTP " in line and " → " in line]
    assert len(http) == 7, text
    assert f"GET /admin/v2/namespaces/{http_capture.tenant}/missing/messageTTL → 404" in http[3]
    assert "redirected 1" in http[0] and "credentials redacted" in http[0]
    ws = [line for line in text.splitlines() if " WS " in line]
    assert len(ws) == 4 * (N + 1), text
    assert "7 HTTP exchanges: admin 2xx 3, admin 4xx 1, lookup 2xx 1, websocket 1xx 2" in text
    assert (
        "WebSocket frames: broker_to_client close 2, broker_to_client text 6, "
        "client_to_broker close 2, client_to_broker text 6"
    ) in text
    lines = [json.loads(line) for line in run_sluice(
        "inspect", str(http_capture.record), "--json").splitlines()]  # fmt: skip
    exchanges = [x for x in lines if x["kind"] == "http"]
    assert [x["status"] for x in exchanges] == [204, 204, 200, 404, 200, 101, 101]
    assert exchanges[0]["request"]["headers"]["authorization"] == "<redacted>"
    assert "raw" not in exchanges[0]["request"]  # bytes only --with-bytes
    assert [x["request_kind"] for x in exchanges][-2:] == ["websocket"] * 2
    assert len({x["http_conn"] for x in exchanges}) == 7  # urllib: a connection each


def test_view_lists_the_exchanges(http_capture: Session) -> None:
    viewer = Viewer(http_capture.record)
    try:
        deadline = time.monotonic() + TIMEOUT
        while viewer.api("status")["building"]:
            assert time.monotonic() < deadline, "the index was not built"
            time.sleep(0.05)
        everything = viewer.api("http")
        assert everything["total"] == 7
        assert [r["status"] for r in everything["rows"]] == [204, 204, 200, 404, 200, 101, 101]
        assert everything["rows"][5]["frames"] == 2 * (N + 1)
        assert viewer.api("http?status=4xx")["rows"][0]["path"].endswith("/missing/messageTTL")
        assert viewer.api("http?status=404")["total"] == 1
        assert viewer.api("http?path=/ws/")["total"] == 2
        assert viewer.api("http?path=/lookup/&status=2xx")["total"] == 1
        assert viewer.api("http?path=nothing-like-it")["total"] == 0
        assert viewer.api("status")["http"] == 7
        # The timeline's lane of exchanges: each from its start, by status.
        lane = viewer.api("timeline")["http"]
        assert [e[3] for e in lane] == [204, 204, 200, 404, 200, 101, 101]
        assert all(e[1] >= lane[0][1] and e[2] >= 0 for e in lane)
    finally:
        viewer.stop()


def test_analyze_has_an_http_table(http_capture: Session, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = analyze(http_capture.record.as_uri(), out, "local[1]")
    rows = sorted(rows_of(out / "http"), key=lambda r: r["wall_ns"])
    assert [(r["method"], r["status"], r["kind"]) for r in rows] == [
        ("PUT", 204, "admin"), ("PUT", 204, "admin"), ("GET", 200, "admin"),
        ("GET", 404, "admin"), ("GET", 200, "lookup"), ("GET", 101, "websocket"),
        ("GET", 101, "websocket"),
    ]  # fmt: skip
    assert rows[1]["path"].endswith("?token=<redacted>")
    assert all(r["redirects"] == 1 and r["seconds"] >= 0 for r in rows)
    assert rows[5]["websocket_frames"] == 2 * (N + 1)
    assert "7 HTTP exchanges" in result.stderr
    report = (out / "report.html").read_text()
    assert "<h2>HTTP exchanges</h2><p>7 exchanges.</p>" in report


def test_view_page_shows_and_filters_the_exchanges(
    http_capture: Session,
    browser: Browser,  # noqa: F811
) -> None:
    viewer = Viewer(http_capture.record)
    page = browser.new_page()
    errors = console_errors(page)
    try:
        page.goto(viewer.url)
        rows = page.locator("#exchanges tbody tr")
        rows.nth(6).wait_for(timeout=TIMEOUT * 1000)
        assert rows.count() == 7
        assert "credentials redacted" in rows.nth(0).inner_text()
        assert f"{2 * (N + 1)} WebSocket frames (closed)" in rows.nth(5).inner_text()
        page.wait_for_function(
            "() => document.querySelectorAll('#timeline rect[data-exchange]').length === 7"
        )
        assert "http" in page.locator("#timeline svg text.lane").all_text_contents()
        page.fill("#http-filters input[name=status]", "4xx")
        page.click("#http-filters button")
        page.wait_for_function(
            "() => document.querySelectorAll('#exchanges tbody tr').length === 1"
        )
        assert "/missing/messageTTL" in rows.nth(0).inner_text()
        assert page.locator("#http-count").inner_text() == "(1 match)"
        assert errors == []
    finally:
        page.close()
        viewer.stop()


# --- what is left out, on values ---------------------------------------------------


def test_credentials_are_left_out_of_targets_headers_and_bodies() -> None:
    assert redact_target(b"/a?token=x&authoritative=true&jwt=y") == (
        "/a?token=<redacted>&authoritative=true&jwt=<redacted>"
    )
    assert redact_target("https://user:pw@host:1/p?api_key=k") == (
        "https://<redacted>@host:1/p?api_key=<redacted>"
    )
    assert redact_headers([(b"Proxy-Authorization", b"Basic x"), (b"Set-Cookie", b"s=1"),
                           (b"X-Original-Principal", b"role"), (b"Accept", b"*/*"),
                           (b"Location", b"http://h/x?token=t")]) == [
        ["Proxy-Authorization", "<redacted>"], ["Set-Cookie", "<redacted>"],
        ["X-Original-Principal", "<redacted>"], ["Accept", "*/*"],
        ["Location", "http://h/x?token=<redacted>"],
    ]  # fmt: skip
    # A browser's token as a WebSocket subprotocol; the handshake's nonces kept.
    assert redact_headers([(b"Sec-WebSocket-Protocol", f"access_token, {BEARER}".encode()),
                           (b"Sec-WebSocket-Key", b"dGhlIHNhbXBsZSBub25jZQ==")]) == [
        ["Sec-WebSocket-Protocol", "<redacted>"],
        ["Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="],
    ]  # fmt: skip
    assert redact_body(b'{"a": [{"password": "p", "key": "k"}]}') == (
        b'{"a":[{"password":"<redacted>","key":"k"}]}',
        True,
    )
    assert redact_body(b'{"key": "k"}') == (b'{"key": "k"}', False)
    assert redact_body(b"token=t&x=1", "application/x-www-form-urlencoded") == (
        b"token=<redacted>&x=1",
        True,
    )
    assert redact_body(b"token=t") == (b"token=<redacted>", True)  # a form whatever its type


def test_bodies_follow_the_payload_policy() -> None:
    text = b'{"token": "t", "n": 1}'
    headers = [(b"content-type", b"application/json"), (b"authorization", b"Basic x")]
    full = Body(fmt.PayloadPolicy.FULL, limit=64)
    full.add(text[:5])
    full.add(text[5:])
    assert full.record(headers) == (
        {"h": [["content-type", "application/json"], ["authorization", "<redacted>"]],
         "n": len(text), "raw": b'{"token":"<redacted>","n":1}'},
        True,
    )  # fmt: skip
    digest = hashlib.sha256(text).digest()
    for policy, p in ((fmt.PayloadPolicy.HASH, [len(text), digest]),
                      (fmt.PayloadPolicy.NONE, [len(text)])):  # fmt: skip
        body = Body(policy, limit=64)
        body.add(text)
        assert body.record([]) == ({"h": [], "n": len(text), "p": p}, False)
    cut = Body(fmt.PayloadPolicy.FULL, limit=10)  # over the limit: its digest, not its bytes
    cut.add(text)
    assert cut.record([]) == ({"h": [], "n": len(text), "p": [len(text), digest]}, False)
    assert Body(fmt.PayloadPolicy.FULL, limit=10).record([]) == ({"h": [], "n": 0}, False)


def test_a_redirect_loop_is_told_without_credentials() -> None:
    """The 502 a loop gets (and its log line) names the hops' paths with
    their credential-like query values replaced."""
    broker = parse_http_url("http://127.0.0.1:8080")
    target = f"/admin/v2/tenants?token={QUERY_TOKEN}".encode()
    redirects = Redirects(Hop(broker, target), 5, lambda url: True)
    with pytest.raises(RedirectError) as loop:
        redirects.follow(307, [(b"location", b"http://127.0.0.1:8080" + target)])
    assert "redirect loop" in str(loop.value) and QUERY_TOKEN not in str(loop.value)


# --- what a recording keeps, through the real HttpRecording and Recorder -----------


def captured(
    tmp_path: Path,
    drive: Callable[[HttpRecording], None],
    payloads: fmt.PayloadPolicy = fmt.PayloadPolicy.FULL,
) -> list[dict[str, Any]]:
    """The records a real ``Recorder`` wrote of what ``drive`` told a real
    ``HttpRecording`` (``--record-payloads full``, a 1 MiB body limit)."""
    directory = tmp_path / "rec"

    async def main() -> None:
        recorder = Recorder(RecorderConfig(directory, payloads=payloads))
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run)
            drive(HttpRecording(recorder, payloads, 1 << 20))
            nursery.cancel_scope.cancel()  # the writer writes what is queued

    trio.run(main)
    files = fmt.recording_files(directory)
    return [r for path in files for r in fmt.read_records(path) if r["k"] in ("http", "ws")]


def posted(body: bytes, content_type: bytes, target: bytes = b"/admin/v3/sinks/p/d/s"
           ) -> Callable[[HttpRecording], None]:  # fmt: skip
    """One POST with ``body``, answered 204, as the HTTP relay tells its watch."""

    def drive(recording: HttpRecording) -> None:
        conn = h11.Connection(h11.SERVER)
        recording.opened(conn, "127.0.0.1:1")
        headers = [(b"host", b"x"), (b"content-type", content_type),
                   (b"content-length", str(len(body)).encode())]  # fmt: skip
        recording.received(conn, h11.Request(method="POST", target=target, headers=headers))
        recording.received(conn, h11.Data(data=body))
        recording.sent(conn, h11.Response(status_code=204, headers=[]))
        recording.sent(conn, h11.EndOfMessage())
        recording.closed(conn)

    return drive


def test_a_deeply_nested_json_body_is_recorded_by_its_digest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """JSON nested past what ``json`` (or the redaction) recurses into:
    the exchange is recorded, its body by size and digest, nothing logged
    as an error."""
    deep = b"[" * 100_000 + b"]" * 100_000
    shallow_enough = b'{"a":' * 500 + b'{"token":"t"}' + b"}" * 500  # parses; too deep to scrub
    for i, body in enumerate((deep, shallow_enough)):
        (record,) = captured(tmp_path / str(i), posted(body, b"application/json", b"/a?token=t"))
        assert record["req"]["n"] == len(body) and "raw" not in record["req"]
        assert record["req"]["p"] == [len(body), hashlib.sha256(body).digest()]
        assert record["path"] == "/a?token=<redacted>"
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_multipart_body_is_recorded_without_its_parts_credentials(tmp_path: Path) -> None:
    """``pulsar-admin sinks create`` sends its config as a JSON part of a
    ``multipart/form-data`` body: each part is redacted as its own type
    says, the rest (a package's bytes) kept as it came."""
    boundary = b"sluice-" + uuid.uuid4().hex.encode()
    package = bytes(range(256)) * 4 + b"\r\n--not-the-boundary\r\n"
    config = {"configs": {"jdbcUrl": "jdbc:postgresql://db/x", "password": QUERY_TOKEN}}

    def part(headers: bytes, payload: bytes) -> bytes:
        return b"--" + boundary + b"\r\nContent-Disposition: form-data; " + headers + payload

    body = (
        part(b'name="data"; filename="sink.nar"\r\n'
             b"Content-Type: application/octet-stream\r\n\r\n", package) + b"\r\n"
        + part(b'name="sinkConfig"\r\nContent-Type: application/json\r\n\r\n',
               json.dumps(config).encode()) + b"\r\n"
        + part(b'name="password"\r\n\r\n', BEARER.encode()) + b"\r\n"
        + b"--" + boundary + b"--\r\n"
    )  # fmt: skip
    kind = b"multipart/form-data; boundary=" + boundary
    (record,) = captured(tmp_path / "ok", posted(body, kind))
    raw = record["req"]["raw"]
    assert QUERY_TOKEN.encode() not in raw and BEARER.encode() not in raw
    assert record["redacted"] is True and record["req"]["n"] == len(body)
    kept = (
        part(b'name="data"; filename="sink.nar"\r\n'
             b"Content-Type: application/octet-stream\r\n\r\n", package) + b"\r\n"
        + part(b'name="sinkConfig"\r\nContent-Type: application/json\r\n\r\n',
               b'{"configs":{"jdbcUrl":"jdbc:postgresql://db/x","password":"<redacted>"}}')
        + b"\r\n" + part(b'name="password"\r\n\r\n', b"<redacted>") + b"\r\n"
        + b"--" + boundary + b"--\r\n"
    )  # fmt: skip
    assert raw == kept
    # One that does not parse as multipart: its digest, not its bytes.
    broken = body.replace(b"--" + boundary, b"--other")
    (record,) = captured(tmp_path / "broken", posted(broken, kind))
    assert record["req"]["p"] == [len(broken), hashlib.sha256(broken).digest()]
    # A part whose bytes are encoded (base64) holds what they do not show,
    # whatever its type: the body's digest; a name in RFC 2047 words is
    # read decoded.
    encoded = base64.b64encode(json.dumps(config).encode())
    hidden = (part(b'name="cfg"\r\nContent-Type: application/octet-stream\r\n'
                   b"Content-Transfer-Encoding: base64\r\n\r\n", encoded)
              + b"\r\n--" + boundary + b"--\r\n")  # fmt: skip
    (record,) = captured(tmp_path / "encoded", posted(hidden, kind))
    assert "raw" not in record["req"] and record["req"]["p"][0] == len(hidden)
    worded = (part(b'name="=?UTF-8?B?cGFzc3dvcmQ=?="\r\n\r\n', BEARER.encode())
              + b"\r\n--" + boundary + b"--\r\n")  # fmt: skip
    (record,) = captured(tmp_path / "worded", posted(worded, kind))
    assert BEARER.encode() not in record["req"]["raw"] and record["redacted"] is True


def test_a_multipart_upload_is_redacted_without_looking_into_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pulsar-admin functions create`` sends a function's jar with its
    JSON config: the jar's bytes are kept without being looked into, so
    redacting a 5 MiB upload takes a few milliseconds on the event loop
    (the stdlib's parser took some 200, every part decoded); the config's
    credential is still replaced, in its own part (not in a preamble that repeats its value)."""
    boundary = b"Boundary_1_" + uuid.uuid4().hex.encode()
    jar = random.Random(0).randbytes(5 << 20) + b"\r\n--not-the-boundary\r\n"
    config = json.dumps({"className": "F", "userConfig": {"password": QUERY_TOKEN}}).encode()
    redacted = b'{"className":"F","userConfig":{"password":"<redacted>"}}'

    def upload(package: bytes, kept: bool = False) -> bytes:
        return (
            b"--" + boundary + b'\r\nContent-Disposition: form-data; name="data"; '
            b'filename="f.jar"\r\nContent-Type: application/java-archive\r\n\r\n' + package
            + b"\r\n--" + boundary + b'\r\nContent-Disposition: form-data; name="functionConfig"'
            b"\r\nContent-Type: application/json\r\n\r\n" + (redacted if kept else config)
            + b"\r\n--" + boundary + b"--\r\n"
        )  # fmt: skip

    kind = b"multipart/form-data; boundary=" + boundary
    # What the recording does on the event loop once the body is whole: the
    # parts given to the redactor (the config's, not the package's).
    body = Body(fmt.PayloadPolicy.FULL, limit=8 << 20)
    sent = upload(jar)
    for at in range(0, len(sent), 65536):
        body.add(sent[at : at + 65536])
    looked_into: list[int] = []
    redact = recorded.redact_body

    def spy(part: bytes, content_type: str = "") -> tuple[bytes | None, bool]:
        looked_into.append(len(part))
        return redact(part, content_type)

    monkeypatch.setattr(recorded, "redact_body", spy)
    record, replaced = body.record([(b"content-type", kind)])
    monkeypatch.undo()
    assert replaced and record["raw"] == upload(jar, kept=True)
    assert looked_into == [len(config)], looked_into  # the config's part alone
    # Through the recording, a smaller one: the package kept, the config
    # redacted where it is.
    package = jar[:4096]
    (record,) = captured(tmp_path, posted(upload(package), kind))
    assert record["req"]["raw"] == upload(package, kept=True) and record["redacted"] is True
    # A preamble that repeats a part's value: the part's value is replaced
    # (not the same bytes in the preamble instead).
    part = b'Content-Disposition: form-data; name="password"\r\n\r\n'
    repeated = b"%s\r\n--%s\r\n%s%s\r\n--%s--\r\n" % (
        BEARER.encode(), boundary, part, BEARER.encode(), boundary,
    )  # fmt: skip
    raw, replaced = redact_body(repeated, kind.decode())
    assert replaced and raw is not None and part + b"<redacted>\r\n" in raw


def test_a_brokers_credential_in_its_dynamic_config_is_left_out(tmp_path: Path) -> None:
    """``pulsar-admin brokers update-dynamic-config`` sets the broker's own
    client credential by path; ``…/configuration/values`` answers it as a
    JSON key."""
    names = ("brokerClientAuthenticationParameters", "clientAuthenticationParameters",
             "bookkeeperClientAuthenticationParameters", "bookkeeperClientAuthParams")  # fmt: skip
    for name in names:
        target = f"/admin/v2/brokers/configuration/{name}/token%3A{BEARER}".encode()
        assert redact_target(target) == f"/admin/v2/brokers/configuration/{name}/<redacted>"
        answer = json.dumps({name: f"token:{BEARER}", "superUserRoles": "admin"}).encode()
        assert redact_body(answer, "application/json") == (
            f'{{"{name}":"<redacted>","superUserRoles":"admin"}}'.encode(),
            True,
        )
    kept = "/admin/v2/brokers/configuration/loadBalancerEnabled/false"
    assert redact_target(kept) == kept
    target = (
        b"/admin/v2/brokers/configuration/brokerClientAuthenticationParameters/" + BEARER.encode()
    )
    (record,) = captured(tmp_path, posted(b"", b"text/plain", target))
    assert BEARER not in record["path"] and record["redacted"] is True


def client_frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """A client's (masked) frame, payload under 126 bytes."""
    assert len(payload) < 126
    key = b"\x01\x02\x03\x04"
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return bytes([(0x80 if fin else 0) | opcode, 0x80 | len(payload)]) + key + masked


def test_a_fragmented_websocket_message_is_redacted_whole(tmp_path: Path) -> None:
    """A JSON message in two fragments (a ping between them) holds a
    credential only as a whole: its fragments are kept by their digests;
    one without a credential is kept as it came."""
    secret = json.dumps({"payload": "aGk=", "properties": {"password": BEARER}}).encode()
    plain = json.dumps({"payload": "aGk=", "properties": {"colour": "blue"}}).encode()

    def drive(recording: HttpRecording) -> None:
        conn = h11.Connection(h11.SERVER)
        recording.opened(conn, "127.0.0.1:1")
        tap = recording.session(conn)
        assert tap is not None
        reader = FrameReader(from_client=True, max_message=1 << 20, keep=True)
        for message in (secret, plain):
            tap.frames(False, reader.feed(client_frame(1, message[:20], fin=False)))
            tap.frames(False, reader.feed(client_frame(9, b"ping")))
            tap.frames(False, reader.feed(client_frame(0, message[20:])))
        # A message its last fragment never ended: its digest.
        tap.frames(False, reader.feed(client_frame(1, secret[:30], fin=False)))
        tap.ended("hangup")

    records = captured(tmp_path, drive)
    assert BEARER.encode() not in b"".join(r.get("raw", b"") for r in records)
    assert [r["op"] for r in records] == ["text", "ping", "text"] * 2 + ["text"]
    first, ping, last = records[:3]
    assert ping["raw"] == b"ping"
    for record, part in ((first, secret[:20]), (last, secret[20:])):
        assert record["p"] == [len(part), hashlib.sha256(part).digest()] and record["redacted"]
    assert [r["raw"] for r in records[3:6]] == [plain[:20], b"ping", plain[20:]]
    assert records[6]["p"] == [30, hashlib.sha256(secret[:30]).digest()]


def test_an_endless_fragmented_message_does_not_grow_the_recording(tmp_path: Path) -> None:
    """With ``full`` payloads, a message whose fragments never end (empty
    ones, with pings between them: within any size limit, so the relay
    lets them through) is not held back whole: past ``MAX_PENDING``
    records its fragments are written as they come, by their digests,
    before the message ends; and every frame is recorded, in order."""
    rounds = 3 * MAX_PENDING // 11  # of ten empty fragments and a ping
    queued: list[int] = []

    def drive(recording: HttpRecording) -> None:
        conn = h11.Connection(h11.SERVER)
        recording.opened(conn, "127.0.0.1:1")
        tap = recording.session(conn)
        assert tap is not None
        reader = FrameReader(from_client=True, max_message=1 << 20, keep=True)
        tap.frames(False, reader.feed(client_frame(2, b"first", fin=False)))
        empty = client_frame(0, b"", fin=False) * 10 + client_frame(9, b"ping")
        for _ in range(rounds):
            tap.frames(False, reader.feed(empty))
        recorder = recording.recorder
        queued.append(recorder.queued + recorder.dropped_total)
        tap.frames(False, reader.feed(client_frame(0, b"last")))
        tap.frames(False, reader.feed(client_frame(2, b"next")))
        tap.ended("closed")

    records = captured(tmp_path, drive)
    total = 3 + 11 * rounds  # first, the rounds, last, next
    # Held back: no more than MAX_PENDING records of the message unwritten.
    assert queued[0] >= total - 1 - MAX_PENDING, queued
    assert len(records) == total
    assert [r["op"] for r in records[:12]] == ["binary"] * 11 + ["ping"]
    assert records[0]["p"] == [5, hashlib.sha256(b"first").digest()]
    assert records[-2]["p"] == [4, hashlib.sha256(b"last").digest()]
    assert records[-1]["raw"] == b"next"  # the next message is kept whole again


def test_a_compressed_body_is_checked_for_credentials() -> None:
    """Pulsar's web service gzips its answers for a client that accepts
    it (``httpServerGzipCompression``, on by default), and Sluice passes
    ``Accept-Encoding`` on: a source's config with a password, gzipped, is
    kept by its digest (marked ``redacted``), not as bytes anyone can
    gunzip; a gzipped (or deflated) body without a credential is kept as
    it came; one that does not decompress, or in a coding Sluice does not
    read, by its digest."""
    secret = json.dumps({"configs": {"password": BEARER}, "parallelism": 1}).encode()
    plain = json.dumps({"parallelism": 1, "key": "k"}).encode()
    deflated = zlib.compress(plain)
    # body, its Content-Encoding, whether it is kept as it came, whether redacted
    cases: list[tuple[bytes, bytes, bool, bool]] = [
        (gzip.compress(secret), b"gzip", False, True),
        (zlib.compress(secret), b"deflate", False, True),
        (gzip.compress(gzip.compress(secret)), b"gzip, gzip", False, True),
        (gzip.compress(plain), b"gzip", True, False),
        (deflated, b"deflate", True, False),
        (deflated[2:-4], b"deflate", True, False),  # raw deflate, as some servers send it
        (gzip.compress(plain), b"identity, x-gzip", True, False),
        (b"\x1f\x8b not gzip", b"gzip", False, False),
        (gzip.compress(plain), b"br", False, False),
        (gzip.compress(b"[" * 1000), b"gzip", False, False),  # past the limit decompressed
    ]
    for body, coding, kept, redacted in cases:
        headers = [(b"content-type", b"application/json"), (b"content-encoding", coding)]
        recorded = Body(fmt.PayloadPolicy.FULL, limit=200)
        recorded.add(body)
        out, marked = recorded.record(headers)
        if kept:
            assert out.get("raw") == body, (body, coding, out)
        else:
            assert "raw" not in out, (body, coding, out)
            assert out["p"] == [len(body), hashlib.sha256(body).digest()], (body, coding)
        assert marked == redacted, (body, coding)


def test_no_record_of_the_first_segment_is_older_than_its_header(tmp_path: Path) -> None:
    """The first segment's header said recording started when its file was
    made, a moment after its first records were taken: sluice inspect
    showed them at negative offsets, and --since 0 left them out."""
    directory = tmp_path / "rec"

    async def main() -> None:
        recorder = Recorder(RecorderConfig(directory, payloads=fmt.PayloadPolicy.HASH))
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run)
            posted(b"{}", b"application/json")(
                HttpRecording(recorder, fmt.PayloadPolicy.HASH, 1 << 20)
            )
            nursery.cancel_scope.cancel()

    trio.run(main)
    (path,) = fmt.recording_files(directory)
    header, *records = fmt.read_records(path)
    assert records and all(r["w"] >= header["started"] for r in records if "w" in r)
