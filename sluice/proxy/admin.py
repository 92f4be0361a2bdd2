"""The admin HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``, ``/faults``.

A deliberately small HTTP/1.1 responder on trio, sharing the proxy's event
loop (no threads): one request per connection, request heads capped at
8 KiB, bodies at 64 KiB, everything at 10 seconds, at most
``MAX_CONNECTIONS`` connections at once. That is all Prometheus, Kubernetes
probes and ``sluice faults`` need.

The connection cap keeps the probes answering when someone holds many
connections open: a connection that arrives when the cap is reached takes
the place of the oldest one that has not yet sent a whole request (which
is answered 503 and closed); only when every held connection has sent its
request and is being answered is the newcomer answered 503 itself.

- ``/healthz``: 200 while the process runs its event loop.
- ``/readyz``: 200 when the proxy is listening and its upstream broker
  answered the last probe; 503 with the reason otherwise.
  ``/readyz?exclude=upstream`` leaves the broker out: 200 while the proxy
  is listening (not draining), whatever the broker (a sidecar's probe: a
  broker outage must not take the application's pod out of its Service).
- ``/metrics``: the Prometheus text format.
- ``/faults``: the fault rules (JSON). ``GET`` lists them with their hit
  counts; ``POST`` adds one (201 and its id); ``DELETE /faults/ID`` removes
  one, ``DELETE /faults`` all. Changing rules needs the admin token
  (``Authorization: Bearer …``, from ``--admin-token-file``); without a
  token configured, rules can only be loaded at start (``--faults``).
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from sluice.addresses import Address, names_this_server
from sluice.protocols.faults import FaultError, Faults, ProtocolFaults, check_room, parse_rule
from sluice.protocols.haproxy import HeaderError
from sluice.protocols.http.recorded import redact_target
from sluice.proxy.dial import open_listeners
from sluice.proxy.inbound import ProxyProtocolIn, peer_address
from sluice.recording.writer import Recorder, SnapshotError

log = logging.getLogger("sluice.admin")

MAX_HEAD = 8 * 1024
MAX_BODY = 64 * 1024
TIMEOUT = 10.0
# What a reload may take, answered (an issuer's keys or Sluice's own token
# fetched, every worker waited for): past TIMEOUT, the caller got no answer.
RELOAD_TIME = 90.0
# What writing a snapshot may take, answered (a ring of up to 256 MiB read
# and written, on a slow volume): past TIMEOUT, the caller got no answer,
# though the capture was written (and asked again: a second one).
SNAPSHOT_TIME = 120.0
# Admin connections held at once (each for at most TIMEOUT), per endpoint.
MAX_CONNECTIONS = 64
# How long a connection answered 503 at the cap is given to send its request
# first (an answer to an unread request can reach the client as a reset).
REFUSE_WAIT = 1.0
_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 401: "Unauthorized",
            403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 409: "Conflict",
            413: "Content Too Large", 500: "Internal Server Error", 502: "Bad Gateway",
            503: "Service Unavailable"}  # fmt: skip
_JSON = "application/json"


async def open_admin(address: Address) -> list[trio.SocketListener]:
    """Bind the admin endpoint (raises OSError, e.g. when the port is taken)."""
    return await open_listeners(address)


def bound(listeners: list[trio.SocketListener]) -> Address:
    host, port = listeners[0].socket.getsockname()[:2]
    return Address(host, port)


# What /readyz reports: the reasons the proxy is not ready (none: ready),
# leaving out the checks named (``?exclude=``, of READINESS_CHECKS).
Readiness = Callable[[frozenset[str]], list[str]]
# The checks /readyz?exclude= may leave out.
READINESS_CHECKS = frozenset({"upstream"})


@dataclass
class AdminRequest:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    query: str = ""  # after the target's '?', as sent


# Serves a path and those under it (/faults, /recording): (status, JSON
# answer), or raises Refused.
Handler = Callable[[AdminRequest], Awaitable[tuple[int, Any]]]
FaultsHandler = Handler
# What each path is for, when nothing serves it here.
_UNSERVED = {
    "/faults": "fault injection is not available here",
    "/recording": "recording is off here: start the proxy with --record DIR --record-ring SIZE",
}
# Produces the /metrics text (default: the registry's).
MetricsSource = Callable[[], Awaitable[bytes]]


class Refused(Exception):
    def __init__(self, status: int, message: str, extra: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra or []


def json_body(body: bytes, empty: Any = None) -> Any:
    """A request's JSON body (``empty`` for one with nothing in it, when
    given); a 400 when it is not JSON, or is nested past what Python reads
    (RecursionError: it was a 500 and a logged traceback)."""
    if empty is not None and not body.strip():
        return empty
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise Refused(400, "the body is not JSON: nested too deep") from None


@dataclass(eq=False)
class _Held:
    """One admin connection inside the cap."""

    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    busy: bool = False  # its whole request is read: it is being answered
    evicted: bool = False  # its place went to a newer connection


class _Gate:
    """At most ``limit`` connections held at once (see the module's docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.idle: dict[_Held, None] = {}  # oldest first
        self.busy = 0
        self.refusing = 0  # connections being answered 503 at the cap
        self.warned = False

    def admit(self) -> _Held | None:
        """A place for a new connection, or None: answer it 503."""
        if len(self.idle) + self.busy >= self.limit:
            self._warn()
            if not self.idle:
                return None
            oldest = next(iter(self.idle))
            del self.idle[oldest]
            oldest.evicted = True
            oldest.scope.cancel()
        elif len(self.idle) + self.busy <= self.limit // 2:
            self.warned = False
        held = _Held()
        self.idle[held] = None
        return held

    def working(self, held: _Held) -> None:
        if held in self.idle:  # not evicted meanwhile
            del self.idle[held]
            held.busy = True
            self.busy += 1

    def leave(self, held: _Held) -> None:
        if held.busy:
            self.busy -= 1
        else:
            self.idle.pop(held, None)

    def _warn(self) -> None:
        if not self.warned:  # once until the endpoint is half free again
            self.warned = True
            log.warning("admin endpoint: %d connections at once, its limit; the oldest idle "
                        "ones (or new ones) are answered 503", self.limit)  # fmt: skip


def _too_many(limit: int) -> str:
    return f"too many admin connections at once (at most {limit}); try again\n"


async def serve_admin(
    listeners: list[trio.SocketListener],
    registry: CollectorRegistry,
    readiness: Readiness,
    handlers: Mapping[str, Handler] | None = None,
    metrics: MetricsSource | None = None,
    max_connections: int = MAX_CONNECTIONS,
    *,
    inbound: ProxyProtocolIn | None = None,
    refused: Callable[[Address, HeaderError], None] | None = None,
) -> None:
    """Serve the endpoint; ``handlers``: by path (e.g. ``/faults``);
    ``max_connections``: connections held at once; ``inbound``: the PROXY
    headers to read first (--proxy-protocol-in), ``refused`` told of each
    bad one."""
    routes = dict(handlers or {})
    gate = _Gate(max_connections)
    busy = _too_many(max_connections).encode()
    retry = [("Retry-After", "1")]

    async def handle(stream: trio.SocketStream) -> None:
        # A place first, the PROXY header after: a connection waiting to
        # show whether it sends one holds a place (the oldest idle one goes
        # to a newer connection), not an uncounted descriptor for the
        # header's whole timeout.
        held = gate.admit()
        try:
            if held is None:
                await refuse(stream)
                return
            with held.scope, trio.move_on_after(TIMEOUT) as limit:
                if inbound is not None:  # a listed source's probe may come without a header
                    try:
                        await inbound.read(stream, peer_address(stream), optional=True)
                    except HeaderError as exc:
                        if refused is not None:
                            refused(peer_address(stream), exc)
                        return
                # A listed balancer's requests name what its clients asked it.
                named = inbound is None or not inbound.trusts(peer_address(stream).host)
                await _respond(stream, registry, readiness, routes, metrics,
                               lambda: gate.working(held), limit, named)  # fmt: skip
            if held.evicted:
                with trio.CancelScope(shield=True) as shielded:
                    shielded.deadline = trio.current_time() + REFUSE_WAIT
                    await _send(stream, 503, busy, extra=retry)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            if held is not None:
                gate.leave(held)
            await trio.aclose_forcefully(stream)

    async def refuse(stream: trio.SocketStream) -> None:
        """503 for a connection over the cap: read its request (briefly), answer."""
        if gate.refusing >= max_connections:
            return  # a flood: closed at once
        gate.refusing += 1
        try:
            with trio.move_on_after(REFUSE_WAIT):
                with contextlib.suppress(Refused):
                    await _read_request(stream)
            with trio.move_on_after(REFUSE_WAIT):
                await _send(stream, 503, busy, extra=retry)
        finally:
            gate.refusing -= 1

    await trio.serve_listeners(handle, listeners)


# The whitespace around a header's value (RFC 9110: spaces and tabs).
_OWS = " \t"


async def _read_request(stream: trio.SocketStream) -> AdminRequest | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        data += chunk
        if len(data) > MAX_HEAD and b"\r\n\r\n" not in data[:MAX_HEAD]:
            raise Refused(400, "request head too large")
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Refused(400, "bad request")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            # HTTP's whitespace alone (RFC 9110 OWS): the head is read as
            # Latin-1, where str.strip() would also take NBSP and NEL, the
            # last bytes of UTF-8 characters such as 'à' (C3 A0).
            headers[name.strip().lower()] = value.strip(_OWS)
    if headers.get("transfer-encoding", "identity").lower() != "identity":
        # Not read here: taken for no body, its fields would be ignored.
        raise Refused(400, "send the body with Content-Length (a chunked body is not read)")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise Refused(400, "bad Content-Length") from None
    if length < 0 or length > MAX_BODY:
        raise Refused(413, f"request body over {MAX_BODY} bytes")
    while len(body) < length:
        chunk = await stream.receive_some(length - len(body))
        if not chunk:
            raise Refused(400, "request body cut short")
        body += chunk
    path, _, query = parts[1].partition("?")
    return AdminRequest(parts[0], path, headers, body[:length], query)


def _check_host(stream: trio.SocketStream, request: AdminRequest) -> None:
    """On loopback, a request must name this server in its ``Host`` (an
    address, or ``localhost``): a page the operator opens elsewhere could
    point its own name here (DNS rebinding) and read every answer that
    needs no token (metrics name topics). Elsewhere any name goes:
    Prometheus and Kubernetes reach the endpoint by a service's name."""
    try:
        local = stream.socket.getsockname()
        loopback = ipaddress.ip_address(local[0]).is_loopback
    except (OSError, ValueError, TypeError, IndexError):  # not an IP socket
        return
    if not loopback:
        return
    host = request.headers.get("host")
    if host is None or not names_this_server(host, local[1], "localhost"):
        raise Refused(
            403,
            "the Host header names another server: on loopback the admin "
            "endpoint answers requests that name it by address or localhost only",
        )


async def _respond(
    stream: trio.SocketStream,
    registry: CollectorRegistry,
    readiness: Readiness,
    routes: Mapping[str, Handler],
    metrics: MetricsSource | None = None,
    received: Callable[[], None] | None = None,
    limit: trio.CancelScope | None = None,
    named: bool = True,
) -> None:
    """Answer one request; ``named``: its ``Host`` must name this server
    when it listens on loopback (not for a listed PROXY-protocol source)."""
    try:
        request = await _read_request(stream)
        if request is None:
            return
        if received is not None:
            received()
        if named:
            _check_host(stream, request)
        for prefix in (*routes, *_UNSERVED):
            if request.target == prefix or request.target.startswith(prefix + "/"):
                handler = routes.get(prefix)
                if handler is None:
                    raise Refused(404, _UNSERVED[prefix])
                own = getattr(handler, "time_limit", 0.0)  # a handler that may take longer
                if limit is not None and own:
                    limit.deadline = max(limit.deadline, trio.current_time() + own)
                try:
                    status, answer = await handler(request)
                except Refused:
                    raise
                except Exception as exc:  # a bug answers 500; it never stops the endpoint
                    target = redact_target(request.target)
                    log.error("admin %s %s failed: %r", request.method, target, exc, exc_info=exc)
                    raise Refused(500, f"internal error: {exc!r}") from None
                await _send(stream, status, json.dumps(answer).encode() + b"\n", _JSON)
                return
    except Refused as refused:
        await _send(stream, refused.status, refused.message.encode() + b"\n", extra=refused.extra)
        return
    method, target = request.method, request.target
    if method not in ("GET", "HEAD"):
        await _send(stream, 405, b"GET or HEAD only\n", extra=[("Allow", "GET, HEAD")])
        return
    body_wanted = method == "GET"
    if target == "/metrics":
        text = await metrics() if metrics is not None else generate_latest(registry)
        await _send(stream, 200, text, CONTENT_TYPE_LATEST, body_wanted=body_wanted)
    elif target == "/healthz":
        await _send(stream, 200, b"ok\n", body_wanted=body_wanted)
    elif target == "/readyz":
        excluded = _excluded(request.query)
        if isinstance(excluded, str):
            await _send(stream, 400, excluded.encode(), body_wanted=body_wanted)
            return
        problems = readiness(excluded)
        if problems:
            await _send(stream, 503, ("; ".join(problems) + "\n").encode(), body_wanted=body_wanted)
        else:
            await _send(stream, 200, b"ready\n", body_wanted=body_wanted)
    else:
        await _send(stream, 404, b"not found: try /metrics, /healthz, /readyz, /faults or "
                    b"/recording/snapshot\n", body_wanted=body_wanted)  # fmt: skip


def _excluded(query: str) -> frozenset[str] | str:
    """The checks ``/readyz?exclude=NAME[&exclude=NAME]`` leaves out, or
    why the query is refused (a name that is no check: a probe with a typo
    must fail at once, not pass for ever)."""
    names = set()
    for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if key != "exclude":
            return f"/readyz takes only exclude=CHECK, not {key!r}\n"
        for name in value.split(","):
            if name not in READINESS_CHECKS:
                known = ", ".join(sorted(READINESS_CHECKS))
                return f"/readyz: no check named {name!r} to exclude (checks: {known})\n"
            names.add(name)
    return frozenset(names)


def fault_id(target: str) -> str | None:
    """The rule id ``/faults/ID`` names (percent-decoded); None for
    ``/faults`` itself (every rule). ``/faults/`` names no rule: refused,
    never taken for every rule."""
    if not target.startswith("/faults/"):
        return None
    rule_id = urllib.parse.unquote(target[len("/faults/") :])
    if not rule_id:
        raise Refused(400, "no rule id after /faults/ (DELETE /faults removes every rule)")
    return rule_id


def rule_path(rule_id: str) -> str:
    """``/faults/ID``, the id percent-encoded (``fault_id`` reads it back)."""
    return "/faults/" + urllib.parse.quote(rule_id, safe="")


@dataclass
class FaultsEndpoint:
    """``/faults`` of one proxy process: its rule set, the protocols rules
    may name, and the token that changing them takes (None: no changes)."""

    faults: Faults
    protocols: Mapping[str, ProtocolFaults]
    token: str | None = None

    async def __call__(self, request: AdminRequest) -> tuple[int, Any]:
        method = request.method
        rule_id = fault_id(request.target)
        rules = self.faults
        if method == "GET" and rule_id is None:
            return 200, {"rules": [rule.to_json() for rule in rules.rules]}
        if method == "GET":
            for rule in rules.rules:
                if rule.id == rule_id:
                    return 200, rule.to_json()
            raise Refused(404, f"no fault rule {rule_id!r}")
        if method not in ("POST", "DELETE") or (method == "POST" and rule_id is not None):
            raise Refused(405, "GET, POST /faults or DELETE /faults[/ID]",
                          [("Allow", "GET, POST, DELETE")])  # fmt: skip
        authorize(request, self.token, "changing fault rules")
        if method == "DELETE":
            if rule_id is None:
                count = rules.clear()
                log.warning("fault injection: all %d rules removed", count)
                return 200, {"deleted": count}
            if not rules.remove(rule_id):
                raise Refused(404, f"no fault rule {rule_id!r}")
            log.warning("fault injection: rule %s removed", rule_id)
            return 200, {"deleted": 1}
        data = json_body(request.body)
        try:
            check_room(len(rules.rules))
            rule = rules.add(parse_rule(data, self.protocols))
        except FaultError as exc:
            raise Refused(400, str(exc)) from None
        log.warning("fault injection: rule %s", rule.describe())
        return 201, {"id": rule.id, "rule": rule.to_json()}


@dataclass
class ConfigEndpoint:
    """``/config``: ``GET`` the configuration generation in force (its
    number, when and how it was loaded); ``POST /config/reload`` (with the
    admin token) reads the settings again and reloads them, answering what
    was put in force, what needs a restart, or why it was refused (400).
    ``current`` and ``reload`` give JSON."""

    current: Callable[[], Any]
    reload: Callable[[], Awaitable[Any]]
    token: str | None = None
    time_limit: float = RELOAD_TIME  # (longer than a request's: see _respond)

    async def __call__(self, request: AdminRequest) -> tuple[int, Any]:
        if request.method == "GET" and request.target in ("/config", "/config/"):
            return 200, self.current()
        if request.target != "/config/reload" or request.method != "POST":
            raise Refused(405, "GET /config or POST /config/reload", [("Allow", "GET, POST")])
        authorize(request, self.token, "reloading the configuration")
        answer = await self.reload()
        return (400 if answer.get("outcome") == "refused" else 200), answer


def authorize(request: AdminRequest, token: str | None, what: str) -> None:
    """Refused unless the request carries the admin token (``what`` needs it).
    An empty or blank token is none: no one may change state with it."""
    if token is None or not token.strip():
        extra = " (or load rules at start with --faults)" if "fault" in what else ""
        raise Refused(
            403, f"{what} needs an admin token: start the proxy with --admin-token-file FILE{extra}"
        )
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not _same_token(value.strip(_OWS), token):
        raise Refused(401, "a valid admin token is needed (Authorization: Bearer TOKEN)",
                       [("WWW-Authenticate", 'Bearer realm="sluice"')])  # fmt: skip


def _same_token(sent: str, token: str) -> bool:
    """Whether ``sent`` (read from the head as Latin-1) is ``token``, in
    constant time: its bytes as sent are the token's UTF-8 (curl, the
    supervisor's calls to its workers) or Latin-1 (Python's http.client,
    ``sluice faults``) bytes."""
    raw = sent.encode("latin-1", "replace")
    same = hmac.compare_digest(raw, token.encode())
    with contextlib.suppress(UnicodeEncodeError):
        same |= hmac.compare_digest(raw, token.encode("latin-1"))
    return same


@dataclass(frozen=True)
class SnapshotRequest:
    last: float | None = None  # seconds back (None: the whole ring)
    reason: str = ""
    name: str = ""  # the capture directory (the supervisor names it for its workers)

    @classmethod
    def parse(cls, body: bytes) -> SnapshotRequest:
        data = json_body(body, empty={})
        if not isinstance(data, dict):
            raise Refused(400, 'the body is a JSON object, e.g. {"last": 30, "reason": "…"}')
        unknown = set(data) - {"last", "reason", "name"}
        if unknown:
            raise Refused(400, f"unknown field(s): {', '.join(sorted(unknown))} "
                               "(known: last, reason, name)")  # fmt: skip
        last = data.get("last")
        if last is not None and (
            isinstance(last, bool)
            or not isinstance(last, int | float)
            or not 0 < last <= MAX_SNAPSHOT_SECONDS
        ):
            raise Refused(400, f"last is a number of seconds, above 0 and at most "
                               f"{MAX_SNAPSHOT_SECONDS}")  # fmt: skip
        reason, name = data.get("reason", ""), data.get("name", "")
        if not isinstance(reason, str) or len(reason) > 200:
            raise Refused(400, "reason is a string of at most 200 characters")
        if _CONTROL.search(reason):  # it is logged as it is
            raise Refused(400, "reason holds a control character (a newline, ...)")
        if not isinstance(name, str) or (name and not _NAME.fullmatch(name)):
            raise Refused(400, "name is a directory name: letters, digits, '.', '_', '-'")
        return cls(None if last is None else float(last), reason, name)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v}


# How far back a snapshot may reach (a ring in seconds is capped lower anyway).
MAX_SNAPSHOT_SECONDS = 7 * 24 * 3600
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,120}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass
class Limited:
    """``handler``, given ``time_limit`` seconds to answer instead of a
    request's TIMEOUT (see _respond)."""

    handler: Handler
    time_limit: float

    async def __call__(self, request: AdminRequest) -> tuple[int, Any]:
        return await self.handler(request)


@dataclass
class SnapshotEndpoint:
    """``POST /recording/snapshot`` of one proxy process: its flight
    recorder's ring written out as a capture (needs the admin token)."""

    recorder: Recorder | None
    token: str | None = None
    time_limit: float = SNAPSHOT_TIME  # (longer than a request's: see _respond)

    async def __call__(self, request: AdminRequest) -> tuple[int, Any]:
        if request.target != "/recording/snapshot":
            raise Refused(404, "try POST /recording/snapshot")
        if request.method != "POST":
            raise Refused(405, "POST /recording/snapshot", [("Allow", "POST")])
        authorize(request, self.token, "taking a snapshot")
        wanted = SnapshotRequest.parse(request.body)
        if self.recorder is None:
            raise Refused(409, _UNSERVED["/recording"])
        try:
            taken = await self.recorder.snapshot(
                last=wanted.last, reason=wanted.reason, name=wanted.name
            )
        except SnapshotError as exc:
            raise Refused(409, str(exc)) from None
        except OSError as exc:
            raise Refused(500, f"the snapshot could not be written: {exc}") from None
        return 201, {"path": str(taken.directory), "file": str(taken.file),
                     "records": taken.records, "bytes": taken.bytes,
                     "seconds": round(taken.seconds, 3)}  # fmt: skip


async def _send(
    stream: trio.SocketStream,
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    *,
    body_wanted: bool = True,
    extra: list[tuple[str, str]] | None = None,
) -> None:
    headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
        # Answers repeat what was asked (a rule id, a path): never taken
        # for another type than the one said, by a browser that sniffs.
        ("X-Content-Type-Options", "nosniff"),
        *(extra or []),
    ]
    head = f"HTTP/1.1 {status} {_REASONS[status]}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers
    )
    await stream.send_all(head.encode("latin-1") + b"\r\n" + (body if body_wanted else b""))
