"""One Pulsar client connection through the proxy, sans-I/O.

``PulsarConnection`` takes the bytes of a client connection (and of the
broker connection it may be relayed to) and returns actions for the proxy to
carry out. It is the whole of Pulsar's proxy behaviour:

- The handshake. CONNECT with ``proxy_to_broker_url`` is a *proxied*
  connection: the named broker is checked against the allow-list, dialled,
  and sent the client's CONNECT (credentials included, auth challenges
  relayed both ways) before frames are relayed. CONNECT without it is a
  *lookup* connection, answered by Sluice itself.
- Lookup connections: discovery requests (LOOKUP, PARTITIONED_METADATA,
  GET_TOPICS_OF_NAMESPACE, GET_SCHEMA) go to the upstream broker over the
  proxy's shared connections (``Ask``); Redirect answers are followed here,
  and a Connect answer is rewritten so that the client comes back through
  Sluice: ``proxy_through_service_url=true``, both broker URLs set,
  ``authoritative=true``. Brokers named this way are learned into the
  allow-list, since the client will ask for them next.
- Sluice's own credential (``--auth-mode proxy``) goes only to brokers the
  upstream named (learned) or that ``--trust-broker`` names: a client with
  any valid token may name any allowed address in ``proxy_to_broker_url``,
  and one it controls must not collect the credential that acts as every
  role. Lookups carry the client's verified role, never its own
  ``original_*`` fields.
- Proxied connections: every frame both ways is framed, validated (CRC32-C
  included), counted by the taps, correlated, and forwarded as its original
  bytes; an invalid frame from a client is answered as the broker would
  (``OnInvalid.REJECT``) or passed on (``FORWARD``). Brokers named in
  CLOSE_PRODUCER / CLOSE_CONSUMER / TOPIC_MIGRATED are learned too.
- Keepalive of lookup connections and the graceful drain (which producers
  and consumers to close, whether sends are still in flight).
- Fault injection: when the proxy's ``Faults`` hold rules, every frame
  either way (and every frame Sluice writes itself) is checked against them
  and the rule that fires is carried out on the frame (see
  ``sluice.protocols.faults``). With no rules this costs one check per read.
"""

from __future__ import annotations

import collections
import enum
import functools
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from google.protobuf import text_format

from sluice import __version__
from sluice.addresses import Address, AllowList
from sluice.errors import ConfigError
from sluice.logs import LogLimit, clipped
from sluice.protocols.core import (
    Action,
    Answered,
    AnsweredMany,
    Ask,
    Authenticated,
    Close,
    Closed,
    Conn,
    Dialed,
    FaultInjected,
    Invalid,
    LookupDone,
    OnInvalid,
    Opened,
    OpenUpstream,
    Peer,
    QuickStep,
    Rejected,
    Send,
    Tap,
    TopicTraffic,
    held_back,
    resumed_in_step,
)
from sluice.protocols.faults import FaultAction, Faults, Pacer, Rule
from sluice.protocols.filtering import DELIVER, PRODUCE, Chain, Direction, Filtering
from sluice.protocols.oidc import KeysNeeded
from sluice.protocols.pulsar import pulsar_api_pb2 as pb
from sluice.protocols.pulsar.auth import (
    FAILED,
    REFRESH,
    AuthError,
    Identity,
    ProxyAuth,
    UpstreamAuth,
)
from sluice.protocols.pulsar.correlation import (
    CLIENT_TYPES,
    SERVER_TYPES,
    Completion,
    Correlator,
    Times,
    Traffic,
    add_time,
    add_traffic,
    answer_error,
)
from sluice.protocols.pulsar.decoder import CLOSED, COMPILED, FrameDecoder, ScannedBatch
from sluice.protocols.pulsar.encoder import command, corrupted, encode, error_reply, own_frame
from sluice.protocols.pulsar.errors import Problem, RemoteProtocolError
from sluice.protocols.pulsar.features import lookup_flags
from sluice.protocols.pulsar.filtering import FilterGate, Wait, schema_of
from sluice.protocols.pulsar.frame import Frame, command_name, text
from sluice.protocols.pulsar.redact import loggable
from sluice.protocols.pulsar.spec import PULSAR_FAULTS
from sluice.protocols.pulsar.urls import BrokerUrl, parse_broker_url

log = logging.getLogger("sluice.pulsar")

PROTOCOL_VERSION = max(pb.ProtocolVersion.values())
SLUICE_VERSION = f"Sluice/{__version__}"
# Brokers answer a failed CONNECT with request_id -1.
NO_REQUEST = 2**64 - 1

T = pb.BaseCommand
# Bytes a client may send while one of its SENDs waits for a schema.
_MAX_HELD = 64 * 1024 * 1024
# Bytes a client may send past its CONNECT before the handshake is done
# (the broker's CONNECTED, an issuer's keys): clients wait for CONNECTED.
_MAX_EARLY = 64 * 1024 * 1024
_NAMED = frozenset({T.PRODUCER, T.SUBSCRIBE})
# What the filters' gate reads of a topic's schema being registered: the
# client's ask (a PRODUCER or SUBSCRIBE names its topic too), the broker's answer.
_REGISTERS = _NAMED | {T.GET_OR_CREATE_SCHEMA}
_REGISTERED = frozenset({T.PRODUCER_SUCCESS, T.GET_OR_CREATE_SCHEMA_RESPONSE})
_FORWARDED = frozenset({T.LOOKUP, T.PARTITIONED_METADATA, T.GET_TOPICS_OF_NAMESPACE, T.GET_SCHEMA})
_NAMES_BROKERS = frozenset(
    {T.CLOSE_PRODUCER, T.CLOSE_CONSUMER, T.TOPIC_MIGRATED, T.LOOKUP_RESPONSE}
)
LookupResponse = pb.CommandLookupTopicResponse


class UpstreamFailure(Exception):
    """A broker could not be reached, refused us, or went away; ``error`` is
    the ServerError the client is told."""

    def __init__(self, message: str, error: int = pb.ServiceNotReady) -> None:
        super().__init__(message)
        self.message = message
        self.error = error


@dataclass(frozen=True)
class Route:
    """How to reach a broker a lookup answer named."""

    tls: bool  # its URL was pulsar+ssl://
    via_upstream: bool  # the upstream is itself a proxy and asked to be used


# The most verified identities whose lookup credentials are kept (see
# ``Routing.upstream_auth``); past it the oldest is forgotten.
MAX_IDENTITIES = 4_096


# A learned broker no answer has named for this long, to which no
# connection is open, is forgotten (``Routing.expire``). An hour: brokers in
# use are named far more often (every lookup, every reconnect of every
# client: the official clients look a topic up again before they
# reconnect) or kept by their open connections, so forgetting one costs at
# most a lookup that learns it again; and an address a broker left (a
# Kubernetes pod replaced) stops being one Sluice dials for clients within
# the hour.
FORGET_AFTER = 3600.0
# How often, at most, learned brokers are looked over (on the cores' clock).
SWEEP_EVERY = 60.0


def _keep_none(address: Address) -> bool:
    return False


def _key(address: Address) -> Address:
    """A learned broker's address as the allow-list keeps it."""
    return Address(address.host.lower(), address.port)


class Routing:
    """What every connection of one proxy shares: the broker it fronts, the
    allow-list with the brokers learned from answers, the lookup limit, and
    which warnings were logged lately.

    Learned brokers are forgotten (``expire``) when no answer has named
    them for ``forget_after`` seconds and no connection to them is open
    (``hold``, ``release``); the configured broker, one ``--trust-broker``
    admits and one ``keep`` says to keep never are. What was forgotten is
    queued in ``forgotten`` for the backend (a listener of Sluice's that
    stands for it, port-per-broker, is closed)."""

    def __init__(
        self, broker: BrokerUrl, allow_rules: tuple[str, ...] = (), max_lookups: int = 1_000
    ) -> None:
        self.broker = broker
        self.allowlist = AllowList(allow_rules)
        self.allowlist.learn(broker.address)
        self.routes: dict[Address, Route] = {}
        self.max_lookups = max_lookups
        self.lookups = 0
        self.warned = LogLimit()
        # The configured broker refused Sluice's own CONNECT, which carries no
        # credential, with AuthenticationError: it authenticates its clients
        # (learned by the backend's probe).
        self.broker_authenticates = False
        self._lookup_auth: dict[tuple[object, ...], UpstreamAuth] = {}
        # --sni-route: TLS server names that stand for a broker, as configured.
        self.named: dict[str, BrokerUrl] = {}
        # Forgetting learned brokers (``expire``).
        self.forget_after = FORGET_AFTER
        self.keep: Callable[[Address], bool] = _keep_none  # the backend's say
        self.forgotten: list[Address] = []  # for the backend to take
        self._open: collections.Counter[Address] = collections.Counter()
        self._next_sweep: float | None = None
        # When each learned broker was last learned afresh (``seen``): with
        # workers, what tells the others it is still named.
        self._told: dict[Address, float] = {}
        # Brokers taken in from other workers (``heard``) and not yet seen
        # named here: the first answer naming one here tells the others.
        self._heard: set[Address] = set()

    def refresh(self) -> None:
        """Take in brokers learned elsewhere (``SharedRouting``: by other
        workers); one process has nothing to take in."""

    def knows(self, address: Address) -> bool:
        """Whether the upstream itself named ``address`` (or it is the
        configured broker): one Sluice may log in to as itself."""
        if self.allowlist.knows(address):
            return True
        self.refresh()
        return self.allowlist.knows(address)

    def upstream_auth(self, auth: ProxyAuth, client: Identity) -> UpstreamAuth:
        """Proxy mode: what lookups for ``client`` go upstream with, one value
        per verified identity (Sluice's credential, the role, the method, and
        with ``--forward-auth-data`` the token's expiry), so that the shared
        connections are kept per identity and not per spelling of a token
        (whitespace, a ``token:`` prefix, base64 variants all verify alike)."""
        fresh = auth.upstream(client)
        expires = client.expires if fresh.original_data is not None else None
        key = (fresh.method, fresh.data, client.role, client.method, expires)
        kept = self._lookup_auth.get(key)
        if kept is None:
            if len(self._lookup_auth) >= MAX_IDENTITIES:
                del self._lookup_auth[next(iter(self._lookup_auth))]
            kept = self._lookup_auth[key] = fresh
        return kept

    def route(self, address: Address) -> Route | None:
        """How to reach a broker the upstream named (None: none did), what
        other workers learned taken in first when it is not known here (a
        lookup one answered, the CONNECT on another: its TLS, or going
        through the upstream, was lost on that first CONNECT)."""
        route = self.routes.get(address)
        if route is None and address != self.broker.address:
            self.refresh()
            route = self.routes.get(address)
        return route

    def learn(self, url: BrokerUrl, *, via_upstream: bool = False) -> None:
        """A broker the upstream named: allow it, and remember how to reach it."""
        self.allowlist.learn(url.address)
        self.routes[url.address] = Route(url.tls, via_upstream)

    def seen(self, address: Address, now: float) -> None:
        """An answer named ``address`` (learned already) at ``now``: it is
        not forgotten for ``forget_after`` from now. Every half of that, it
        is learned afresh, which a routing shared by workers
        (``SharedRouting``) tells the others, so none of them forgets a
        broker another still sees named."""
        key = _key(address)
        if not self.allowlist.knows(key):
            return
        told = self._told.get(key)
        if told is None and key not in self._heard:  # learned here: told already
            self._told[key] = now
        elif told is None or now - told >= self.forget_after / 2:
            # Another worker learned it (and forgets it an hour after that,
            # whatever this one sees, unless told): told now.
            self._heard.discard(key)
            self._told[key] = now
            for spelled, route in list(self.routes.items()):
                if _key(spelled) == key:
                    del self.routes[spelled]
                    url = BrokerUrl(spelled.host, spelled.port, route.tls)
                    self.learn(url, via_upstream=route.via_upstream)
        # What this learning wrote (and others) read now, not taken as
        # named when it is read later.
        self.refresh()
        self.allowlist.learn(key, now)

    def heard(self, address: Address) -> None:
        """``address`` was learned by another worker (``SharedRouting``)."""
        key = _key(address)
        if key not in self._told:
            self._heard.add(key)

    def hold(self, address: Address) -> None:
        """A connection to ``address`` is open: it is not forgotten."""
        self._open[_key(address)] += 1

    def release(self, address: Address) -> None:
        """A connection ``hold`` counted is closed."""
        key = _key(address)
        self._open[key] -= 1
        if self._open[key] <= 0:
            del self._open[key]

    def expire(self, now: float, trusted: AllowList | None = None) -> list[Address]:
        """Forget the learned brokers no answer has named for
        ``forget_after`` (on the cores' clock), to which no connection is
        open, that neither ``trusted`` (--trust-broker) admits nor ``keep``
        keeps: no longer allowed, nor routed; each is logged and queued in
        ``forgotten``. Looked over every ``SWEEP_EVERY`` at most (what
        other workers named is taken in first); what was forgotten now."""
        if self._next_sweep is not None and now < self._next_sweep:
            return []
        self._next_sweep = now + min(SWEEP_EVERY, self.forget_after / 4)
        self.refresh()
        configured = _key(self.broker.address)
        gone: list[Address] = []
        for address in self.allowlist.stale(now - self.forget_after, now):
            if address == configured or self._open.get(address):
                continue
            if (trusted is not None and trusted.allows(address)) or self.keep(address):
                continue
            self.forget(address)
            gone.append(address)
            log.info("broker %s forgotten: no answer named it for %gs and no connection to "
                     "it is open (a lookup that names it learns it again)", address,
                     self.forget_after)  # fmt: skip
        self.forgotten.extend(gone)
        return gone

    def forget(self, address: Address) -> None:
        """``address`` is no longer a learned broker: not allowed (unless a
        rule admits it), nor routed."""
        key = _key(address)
        self.allowlist.forget(key)
        self._told.pop(key, None)
        self._heard.discard(key)
        for spelled in [a for a in self.routes if _key(a) == key]:
            del self.routes[spelled]

    def route_name(self, name: str) -> Address | None:
        """SNI routing: the broker a TLS server name (lower-case) stands for:
        the one ``named`` (--sni-route) gives, else the configured broker or
        one the upstream named by that host (its TLS address first), as long
        as the allow-list admits it, as it must admit ``proxy_to_broker_url``.
        None: no broker goes by that name."""
        url = self.named.get(name)
        if url is not None:
            return url.address
        for look in range(2):
            known = [self.broker.address, *self.routes]
            found = [a for a in known if a.host.lower().removesuffix(".") == name]
            if found or look:
                break
            self.refresh()  # another worker may have learned it
        found.sort(key=lambda a: not self.tls_of(a))
        for address in found:
            if self.allowlist.allows(address):
                return address
        return None

    def tls_of(self, address: Address) -> bool:
        """Whether the broker at ``address`` is dialled with TLS: as its
        --sni-route URL, or the answer that named it, says."""
        for url in self.named.values():
            if url.address == address:
                return url.tls
        route = self.route(address)
        if route is not None:
            return route.tls
        return self.broker.tls

    def start_lookup(self) -> bool:
        if self.lookups >= self.max_lookups:
            return False
        self.lookups += 1
        return True

    def end_lookup(self) -> None:
        self.lookups -= 1


@dataclass
class PulsarSettings:
    """The proxy settings a Pulsar connection core acts on: one value the
    proxy's cores share, changed in place by a configuration reload (every
    core reads it when it acts)."""

    on_invalid: OnInvalid
    max_message_size: int
    max_redirects: int
    # --auth-mode proxy: Sluice authenticates clients (None: passthrough).
    auth: ProxyAuth | None = None
    # --trust-broker: brokers Sluice's own credential may go to though the
    # upstream never named them (learned brokers always may).
    trusted: AllowList = field(default_factory=AllowList)
    # --proxy-protocol-out: brokers get a PROXY header first (said when one hangs up).
    proxy_header_out: bool = False
    # --filter: the message filters of this process (None: none configured).
    filtering: Filtering | None = None


class State(enum.Enum):
    HANDSHAKE = "waiting for CONNECT"
    CONNECTING = "connecting to the broker"
    RELAY = "relaying"
    LOOKUP = "serving lookups"
    CLOSED = "closed"


@dataclass
class _Pending:
    """A discovery request forwarded upstream on a lookup connection."""

    frame: Frame
    body: Any  # our copy, sent with our request ids
    client_rid: int
    started: float
    asked: float
    hops: int = 0
    upstream: float = 0.0


# The auth method of a client that logs in with its TLS certificate.
TLS_AUTH = "tls"
# Why such a client is refused in passthrough mode (a rejection reason),
# and what it is told.
TLS_PASSTHROUGH = "tls_passthrough"
CERTIFICATE_NOT_PASSED = (
    "Sluice: authentication by TLS client certificate (auth method tls) cannot pass through a "
    "proxy that ends the TLS session, as Sluice does: the broker never sees the certificate. "
    "Run Sluice with --auth-mode proxy --tls-client-ca CA_FILE: Sluice then checks the "
    "certificate and names its common name to the broker as the client's role (Sluice's own "
    "role must be one of the broker's proxyRoles)"
)


def connect_error(error: int, message: str) -> Frame:
    return own_frame(
        T.ERROR,
        pb.CommandError(request_id=NO_REQUEST, error=error, message=message),  # type: ignore[arg-type]
    )


class PulsarConnection:
    protocol = "pulsar"

    def __init__(
        self,
        conn: Conn,
        settings: PulsarSettings,
        routing: Routing,
        tap: Tap,
        faults: Faults | None = None,
        routed: Address | None = None,
    ) -> None:
        self.conn = conn
        # SNI routing: the broker the client's TLS server name chose. Its
        # CONNECT, naming no proxy_to_broker_url, is relayed there as it is
        # to a broker behind a TLS proxy (Pulsar's ProxyProtocol.SNI).
        self._routed = routed
        self.faults = faults if faults is not None else Faults()
        self._pacer = Pacer(self.faults)
        self._now = 0.0  # the clock of the latest input, for frames of our own
        # What lookups go upstream with: the client's credentials, or in
        # proxy mode Sluice's naming the client's role.
        self._credentials: UpstreamAuth | None = None
        # Proxy mode: who the client is, when its credentials expire (on the
        # core's clock), and when Sluice asked it to refresh them.
        self._identity: Identity | None = None
        self._expires_at: float | None = None
        self._refresh_asked: float | None = None
        # --forward-auth-data on a relayed connection: the client's token the
        # broker holds (its original_auth_data, which a broker that checks it
        # refreshes), and whether the broker asked for a fresh one and waits.
        self._broker_holds: bytes | None = None
        self._broker_waits = False
        self.settings = settings
        self.routing = routing
        self.tap = tap
        self.correlator = Correlator()
        conn.state = self.correlator
        self.state = State.HANDSHAKE
        self._client = FrameDecoder(settings.max_message_size)
        self._broker = FrameDecoder(settings.max_message_size)
        self._reject = settings.on_invalid is OnInvalid.REJECT
        self._trace = log.isEnabledFor(logging.DEBUG)
        # Commands a lookup connection ignored: each is logged once at INFO
        # (a client repeating one cannot fill the log), again only at DEBUG.
        self._ignored: set[int] = set()
        self.last_heard = 0.0
        self._pinged = -1.0
        self._dial_started = 0.0
        self._challenged = False
        self._asks: dict[int, _Pending] = {}
        self._tokens = itertools.count(1)
        # --auth-oidc-issuers: what to do again once an issuer's keys are
        # fetched (by the token of the Ask that fetches them); while the
        # CONNECT waits, the client's next frames wait too.
        self._key_asks: dict[int, Any] = {}
        self._connect_waits = False
        self._keys_fetched = False  # while checking again after a fetch
        # The compiled step that carries whole reads once relaying (quick()).
        self._step: QuickStep | None = None
        self._step_generation = 0  # the taps' generation the step was built for
        # Message filters (--filter): what this connection's producers and
        # consumers go through; the broker it relays to (which answers the
        # schema questions), the SEND waiting for its topic's schema.
        self._gate = (
            FilterGate(
                settings.filtering, conn, tap, settings.max_message_size, self.correlator.sends
            )
            if settings.filtering is not None
            else None
        )
        self._upstream: Address | None = None
        # Whether that broker is one the upstream named (or configured: the
        # broker, an --sni-route): only such a broker's answers teach Sluice
        # brokers. One a client chose, that only --allow-broker admits,
        # could otherwise widen the allow-list to any host and port.
        self._upstream_named = False
        # The broker this connection keeps from being forgotten (``_dial``).
        self._holding: Address | None = None
        self._held: Frame | None = None
        self._schema_asks: dict[int, Wait] = {}

    @property
    def established(self) -> bool:
        """Past the handshake: relaying, or serving lookups."""
        return self.state in (State.RELAY, State.LOOKUP)

    @property
    def upstream_pending(self) -> bool:
        return self.state is State.CONNECTING

    @property
    def in_flight_sends(self) -> int:
        return self.correlator.in_flight_sends

    # --- input -------------------------------------------------------------------

    def receive_client(self, data: bytes, now: float) -> list[Action]:
        """Bytes from the client; ``b""`` when it closed its side."""
        self._now = now
        state = self.state
        if state is State.RELAY:
            return self._relay(True, data, now)
        if state is State.CLOSED:
            return []
        self._client.receive_data(data)
        if self._client.buffered > _MAX_EARLY and (
            state is State.CONNECTING or self._connect_waits
        ):
            return self._too_early(now)
        try:
            if state is State.HANDSHAKE:
                return [] if self._connect_waits else self._handshake(now)
            if state is State.LOOKUP:
                return self._lookups(now)
            return self._while_connecting(now, client_closed=not data)
        except RemoteProtocolError as exc:
            return self._unframeable(True, exc)

    def receive_broker(self, data: bytes, now: float) -> list[Action]:
        """Bytes from the broker a proxied connection was relayed to."""
        self._now = now
        if self.state is State.RELAY:
            return self._relay(False, data, now)
        if self.state is not State.CONNECTING:
            return []
        self._broker.receive_data(data)
        try:
            return self._broker_handshake(now, closed=not data)
        except RemoteProtocolError as exc:
            return self.upstream_failed(f"broker broke off the handshake: {exc}", now)

    def upstream_failed(self, message: str, now: float) -> list[Action]:
        """The broker of a proxied connection could not be reached or handshaken."""
        log.warning("%s: %s", self.conn.name, message)
        self.tap.event(self.conn, Dialed(None))
        return [
            *self._own(connect_error(pb.ServiceNotReady, message)),
            self._close("upstream"),
        ]

    def upstream_ready(self, now: float) -> list[Action]:
        """Dialled: the broker's CONNECTED (``receive_broker``) says the rest."""
        return []

    def answered(self, token: int, answer: Frame | UpstreamFailure, now: float) -> list[Action]:
        """The upstream's answer to an ``Ask`` (or why there is none)."""
        self._now = now
        retry = self._key_asks.pop(token, None)
        if retry is not None:  # an issuer's keys fetched (or not): check again, once
            self._connect_waits = False
            if self.state is State.CLOSED:
                return []
            self._keys_fetched = True
            try:
                actions: list[Action] = retry(now)
            finally:
                self._keys_fetched = False
            return actions
        wait = self._schema_asks.pop(token, None)
        if wait is not None:
            return self._schema_answered(wait, answer, now)
        pending = self._asks.pop(token, None)
        if pending is None:
            return []
        if self.state is State.CLOSED:  # nobody to tell; the slot goes back
            self.routing.end_lookup()
            return []
        pending.upstream += now - pending.asked
        if isinstance(answer, UpstreamFailure):
            return self._lookup_failed(pending, answer, now)
        if answer.error is not None:  # answered, but not with anything to pass on
            failure = UpstreamFailure(
                f"upstream answered {pending.frame.name} with an invalid {answer.name}: "
                f"{answer.error.message}",
                pb.ServiceNotReady,
            )
            return self._lookup_failed(pending, failure, now)
        if pending.frame.type != T.LOOKUP:
            reply = _with_request_id(answer, pending.client_rid)
            return self._finish(pending, reply, answer_error(answer.type, answer.body), now)
        try:
            return self._lookup_answer(token, pending, answer, now)
        except UpstreamFailure as failure:
            return self._lookup_failed(pending, failure, now)

    keeps_alive = True  # pings idle lookup clients, refreshes credentials

    def keepalive(self, now: float, interval: float) -> list[Action]:
        """Called every ``interval`` seconds: ping an idle lookup client, or
        hang up on one that stopped answering. Proxied connections are kept
        alive by their own ends."""
        self._now = now
        if self._expires_at is not None and self.state in (State.LOOKUP, State.RELAY):
            refresh = self._refresh(now, interval)
            if refresh:
                return refresh
        if self.state is not State.LOOKUP:
            return []
        idle = now - self.last_heard
        if idle >= 2 * interval:
            return [self._close("idle", f"client silent for {idle:.0f}s, closing")]
        if idle >= interval and self._pinged <= self.last_heard:
            self._pinged = now  # one ping per silence
            return self._own(own_frame(T.PING))
        return []

    def drain(self) -> list[Action]:
        """Close the client's producers and consumers the way a broker
        unloading a topic does, so that it reconnects elsewhere. Call once
        sends in flight have their receipts (``in_flight_sends``)."""
        out: list[Action] = []
        for pid in self.correlator.producers:
            producer = pb.CommandCloseProducer(producer_id=pid, request_id=NO_REQUEST)
            out += self._own(own_frame(T.CLOSE_PRODUCER, producer))
        for cid in self.correlator.consumers:
            consumer = pb.CommandCloseConsumer(consumer_id=cid, request_id=NO_REQUEST)
            out += self._own(own_frame(T.CLOSE_CONSUMER, consumer))
        return out

    def quick(self, from_client: bool) -> QuickStep | None:
        """The compiled step that may carry the next read of a direction
        (rust/src/step.rs): relaying, with no fault rule or trace to apply,
        nothing of a frame buffered on that side, and the metrics the only
        tap. None: the read comes through ``receive_client`` or
        ``receive_broker``. The step itself gives back any read that is not
        frames the scanner took, every one of them, and the start of one;
        the start of a frame it held from the read before is taken into the
        decoder by the next read that comes the usual way."""
        step = self._step
        renew = self._step_generation != getattr(self.tap, "generation", 0)
        if renew and self.state is State.RELAY:
            step = self._renewed_step(step)
        if step is None or self.faults.rules or self._trace:
            return None
        if self._gate is not None and self._gate.wants(
            from_client, self.correlator.producers, self.correlator.consumers, compiled=True
        ):
            return None
        decoder = self._client if from_client else self._broker
        return step if resumed_in_step(step, decoder, from_client) else None

    def _filtered(self, from_client: bool) -> bool:
        """Whether this side's reads go through the message filters."""
        assert self._gate is not None
        correlator = self.correlator
        return self._gate.wants(from_client, correlator.producers, correlator.consumers)

    def _opens_filtered(self, from_client: bool) -> bool:
        """After a client's PRODUCER in a read that was not filtered: whether
        the rest of the read now is."""
        return from_client and self._gate is not None and self._filtered(True)

    def _renewed_step(self, old: QuickStep | None) -> QuickStep | None:
        """The taps changed (a live view began or ended): a step built for
        them, the start of a frame the old one held taken into the decoders."""
        if old is not None:
            held_back(old, self._client, True)
            held_back(old, self._broker, False)
        self._step = self._compiled_step()
        return self._step

    def _compiled_step(self) -> QuickStep | None:
        self._step_generation = getattr(self.tap, "generation", 0)
        quick = getattr(self.tap, "quick", None)
        taps = quick(self.conn) if quick is not None else None
        sends = self.correlator.sends
        if COMPILED is None or taps is None or not isinstance(sends, COMPILED.send_table):
            return None
        figures, records = taps
        record, payloads = records if records is not None else (None, 0)
        sealing = self._gate.sealing if self._gate is not None else None
        step: QuickStep = COMPILED.step(
            sends, self.correlator.producers, self.correlator.consumers, figures,
            self._client.max_total, "SEND", record, payloads, self.conn.id, time.monotonic_ns(),
            sealing,
        )  # fmt: skip
        return step

    def closed(self, reason: str) -> None:
        """The proxy hung up (for whatever reason): release what we hold."""
        self._step = None
        if self.state is not State.CLOSED:
            self.state = State.CLOSED
        for _ in self._asks:
            self.routing.end_lookup()
        self._asks.clear()
        self._key_asks.clear()
        if self._holding is not None:
            self.routing.release(self._holding)
            self._holding = None
        self.tap.event(self.conn, Closed(reason))

    # --- handshake ---------------------------------------------------------------

    def _handshake(self, now: float) -> list[Action]:
        first = self._client.next_event()
        if not isinstance(first, Frame):
            return [self._close("closed")] if first is CLOSED else []
        body = first.body
        relayed = (
            first.type == T.CONNECT and body is not None and body.HasField("proxy_to_broker_url")
        )
        routed = self._routed if not relayed else None
        # A text field that is not UTF-8 comes out of protobuf as bytes.
        garbled = _not_text(body) if first.type == T.CONNECT and body is not None else None
        if first.type != T.CONNECT or first.error is not None or garbled:
            self.conn.kind = "invalid"
        else:
            self.conn.kind = "proxied" if relayed or routed else "lookup"
        if relayed and not garbled:
            self.conn.broker = body.proxy_to_broker_url
        else:
            self.conn.broker = str(routed) if routed is not None else str(self.routing.broker)
        self.tap.event(self.conn, Opened())
        self.tap.frames(self.conn, True, (first,))
        if first.type != T.CONNECT or first.error is not None or garbled:
            if first.error:
                why = first.error.message
            elif garbled:
                why = f"CONNECT {garbled} is not UTF-8"
            else:
                why = f"expected CONNECT, got {first.name}"
            self.tap.event(self.conn, Rejected("handshake"))
            level = self.routing.warned.level(("handshake", why), now)
            return [
                *self._own(connect_error(pb.NotAllowedError, why)),
                self._close("handshake", f"bad handshake: {why}", level),
            ]
        return self._admit(first, relayed, routed, now)

    def _admit(
        self, first: Frame, relayed: bool, routed: Address | None, now: float
    ) -> list[Action]:
        """A valid CONNECT: the client authenticated (proxy mode), then
        relayed, dialled or served lookups."""
        body = first.body
        # Learned brokers no answer named lately are forgotten before this
        # client may name one.
        self.routing.expire(now, self.settings.trusted)
        auth = self.settings.auth
        if auth is not None:
            try:
                refused = self._authenticate(
                    auth, body.auth_method_name, bytes(body.auth_data), now
                )
            except KeysNeeded as needed:
                self._connect_waits = True
                return self._fetch_keys(
                    needed, functools.partial(self._admit, first, relayed, routed)
                )
            if refused is not None:
                return refused
        elif body.auth_method_name == TLS_AUTH and self.routing.broker_authenticates:
            return self._refuse_certificate(now)
        if relayed:
            return self._open_relay(body, now)
        if routed is not None:
            return self._dial(body, routed, self.routing.tls_of(routed), now, named=True)
        self.state = State.LOOKUP
        self.last_heard = now
        # Lookups go upstream with the client's own credentials: a broker
        # that authenticates every connection answers them as it would the
        # client (the proxy's connections are kept per set of credentials).
        # In proxy mode, with Sluice's, naming the client's role.
        if auth is not None:
            assert self._identity is not None
            self._credentials = self.routing.upstream_auth(auth, self._identity)
        elif body.HasField("auth_method_name") or body.HasField("auth_data"):
            self._credentials = UpstreamAuth(body.auth_method_name, bytes(body.auth_data))
        connected = pb.CommandConnected(
            server_version=SLUICE_VERSION,
            protocol_version=min(body.protocol_version, PROTOCOL_VERSION),
            # No max_message_size: only the broker knows its limit, and clients
            # size chunks by it. The broker's own CONNECTED, relayed unchanged
            # on the client's proxied connection, tells it (or leaves the
            # client's default, which is what a broker that names none expects).
            # PARTITIONED_METADATA goes upstream with the client's
            # metadata_auto_creation_enabled: Java clients may ask without
            # creating the topic (PIP-344) where the broker said it honours
            # that (a broker older than PIP-344 creates it all the same).
            # No topic watchers (WATCH_TOPIC_LIST is refused here).
            feature_flags=lookup_flags(self.routing.broker.address),
        )
        return [*self._own(own_frame(T.CONNECTED, connected)), *self._lookups(now)]

    def _open_relay(self, connect: pb.CommandConnect, now: float) -> list[Action]:
        try:
            target = parse_broker_url(connect.proxy_to_broker_url, what="proxy_to_broker_url")
        except ConfigError as exc:
            return self._refuse(str(exc), now=now)
        if not self.routing.allowlist.allows(target.address):
            return self._refuse(f"broker {target.address} is not in the allow-list", now=now)
        route = self.routing.route(target.address)
        auth = self.settings.auth
        chained = route is not None and route.via_upstream
        if auth is not None and not chained and not self._trusts(target.address):
            return self._refuse(
                f"broker {target.address} is allowed but was not named by the upstream, nor "
                "by --trust-broker: Sluice logs in to it as itself only then",
                "untrusted_broker",
                now=now,
            )
        if chained:
            # Chained: the upstream is a proxy too; go through it, naming the
            # broker the same way the client named it to us.
            # The connection holds the broker it is chained to (not the
            # configured one, never forgotten): it is not forgotten while open.
            address, tls = self.routing.broker.address, self.routing.broker.tls
            return self._dial(
                connect, address, tls, now, chained=True, named=True, holds=target.address
            )
        # proxy_to_broker_url has no scheme: the lookup answer that named
        # the broker says whether it speaks TLS.
        tls = route.tls if route is not None else (target.tls or self.routing.broker.tls)
        named = self.routing.knows(target.address)
        return self._dial(connect, target.address, tls, now, named=named)

    def _dial(
        self,
        connect: pb.CommandConnect,
        address: Address,
        tls: bool,
        now: float,
        *,
        chained: bool = False,
        named: bool = False,
        holds: Address | None = None,
    ) -> list[Action]:
        """Relay the client to the broker at ``address`` (``named``: one the
        upstream named, or configured): dial it and send it the client's
        CONNECT, as the client wrote it. No proxy_version: a
        broker with authentication on refuses a CONNECT that names one
        unless the connecting role is one of its proxyRoles ("Must not set
        proxyVersion without connecting as a ProxyRole"), and here the
        credentials are the client's own. ``holds``: the broker the
        connection keeps from being forgotten while it is open (None:
        ``address``; a chained one's: the broker behind the upstream)."""
        ours = pb.CommandConnect()
        ours.CopyFrom(connect)
        auth = self.settings.auth
        if auth is not None:
            # Sluice's credentials, the client's role as original_principal.
            assert self._identity is not None
            for name in _AUTH_FIELDS:
                ours.ClearField(name)
            upstream = auth.upstream(self._identity)
            upstream.apply(ours)
            if upstream.original_data is not None:
                self._broker_holds = self._identity.data
        if not chained:
            ours.ClearField("proxy_to_broker_url")
        self._upstream, self._upstream_named = address, named
        if self._holding is None:
            self._holding = address if holds is None else holds
            self.routing.hold(self._holding)
        gate = self._gate
        if gate is not None:
            gate.client_version = connect.client_version
            if auth is not None:
                assert self._identity is not None
                gate.role = self._identity.role
                self._credentials = self.routing.upstream_auth(auth, self._identity)
            elif connect.HasField("auth_method_name") or connect.HasField("auth_data"):
                self._credentials = UpstreamAuth(connect.auth_method_name, bytes(connect.auth_data))
        self.state = State.CONNECTING
        self._dial_started = now
        return [OpenUpstream(address, tls, encode(command(T.CONNECT, ours)))]

    def _refuse_certificate(self, now: float) -> list[Action]:
        """Passthrough: a client that logs in with its TLS certificate to a
        broker that authenticates. Its TLS session ends at Sluice, so the
        broker would see no certificate and answer a bare
        AuthenticationError; Sluice says why, and what works, itself. (A
        broker that does not authenticate takes it as any other CONNECT.)"""
        self.tap.event(self.conn, Rejected(TLS_PASSTHROUGH))
        level = self.routing.warned.level(TLS_PASSTHROUGH, now)
        return [
            *self._own(connect_error(pb.AuthenticationError, CERTIFICATE_NOT_PASSED)),
            self._close("auth", f"refusing CONNECT: {CERTIFICATE_NOT_PASSED}", level),
        ]

    def _trusts(self, address: Address) -> bool:
        """Proxy mode: whether Sluice may log in to ``address`` as itself."""
        return self.routing.knows(address) or self.settings.trusted.allows(address)

    def _refuse(self, reason: str, why: str = "relay_refused", *, now: float) -> list[Action]:
        """Refuse a relay with ServiceNotReady, which clients retry after a
        fresh lookup (one that teaches Sluice the broker, if it is one);
        counted as ``why``, logged once a minute per ``reason``."""
        self.tap.event(self.conn, Rejected(why))
        level = self.routing.warned.level(reason, now)
        return [
            *self._own(connect_error(pb.ServiceNotReady, reason)),
            self._close("relay_refused", f"refusing relay: {reason}", level),
        ]

    def _too_early(self, now: float) -> list[Action]:
        """A client that sent more than ``_MAX_EARLY`` bytes while its
        handshake was not done: they would wait in memory until it is."""
        why = (
            f"client sent over {_MAX_EARLY} bytes before its CONNECT was answered; "
            "clients wait for CONNECTED"
        )
        self.tap.event(self.conn, Rejected("handshake"))
        level = self.routing.warned.level(("handshake", why), now)
        return [
            *self._own(connect_error(pb.NotAllowedError, why)),
            self._close("handshake", f"closing: {why}", level),
        ]

    def _while_connecting(self, now: float, *, client_closed: bool) -> list[Action]:
        """Client bytes before the broker said CONNECTED: only an answer to an
        auth challenge goes on now; anything else waits in the decoder."""
        out: list[Action] = []
        if self._challenged:
            answer = self._client.next_event()
            if isinstance(answer, Frame):
                self.tap.frames(self.conn, True, (answer,))
                if answer.type != T.AUTH_RESPONSE:
                    return self.upstream_failed(
                        "client did not answer the broker's auth challenge", now
                    )
                self._challenged = False
                out.append(Send(Peer.BROKER, answer.raw))
        if client_closed:
            out.append(self._close("closed", "client closed the connection"))
        return out

    def _broker_handshake(self, now: float, *, closed: bool) -> list[Action]:
        out: list[Action] = []
        while isinstance(frame := self._broker.next_event(), Frame):
            self.tap.frames(self.conn, False, (frame,))
            t = frame.type
            if t == T.CONNECTED:
                if frame.error is not None:
                    return self.upstream_failed(
                        f"broker answered CONNECT with an invalid CONNECTED: {frame.error.message}",
                        now,
                    )
                if frame.body.HasField("max_message_size"):
                    size = frame.body.max_message_size
                    if size <= 0:
                        return self.upstream_failed(
                            f"broker's CONNECTED allows messages of {size} bytes", now
                        )
                    self._broker.max_message_size = size
                    self._client.max_message_size = size
                    if self._gate is not None:
                        self._gate.max_message_size = size
                out.append(Send(Peer.CLIENT, frame.raw))
                self.state = State.RELAY
                self._step = self._compiled_step()
                elapsed = now - self._dial_started
                self.tap.event(self.conn, Dialed(elapsed))
                self.tap.event(self.conn, Answered("CONNECT", elapsed))
                # Whatever either side sent meanwhile is relayed now.
                return out + self._relay(True, None, now) + self._relay(False, None, now)
            if t == T.AUTH_CHALLENGE:
                if self._answers_auth():  # Sluice's login: its own answer
                    out.append(Send(Peer.BROKER, self._own_auth_response()))
                    continue
                out.append(Send(Peer.CLIENT, frame.raw))
                self._challenged = True
                continue
            if t == T.ERROR:
                # The broker's own refusal goes to the client unchanged.
                out.append(Send(Peer.CLIENT, frame.raw))
                why = frame.body.message if frame.body is not None else frame.name
                log.warning("%s: broker refused CONNECT: %s", self.conn.name, clipped(why))
                self.tap.event(self.conn, Dialed(None))
                return [*out, self._close("upstream")]
            return self.upstream_failed(f"broker answered CONNECT with {frame.name}", now)
        if closed:
            why = "broker closed the connection during the handshake"
            if self.settings.proxy_header_out:
                why += (
                    " (Sluice sent it a PROXY protocol header first, --proxy-protocol-out: a "
                    "broker that does not read one hangs up; Apache Pulsar reads it with "
                    "haProxyProtocolEnabled=true)"
                )
            return self.upstream_failed(why, now)
        return out

    # --- proxied connections: the hot path ------------------------------------------

    def _relay(self, from_client: bool, data: bytes | None, now: float) -> list[Action]:
        """Frame, validate, count and forward one read (``None``: what is buffered)."""
        decoder = self._client if from_client else self._broker
        step = self._step
        if step is not None and data is not None:
            # The start of a frame the compiled step's last read ended in
            # comes before this read.
            held_back(step, decoder, from_client)
        # A read that starts on a frame boundary, ends on one, and holds only
        # frames forwarded unchanged is sent on as it came.
        whole = data is not None and decoder.buffered == 0
        if data is not None:
            decoder.receive_data(data)
        filtered = self._gate is not None and self._filtered(from_client)
        if filtered and from_client and self._held is not None:
            # A SEND waits for its topic's schema: what follows waits behind it.
            return self._while_held(data)
        batch = None
        # Rules are added and removed by other tasks, never during a read.
        if data and not self.faults.rules and not self._trace and not filtered:
            # Nearly every read: frames the compiled scanner took, all of
            # them, with no rule or trace to apply. They are shown to the taps
            # at once and accounted without a Python object per frame.
            batch = decoder.take_batch()
            if batch is not None and whole and decoder.buffered == 0:
                self.tap.frames(self.conn, from_client, batch)
                answered, topics = self._account(batch, from_client, now)
                if answered or topics:
                    self._report(from_client, answered, topics)
                return [Send(Peer.BROKER if from_client else Peer.CLIENT, data)]
        return self._relay_frames(from_client, data, now, whole and not filtered, batch, filtered)

    def _relay_frames(
        self,
        from_client: bool,
        data: bytes | None,
        now: float,
        whole: bool,
        batch: ScannedBatch | None,
        filtered: bool = False,
    ) -> list[Action]:
        """``_relay`` for a read that is not one whole batch: what a batch
        took (if any), then the rest frame by frame."""
        decoder = self._client if from_client else self._broker
        conn = self.conn
        tap = self.tap
        observe = self.correlator.observe
        sent = self.correlator.sent
        sending = self.correlator.sending
        consumers = self.correlator.consumers
        observed = CLIENT_TYPES if from_client else SERVER_TYPES
        receipt = -1 if from_client else T.SEND_RECEIPT  # one per SEND: timed here
        payload_type = T.SEND if from_client else T.MESSAGE
        faulty = bool(self.faults.rules)
        # Message filters, when a producer or consumer of this side has any.
        gate = self._gate if filtered else None
        direction: Direction = PRODUCE if from_client else DELIVER
        producers = self.correlator.producers
        # Proxy mode: AUTH_CHALLENGE from the broker and AUTH_RESPONSE from
        # the client are Sluice's to answer, not to pass on (and a client's
        # AUTH_CHALLENGE is Sluice's to refuse).
        own_auth = self._answers_auth()
        trace = self._trace
        out: list[bytes] = []
        actions: list[Action] = []
        # The taps see the read's frames in parts (up to _SHOWN_AT_ONCE), and
        # the receipts' times and each topic's traffic as one event per read.
        # Before an event about a frame (an answer, a fault, an invalid
        # frame), the frames so far are shown.
        seen: list[Frame] = []
        answered: Times | None = None
        topics: Traffic | None = None
        try:
            # What the compiled scanner took of a read it did not take whole;
            # what is left (an incomplete frame, one over the limit) goes below.
            if batch is not None:
                tap.frames(conn, from_client, batch)
                out.append(batch.data[batch.start : batch.stop])
                answered, topics = self._account(batch, from_client, now)
            for frame in decoder.frames():
                t = frame.type
                seen.append(frame)
                if len(seen) == _SHOWN_AT_ONCE:
                    tap.frames(conn, from_client, seen)
                    seen = []
                if trace:
                    side = "client" if from_client else "broker"
                    log.debug("%s: %s -> %s %s", conn.name, side, frame.name, _brief(frame))
                if faulty:
                    rule = self._fault(frame, from_client)
                    if rule is not None:
                        whole = False
                        if seen:
                            tap.frames(conn, from_client, seen)
                            seen = []
                        to = Peer.BROKER if from_client else Peer.CLIENT
                        if out:
                            actions.append(Send(to, b"".join(out)))
                            out = []
                        done_by_fault = self._apply(rule, frame, from_client, now, actions)
                        if done_by_fault is not None:
                            if done_by_fault:
                                return actions
                            continue
                if frame.error is None:
                    if gate is not None and t == payload_type:
                        ids = frame.ids
                        assert ids is not None
                        topic = (producers if from_client else consumers).get(ids[0])
                        chain = gate.chain(topic, direction)
                        if chain is not None and topic is not None:
                            whole = False
                            if seen:  # the frame's record goes before what filters say of it
                                tap.frames(conn, from_client, seen)
                                seen = []
                            if from_client:
                                went = self._filter_send(frame, topic, chain, now, out, actions)
                                if isinstance(went, Wait):  # the rest waits for the schema
                                    if seen:
                                        tap.frames(conn, from_client, seen)
                                        seen = []
                                    if out:
                                        actions.append(Send(Peer.BROKER, b"".join(out)))
                                    return [*actions, self._ask_schema(frame, went)]
                                if not went:
                                    continue  # refused
                            else:
                                to_client, to_broker = gate.deliver(frame, topic, chain)
                                if to_broker:
                                    actions.append(Send(Peer.BROKER, to_broker))
                                if not to_client:
                                    continue
                                out.append(to_client)
                            topics = add_traffic(topics, topic, ids[2], len(frame.raw))
                            continue
                    raw = frame.raw
                    if from_client and t in _NAMED:
                        elsewhere = self.correlator.open_elsewhere(frame)
                        if elsewhere is not None:
                            whole = False
                            if seen:  # the request's record goes before Sluice's answer
                                tap.frames(conn, from_client, seen)
                                seen = []
                            actions += self._open_elsewhere(frame, elsewhere)
                            continue
                        if self._gate is not None and t == T.PRODUCER:
                            marked = self._gate.marked_encrypted(frame)
                            if marked is not None:  # goes on changed; seen as it came
                                whole = False
                                raw = marked
                    elif own_auth and from_client and t in _DISCOVERY:
                        # Proxy mode: Sluice's login names the client it
                        # verified, never the principal the client wrote.
                        whole = False
                        raw = self._naming_client(frame)
                    elif gate is not None and t == T.ACK and from_client:
                        renumbered = gate.acked(frame)
                        if renumbered is not None:  # goes on changed; seen as it came
                            whole = False
                            raw = renumbered
                    out.append(raw)
                    if t == payload_type:
                        # Tallied by topic, for one TopicTraffic event per read.
                        # ids: (producer, sequence, messages) of a SEND,
                        # (consumer, 0, messages in the batch) of a MESSAGE.
                        ids = frame.ids
                        assert ids is not None  # set for every valid SEND and MESSAGE
                        if from_client:
                            topic = sending(ids[0], ids[1], now)
                        else:
                            topic = consumers.get(ids[0])
                        if topic is not None:
                            topics = add_traffic(topics, topic, ids[2], len(frame.raw))
                        continue
                    if t == receipt:
                        ids = frame.ids
                        assert ids is not None  # set for every valid SEND_RECEIPT
                        send = sent(ids[0], ids[1])
                        if send is not None:
                            answered = add_time(answered, send.topic, now - send.started)
                        if gate is not None:
                            released = gate.answered(frame)
                            if released:  # SEND_ERRORs of Sluice's that waited for this receipt
                                whole = False
                                seen += released
                                out += [f.raw for f in released]
                        continue
                    if own_auth and t in _AUTH_EXCHANGE and (from_client or t == T.AUTH_CHALLENGE):
                        out.pop()
                        whole = False
                        exchanged = self._auth_exchange(frame, from_client, now)
                        if exchanged and out:  # what came before goes first
                            to = Peer.BROKER if from_client else Peer.CLIENT
                            actions.append(Send(to, b"".join(out)))
                            out.clear()
                        if exchanged and isinstance(exchanged[-1], Close):
                            return actions + exchanged
                        actions += exchanged
                        continue
                    if t in observed:
                        if self._gate is not None:
                            if from_client and t in _REGISTERS:
                                self._gate.named(frame, now)
                            elif not from_client and t in _REGISTERED:
                                self._gate.registered(frame, now)
                            elif t == T.CLOSE_PRODUCER and frame.body is not None:
                                self._gate.closed(frame.body.producer_id)
                            elif gate is not None and t == T.SEND_ERROR:
                                released = gate.answered(frame)
                                if released:
                                    whole = False
                                    seen += released
                                    out += [f.raw for f in released]
                        done = observe(frame, from_client, now)
                        # A PRODUCER this read opened may want filters: the
                        # SENDs behind it in the read go through them, as
                        # they would in a read of their own.
                        if gate is None and t == T.PRODUCER and self._opens_filtered(from_client):
                            gate = self._gate
                        if done is not None:  # a request answered: rare, not per message
                            tap.frames(conn, from_client, seen)
                            seen = []
                            tap.event(conn, _answered(done))
                        if not from_client and t in _NAMES_BROKERS:
                            self._learn_brokers(frame, now)
                    continue
                if seen:
                    tap.frames(conn, from_client, seen)
                    seen = []
                error = frame.error
                tap.event(conn, Invalid(from_client, error.problem.value, error.message))
                side = "client" if from_client else "broker"
                message = error.message
                log.warning("%s: invalid %s from %s: %s", conn.name, frame.name, side, message)
                forward = not self._reject or not from_client
                if gate is not None and from_client and frame.type == T.SEND:
                    # Filters act on this side's sends (encryption among
                    # them, which fails closed): one they cannot read is
                    # refused, never forwarded as it came (in plaintext).
                    forward = False
                if forward or error.problem is Problem.UNKNOWN_TYPE:
                    out.append(frame.raw)
                    observe(frame, from_client, now)
                    continue
                whole = False
                reply = error_reply(frame, error.server_error, error.message)
                if reply is None:
                    if out:
                        actions.append(Send(Peer.BROKER, b"".join(out)))
                    actions.append(
                        self._close(
                            "invalid",
                            f"closing: invalid {frame.name} from client cannot be answered: "
                            f"{error.message}",
                            logging.WARNING,
                        )
                    )
                    return actions
                actions += self._own(reply)
        except RemoteProtocolError as exc:
            if seen:
                tap.frames(conn, from_client, seen)
                seen = []
            if out:
                actions.append(Send(Peer.BROKER if from_client else Peer.CLIENT, b"".join(out)))
            return actions + self._unframeable(from_client, exc)
        finally:  # however the loop ended
            if seen:
                tap.frames(conn, from_client, seen)
            if answered or topics:
                self._report(from_client, answered, topics)
        if out:
            to = Peer.BROKER if from_client else Peer.CLIENT
            if whole and decoder.buffered == 0:
                assert data is not None
                actions.append(Send(to, data))
            else:
                actions.append(Send(to, out[0] if len(out) == 1 else b"".join(out)))
        if data is not None and not data:
            if from_client:
                actions.append(self._close("closed", "client closed the connection"))
            else:
                actions.append(self._close("broker_closed", "broker closed the connection"))
        return actions

    # --- message filters (--filter) ---------------------------------------------------

    def _filter_send(
        self, frame: Frame, topic: str, chain: Chain, now: float, out: list[bytes],
        actions: list[Action],
    ) -> Wait | bool:  # fmt: skip
        """A filtered producer's SEND: on to the broker (``out``, maybe
        rebuilt; in flight from now: True), refused (a SEND_ERROR to the
        client now or after earlier receipts: False), or a Wait for the
        topic's schema."""
        assert self._gate is not None
        result = self._gate.send(frame, topic, chain, now)
        if isinstance(result, Wait):
            return result
        if isinstance(result, bytes):
            out.append(result)
            ids = frame.ids
            assert ids is not None
            self.correlator.sending(ids[0], ids[1], now)
            return True
        if result is not None:
            actions += self._own(result)
        return False

    def _ask_schema(self, frame: Frame, wait: Wait) -> Ask:
        """Hold ``frame`` (and the client's frames after it) until Sluice's
        upstream connection has asked the broker for the schema it needs."""
        assert self._gate is not None
        self._held = frame
        self._gate.waiting = wait
        token = next(self._tokens)
        self._schema_asks[token] = wait
        body = pb.CommandGetSchema(request_id=0, topic=wait.topic)
        if wait.version is not None:
            body.schema_version = wait.version
        address = self._upstream or self.routing.broker.address
        return Ask(token, address, (T.GET_SCHEMA, body, self._lookup_credentials()))

    def _schema_answered(
        self, wait: Wait, answer: Frame | UpstreamFailure, now: float
    ) -> list[Action]:
        gate, held = self._gate, self._held
        assert gate is not None
        self._held = None
        gate.waiting = None
        if self.state is not State.RELAY or held is None:
            return []
        body: Any = None if isinstance(answer, UpstreamFailure) else answer.body
        failure: str | None = None
        if isinstance(answer, UpstreamFailure):
            failure = answer.message
        elif body is None or (body.HasField("error_code") and body.error_code != pb.TopicNotFound):
            failure = f"broker answered GET_SCHEMA with {answer.name}: {_brief(answer)}"
        elif body.HasField("error_code") and wait.version:
            # "Topic not found or no-schema" for a version the SEND named:
            # not that the topic has no schema (its messages would pass
            # unchecked), only that it lacks this version.
            failure = f"the topic has no schema version {wait.version.hex()}"
        else:  # TopicNotFound: "Topic not found or no-schema"
            gate.filtering.learn_schema(wait.topic, wait.version, schema_of(answer), now)
        actions: list[Action] = []
        out: list[bytes] = []
        ids = held.ids
        assert ids is not None
        chain = gate.chain(wait.topic, PRODUCE)
        if failure is not None or chain is None:
            log.warning(
                "%s: cannot learn the schema of %s: %s", self.conn.name, wait.topic, failure
            )
            refused = gate.unavailable(held, wait.topic, failure or "no filter")
            if refused is not None:
                actions += self._own(refused)
        elif isinstance(self._filter_send(held, wait.topic, chain, now, out, actions), Wait):
            # Forgotten again at once (the cache started over): refused, not waited on forever.
            refused = gate.unavailable(held, wait.topic, "schema cache overflow")
            if refused is not None:
                actions += self._own(refused)
        if out:
            actions.append(Send(Peer.BROKER, b"".join(out)))
            self._report(True, None, add_traffic(None, wait.topic, ids[2], len(held.raw)))
        return actions + self._relay(True, None, now)

    def _while_held(self, data: bytes | None) -> list[Action]:
        """A client read while a SEND waits for its schema: kept, in order."""
        if data is not None and not data:
            return [self._close("closed", "client closed the connection")]
        if self._client.buffered > _MAX_HELD:
            return [self._close("filter", f"client sent over {_MAX_HELD} bytes while "
                                "Sluice waited for a topic's schema", logging.WARNING)]  # fmt: skip
        return []

    def _report(
        self,
        from_client: bool,
        answered: Times | None,
        topics: Traffic | None,
    ) -> None:
        """One read's receipt times (by topic) and traffic by topic, to the taps."""
        conn, tap = self.conn, self.tap
        if answered:
            for topic, seconds in answered.items():
                tap.event(conn, AnsweredMany("SEND", seconds, topic))
        if topics:
            for topic, (messages, size) in topics.items():
                tap.event(conn, TopicTraffic(topic, from_client, messages, size))

    def _account(
        self, batch: ScannedBatch, from_client: bool, now: float
    ) -> tuple[Times | None, Traffic | None]:
        """What ``_relay`` does for each valid frame, for a batch, in one
        call to the send table (compiled where built): SENDs in flight and
        their receipts timed (by topic), ACKs observed, messages and bytes
        tallied by topic."""
        correlator = self.correlator
        if from_client:
            traffic, acks = correlator.sends.account_client(
                batch.found, batch.start, now, correlator.producers
            )
            for i in acks:  # a request when it asks for a receipt
                correlator.observe(batch.frame(i), True, now)
            return None, traffic
        return correlator.sends.account_broker(batch.found, batch.start, now, correlator.consumers)

    # --- authentication at the proxy (--auth-mode proxy) -------------------------

    def _authenticate(
        self, auth: ProxyAuth, method: str, data: bytes, now: float
    ) -> list[Action] | None:
        """Check the client's credentials; the refusal, or None (accepted).
        KeysNeeded: an issuer's keys must be fetched first."""
        try:
            identity = auth.authenticate(
                method, data, self.conn.peer_role(), fetched=self._keys_fetched
            )
        except AuthError as exc:
            self.tap.event(self.conn, Authenticated(method or "none", "failed"))
            self.tap.event(self.conn, Rejected("auth"))
            return [
                *self._own(connect_error(pb.AuthenticationError, FAILED)),
                self._close("auth", f"authentication failed: {exc}", logging.WARNING),
            ]
        self._accept_identity(identity, now)
        self.tap.event(self.conn, Authenticated(method, "ok"))
        return None

    def _lookup_credentials(self) -> UpstreamAuth | None:
        """What this connection's requests go upstream with. In proxy mode,
        Sluice's credential as it is now (its token is renewed: a file
        rewritten, an OAuth2 token fetched again), naming the client; the
        shared connections are kept per value, so a renewed token opens new
        ones and the old ones are left to close when idle."""
        auth = self.settings.auth
        if auth is not None and self._identity is not None:
            return self.routing.upstream_auth(auth, self._identity)
        return self._credentials

    def _fetch_keys(self, needed: KeysNeeded, retry: Any) -> list[Action]:
        """Ask the proxy to fetch an issuer's keys; ``retry(now)`` once it has."""
        token = next(self._tokens)
        self._key_asks[token] = retry
        return [Ask(token, self.routing.broker.address, needed)]

    def _accept_identity(self, identity: Identity, now: float) -> None:
        self._identity = identity
        self._refresh_asked = None
        if identity.expires is None:
            self._expires_at = None
        else:  # the token's wall-clock expiry on the core's clock
            self._expires_at = now + max(0.0, identity.expires - time.time())

    def _refresh(self, now: float, interval: float) -> list[Action]:
        """Ask a client whose credentials expired for fresh ones, as a broker
        does; hang up on one that does not answer within an interval."""
        assert self._identity is not None
        method = self._identity.method
        if self._refresh_asked is not None:
            if now - self._refresh_asked < interval:
                return []
            self.tap.event(self.conn, Authenticated(method, "expired"))
            return [
                *self._own(connect_error(pb.AuthenticationError, FAILED)),
                self._close("auth", "client did not refresh its expired credentials",
                            logging.WARNING),
            ]  # fmt: skip
        if now < self._expires_at:  # type: ignore[operator]
            return []
        return self._challenge_client(now)

    def _challenge_client(self, now: float) -> list[Action]:
        """Ask the client for fresh credentials, as a broker does."""
        assert self._identity is not None
        self._refresh_asked = now
        challenge = pb.CommandAuthChallenge(
            challenge=pb.AuthData(auth_method_name=self._identity.method, auth_data=REFRESH),
            protocol_version=PROTOCOL_VERSION,
        )
        return self._own(own_frame(T.AUTH_CHALLENGE, challenge))

    def _naming_client(self, frame: Frame) -> bytes:
        """A client's discovery request on a proxied connection in proxy
        mode, as it goes upstream: naming the client Sluice verified."""
        body: Any = type(frame.body)()
        body.CopyFrom(frame.body)
        _name_client(body, self._lookup_credentials())
        return encode(command(frame.type, body))

    def _answers_auth(self) -> bool:
        """Proxy mode for this connection: in force, and the connection
        accepted in it (it has an identity). One accepted in passthrough
        stays passthrough when a reload turns proxy mode on: its client's
        credentials, not Sluice's, are what its broker knows."""
        return self.settings.auth is not None and self._identity is not None

    def _auth_exchange(self, frame: Frame, from_client: bool, now: float) -> list[Action]:
        """Proxy mode: the broker challenging Sluice's own credentials, or
        the client answering Sluice's challenge (anything else from the
        client is refused: a challenge of its own, or an answer nobody asked
        for, each of which would otherwise be new credentials at any time)."""
        auth = self.settings.auth
        assert auth is not None and self._identity is not None
        if not from_client:
            if self._broker_holds is not None and frame.body.challenge.auth_data == REFRESH:
                return self._broker_refresh(now)
            # On Sluice's login: its own answer.
            return [Send(Peer.BROKER, self._own_auth_response())]
        old = self._identity
        if frame.type != T.AUTH_RESPONSE or self._refresh_asked is None:
            why = (
                "AUTH_RESPONSE without a challenge"
                if frame.type == T.AUTH_RESPONSE
                else f"{frame.name} from a client: only brokers challenge"
            )
            self.tap.event(self.conn, Authenticated(old.method, "unsolicited"))
            level = self.routing.warned.level(why, now)
            return [
                *self._own(connect_error(pb.NotAllowedError, why)),
                self._close("auth", f"closing: {why}", level),
            ]
        response = frame.body.response
        method = response.auth_method_name or old.method
        try:
            identity = auth.authenticate(
                method, bytes(response.auth_data), self.conn.peer_role(),
                fetched=self._keys_fetched,
            )  # fmt: skip
            if identity.role != old.role:
                raise AuthError(f"the refreshed credentials name role {identity.role!r}, "
                                f"not {old.role!r}")  # fmt: skip
        except KeysNeeded as needed:  # the client goes on meanwhile
            return self._fetch_keys(
                needed, functools.partial(self._auth_exchange, frame, from_client)
            )
        except AuthError as exc:
            self.tap.event(self.conn, Authenticated(method, "failed"))
            return [
                *self._own(connect_error(pb.AuthenticationError, FAILED)),
                self._close("auth", f"refreshed credentials refused: {exc}", logging.WARNING),
            ]
        self._accept_identity(identity, now)
        if self.state is State.LOOKUP:  # lookups go on with the fresh credentials
            self._credentials = self.routing.upstream_auth(auth, identity)
        self.tap.event(self.conn, Authenticated(method, "refreshed"))
        if self._broker_waits:  # verified: now the broker's answer
            return [self._forward_identity()]
        return []

    def _broker_refresh(self, now: float) -> list[Action]:
        """``--forward-auth-data``: the broker's refresh challenge is about
        the client's token it holds (a broker that checks
        ``original_auth_data`` refreshes that one, and refuses a refresh to
        another role, so Sluice's own would end the connection). As Apache
        Pulsar's proxy does, it gets the client's token: a newer one Sluice
        verified since, at once; else Sluice challenges the client and
        answers once the client's answer is verified as at CONNECT
        (``_auth_exchange``); what the client sends is never passed on
        unchecked."""
        assert self._identity is not None
        expired = self._expires_at is not None and now >= self._expires_at
        newer = self._identity.data != self._broker_holds or self._expires_at is None
        self._broker_waits = True
        if newer and not expired:
            return [self._forward_identity()]
        if self._refresh_asked is not None:  # asked already: its answer goes on
            return []
        return self._challenge_client(now)

    def _forward_identity(self) -> Send:
        """AUTH_RESPONSE to the broker with the client's verified token (as
        verified, whatever its spelling; never recorded, as Sluice's own)."""
        assert self._identity is not None
        self._broker_waits = False
        self._broker_holds = self._identity.data
        data = pb.AuthData(auth_method_name=self._identity.method, auth_data=self._identity.data)
        response = pb.CommandAuthResponse(response=data, protocol_version=PROTOCOL_VERSION)
        return Send(Peer.BROKER, encode(command(T.AUTH_RESPONSE, response)))

    def _own_auth_response(self) -> bytes:
        """AUTH_RESPONSE with Sluice's own credentials (never recorded)."""
        assert self.settings.auth is not None
        return encode(command(T.AUTH_RESPONSE, self.settings.auth.own.response()))

    def _learn(self, url: BrokerUrl, now: float, via_upstream: bool = False) -> None:
        """A broker an answer named at ``now``: learned (or kept known)."""
        self.routing.learn(url, via_upstream=via_upstream)
        self.routing.seen(url.address, now)

    def _learn_brokers(self, frame: Frame, now: float) -> None:
        if not self._upstream_named:
            return  # a broker only --allow-broker admits names none for Sluice
        body: Any = frame.body
        if frame.type in (T.TOPIC_MIGRATED, T.LOOKUP_RESPONSE):
            # A lookup answered on a relayed connection (SNI routing: the
            # client asks the broker itself) names brokers it will dial next.
            urls = (body.brokerServiceUrl, body.brokerServiceUrlTls)
        else:
            urls = (body.assignedBrokerServiceUrl, body.assignedBrokerServiceUrlTls)
        for url in urls:
            if url:
                try:
                    if not isinstance(url, str):  # not UTF-8: protobuf gives bytes
                        raise ConfigError("not UTF-8")
                    named = parse_broker_url(url)
                except ConfigError:
                    log.warning("%s: broker named an unusable URL %s", self.conn.name, clipped(url))
                    continue
                # With a TLS --broker, a plain URL is never a route: a client
                # sent there would be relayed (with Sluice's own credential,
                # in proxy mode) in the clear, as a Connect answer's is not.
                if named.tls or not self.routing.broker.tls:
                    self._learn(named, now)

    def _unframeable(self, from_client: bool, exc: RemoteProtocolError) -> list[Action]:
        side = "client" if from_client else "broker"
        self.tap.event(self.conn, Invalid(from_client, exc.problem.value, exc.message, fatal=True))
        return [
            self._close(
                "unframeable", f"closing: {side} sent an unframeable stream: {exc}", logging.WARNING
            )
        ]

    # --- lookup connections ----------------------------------------------------------

    def _lookups(self, now: float) -> list[Action]:
        out: list[Action] = []
        while isinstance(event := self._client.next_event(), Frame):
            out += self._lookup_frame(event, now)
            if self.state is State.CLOSED:
                return out
        if event is CLOSED:
            out.append(self._close("closed"))
        return out

    def _lookup_frame(self, frame: Frame, now: float) -> list[Action]:
        self.tap.frames(self.conn, True, (frame,))
        self.last_heard = now
        if self.faults.rules:
            rule = self._fault(frame, True)
            if rule is not None:
                actions: list[Action] = []
                done = self._apply(rule, frame, True, now, actions, own=True)
                if done is not None:
                    return actions
                return actions + self._lookup_request(frame, now)
        return self._lookup_request(frame, now)

    def _lookup_request(self, frame: Frame, now: float) -> list[Action]:
        t = frame.type
        if t == T.PING:
            return self._own(own_frame(T.PONG))
        if t == T.PONG:
            return []
        if t in _AUTH_EXCHANGE and self._answers_auth() and frame.error is None:
            return self._auth_exchange(frame, True, now)
        error = frame.error
        if error is not None:
            self.tap.event(self.conn, Invalid(True, error.problem.value, error.message))
            log.warning("%s: invalid %s from client: %s", self.conn.name, frame.name, error.message)
            reply = error_reply(frame, error.server_error, error.message)
            if reply is None:
                return [self._close("invalid", f"closing: {error}", logging.WARNING)]
            return self._own(reply)
        if t == T.CONNECT:
            # One CONNECT per connection: a broker (and Apache Pulsar's proxy)
            # hangs up on another. Ignored, the client would wait for a
            # CONNECTED that never comes.
            why = "CONNECT on a connection already connected"
            level = self.routing.warned.level(("handshake", why), now)
            return [
                *self._own(connect_error(pb.NotAllowedError, why)),
                self._close("handshake", f"closing: {why}", level),
            ]
        if t not in _FORWARDED:
            reply = error_reply(
                frame, pb.NotAllowedError, f"{frame.name} is not served on a lookup connection"
            )
            if reply is None:
                first = t not in self._ignored
                self._ignored.add(t)
                log.log(logging.INFO if first else logging.DEBUG,
                        "%s: ignoring %s on a lookup connection%s", self.conn.name, frame.name,
                        " (again only at debug level)" if first else "")  # fmt: skip
                return []
            return self._own(reply)
        if not self.routing.start_lookup():
            self.tap.event(self.conn, LookupDone("rejected"))
            reply = error_reply(frame, pb.TooManyRequests, "too many concurrent lookups")
            assert reply is not None
            return self._own(reply)
        body: Any = type(frame.body)()
        body.CopyFrom(frame.body)
        credentials = self._lookup_credentials()
        if self._answers_auth():
            _name_client(body, credentials)
        token = next(self._tokens)
        self._asks[token] = _Pending(frame, body, body.request_id, now, now)
        return [Ask(token, self.routing.broker.address, (t, body, credentials))]

    def _lookup_answer(
        self, token: int, pending: _Pending, answer: Frame, now: float
    ) -> list[Action]:
        result: Any = answer.body
        if answer.type != T.LOOKUP_RESPONSE or result.response == LookupResponse.Failed:
            reply = _with_request_id(answer, pending.client_rid)
            return self._finish(pending, reply, answer_error(answer.type, result), now, "failed")
        # A redirect is followed as Sluice speaks to its brokers (the
        # configured broker's scheme): the answer names the broker both ways.
        if self.routing.broker.tls:
            if not result.brokerServiceUrlTls:
                # Never in the clear what Sluice speaks TLS for (its own
                # credential, the clients' messages); a Java client on TLS
                # does not follow such an answer either.
                raise UpstreamFailure(
                    f"lookup of {pending.body.topic}: the answer names no TLS URL for its "
                    f"broker ({clipped(result.brokerServiceUrl)}), and Sluice speaks TLS to "
                    "its brokers",
                    pb.ServiceNotReady,
                )
            url_text = result.brokerServiceUrlTls
        else:
            url_text = result.brokerServiceUrl or result.brokerServiceUrlTls
        url = _url(url_text)
        if result.response == LookupResponse.Redirect:
            pending.hops += 1
            limit = self.settings.max_redirects
            if pending.hops > limit:
                raise UpstreamFailure(
                    f"lookup of {pending.body.topic} redirected more than {limit} times",
                    pb.ServiceNotReady,
                )
            self.tap.event(self.conn, LookupDone("redirected"))
            self._learn(url, now)
            pending.body.authoritative = result.authoritative
            pending.asked = now
            self._asks[token] = pending
            credentials = self._lookup_credentials()
            return [Ask(token, url.address, (T.LOOKUP, pending.body, credentials))]
        # An upstream that is itself a proxy asks to be kept in the path.
        via = result.proxy_through_service_url
        if self.routing.broker.tls:
            # Sluice speaks TLS to its brokers: the client is sent to the TLS
            # URL whichever it picks (a client on plain TCP picks
            # brokerServiceUrl), as Apache Pulsar's proxy names the URL it
            # connects with both ways; the plain one is not learned, so that
            # no client has it dialled in the clear.
            plain = tls_url = url_text
        else:
            plain = result.brokerServiceUrl or url_text
            tls_url = result.brokerServiceUrlTls or url_text
        for named in dict.fromkeys((plain, tls_url)):
            self._learn(_url(named), now, via)
        rewritten = LookupResponse(
            request_id=pending.client_rid,
            response=LookupResponse.Connect,
            brokerServiceUrl=plain,
            brokerServiceUrlTls=tls_url,
            authoritative=True,
            proxy_through_service_url=True,
        )
        return self._finish(pending, own_frame(T.LOOKUP_RESPONSE, rewritten), None, now, "answered")

    def _lookup_failed(
        self, pending: _Pending, failure: UpstreamFailure, now: float
    ) -> list[Action]:
        log.warning("%s: %s failed: %s", self.conn.name, pending.frame.name, failure.message)
        reply = error_reply(pending.frame, failure.error, failure.message)
        assert reply is not None  # every forwarded request carries a request_id
        return self._finish(pending, reply, failure.error, now, "failed")

    def _finish(
        self,
        pending: _Pending,
        reply: Frame,
        error: int | None,
        now: float,
        outcome: str = "",
    ) -> list[Action]:
        self.routing.end_lookup()
        total = now - pending.started
        t = pending.frame.type
        self.tap.event(self.conn, Answered(command_name(t), total, _error_name(error)))
        if t == T.LOOKUP:
            self.tap.event(self.conn, LookupDone(outcome, total, pending.upstream))
        return self._own(reply)

    # --- helpers -----------------------------------------------------------------

    def _own(self, frame: Frame) -> list[Action]:
        """A frame Sluice writes to the client itself: counted and recorded too."""
        self.tap.frames(self.conn, False, (frame,))
        if self.faults.rules:
            rule = self._fault(frame, False)
            if rule is not None:
                actions: list[Action] = []
                if self._apply(rule, frame, False, self._now, actions, own=True) is None:
                    actions.append(Send(Peer.CLIENT, frame.raw))
                return actions
        return [Send(Peer.CLIENT, frame.raw)]

    # --- fault injection -----------------------------------------------------------

    def _fault(self, frame: Frame, from_client: bool) -> Rule | None:
        body: Any = frame.body
        # One that carries a request id (an ACK asks for a receipt only
        # with one): else no answer reaches the client, and a rule that
        # matched it would spend a hit and be recorded for nothing.
        answerable = (
            from_client
            and body is not None
            and (
                frame.type == T.SEND
                or ("request_id" in body.DESCRIPTOR.fields_by_name and body.HasField("request_id"))
            )
        )
        return self.faults.check(
            "pulsar",
            frame.name,
            from_client,
            self.conn.client,
            lambda: self.correlator.topic_of(frame),
            answerable,
            errors=PULSAR_FAULTS.errors,
        )

    def _apply(
        self,
        rule: Rule,
        frame: Frame,
        from_client: bool,
        now: float,
        actions: list[Action],
        *,
        own: bool = False,
    ) -> bool | None:
        """Carry out ``rule`` on ``frame``, appending to ``actions``.

        None: the frame goes on as usual, after what was appended (delay,
        throttle). False: the frame was dealt with here (dropped, corrupted
        and sent, answered). True: the connection closes; stop.
        ``own``: the frame is Sluice's own or served by Sluice, not relayed.
        """
        action = rule.action
        topic = self.correlator.topic_of(frame) if rule.match.topic is not None else None
        self.tap.event(
            self.conn, FaultInjected(rule.id, str(action), frame.name, from_client, topic)
        )
        to = Peer.BROKER if from_client else Peer.CLIENT
        if action is FaultAction.DELAY or action is FaultAction.THROTTLE:
            actions.append(self._pacer.hold(rule, from_client, now, len(frame.raw)))
            return None
        if action is FaultAction.DROP:
            if not from_client and not own:
                self.correlator.observe(frame, False, now)
            return False
        if action is FaultAction.DISCONNECT:
            if not own or not from_client:
                actions.append(Send(to, frame.raw))
            actions.append(
                self._close("fault", f"fault {rule.id}: disconnecting after {frame.name}")
            )
            return True
        if action is FaultAction.CORRUPT:
            if own and from_client:
                return None  # a request Sluice answers itself is never sent on
            actions.append(Send(to, corrupted(frame)))
            if not own:
                self.correlator.observe(frame, from_client, now)
            return False
        # ERROR: answer the request in the broker's place.
        name = rule.code(PULSAR_FAULTS.errors)
        if name is None:  # not a ServerError (``check`` passes such rules by)
            return None
        reply = error_reply(frame, pb.ServerError.Value(name), rule.message)
        if reply is None:
            return None
        if not own:
            self.correlator.observe(frame, True, now)
            done = self.correlator.observe(reply, False, now)
            if done is not None:
                self.tap.event(self.conn, _answered(done))
        actions += self._own(reply)
        return False

    def _open_elsewhere(self, frame: Frame, topic: str) -> list[Action]:
        """A PRODUCER or SUBSCRIBE for an id open on another topic
        (``Correlator.open_elsewhere``): answered by Sluice, not relayed."""
        body: Any = frame.body
        what, ident = (
            ("producer", body.producer_id)
            if frame.type == T.PRODUCER
            else ("consumer", body.consumer_id)
        )
        why = f"{what} id {ident} is open on {clipped(topic)} on this connection: close it first"
        log.warning("%s: refusing %s for %s: %s", self.conn.name, frame.name,
                    clipped(text(body.topic)), why)  # fmt: skip
        reply = error_reply(frame, pb.NotAllowedError, why)
        assert reply is not None  # both carry a request id
        return self._own(reply)

    def _close(self, reason: str, message: str = "", level: int = logging.INFO) -> Close:
        self.state = State.CLOSED
        return Close(reason, message, level)


def _url(text: str | bytes) -> BrokerUrl:
    if not isinstance(text, str):  # protobuf hands over a string that is not UTF-8 as bytes
        raise UpstreamFailure(
            f"broker URL in lookup answer is not UTF-8: {clipped(text)}", pb.ServiceNotReady
        )
    try:
        return parse_broker_url(text, what="broker URL in lookup answer")
    except ConfigError as exc:
        raise UpstreamFailure(str(exc), pb.ServiceNotReady) from None


def _with_request_id(answer: Frame, request_id: int) -> Frame:
    body: Any = type(answer.body)()
    body.CopyFrom(answer.body)
    body.request_id = request_id
    return own_frame(answer.type, body)


# The CONNECT fields that carry credentials and the principal.
_AuthField = Literal[
    "auth_method",
    "auth_method_name",
    "auth_data",
    "original_principal",
    "original_auth_method",
    "original_auth_data",
]
_AUTH_FIELDS: tuple[_AuthField, ...] = get_args(_AuthField)
# What LOOKUP and PARTITIONED_METADATA carry of them.
_ORIGINAL_FIELDS: tuple[_AuthField, ...] = _AUTH_FIELDS[3:]


# Requests with original_* fields a client may send on a proxied connection.
_DISCOVERY = frozenset({T.LOOKUP, T.PARTITIONED_METADATA})


def _name_client(body: Any, credentials: UpstreamAuth | None) -> None:
    """Proxy mode: a discovery request goes upstream naming the client Sluice
    verified, as its CONNECT does, never the principal the client wrote."""
    fields = body.DESCRIPTOR.fields_by_name
    if "original_principal" not in fields:
        return
    for name in _ORIGINAL_FIELDS:
        body.ClearField(name)
    if credentials is not None:
        credentials.name_client(body)


def _not_text(body: Any) -> str | None:
    """The first set text field of ``body`` that is not UTF-8 (protobuf
    hands such a field over as bytes), or None."""
    for described in body.DESCRIPTOR.fields:
        if described.type != described.TYPE_STRING or described.is_repeated:
            continue
        name = described.name
        if body.HasField(name) and not isinstance(getattr(body, name), str):
            return str(name)
    return None


_AUTH_EXCHANGE = frozenset({T.AUTH_CHALLENGE, T.AUTH_RESPONSE})

_ERROR_NAMES: dict[int, str] = {value: name for name, value in pb.ServerError.items()}


def _error_name(error: int | None) -> str | None:
    if error is None:
        return None
    return _ERROR_NAMES.get(error, str(error))


_COMMAND_NAMES: dict[int, str] = {}


# The most frames the relay holds back from the taps: enough to spread the
# cost of a call over many frames, few enough that the frames are still in
# the CPU's caches when the recorder hashes their payloads (holding a whole
# read of 512 SENDs cost 12.0 µs per message in hotpath.py, against 10.5).
_SHOWN_AT_ONCE = 32


def _answered(done: Completion) -> Answered:
    name = _COMMAND_NAMES.get(done.request_type)
    if name is None:
        name = _COMMAND_NAMES[done.request_type] = command_name(done.request_type)
    return Answered(name, done.seconds, _error_name(done.error), done.topic)


def _brief(frame: Frame) -> str:
    body = loggable(frame)  # credentials never reach the log
    if body is None:
        return ""
    text: str = text_format.MessageToString(body, as_one_line=True)
    return text
