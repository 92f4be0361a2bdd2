"""What every protocol core and the proxy agree on: actions, events, taps.

A protocol core is sans-I/O, in the style of h11: the proxy hands it the
bytes a socket produced, and it answers with a list of *actions* (send these
bytes to that peer, open an upstream, ask a shared upstream connection
something, close). Validation, rewriting, correlation and the policy
decision all happen inside the core; the proxy only owns sockets, TLS,
timeouts, limits and backpressure, and is the same for every protocol.

What happens is reported to *taps* (metrics, the recorder; fault
injection reports what it did) through one small interface: ``frame`` for every frame, on the
hot path, and ``event`` for everything rarer. Taps are called through
``Taps``, which keeps a failing tap from ever breaking traffic.

Nothing here does I/O or imports trio.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sluice.addresses import Address

log = logging.getLogger("sluice.taps")


class Peer(enum.IntEnum):
    """One end of a relayed connection. The value is the recorded direction
    of frames *from* that end (0: client to broker, 1: broker to client)."""

    CLIENT = 0
    BROKER = 1


# --- actions: what a core asks the proxy to do -------------------------------------


# Send is made once per read, so, like the per-read events below, it is not
# a frozen dataclass (measured: 681 ns to make one frozen, 151 ns not); the
# relay never changes one.
@dataclass(slots=True)
class Send:
    """Write ``data`` to ``to``, after everything sent to it before."""

    to: Peer
    data: bytes


@dataclass(frozen=True, slots=True)
class OpenUpstream:
    """Dial ``address`` (over TLS when ``tls``), send ``hello``, and feed
    what comes back to the core's ``receive_broker``."""

    address: Address
    tls: bool
    hello: bytes


@dataclass(frozen=True, slots=True)
class Ask:
    """Send ``request`` over the proxy's shared connection to ``address``
    and hand the answer (or the failure) to the core's ``answered(token, …)``.

    ``request`` is the protocol's own value; the proxy passes it to the
    protocol's upstream client without looking inside.
    """

    token: int
    address: Address
    request: Any


@dataclass(frozen=True, slots=True)
class Close:
    """Hang up both sides. ``reason`` is a short code (recordings, metrics);
    ``message`` is for the log, at ``level``."""

    reason: str
    message: str = ""
    level: int = logging.INFO


def _never() -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Hold:
    """Carry out nothing after this before ``until`` (the relay's clock):
    an injected delay or a throttle, keeping the order of what follows;
    sooner once ``released()`` (the rule that held it was removed)."""

    until: float
    released: Callable[[], bool] = field(default=_never, compare=False)


Action = Send | OpenUpstream | Ask | Close | Hold


# --- the connection as taps see it ----------------------------------------------


@dataclass(slots=True, eq=False)
class Conn:
    """One client connection: who, where, and what the core learned about it.

    ``state`` is the core's per-connection state a tap may read (for Pulsar,
    its Correlator: producers, consumers and their topics).
    """

    id: int
    client: str
    listener: str
    protocol: str
    kind: str = ""  # set when the handshake says (Pulsar: lookup | proxied)
    broker: str = ""
    state: Any = None
    # The CN of the client's verified TLS certificate, once the TLS
    # handshake is done (None: plain, or no certificate).
    peer_role: Callable[[], str | None] = lambda: None
    # The balancer the connection came through when a PROXY protocol header
    # named the client ("": it came straight from the client).
    via: str = ""

    @property
    def name(self) -> str:
        return f"conn-{self.id} {self.client}"


# --- events: everything that is not a frame ---------------------------------------
# Taps must not change an event (nor the list in an AnsweredMany: every tap
# is shown the same one). The few made per request or per read (Answered,
# AnsweredMany, Relayed, TopicTraffic) are not frozen dataclasses only
# because a frozen one's __init__ costs 3.5x as much (measured 500 vs 145 ns
# with Answered's fields).


@dataclass(frozen=True, slots=True)
class Accepted:
    """The proxy accepted the connection (limits passed)."""


@dataclass(frozen=True, slots=True)
class Opened:
    """The handshake said what the connection is for (``conn.kind``)."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """A connection (or a relay, a lookup) refused before it got going."""

    reason: str


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The proxy checked a client's credentials itself (``--auth-mode
    proxy``): ``outcome`` is ``ok``, ``failed``, ``refreshed`` or
    ``expired``."""

    method: str
    outcome: str


@dataclass(frozen=True, slots=True)
class Invalid:
    """A frame failed validation, or a stream lost its framing (``fatal``)."""

    from_client: bool
    problem: str
    message: str
    fatal: bool = False


@dataclass(slots=True)
class Answered:
    """A request (or a SEND) and the answer it got, as the proxy timed it."""

    request: str  # command name
    seconds: float
    error: str | None = None  # the protocol's error code name, on failure
    topic: str | None = None


@dataclass(slots=True)
class AnsweredMany:
    """Answers to one kind of request about one topic, all read at once
    (send receipts): one event per read rather than an ``Answered`` each."""

    request: str  # command name
    seconds: list[float]
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class LookupDone:
    """A lookup the proxy answered itself; ``upstream`` is the part spent waiting."""

    outcome: str  # answered | redirected | failed | rejected
    total: float = 0.0
    upstream: float = 0.0


@dataclass(frozen=True, slots=True)
class Dialed:
    """An upstream connection made (``seconds``) or not (``None``)."""

    seconds: float | None


@dataclass(slots=True)
class Relayed:
    """One read's frames written on: the proxy's own share of the latency."""

    from_client: bool
    seconds: float


@dataclass(slots=True)
class TopicTraffic:
    """Messages and bytes of one topic in one read (SEND / MESSAGE frames)."""

    topic: str
    from_client: bool
    messages: int
    size: int


@dataclass(frozen=True, slots=True)
class Closed:
    reason: str


@dataclass(frozen=True, slots=True)
class FaultInjected:
    """A fault rule fired on a frame (see ``sluice.protocols.faults``)."""

    rule: str
    action: str
    command: str
    from_client: bool
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class Filtered:
    """A message filter acted on one frame's messages (``sluice.filters``):
    ``action`` is ``replaced``, ``rejected`` or ``error`` (a filter raised;
    ``reason`` says whether it then failed open or closed). ``sent`` is the
    frame as it went on when it was changed (the taps saw it as it came)."""

    filter: str
    action: str
    from_client: bool
    topic: str | None
    reason: str = ""
    messages: int = 1
    sent: bytes | None = None


Event = (
    Accepted
    | Opened
    | Rejected
    | Authenticated
    | Invalid
    | Answered
    | AnsweredMany
    | LookupDone
    | Dialed
    | Relayed
    | TopicTraffic
    | Closed
    | FaultInjected
    | Filtered
)


class Tap(Protocol):
    """Something that watches traffic. Both methods must return quickly and
    never block: the relay calls them inline."""

    def frames(self, conn: Conn, from_client: bool, frames: Sequence[Any]) -> None:
        """Frames read (or written by the proxy itself) at one time, in order."""
        ...

    def event(self, conn: Conn | None, event: Event) -> None: ...


@dataclass
class Taps:
    """Every tap, called in order; a tap that raises is logged once and
    counted, and traffic goes on as if it had not been there."""

    taps: list[Tap] = field(default_factory=list)
    failures: int = 0
    _reported: set[int] = field(default_factory=set)
    # Moves on whenever what ``quick`` answers may change (a tap added, one
    # that was idle watching or one that watched going idle): a core that
    # built a compiled step from ``quick`` builds it again.
    generation: int = 0

    def add(self, tap: Tap) -> None:
        self.taps.append(tap)
        self.changed()

    def changed(self) -> None:
        self.generation += 1

    def quick(self, conn: Conn) -> tuple[Any, Any] | None:
        """What a compiled relay step may stand in for the taps with, on
        ``conn``: the metrics' ``figures`` (where it counts), and a
        recorder's ``quick_records(conn)`` (where it queues frame records,
        and how it lays them out) or None without a recorder. None: some
        tap must see every read. A tap that says it is ``idle`` (a live
        view nobody watches) is passed over: it wants no frames now."""
        figures = records = None
        for tap in self.taps:
            if getattr(tap, "idle", False):
                continue
            found = getattr(tap, "figures", None)
            if found is not None and figures is None:
                figures = found
                continue
            quick = getattr(tap, "quick_records", None)
            found = quick(conn) if quick is not None else None
            if found is None or records is not None:
                return None
            records = found
        return None if figures is None else (figures, records)

    def frames(self, conn: Conn, from_client: bool, frames: Sequence[Any]) -> None:
        for tap in self.taps:
            try:
                tap.frames(conn, from_client, frames)
            except Exception as exc:
                self._failed(tap, exc)

    def event(self, conn: Conn | None, event: Event) -> None:
        for tap in self.taps:
            try:
                tap.event(conn, event)
            except Exception as exc:
                self._failed(tap, exc)

    def _failed(self, tap: object, exc: Exception) -> None:
        self.failures += 1
        if id(tap) not in self._reported:
            self._reported.add(id(tap))
            log.error("%s failed (traffic goes on): %r", type(tap).__name__, exc, exc_info=exc)


class QuickStep(Protocol):
    """A protocol's compiled way to carry one read of a relayed direction
    whole (rust/src/step.rs): read, checked, accounted and written on in one
    call, or handed back untouched for ``receive_client``/``receive_broker``."""

    def carry(self, source: int, sink: int, from_client: bool, now: float) -> Any:
        """None: nothing to read; bytes: the read, for the usual path; an
        int: that many bytes carried whole; (read, rest, error, seconds):
        carried but for ``rest`` (or a write that failed with ``error``).
        A read may end in the start of a frame: the step holds it for the
        next read of that direction."""
        ...

    def take_held(self, from_client: bool) -> bytes:
        """What the step holds of a frame begun in its last read of that
        direction (b"" if nothing), given up: it goes to the decoder first
        when the next read takes the usual way."""
        ...

    def give_held(self, from_client: bool, start: bytes) -> bool:
        """Hold ``start``, the start of a frame the core's decoder had
        buffered, for the next carried read of that direction; False when
        the step cannot (it holds something already, or it is too long)."""
        ...


class Buffering(Protocol):
    """A protocol's frame decoder, as far as handing a frame's start to a
    compiled step goes."""

    @property
    def buffered(self) -> int: ...

    def take_buffered(self) -> bytes: ...

    def receive_data(self, data: bytes) -> None: ...


try:  # the most of a frame's start a compiled step holds (no step without it)
    from sluice._frames import STEP_HOLD_MAX
except ImportError:
    STEP_HOLD_MAX = 0


def resumed_in_step(step: QuickStep, decoder: Buffering, from_client: bool) -> bool:
    """Whether ``step`` may carry the next read of a direction: yes when the
    direction's decoder buffers nothing, or the start of a frame (a read
    that came the usual way ended in it) the step takes over, so that a
    direction whose reads end inside frames does not stay on the usual way.
    No when the step cannot hold it (longer than it holds, or it holds
    something already): it stays in the decoder, as it was."""
    if not decoder.buffered:
        return True
    if decoder.buffered > STEP_HOLD_MAX:
        return False
    start = decoder.take_buffered()
    if step.give_held(from_client, start):
        return True
    decoder.receive_data(start)  # as it was
    return False


def held_back(step: QuickStep, decoder: Buffering, from_client: bool) -> None:
    """The start of a frame ``step``'s last read of a direction ended in,
    taken into that direction's decoder: it comes before whatever the
    decoder is given next (a read that goes the usual way, or a new step)."""
    held = step.take_held(from_client)
    if held:
        decoder.receive_data(held)


class OnInvalid(enum.Enum):
    """What a core does with an invalid frame from a client."""

    REJECT = "reject"  # answer it as the broker would, never pass it on
    FORWARD = "forward"  # count it, log it, pass it on


def compiled_frames_wanted() -> bool:
    """Whether a protocol may use its compiled frame code (``sluice._frames``,
    where built): yes, unless ``SLUICE_FRAMES=python`` asks for the Python
    reference alone (for comparing the two in benchmarks and tests)."""
    return os.environ.get("SLUICE_FRAMES", "").lower() != "python"
