"""Pulsar's web port (admin REST API, HTTP lookups), sans-I/O.

h11 parses and writes HTTP on both sides (``sluice/proxy/http.py`` runs it
on trio streams); what is decided here takes values and returns values:

- ``request_kind``: what a request is for (a metric label); ``head_size``;
  ``framed_twice``: a request after which the connection is closed;
  ``h11_reason``: why h11 refused a message, its bytes left out.
- ``forward_headers`` / ``answer_headers``: the headers passed on, less the
  hop-by-hop ones (each hop frames its own message); ``unlisted``: a
  request's own before Sluice adds any; ``with_credentials``:
  the client's credentials replaced (proxy-mode authentication).
- ``parse_http_url``: ``--broker-http`` and the URLs brokers name.
- ``replayable``: a request Sluice may send again on a new connection.
- ``Redirects``: which 307/308 answers Sluice follows itself, and when a
  chain of them is an error (a loop, too many hops).
- ``lookup_broker_urls`` / ``rewrite_lookup``: the brokers an HTTP lookup
  answer names, and the answer rewritten to name Sluice.

Nothing here imports trio or opens a socket.
"""

from __future__ import annotations

import contextlib
import json
import re
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sluice.addresses import Address, parse_address
from sluice.errors import ConfigError
from sluice.protocols.faults import Direction, FaultAction, ProtocolFaults
from sluice.protocols.http.recorded import redact_target

# What requests are for, by path: the label of the HTTP metrics.
KINDS = ("admin", "lookup", "websocket", "other")
# What fault rules may name for the web port (``match.protocol`` "http",
# which they must name): a request's kind as its command, its path as its
# topic (a glob starting with "/"), the status an ``error`` rule answers.
HTTP_FAULTS = ProtocolFaults(
    "http",
    frozenset(kind.upper() for kind in KINDS),
    ("503", "500", "502", "504", "429", "404", "403", "401", "400"),
    actions=frozenset(
        {FaultAction.DELAY, FaultAction.DROP, FaultAction.DISCONNECT, FaultAction.ERROR}
    ),
    named_only=True,
    directions=frozenset({Direction.TO_BROKER}),
)
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")
# Redirects Sluice follows itself: the two that keep the method and body.
FOLLOWED = frozenset({307, 308})
# The methods whose request, made twice, does what it does once (RFC 9110
# 9.2.2): those Sluice may send again when a kept connection fails unanswered.
_IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})

# Headers about one hop only (RFC 9110 7.6.1), never passed on; h11 writes
# the framing (Content-Length or chunked) for each hop itself. Expect: Sluice
# sends a request's body whole, it asks the client for it itself.
_HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate",
    b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade", b"expect",
})  # fmt: skip

Headers = list[tuple[bytes, bytes]]


# Characters RFC 3986 calls unreserved: the same percent-encoded or not.
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


# Where h11's reason for refusing a message starts quoting its bytes ("illegal
# request line: bytearray(b'GET ...')", "Illegal header value b'...'").
_QUOTED = re.compile(r":? ?(?:bytearray\(|b['\"]).*", re.S)


def h11_reason(exc: Exception) -> str:
    """Why h11 refused a message, without the bytes it quotes: a request
    line's query or a header's value may hold a credential, and the reason
    goes to the log, the client's answer and the capture."""
    return _QUOTED.sub("", str(exc)).rstrip(": ") or "malformed"


def framed_twice(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request carried both Transfer-Encoding and Content-Length.
    h11 frames it by the former, but a hop before Sluice may have read the
    latter, so the connection is closed after the answer (RFC 9112 6.3):
    what follows on it is not trusted to be where a request begins."""
    names = {name for name, _ in headers}
    return b"transfer-encoding" in names and b"content-length" in names


def origin_form(target: bytes) -> bytes:
    """A request target as Sluice reads it and asks the broker for it: the
    absolute form (``http://host/path?q``, which an HTTP/1.1 server must
    take) made the origin form (``/path?q``), and percent-encoded
    unreserved characters of the path decoded (``%70ersistent`` is
    ``persistent``) and its ``.`` and ``..`` segments resolved, so that
    what Sluice recognizes (a topic lookup whose answer it rewrites, the
    kind, a fault rule's path) is what the broker serves. A ``#fragment``
    (which no request target may hold, but h11 passes) is dropped: the
    broker's web server routes by what comes before it. Anything else is
    left as it is."""
    target = target.partition(b"#")[0]
    if target[:7].lower() == b"http://" or target[:8].lower() == b"https://":
        rest = target.split(b"//", 1)[1]
        cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
        target = rest[cut:]
        target = target if target.startswith(b"/") else b"/" + target
    path, mark, query = target.partition(b"?")
    if b"%" in path:
        path = _ESCAPED.sub(_unreserved, path)
    if path.startswith(b"/") and b"." in path:
        path = _without_dot_segments(path)
    return path + mark + query


_ESCAPED = re.compile(rb"%([0-9A-Fa-f]{2})")


def _without_dot_segments(path: bytes) -> bytes:
    """``path`` with its ``.`` and ``..`` segments resolved (RFC 3986
    5.2.4), as the broker's web server (Jetty) resolves them before it
    routes: ``/lookup/v2/topic/persistent/../../../admin/…`` is an admin
    request, whose answer (which a client may have written) Sluice must not
    read as a lookup's. A segment's ``;parameters`` do not make a dot
    segment another one (``..;x`` is ``..``, as Jetty reads it)."""
    segments = path.split(b"/")[1:]
    kept: list[bytes] = []
    for i, segment in enumerate(segments):
        name = segment.split(b";", 1)[0]
        if name in (b".", b".."):
            if name == b".." and kept:
                kept.pop()
            if i == len(segments) - 1:
                kept.append(b"")  # "/a/.." is "/a/", a directory
        else:
            kept.append(segment)
    return b"/" + b"/".join(kept)


def _unreserved(escaped: re.Match[bytes]) -> bytes:
    """A %XX escape decoded when it stands for an unreserved character."""
    byte = int(escaped[1], 16)
    return bytes([byte]) if byte in _UNRESERVED else escaped[0]


def request_kind(target: bytes) -> str:
    """admin, lookup, websocket or other, by the request's path."""
    path = target.split(b"?", 1)[0]
    if path == b"/admin" or path.startswith(b"/admin/"):
        return "admin"
    if path.startswith(b"/lookup/"):
        return "lookup"
    if path.startswith(b"/ws/"):
        return "websocket"
    return "other"


def replayable(method: bytes) -> bool:
    """Whether a request that a broker's connection failed without
    answering may be sent again: an idempotent method's. Any other (POST:
    a cursor reset, ``skip/{n}``, a compaction) may have been carried out
    before the connection failed, and a proxy must not repeat it (RFC 9112
    9.3.1): its client gets the failure."""
    return method.upper() in _IDEMPOTENT


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "5xx"


# Where a broker answers a topic lookup with the owner's URLs: v2 topic
# names (tenant/namespace/topic), and v1 ones (property/cluster/namespace/
# topic), which the Java and C++ clients look up under /lookup/v2/destination/.
_LOOKUPS = tuple(
    b"/lookup/v2/%s/%s/" % (kind, domain)
    for kind in (b"topic", b"destination")
    for domain in (b"persistent", b"non-persistent")
)


def is_topic_lookup(method: bytes, target: bytes) -> bool:
    """``GET /lookup/v2/topic/{persistent|non-persistent}/…`` (and the v1
    names' ``/lookup/v2/destination/…``): answered with the owner's URLs,
    which Sluice rewrites. Not a topic's ``…/bundle`` (v2 names: tenant,
    namespace, topic, ``bundle``; v1: property, cluster, namespace, topic,
    ``bundle``), answered with the name of the bundle that holds it."""
    path = target.split(b"?", 1)[0]
    if method != b"GET" or not path.startswith(_LOOKUPS):
        return False
    segments = path.split(b"/")[5:]
    bundle = 5 if path.startswith(b"/lookup/v2/destination/") else 4
    return not (len(segments) == bundle and segments[-1] == b"bundle")


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    """Header names a Connection header lists: hop-by-hop too."""
    named: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            named |= {t.strip().lower() for t in value.split(b",") if t.strip()}
    return named


def _end_to_end(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    headers = list(headers)
    dropped = _HOP_BY_HOP | _connection_tokens(headers)
    return [(n, v) for n, v in headers if n.lower() not in dropped]


# Headers Sluice frames, reads or writes itself for each hop: a client's
# Connection header naming one does not take it away (``unlisted``).
_OWN_FRAMING = _HOP_BY_HOP | {b"host", b"content-length"}


def unlisted(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """A client's request headers less those its ``Connection`` header
    names (hop-by-hop, for the client's hop only), and that header naming
    no others: done before Sluice adds headers of its own
    (``X-Forwarded-For``; in proxy mode, its ``Authorization`` and the
    client's role in ``X-Original-Principal``), so that a client's
    ``Connection: X-Original-Principal`` cannot take away what Sluice
    asserts (``forward_headers`` drops what the Connection header names,
    then). The names Sluice frames and reads itself stay (``Upgrade``,
    ``Content-Length``, ...)."""
    headers = list(headers)
    listed = _connection_tokens(headers) - _OWN_FRAMING
    if not listed:
        return headers
    kept: Headers = []
    for name, value in headers:
        lower = name.lower()
        if lower in listed:
            continue
        if lower == b"connection":
            tokens = [t.strip() for t in value.split(b",") if t.strip()]
            value = b", ".join(t for t in tokens if t.lower() not in listed)
            if not value:
                continue
        kept.append((name, value))
    return kept


def forward_headers(
    headers: Iterable[tuple[bytes, bytes]], host: bytes, *, identity: bool = False
) -> Headers:
    """A client's request headers as they go to the broker at ``host``
    (``Host`` names the broker; ``Authorization`` and the rest unchanged).
    ``identity``: the answer is to be rewritten, so it is asked for
    uncompressed (``Accept-Encoding`` left out)."""
    dropped = {b"host", b"accept-encoding"} if identity else {b"host"}
    kept = [(n, v) for n, v in _end_to_end(headers) if n.lower() not in dropped]
    return [(b"host", host), *kept]


# A client's own credentials, which proxy-mode authentication replaces
# (a client naming a principal itself must not reach the broker).
PRINCIPAL = b"x-original-principal"
# Which of the broker's authentication providers checks the request (the
# broker tries only that one): a client's must never choose how Sluice's
# own credential is taken (its TLS certificate for the token it sent).
METHOD = b"x-pulsar-auth-method-name"
CREDENTIALS = frozenset({b"authorization", PRINCIPAL, METHOD})


def with_credentials(
    headers: Iterable[tuple[bytes, bytes]], own: Headers | None, *, upgrade: bool = False
) -> Headers:
    """``headers`` with the client's credentials replaced by ``own`` (None:
    passthrough, unchanged). ``upgrade``: a WebSocket upgrade, which keeps
    the client's own credentials, checked, so that the broker's WebSocket
    service grants the session no more than the client's role; less any
    principal the client names itself (a broker takes one from a proxy
    role, which Sluice's own TLS certificate may be on that hop)."""
    if own is None:
        return list(headers)
    if upgrade:
        kept = [(n, v) for n, v in headers if n.lower() not in (PRINCIPAL, METHOD)]
        if any(n.lower() == b"authorization" for n, _ in kept):  # the client's token
            kept.append((METHOD, b"token"))
        return kept
    return [*((n, v) for n, v in headers if n.lower() not in CREDENTIALS), *own]


# Headers that say whom a request is from, or how it reached the first
# proxy: a broker with ``webServiceTrustXForwardedFor`` (Jetty's
# ForwardedRequestCustomizer) believes them, the leftmost address first.
_FORWARDING = frozenset({b"forwarded", b"x-real-ip"})


def _forwarding(name: bytes) -> bool:
    lower = name.lower()
    return lower in _FORWARDING or lower.startswith(b"x-forwarded-")


def forwarded_for(
    headers: Iterable[tuple[bytes, bytes]], client: str, *, trusted: bool = False
) -> Headers:
    """The request's forwarding headers as they go on: ``X-Forwarded-For``
    naming ``client`` (the address Sluice's listener served: the one a
    PROXY header named, or the peer's). A ``trusted`` client (a source
    ``--proxy-protocol-from`` lists: a proxy of the operator's own) has its
    chain kept and ``client`` added after it, as the Apache Pulsar Proxy's
    web side does. Anyone else's ``X-Forwarded-*``, ``Forwarded`` and
    ``X-Real-IP`` are dropped and ``X-Forwarded-For`` is ``client`` alone:
    a broker that trusts the header takes its leftmost address, which a
    client must not be able to write itself."""
    if trusted:
        before = [v.strip() for n, v in headers if n.lower() == b"x-forwarded-for" and v.strip()]
        rest = [(n, v) for n, v in headers if n.lower() != b"x-forwarded-for"]
    else:
        before, rest = [], [(n, v) for n, v in headers if not _forwarding(n)]
    return [*rest, (b"x-forwarded-for", b", ".join([*before, client.encode()]))]


def forwarded_client(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The client ``forwarded_for`` named last: the one Sluice's listener
    served ("" when there is none)."""
    values = [v for n, v in headers if n.lower() == b"x-forwarded-for"]
    return values[-1].rsplit(b",", 1)[-1].strip().decode("latin-1") if values else ""


def answer_headers(headers: Iterable[tuple[bytes, bytes]], length: int | None = None) -> Headers:
    """A broker's response headers as they go to the client; ``length``: a
    rewritten body's size (its Content-Length replaced). An answer framed
    both ways was read by its Transfer-Encoding, so its Content-Length,
    which does not say what was read, goes (RFC 9112 6.3)."""
    headers = list(headers)
    kept = _end_to_end(headers)
    if length is None:
        if any(n.lower() == b"transfer-encoding" for n, _ in headers):
            return [(n, v) for n, v in kept if n.lower() != b"content-length"]
        return kept
    return [*((n, v) for n, v in kept if n.lower() != b"content-length"),
            (b"content-length", str(length).encode())]  # fmt: skip


def head_size(method: bytes, target: bytes, headers: Iterable[tuple[bytes, bytes]]) -> int:
    """About the bytes of a request's line and headers, as parsed (the
    limit a head that arrived whole in one read is held to)."""
    return len(method) + len(target) + 12 + sum(len(n) + len(v) + 4 for n, v in headers)


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case), or None."""
    for n, v in headers:
        if n.lower() == name:
            return v
    return None


@dataclass(frozen=True, slots=True)
class HttpUrl:
    """Where a web service is: ``http://`` or ``https://``, host and port."""

    address: Address
    tls: bool

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def authority(self) -> bytes:
        return str(self.address).encode()

    def __str__(self) -> str:
        return f"{self.scheme}://{self.address}"


def parse_http_url(text: str, *, what: str = "URL") -> HttpUrl:
    """``http://HOST[:PORT]`` or ``https://HOST[:PORT]`` (80 and 443 by
    default); a path, if any, is ignored."""
    parts = urllib.parse.urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{what} {text!r}: expected http://HOST:PORT or https://HOST:PORT")
    if "@" in parts.netloc:
        raise ConfigError(f"{what} {text!r}: credentials do not belong in the URL")
    tls = parts.scheme == "https"
    address = parse_address(parts.netloc, what=what, default_port=443 if tls else 80)
    return HttpUrl(address, tls)


@dataclass(frozen=True, slots=True)
class Hop:
    """Where a request goes next: the web service and the request target."""

    url: HttpUrl
    target: bytes


# What a request target may hold (RFC 9112 3.2: visible ASCII), as h11 writes one.
_TARGET = re.compile(r"[\x21-\x7e]+")


class RedirectError(Exception):
    """A chain of redirects Sluice will not follow further: a 502 for the client."""


@dataclass
class Redirects:
    """The redirects of one client request, as Sluice follows them.

    ``follow`` says where a 307/308 goes when Sluice should follow it
    itself (None: the answer goes to the client as it is: another status,
    no usable Location, a web service ``allowed`` does not admit, or one
    over plain HTTP after a hop over TLS, where the request's credentials
    would go in the clear), and
    raises ``RedirectError`` for a loop or more than ``limit`` hops.
    """

    first: Hop
    limit: int
    allowed: Callable[[HttpUrl], bool]
    hops: list[Hop] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.hops.append(self.first)

    @property
    def followed(self) -> int:
        return len(self.hops) - 1

    def follow(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> Hop | None:
        if status not in FOLLOWED:
            return None
        location = header(headers, b"location")
        if location is None:
            return None
        hop = self._resolve(location)
        if hop is None or not self.allowed(hop.url):
            return None
        if self.hops[-1].url.tls and not hop.url.tls:
            return None
        if hop in self.hops:
            # Targets without their credential-like query values: this goes
            # to the log and to the client.
            chain = " -> ".join(f"{h.url}{redact_target(h.target)}" for h in self.hops)
            raise RedirectError(f"redirect loop: {chain} -> {hop.url}")
        if self.followed >= self.limit:
            raise RedirectError(
                f"more than {self.limit} redirects (last to {hop.url}); the brokers disagree "
                "on who owns the resource"
            )
        self.hops.append(hop)
        return hop

    def _resolve(self, location: bytes) -> Hop | None:
        current = self.hops[-1]
        try:
            text = location.decode("ascii")
        except UnicodeDecodeError:
            return None
        here = f"{current.url}{current.target.decode('latin-1')}"
        try:
            parts = urllib.parse.urlsplit(urllib.parse.urljoin(here, text))
            url = parse_http_url(f"{parts.scheme}://{parts.netloc}")
        except (ConfigError, ValueError):  # ValueError: an IPv6 host that is not one
            return None
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        if not _TARGET.fullmatch(target):
            return None  # no request target (a space, a control character): not followed
        return Hop(url, target.encode())


# An HTTP lookup answer's fields: the binary URLs (nativeUrl: brokerUrl's
# old name, still written), then the web ones.
BINARY_FIELDS = ("brokerUrl", "brokerUrlTls", "nativeUrl")
WEB_FIELDS = ("httpUrl", "httpUrlTls")


@dataclass(frozen=True)
class LookupRewrite:
    """What ``rewrite_lookup`` made of an answer: the body to send (None:
    the broker's, unchanged), the web URLs it named (brokers Sluice may be
    redirected to next), and why fields were left as they were."""

    body: bytes | None
    named: tuple[HttpUrl, ...] = ()
    kept: tuple[str, ...] = ()


def _answer(body: bytes) -> dict[str, object] | str:
    """An HTTP lookup answer's JSON object, or why it is none."""
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return "the answer is not JSON"
    if not isinstance(answer, dict):
        return "the answer is not a JSON object"
    return answer


def lookup_broker_urls(body: bytes) -> tuple[str, ...]:
    """The binary URLs an HTTP lookup answer names (one broker's: plain,
    TLS), each once, in the order of ``BINARY_FIELDS``."""
    answer = _answer(body)
    if isinstance(answer, str):
        return ()
    urls = (answer.get(name) for name in BINARY_FIELDS)
    return tuple(dict.fromkeys(u for u in urls if isinstance(u, str) and u))


def rewrite_lookup(
    body: bytes,
    *,
    http: str | None,
    https: str | None,
    broker: str | None,
    broker_tls: str | None,
) -> LookupRewrite:
    """An HTTP lookup answer (JSON: brokerUrl, brokerUrlTls, nativeUrl,
    httpUrl, httpUrlTls) rewritten to keep the client on Sluice.

    The web URLs become Sluice's HTTP listener, ``http``, and its TLS one,
    ``https`` (None: Sluice has no such listener, and the field is emptied
    rather than left naming the broker). The binary URLs become Sluice's
    listeners that relay a plain CONNECT to the broker the answer names
    (port per broker): ``broker`` its plain one (brokerUrl, and nativeUrl
    where the answer has it), ``broker_tls`` its TLS one (brokerUrlTls,
    written whether or not the broker has a TLS port); None: Sluice has no
    listener of that kind, and the field is emptied. Both None: Sluice
    relays to that broker nowhere, the fields are left as they are, and
    ``kept`` says so.
    """
    answer = _answer(body)
    if isinstance(answer, str):
        return LookupRewrite(None, kept=(answer,))
    named: list[HttpUrl] = []
    for name in WEB_FIELDS:
        value = answer.get(name)
        if isinstance(value, str) and value:
            with contextlib.suppress(ConfigError):
                named.append(parse_http_url(value, what=name))
    if http is not None:
        answer["httpUrl"] = http
    elif answer.get("httpUrl"):
        answer["httpUrl"] = None
    if https is not None:
        answer["httpUrlTls"] = https
    elif answer.get("httpUrlTls"):
        answer["httpUrlTls"] = None
    kept: list[str] = []
    if broker is None and broker_tls is None:
        for name in BINARY_FIELDS:
            value = answer.get(name)
            if isinstance(value, str) and value:
                kept.append(f"{name} {value} left as the broker gave it: no Sluice listener "
                            "relays a plain CONNECT to that broker")  # fmt: skip
    else:
        ours = {"brokerUrl": broker, "nativeUrl": broker, "brokerUrlTls": broker_tls}
        for name in BINARY_FIELDS:
            value = ours[name]
            if value is not None and (name != "nativeUrl" or answer.get(name)):
                answer[name] = value
            elif answer.get(name):
                answer[name] = None
    rewritten = json.dumps(answer, separators=(",", ":")).encode()
    return LookupRewrite(rewritten, tuple(named), tuple(kept))
