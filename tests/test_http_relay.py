"""The HTTP listener (``sluice/proxy/http.py``) in process, in front of a
small web service of the test's own on loopback (raw bytes both ways), so
that what reaches the "broker" and what the client gets back can be read
exactly: headers Sluice passes on or asserts, the requests it makes.

The upstream is the test's: what is tested is Sluice's relay, not a
broker's behaviour.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio
from prometheus_client import CollectorRegistry

from sluice.addresses import Address
from sluice.brokers.apache_pulsar import hs256_token
from sluice.protocols.http import Headers, origin_form, parse_http_url, unlisted
from sluice.protocols.pulsar.auth import AuthError, ProxyAuth
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.backend import Unauthorized
from sluice.proxy.config import ProxyConfig
from sluice.proxy.http import HttpRelay
from sluice.proxy.metrics import HttpMetrics
from sluice.proxy.shared import PLAIN


@dataclass
class Upstream:
    """A web service on loopback: each request's head (and body by its
    Content-Length) kept, each answered with ``answer`` (raw bytes)."""

    answer: Callable[[bytes], bytes]
    port: int = 0
    heads: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._one, listeners)

    async def _one(self, stream: trio.SocketStream) -> None:
        buffer = b""
        with trio.move_on_after(10):
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buffer) < length:
                    buffer += await stream.receive_some(65536)
                self.heads.append(head)
                self.bodies.append(buffer[:length])
                buffer = buffer[length:]
                await stream.send_all(self.answer(head))

    def headers(self, index: int = -1) -> Headers:
        """The ``index``th request's headers, names lower-cased."""
        lines = self.heads[index].split(b"\r\n")[1:]
        return [
            (n.strip().lower(), v.strip()) for n, _, v in (line.partition(b":") for line in lines)
        ]


def ok(body: bytes = b"ok", *extra: bytes) -> Callable[[bytes], bytes]:
    def answer(head: bytes) -> bytes:
        more = b"".join(h + b"\r\n" for h in extra)
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), more, body)

    return answer


Credentials = Callable[[str | None, str | None], Awaitable[Headers | None]]


@asynccontextmanager
async def relay(
    upstream: Upstream,
    credentials: Credentials | None = None,
    routes: dict[str, str] | None = None,
    asked: list[object] | None = None,
    **settings: object,
) -> AsyncIterator[tuple[HttpRelay, int]]:
    """Sluice's HTTP listener in front of ``upstream``; it and its port.
    ``routes``: Sluice's listeners for any broker a lookup answer names
    (which ``asked`` collects)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(upstream.serve)
        config = ProxyConfig(
            broker=parse_broker_url("pulsar://127.0.0.1:6650"),
            http_listen=Address("127.0.0.1", 0),
            broker_http=parse_http_url(f"http://127.0.0.1:{upstream.port}"),
            **settings,  # type: ignore[arg-type]
        )

        async def listener_urls(urls: object) -> dict[str, str]:
            if asked is not None:
                asked.append(urls)
            return dict(routes or {})

        web = HttpRelay(config, HttpMetrics(CollectorRegistry()), listener_urls, credentials)
        addresses = await web.open()
        nursery.start_soon(web.serve)
        yield web, addresses["http"].port
        nursery.cancel_scope.cancel()


async def exchange(port: int, data: bytes) -> bytes:
    """``data`` written to Sluice's listener; all it answers until it closes
    (or goes quiet for a second)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        got = b""
        with trio.move_on_after(5):
            while True:
                with trio.move_on_after(1) as quiet:
                    chunk = await stream.receive_some(65536)
                if quiet.cancelled_caught or not chunk:
                    break
                got += chunk
        return got


def proxy_auth(directory: Path) -> tuple[Credentials, str]:
    """``--auth-mode proxy``'s checks (Sluice's key, its own token "SLUICE"),
    as the web port calls them; and a client token for role ``app``."""
    secret = secrets.token_bytes(32)
    (directory / "clients.key").write_bytes(secret)
    (directory / "sluice.token").write_text("SLUICE\n")
    auth = ProxyAuth.load(
        secret_key=directory / "clients.key",
        public_key=None,
        role_claim="sub",
        own_token=directory / "sluice.token",
        tls_roles=False,
        forward_auth_data=False,
    )

    async def credentials(authorization: str | None, role: str | None) -> Headers | None:
        try:
            return auth.web_credentials(authorization, role)[1]
        except AuthError as exc:
            raise Unauthorized(str(exc)) from None

    return credentials, hs256_token(secret, "app")


async def test_a_connection_header_cannot_take_away_what_sluice_asserts(tmp_path: Path) -> None:
    """Headers a client's Connection header names are its hop's only, and
    stay behind; but Sluice's own are added after: a client naming
    X-Original-Principal (or Authorization, X-Forwarded-For) there used to
    have Sluice drop its own, and in proxy mode the broker got Sluice's
    token with no principal: Sluice's role, not the client's."""
    upstream = Upstream(ok())
    credentials, token = proxy_auth(tmp_path)
    async with relay(upstream, credentials) as (_, port):
        answer = await exchange(
            port,
            b"GET /admin/v2/tenants HTTP/1.1\r\nHost: sluice\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\n"
            b"Connection: keep-alive, X-Original-Principal, Authorization, X-Forwarded-For, "
            b"X-Hop\r\nX-Original-Principal: admin\r\nX-Hop: 1\r\nX-Forwarded-For: 10.9.9.9\r\n"
            b"Connection: close\r\n\r\n",
        )
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    sent = upstream.headers()
    assert (b"authorization", b"Bearer SLUICE") in sent
    assert [v for n, v in sent if n == b"x-original-principal"] == [b"app"]
    assert [v for n, v in sent if n == b"x-forwarded-for"] == [b"127.0.0.1"]
    assert not [n for n, _ in sent if n in (b"x-hop", b"connection")], sent


def test_connection_named_headers_go_before_sluices_own() -> None:
    sent = [(b"Connection", b"Upgrade, X-Hop, close"), (b"X-Hop", b"1"),
            (b"Upgrade", b"websocket"), (b"Content-Length", b"0")]  # fmt: skip
    assert unlisted(sent) == [(b"Connection", b"Upgrade"), (b"Upgrade", b"websocket"),
                              (b"Content-Length", b"0")]  # fmt: skip
    assert unlisted([(b"Connection", b"x-hop"), (b"X-Hop", b"1")]) == []


LOOKUP_ANSWER = json.dumps({
    "brokerUrl": "pulsar://b1:6650", "brokerUrlTls": "pulsar+ssl://b1:6651",
    "httpUrl": "http://b1:8080", "httpUrlTls": "https://b1:8443", "nativeUrl": "pulsar://b1:6650",
}).encode()  # fmt: skip


async def lookup(port: int, target: bytes) -> dict[str, object]:
    """A GET's answer, as JSON."""
    answer = await exchange(
        port, b"GET " + target + b" HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n"
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), answer
    parsed = json.loads(body)
    assert isinstance(parsed, dict)
    return parsed


async def test_lookups_of_v1_topic_names_name_sluice_too() -> None:
    """The Java and C++ clients look a v1 topic name
    (persistent://property/cluster/namespace/topic) up under
    /lookup/v2/destination/: its answer names the owner as a v2 lookup's
    does, and used to reach the client unchanged (its producers and
    consumers then went to the broker around Sluice)."""
    upstream = Upstream(ok(LOOKUP_ANSWER, b"Content-Type: application/json"))
    async with relay(upstream, routes={PLAIN: "pulsar://sluice:7000"}) as (web, port):
        for target in (
            b"/lookup/v2/topic/persistent/t/n/x",
            b"/lookup/v2/destination/persistent/p/c/n/x",
            b"/lookup/v2/destination/non-persistent/p/c/n/x?authoritative=false",
        ):
            answer = await lookup(port, target)
            assert answer["brokerUrl"] == answer["nativeUrl"] == "pulsar://sluice:7000", target
            assert answer["brokerUrlTls"] is None
            assert answer["httpUrl"] == web.own_url and answer["httpUrlTls"] is None


def test_dot_segments_are_resolved_as_the_broker_resolves_them() -> None:
    assert origin_form(b"/lookup/v2/topic/persistent/../../../../admin/v2/x?a=..") == (
        b"/admin/v2/x?a=.."
    )
    assert origin_form(b"/lookup/v2/topic/%2e%2E/%2e/a/b") == b"/lookup/v2/a/b"
    assert origin_form(b"/a/..;x/b/.") == b"/b/"
    assert origin_form(b"/a/b/..") == b"/a/"
    assert origin_form(b"/../..") == b"/"
    # No dot segment: as it came (empty segments, dots inside names, a query's).
    for kept in (b"/a//b/", b"/a/.b/c../x.y", b"/a?b=/../c", b"*"):
        assert origin_form(kept) == kept


async def test_an_admin_answer_reached_by_dot_segments_is_not_read_as_a_lookup() -> None:
    """A lookup's path with ``..`` segments is whatever path they lead to at
    the broker: an admin call's answer, which a client may have written (a
    namespace's properties: {"brokerUrl": "pulsar://10.0.0.5:22", ...}),
    was read as a lookup answer: Sluice opened a listener relaying to the
    broker it named and took its web URL for one it may be redirected to."""
    planted = json.dumps({
        "brokerUrl": "pulsar://10.0.0.5:22", "httpUrl": "http://169.254.169.254:80",
    }).encode()  # fmt: skip
    upstream = Upstream(ok(planted, b"Content-Type: application/json"))
    asked: list[object] = []
    async with relay(upstream, routes={PLAIN: "pulsar://sluice:7000"}, asked=asked) as (web, port):
        answer = await lookup(
            port, b"/lookup/v2/topic/persistent/%2e%2e/../../../admin/v2/namespaces/t/n/properties"
        )
        assert upstream.heads[-1].startswith(b"GET /admin/v2/namespaces/t/n/properties HTTP/1.1")
        assert answer == json.loads(planted)
        assert asked == []
        assert not web.allowlist.allows(Address("169.254.169.254", 80))


async def test_a_lookup_names_sluices_web_port_as_advertised() -> None:
    """With --advertise-host, a lookup answer's brokerUrl names that host,
    and so must its httpUrl: it named the listener's own host (this
    machine's name for a wildcard, which a gateway pod's clients cannot
    resolve)."""
    upstream = Upstream(ok(LOOKUP_ANSWER))
    routes = {PLAIN: "pulsar://sluice.example:7000"}
    async with relay(upstream, routes=routes, advertise_host="sluice.example") as (_, port):
        answer = await lookup(port, b"/lookup/v2/topic/persistent/t/n/x")
    assert answer["httpUrl"] == f"http://sluice.example:{port}"


async def test_a_redirect_to_no_request_target_goes_to_the_client() -> None:
    """A 307 whose Location is no request target (a space in its path) is
    not followed but passed on, as one Sluice may not follow is: Sluice
    used to fail writing the request and closed the connection unanswered."""

    def answer(head: bytes) -> bytes:
        return b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /a b\r\nContent-Length: 0\r\n\r\n"

    async with relay(Upstream(answer)) as (_, port):
        got = await exchange(port, b"GET /x HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 307 "), got
    assert b"\r\nlocation: /a b\r\n" in got


async def test_connect_is_refused_not_relayed() -> None:
    """CONNECT asks for a tunnel: it went to the broker with its authority
    form target, and a 2xx switched both connections to the tunnel, which
    Sluice then failed on (an internal error, the client's connection
    closed). It is answered 501, the broker never asked."""
    upstream = Upstream(lambda head: b"HTTP/1.1 200 OK\r\n\r\n")
    async with relay(upstream) as (_, port):
        got = await exchange(port, b"CONNECT 10.0.0.5:22 HTTP/1.1\r\nHost: 10.0.0.5:22\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 501 "), got
    assert b"Sluice: CONNECT is not relayed" in got
    assert upstream.heads == []
