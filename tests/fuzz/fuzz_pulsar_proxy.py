"""Fuzz harness: the Pulsar proxy core (``PulsarConnection``) in
``--auth-mode proxy``, driven the way the relay drives it.

Input: one byte of options, then operations, each ``[kind u8][length
u16][data]`` (``script`` writes them): client bytes, broker bytes, either
side closing, the upstream's answer to the oldest lookup asked for, a
keepalive tick, a failed dial, a drain. As the relay does, broker bytes
come only after the core asked to open an upstream, nothing is fed after
either side closed, and nothing after the core said to close.

The core is set up as the sidecar example is: it fronts
``pulsar://127.0.0.1:6650``, ``--allow-broker 127.0.0.0/8:6650`` (not
trusted with Sluice's credential), clients authenticate with HS256 tokens,
and Sluice logs in to brokers with a token of its own. Promises checked:

- the core raises nothing, whatever either side sends;
- Sluice's own token goes only to the broker it fronts and to brokers it
  learned from that broker's answers: never to the client, to a broker a
  client named, into a recording (the recorder's real records, payloads
  kept) or into a log line;
- what goes upstream in the client's name names the role the client
  authenticated as (CONNECT), and a lookup carries no principal or
  credentials of the client's choosing;
- what is sent to the client is whole frames.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import tempfile
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sluice.addresses import Address
from sluice.brokers.apache_pulsar import hs256_token
from sluice.protocols.core import (
    Action,
    Ask,
    Close,
    Conn,
    Event,
    OnInvalid,
    OpenUpstream,
    Peer,
    Send,
)
from sluice.protocols.pulsar import Frame, command, decode_frame, decode_stream, encode, pb
from sluice.protocols.pulsar.auth import ProxyAuth, UpstreamAuth
from sluice.protocols.pulsar.connection import (
    PulsarConnection,
    PulsarSettings,
    Routing,
    UpstreamFailure,
)
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.recording.format import PayloadPolicy
from sluice.recording.pulsar import FrameRecorder
from tests.fuzz.common import check

# Operations.
CLIENT, BROKER, CLIENT_EOF, BROKER_EOF, ANSWER, TICK, DIAL_FAILED, DRAIN = range(8)
OP = struct.Struct(">BH")
# Options (the first byte).
FORWARD_AUTH_DATA = 0x01  # --forward-auth-data
FORWARD_INVALID = 0x02  # --on-invalid forward
SMALL_MESSAGES = 0x04  # a 64 KiB max message size

BROKER_URL = "pulsar://127.0.0.1:6650"
ALLOW = ("127.0.0.0/8:6650",)
SECRET = b"sluice-fuzz-secret-0123456789abc"  # 256 bits, as Pulsar requires
CLIENT_ROLE = "app"
CLIENT_TOKEN = hs256_token(SECRET, CLIENT_ROLE)
OWN_ROLE = "sluice-proxy"
OWN_TOKEN = hs256_token(SECRET, OWN_ROLE)
OWN = OWN_TOKEN.encode()
OWN_SIGNATURE = OWN.rsplit(b".", 1)[1]
# Every role a token signed with SECRET names here: what may be a principal.
ROLES = frozenset({CLIENT_ROLE, OWN_ROLE})


def _auth(forward: bool) -> ProxyAuth:
    keys = Path(_KEYS.name)
    return ProxyAuth.load(
        secret_key=keys / "secret.key",
        public_key=None,
        role_claim="sub",
        own_token=keys / "sluice.token",
        tls_roles=False,
        forward_auth_data=forward,
    )


_KEYS = tempfile.TemporaryDirectory(prefix="sluice-fuzz-")
(Path(_KEYS.name) / "secret.key").write_bytes(SECRET)
(Path(_KEYS.name) / "sluice.token").write_text(OWN_TOKEN + "\n")
AUTH = {False: _auth(False), True: _auth(True)}


def client_connect(connect: pb.CommandConnect | None = None, *, proxied: bool) -> bytes:
    """The client's CONNECT (``connect``, or a plain one) with the harness's
    client token; ``proxied``: naming the broker the harness fronts."""
    body = pb.CommandConnect(client_version="fuzz", protocol_version=21)
    if connect is not None:
        body.CopyFrom(connect)
    body.auth_method_name = "token"
    body.auth_data = CLIENT_TOKEN.encode()
    if proxied:
        body.proxy_to_broker_url = str(parse_broker_url(BROKER_URL).address)
    return encode(command(pb.BaseCommand.CONNECT, body))


def script(options: int, ops: list[tuple[int, bytes]]) -> bytes:
    """An input for this harness: ``options``, then each operation."""
    out = bytearray([options])
    for kind, data in ops:
        for start in range(0, max(len(data), 1), 0xFFFF):
            part = data[start : start + 0xFFFF]
            out += OP.pack(kind, len(part)) + part
    return bytes(out)


def operations(data: bytes) -> list[tuple[int, bytes]]:
    ops: list[tuple[int, bytes]] = []
    pos = 1
    while pos + OP.size <= len(data):
        kind, size = OP.unpack_from(data, pos)
        pos += OP.size
        ops.append((kind % 8, data[pos : pos + size]))
        pos += size
    return ops


def leaks(data: bytes) -> bool:
    return OWN in data or OWN_SIGNATURE in data


class Watch:
    """A tap that records as the recorder does and checks the records."""

    def __init__(self) -> None:
        self.recorder = FrameRecorder(PayloadPolicy.FULL)

    def frames(self, conn: Conn, from_client: bool, frames: Any) -> None:
        for frame in frames:
            check(isinstance(frame, Frame), f"a tap was shown {frame!r}")
        records = self.recorder.packed(conn.id, 0 if from_client else 1, 1, 1, list(frames))
        for record in records:
            check(not leaks(record), "Sluice's token went into a recording")

    def event(self, conn: Conn | None, event: Event) -> None:
        pass


class LogWatch(logging.Handler):
    """Fails the run on a log line holding Sluice's token."""

    def emit(self, record: logging.LogRecord) -> None:
        check(not leaks(record.getMessage().encode(errors="replace")), "token logged")


@contextlib.contextmanager
def watching_logs() -> Iterator[None]:
    """Sluice's log lines at INFO and above go to ``LogWatch`` alone meanwhile."""
    log = logging.getLogger("sluice")
    handler = LogWatch(logging.INFO)
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


class Session:
    """One client connection through the core, as the relay drives it."""

    def __init__(self, options: int) -> None:
        self.auth = AUTH[bool(options & FORWARD_AUTH_DATA)]
        on_invalid = OnInvalid.FORWARD if options & FORWARD_INVALID else OnInvalid.REJECT
        size = 64 * 1024 if options & SMALL_MESSAGES else 5 * 1024 * 1024
        self.routing = Routing(parse_broker_url(BROKER_URL), ALLOW, max_lookups=4)
        self.conn = Conn(1, "127.0.0.1:40000", "plain", "pulsar")
        self.core = PulsarConnection(
            self.conn, PulsarSettings(on_invalid, size, 3, self.auth), self.routing, Watch()
        )
        self.upstream: Address | None = None
        self.dialed = False  # the upstream answered the dial: broker bytes may come
        self.client_closed = False
        self.broker_closed = False
        self.asked: deque[int] = deque()  # tokens of lookups not answered yet
        self.now = 0.0
        self.over = False

    def trusted(self, address: Address) -> bool:
        """Brokers Sluice may log in to: its own, and those its answers named."""
        return address == self.routing.broker.address or address in self.routing.routes

    def step(self, kind: int, data: bytes) -> list[Action]:
        """Carry out one operation (if the relay could): the core's actions."""
        core = self.core
        self.now += 0.25
        actions: list[Action]
        if kind == CLIENT and data and not self.client_closed:
            actions = core.receive_client(data, self.now)
        elif kind == CLIENT_EOF and not self.client_closed:
            self.client_closed = True
            actions = core.receive_client(b"", self.now)
        elif kind in (BROKER, BROKER_EOF) and self.upstream is not None and not self.broker_closed:
            actions = []
            if not self.dialed:
                self.dialed = True
                actions += core.upstream_ready(self.now)
            if kind == BROKER_EOF:
                self.broker_closed = True
                actions += core.receive_broker(b"", self.now)
            elif data:
                actions += core.receive_broker(data, self.now)
        elif kind == ANSWER and self.asked:
            actions = core.answered(self.asked.popleft(), answer(data), self.now)
        elif kind == TICK:
            self.now += int.from_bytes(data[:4], "big") if data else 10.0
            actions = core.keepalive(self.now, 10.0)
        elif kind == DIAL_FAILED and core.upstream_pending:
            actions = core.upstream_failed("cannot reach the broker (fuzz)", self.now)
            self.broker_closed = True
        elif kind == DRAIN:
            actions = core.drain()
        else:
            return []
        self.watch(actions)
        return actions

    def watch(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self.sent(action)
            elif isinstance(action, OpenUpstream):
                self.opened(action)
            elif isinstance(action, Ask):
                self.lookup(action)
            elif isinstance(action, Close):
                self.over = True
                return

    def sent(self, action: Send) -> None:
        if action.to is Peer.CLIENT:
            check(not leaks(action.data), "Sluice's token was sent to the client")
            decode_stream(action.data, 1 << 30)  # whole frames, or it raises
            return
        check(self.upstream is not None, "bytes for a broker before one was opened")
        if leaks(action.data):
            assert self.upstream is not None
            check(self.trusted(self.upstream), f"Sluice's token was sent to {self.upstream}")

    def opened(self, action: OpenUpstream) -> None:
        check(self.upstream is None, "a second upstream opened")
        self.upstream = action.address
        if leaks(action.hello):
            check(self.trusted(action.address), f"Sluice's token was sent to {action.address}")
        (hello,) = decode_stream(action.hello, 1 << 30)
        check(hello.name == "CONNECT" and hello.ok, f"the upstream was greeted with {hello!r}")
        connect = hello.body
        check(connect.auth_data == OWN, "the upstream CONNECT is not Sluice's login")
        principal = connect.original_principal
        check(principal in ROLES, f"upstream CONNECT names principal {principal!r}")

    def lookup(self, action: Ask) -> None:
        type_, body, credentials = action.request
        check(isinstance(credentials, UpstreamAuth), f"a lookup goes with {credentials!r}")
        assert isinstance(credentials, UpstreamAuth)
        if leaks(credentials.data):
            check(self.trusted(action.address), f"Sluice's token was sent to {action.address}")
        check(credentials.original_principal in ROLES, "a lookup names an unknown principal")
        fields = {
            "original_principal": credentials.original_principal,
            "original_auth_method": credentials.original_method,
            "original_auth_data": credentials.original_data,
        }
        for name, allowed in fields.items():
            if name in body.DESCRIPTOR.fields_by_name and body.HasField(name):
                value = getattr(body, name)
                check(value == allowed, f"a {pb.BaseCommand.Type.Name(type_)} carries the "
                                        f"client's own {name}")  # fmt: skip
        self.asked.append(action.token)

    def end(self) -> None:
        self.core.closed("fuzz")


# Frames the upstream pool answers itself and never hands on.
_POOL_KEEPS = frozenset({pb.BaseCommand.PING, pb.BaseCommand.AUTH_CHALLENGE})


def answer(data: bytes) -> Frame | UpstreamFailure:
    """What the upstream pool hands back: a frame carrying a request_id (the
    pool matches answers by it), or why there was none."""
    if not data:
        return UpstreamFailure("the broker did not answer (fuzz)")
    frame = decode_frame(len(data).to_bytes(4, "big") + data)
    body = frame.body
    rid = getattr(body, "request_id", None) if body is not None else None
    if not isinstance(rid, int) or frame.type in _POOL_KEEPS:
        return UpstreamFailure("the broker did not answer (fuzz)")
    return frame


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    with watching_logs():
        session = Session(data[0])
        try:
            for kind, chunk in operations(data):
                session.step(kind, chunk)
                if session.over:
                    break
        finally:
            session.end()
