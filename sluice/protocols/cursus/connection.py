"""One Cursus client connection through the proxy, sans-I/O.

``CursusConnection`` takes the bytes of a client connection and of the
upstream broker connection it is relayed to, and returns the same actions
as the Pulsar core (``Send``, ``OpenUpstream``, ``Ask``, ``Close``):

- No handshake: each proxy listener stands for one upstream broker
  (port-per-broker), so the first client bytes open the upstream. Frames
  that arrive before the I/O layer calls ``upstream_ready`` wait in the
  decoder, in order.
- Client frames are framed and validated as the broker would (its size
  limit and compression setting). ``OnInvalid.REJECT`` answers an invalid
  one with the broker's own ``ERROR:`` line and closes where the broker
  would; ``FORWARD`` counts it and passes it on. Commands the codec does not
  know are always passed on: only the broker can judge them.
- Broker replies that name brokers (``leaders=``, ``host=``/``port=``,
  ``NOT_LEADER LEADER_IS``) are rewritten to the proxy's listener for each
  named broker. An address with no listener yet becomes an ``Ask`` with a
  ``ListenerRequest``; that reply and every broker frame after it wait until
  ``answered`` gives the listener's address. Named brokers are learned into
  the allow-list.
- Requests and their replies are timed (``Answered``), batches counted per
  topic (``TopicTraffic``); a drain ends an open STREAM the way a stopping
  broker does (``STREAM_CONTROL type=CLOSE reason=stopped offset=N``).
- Fault rules (``sluice.protocols.faults``, protocol ``cursus``) act on
  frames both ways; an ``error`` rule answers a request with the broker's
  own ``ERROR:`` forms (``NOT_LEADER LEADER_IS`` naming this listener, so the
  client asks for metadata again and comes back).
- Once a STREAM is answered, what the broker streams (batches, keepalives)
  may be carried read by read by a compiled step (``quick``,
  rust/src/step.rs): counted, tallied by topic and the stream's offset
  moved on as here, with no Python per read.
"""

from __future__ import annotations

import enum
import itertools
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from sluice.addresses import Address, AllowList
from sluice.protocols.core import (
    Action,
    Answered,
    Ask,
    Close,
    Closed,
    Conn,
    Dialed,
    FaultInjected,
    Invalid,
    OnInvalid,
    Opened,
    OpenUpstream,
    Peer,
    QuickStep,
    Rejected,
    Send,
    Tap,
    TopicTraffic,
    compiled_frames_wanted,
    held_back,
    resumed_in_step,
)
from sluice.protocols.cursus.commands import Command, OtherCommand, Stream
from sluice.protocols.cursus.compression import Compression
from sluice.protocols.cursus.decoder import FrameDecoder, decode_frame
from sluice.protocols.cursus.encoder import own_frame, refusal_reply
from sluice.protocols.cursus.errors import Problem, RemoteProtocolError, quote
from sluice.protocols.cursus.frame import BROKER_MAX_FRAME_SIZE, SPEC_MAX_FRAME_SIZE, Frame
from sluice.protocols.cursus.replies import (
    BatchAck,
    ErrorReply,
    Keepalive,
    StreamControl,
)
from sluice.protocols.cursus.rewrite import addresses_in, rewrite_addresses
from sluice.protocols.cursus.spec import CURSUS_FAULTS
from sluice.protocols.faults import (
    FaultAction,
    Faults,
    Pacer,
    Rule,
    flip_last_byte,
)

log = logging.getLogger("sluice.cursus")

try:  # the compiled relay step (rust/src/step.rs)
    from sluice._frames import Step as _Step
except ImportError:  # a source tree nobody built: every read the usual way
    _Step = None  # type: ignore[assignment,misc]
if not compiled_frames_wanted():  # SLUICE_FRAMES=python: the reference alone
    _Step = None  # type: ignore[assignment,misc]


@dataclass(frozen=True)
class CursusSettings:
    """The proxy settings a Cursus connection core acts on."""

    on_invalid: OnInvalid = OnInvalid.REJECT
    # What the broker accepts from clients; replies may be as large as the client takes.
    max_frame_size: int = BROKER_MAX_FRAME_SIZE
    max_reply_size: int = SPEC_MAX_FRAME_SIZE
    compression: Compression = Compression.NONE


@dataclass(frozen=True)
class ListenerRequest:
    """What an ``Ask`` of this core requests: the proxy address clients
    should dial to reach ``upstream`` (open a listener for it if need be).
    The answer is an ``Address``, or an ``Exception`` when none can be had."""

    upstream: Address


class CursusRouting:
    """What every connection of one proxy shares: the upstream broker, the
    allow-list with the brokers replies named, and the listeners for them."""

    def __init__(self, broker: Address, allow_rules: tuple[str, ...] = ()) -> None:
        self.broker = broker
        self.allowlist = AllowList(allow_rules)
        self.allowlist.learn(broker)
        self.listeners: dict[Address, Address] = {}

    def listener_for(self, upstream: Address) -> Address | None:
        return self.listeners.get(_key(upstream))

    def add_listener(self, upstream: Address, proxy: Address) -> None:
        """``proxy`` now relays to ``upstream``."""
        self.allowlist.learn(upstream)
        self.listeners[_key(upstream)] = proxy


@dataclass(frozen=True)
class _Rewritten:
    """A broker frame and the bytes that go to the client for it."""

    frame: Frame
    data: bytes


def _topic(frame: Frame) -> str | None:
    head = frame.head
    if head is not None:
        return head.topic
    message = frame.message
    topic = getattr(message, "topic", None)
    if isinstance(topic, str) and topic:
        return topic
    return frame.envelope or None


def _key(address: Address) -> Address:
    return Address(address.host.lower(), address.port)


class State(enum.Enum):
    IDLE = "waiting for the first request"
    CONNECTING = "connecting to the broker"
    RELAY = "relaying"
    CLOSED = "closed"


@dataclass
class _Request:
    name: str
    started: float
    topic: str | None
    batch: bool
    stream: bool
    # Sluice's own answer (a fault rule's error, a refusal) to a request the
    # broker never got: sent once the requests before it are answered, as
    # Cursus answers carry no request id and clients pair them in order.
    reply: Frame | None = None


# The commits, whose answer the compiled step may carry (``quick``): a
# broker answers a commit with the two letters OK, and one of several
# partitions with ``OK batched=N`` (True here). Every other command's OK
# carries fields of its own: offered for those, the step would read the
# answer only to give it back.
_COMMIT_OK = {"COMMIT_OFFSET": False, "BATCH_COMMIT": True}


class CursusConnection:
    protocol = "cursus"

    def __init__(
        self,
        conn: Conn,
        settings: CursusSettings,
        routing: CursusRouting,
        tap: Tap,
        *,
        upstream: Address | None = None,
        tls: bool = False,
        faults: Faults | None = None,
    ) -> None:
        self.conn = conn
        self.faults = faults if faults is not None else Faults()
        self._pacer = Pacer(self.faults)
        self.settings = settings
        self.routing = routing
        self.tap = tap
        self.upstream = upstream if upstream is not None else routing.broker
        self.tls = tls
        conn.broker = str(self.upstream)
        self.state = State.IDLE
        self._client = FrameDecoder(
            from_client=True,
            max_frame_size=settings.max_frame_size,
            compression=settings.compression,
        )
        self._broker = FrameDecoder(from_client=False, max_frame_size=settings.max_reply_size)
        self._reject = settings.on_invalid is OnInvalid.REJECT
        self._requests: deque[_Request] = deque()
        self._streaming: _Request | None = None
        self._stream_offset: int | None = None
        self._held: deque[Frame] = deque()  # broker frames waiting for a listener
        self._asks: dict[int, Address] = {}  # listener requests not answered yet
        self._asked: set[int] = set()  # ... of which the Ask went out
        self._tokens = itertools.count(1)
        self._dial_started = 0.0
        self._client_closed = False
        self._broker_closed = False
        # A refusal after which the connection closes, waiting for the
        # answers to the requests before it (``_in_turn``); nothing the
        # client sends after the refused frame goes on.
        self._closing: Frame | None = None
        self._closing_why = ""
        # The compiled step that carries a stream's deliveries (quick()), and
        # the taps' generation it was built for.
        self._step: Any = None
        self._step_generation = -1

    # --- what the relay reads ------------------------------------------------------

    @property
    def established(self) -> bool:
        return self.state is State.RELAY

    @property
    def upstream_pending(self) -> bool:
        return self.state is State.CONNECTING

    @property
    def in_flight_sends(self) -> int:
        """Batches passed to the broker that have no answer yet."""
        return sum(1 for r in self._requests if r.batch)

    # --- input ---------------------------------------------------------------------

    def receive_client(self, data: bytes, now: float) -> list[Action]:
        """Bytes from the client; ``b""`` when it closed its side."""
        if self.state is State.CLOSED:
            return []
        self._client.receive_data(data)
        if not data:
            self._client_closed = True
        if self.state is State.IDLE:
            if not data:
                return [self._close("closed", "client closed before sending anything")]
            return self._open(now)
        if self.state is State.CONNECTING:
            return []  # held in the decoder until upstream_ready()
        return self._from_client(now)

    def upstream_ready(self, now: float) -> list[Action]:
        """The I/O layer dialled the upstream and sent the ``hello``."""
        if self.state is not State.CONNECTING:
            return []
        self.state = State.RELAY
        self.tap.event(self.conn, Dialed(now - self._dial_started))
        return self._from_client(now)

    def upstream_failed(self, message: str, now: float) -> list[Action]:
        """The upstream could not be reached. A broker that is not there says
        nothing, so neither does the proxy: the client sees the hang-up."""
        log.warning("%s: %s", self.conn.name, message)
        self.tap.event(self.conn, Dialed(None))
        return [self._close("upstream", message, logging.WARNING)]

    def receive_broker(self, data: bytes, now: float) -> list[Action]:
        """Bytes from the upstream broker."""
        if self.state is not State.RELAY:
            return []
        if self._step is not None:
            self._taken_back(self._step)  # before this read
        self._broker.receive_data(data)
        out: list[Action] = []
        try:
            for frame in self._broker.frames():
                self._held.append(frame)
        except RemoteProtocolError as exc:
            out += self._flush(now)
            return out + self._unframeable(False, exc)
        out += self._flush(now)
        if not data:
            self._broker_closed = True
        return out + self._end_if_broker_closed()

    def _end_if_broker_closed(self) -> list[Action]:
        # What the broker sent before hanging up still reaches the client.
        if self._broker_closed and not self._held:
            return [self._close("broker_closed", "broker closed the connection")]
        return []

    def answered(self, token: int, answer: object, now: float) -> list[Action]:
        """The I/O layer's answer to a ``ListenerRequest``: an ``Address``, or
        an exception saying why there is no listener."""
        upstream = self._asks.pop(token, None)
        self._asked.discard(token)
        if upstream is None or self.state is State.CLOSED:
            return []
        if not isinstance(answer, Address):
            message = f"no proxy listener for broker {upstream}: {answer}"
            self.tap.event(self.conn, Rejected("no_listener"))
            # Passing the reply on would send the client around the proxy:
            # it is told why instead, as an error reply it reads as a
            # failed request (not a bare hang-up), and the connection closed.
            refusal = ErrorReply("unavailable", (f"reason={quote(message)}",))
            return [*self._own(own_frame(refusal)),
                    self._close("no_listener", message, logging.WARNING)]  # fmt: skip
        self.routing.add_listener(upstream, answer)
        return self._flush(now) + self._end_if_broker_closed()

    # Cursus clients and brokers keep their own connections alive.
    keeps_alive = False

    def keepalive(self, now: float, interval: float) -> list[Action]:
        return []

    def drain(self) -> list[Action]:
        """End an open STREAM the way a stopping broker does, so that the
        client resumes where it was; other connections just close."""
        if self._step is not None:
            self._offset_from(self._step)
        if self.conn.kind != "stream" or self._stream_offset is None:
            return []
        control = StreamControl("CLOSE", "stopped", self._stream_offset)
        return self._own(own_frame(control))

    def quick(self, from_client: bool) -> QuickStep | None:
        """The compiled step that may carry the next read of a direction:
        from the broker, with no fault rule, no reply waiting for a
        listener, and the metrics the only tap; once a STREAM is answered,
        or while the one request sent waits for its answer (a commit: the
        step carries its OK, and nothing else, as ``_answer`` would take
        it). None: the read comes through ``receive_broker`` (or
        ``receive_client``). The step gives back any read that is not what
        it checked, every byte of it, and the start of one."""
        if from_client or self.state is not State.RELAY:
            return None
        if self.faults.rules or self._held or self._asks or self._broker_closed:
            return None
        step = self._step
        if self._step_generation != getattr(self.tap, "generation", 0):
            step = self._renewed_step(step)
        if step is None:
            return None
        if self._streaming is None:
            self._taken_back(step)  # (an answer it carried: paired first)
            requests = self._requests
            batched = _COMMIT_OK.get(requests[0].name) if len(requests) == 1 else None
            if batched is None:
                return None
            step.expect_ok(requests[0].name, requests[0].started, batched)
        return step if resumed_in_step(step, self._broker, False) else None

    def _renewed_step(self, old: Any) -> Any:
        """A step built for the taps as they are now (a live view began or
        ended), what the old one held taken into the decoder."""
        if old is not None:
            self._taken_back(old)
        self._step_generation = getattr(self.tap, "generation", 0)
        quick = getattr(self.tap, "quick", None)
        taps = quick(self.conn) if quick is not None else None
        if _Step is None or taps is None or taps[1] is not None:
            # (Cursus frames are recorded the Python way: no step then.)
            self._step = None
        else:
            self._step = _Step.cursus(taps[0], self.settings.max_reply_size)
        return self._step

    def _offset_from(self, step: Any) -> None:
        """Where the stream goes on from, as the step's carried reads left it."""
        offset = step.take_offset()
        if offset is not None:
            self._stream_offset = offset

    def _taken_back(self, step: Any) -> None:
        """What the step's carried reads left: the stream's offset, the
        request it answered (paired here as ``_answer`` pairs one), and the
        start of a frame its last read ended in (into the decoder)."""
        self._offset_from(step)
        for _ in range(step.take_answered()):
            self._requests.popleft()
        held_back(step, self._broker, False)

    def closed(self, reason: str) -> None:
        self._step = None
        self.state = State.CLOSED
        self._asks.clear()
        self._held.clear()
        self.tap.event(self.conn, Closed(reason))

    # --- client side -----------------------------------------------------------------

    def _open(self, now: float) -> list[Action]:
        if not self.routing.allowlist.allows(self.upstream):
            self.tap.event(self.conn, Rejected("relay_refused"))
            message = f"broker {self.upstream} is not in the allow-list"
            return [self._close("relay_refused", message, logging.WARNING)]
        self.conn.kind = "relay"
        self.tap.event(self.conn, Opened())
        self.state = State.CONNECTING
        self._dial_started = now
        return [OpenUpstream(self.upstream, self.tls, b"")]

    def _from_client(self, now: float) -> list[Action]:
        out: list[bytes] = []
        actions: list[Action] = []
        topics: dict[str, list[int]] = {}
        try:
            for frame in self._client.frames():
                if self._closing is not None:
                    continue  # behind a refusal that ends the connection: never sent
                self.tap.frames(self.conn, True, (frame,))
                if self.faults.rules:
                    rule = self._fault(frame, True)
                    if rule is not None:
                        if out:
                            actions.append(Send(Peer.BROKER, b"".join(out)))
                            out = []
                        done = self._apply(rule, frame, True, now, actions)
                        if done is not None:
                            if done:
                                return actions
                            continue
                error = frame.error
                if error is not None:
                    self.tap.event(self.conn, Invalid(True, error.problem.value, error.message))
                    log.warning("%s: invalid %s from client: %s", self.conn.name, frame.name, error)
                    if self._reject and error.problem is not Problem.UNKNOWN_TYPE:
                        if out:
                            actions.append(Send(Peer.BROKER, b"".join(out)))
                            out = []
                        actions += self._refuse(error, now)
                        if self.state is State.CLOSED:
                            return actions
                        continue
                out.append(frame.raw)
                self._track(frame, now, topics)
        except RemoteProtocolError as exc:
            if out:
                actions.append(Send(Peer.BROKER, b"".join(out)))
            return actions + self._unframeable(True, exc)
        for topic, (messages, size) in topics.items():
            self.tap.event(self.conn, TopicTraffic(topic, True, messages, size))
        if out:
            actions.append(Send(Peer.BROKER, b"".join(out)))
        if self._client_closed and self.state is not State.CLOSED:
            # At DEBUG: a consumer commits on a connection of its own each
            # time, so at INFO this was a line per commit (and a tenth of
            # such a connection's CPU); sluice_connections_closed_total
            # counts them.
            actions.append(self._close("closed", "client closed the connection", logging.DEBUG))
        return actions

    def _refuse(self, error: RemoteProtocolError, now: float) -> list[Action]:
        reply, close = refusal_reply(error)
        actions: list[Action] = []
        if reply is not None:
            frame = own_frame(reply)
            actions += self._in_turn(frame, "INVALID", now)
            if close and not actions:
                # Answers to earlier requests come first (the broker would
                # send them before refusing): the close waits for them.
                self._closing = frame
                self._closing_why = f"closing: {error.message}"
                return actions
        if close:
            actions.append(self._close("invalid", f"closing: {error.message}", logging.WARNING))
        return actions

    def _track(self, frame: Frame, now: float, topics: dict[str, list[int]]) -> None:
        # Once a STREAM is answered, the broker's frames are deliveries, not
        # answers (_answer pairs none): a request then would wait for ever.
        pairing = self._streaming is None
        head = frame.head
        if head is not None:
            tally = topics.setdefault(head.topic, [0, 0])
            tally[0] += head.count
            tally[1] += len(frame.raw)
            if pairing:
                self._requests.append(_Request("BATCH", now, head.topic, True, False))
            return
        message = frame.message
        if isinstance(message, Keepalive) or not pairing:
            return
        if message is None:
            # Passed on though invalid (--on-invalid forward): the broker
            # answers it with an ERROR:, which must not be taken for the
            # answer to the request after it.
            if frame.error is not None:
                self._requests.append(_Request("INVALID", now, None, False, False))
            return
        topic = getattr(message, "topic", None) if isinstance(message, Command) else None
        stream = isinstance(message, Stream)
        if stream:
            assert isinstance(message, Stream)
            self.conn.kind = "stream"
            self._stream_offset = message.offset
        # A word only the broker knows (or none does) names no request of
        # its own: metrics label it UNKNOWN, as they count its frames.
        name = "UNKNOWN" if isinstance(message, OtherCommand) and not message.known else frame.name
        self._requests.append(_Request(name, now, topic, False, stream))

    # --- broker side -------------------------------------------------------------------

    def _flush(self, now: float) -> list[Action]:
        """Send on what the broker sent, in order, up to a frame that names a
        broker with no listener yet (that one becomes an ``Ask``)."""
        out: list[bytes] = []
        actions: list[Action] = []
        while self._held and not self._asks:
            frame = self._held[0]
            data = self._rewritten(frame)
            if data is None:
                break  # asked for a listener; the rest waits
            self._held.popleft()
            # Taps (a recording, a live view) see what the client gets.
            shown = frame if data is frame.raw else decode_frame(data, from_client=False)
            self.tap.frames(self.conn, False, (shown,))
            if self.faults.rules:
                rule = self._fault(frame, False)
                if rule is not None:
                    if out:
                        actions.append(Send(Peer.CLIENT, b"".join(out)))
                        out = []
                    fault = _Rewritten(frame, data)
                    done = self._apply(rule, fault, False, now, actions)
                    if done is not None:
                        self._answer(frame, now)
                        for reply in self._replies_due():
                            actions += self._own(reply)
                            if reply is self._closing:
                                return [*actions, self._refused_close()]
                        if done:
                            return actions
                        continue
            if frame.error is not None:
                error = frame.error
                self.tap.event(self.conn, Invalid(False, error.problem.value, error.message))
                log.warning("%s: invalid %s from broker: %s", self.conn.name, frame.name, error)
            self._answer(frame, now)
            out.append(data)
            due = self._replies_due()
            if due:
                actions.append(Send(Peer.CLIENT, b"".join(out)))
                out = []
                for reply in due:
                    actions += self._own(reply)
                    if reply is self._closing:
                        return [*actions, self._refused_close()]
        if out:
            actions.append(Send(Peer.CLIENT, b"".join(out)))
        for token, upstream in self._asks.items():
            if token not in self._asked:
                self._asked.add(token)
                actions.append(Ask(token, upstream, ListenerRequest(upstream)))
        return actions

    def _rewritten(self, frame: Frame) -> bytes | None:
        """The bytes to send for ``frame``: rewritten when it names brokers,
        ``None`` when a listener has to be asked for first."""
        if frame.head is not None:
            return frame.raw  # a batch: the client routes by none of these
        message = frame.message
        if isinstance(message, Keepalive | StreamControl):
            return frame.raw
        if isinstance(message, BatchAck) and "LEADER_IS" not in (message.error or ""):
            return frame.raw  # (an ack's "leader" is a Raft address: nobody dials it)
        named = addresses_in(frame.body)
        if not named:
            return frame.raw
        missing: list[Address] = []
        for host, port in named:
            upstream = Address(host, port)
            self.routing.allowlist.learn(upstream)
            if self.routing.listener_for(upstream) is None and upstream not in missing:
                missing.append(upstream)
        if missing:
            for upstream in missing:
                self._asks[next(self._tokens)] = upstream
            return None

        def to_proxy(host: str, port: int) -> tuple[str, int]:
            proxy = self.routing.listener_for(Address(host, port))
            assert proxy is not None
            return proxy.host, proxy.port

        body = rewrite_addresses(frame.body, to_proxy)
        if body is None:
            return frame.raw
        return len(body).to_bytes(4, "big") + body

    def _answer(self, frame: Frame, now: float) -> None:
        """Pair a broker frame with the request it answers."""
        head = frame.head  # a batch: its messages are not needed (nor decoded) here
        message = frame.message if head is None else None
        if isinstance(message, Keepalive):
            return
        if self._streaming is not None:
            if head is not None and head.last_offset is not None:
                self._stream_offset = head.last_offset + 1
                size = len(frame.raw)
                self.tap.event(self.conn, TopicTraffic(head.topic, False, head.count, size))
            return
        if not self._requests:
            return
        request = self._requests.popleft()
        error: str | None = None
        if isinstance(message, ErrorReply):
            error = message.code or "ERROR"
        elif isinstance(message, BatchAck) and message.status != "OK":
            error = message.status
        elif message is None and head is None:
            error = "INVALID"
        self.tap.event(
            self.conn, Answered(request.name, now - request.started, error, request.topic)
        )
        if head is not None and head.last_offset is not None:
            size = len(frame.raw)
            self.tap.event(self.conn, TopicTraffic(head.topic, False, head.count, size))
        if request.stream and error is None and not isinstance(message, StreamControl):
            self._streaming = request
            if head is not None and head.last_offset is not None:
                self._stream_offset = head.last_offset + 1
        elif request.stream and isinstance(message, ErrorReply):
            # Refused: no stream opened, the connection relays as before.
            self.conn.kind = "relay"
            self._stream_offset = None

    # --- fault injection ------------------------------------------------------------

    def _fault(self, frame: Frame, from_client: bool) -> Rule | None:
        message = frame.message
        answerable = from_client and message is not None and not isinstance(message, Keepalive)
        return self.faults.check(
            "cursus",
            frame.name,
            from_client,
            self.conn.client,
            lambda: _topic(frame),
            answerable,
            errors=CURSUS_FAULTS.errors,
        )

    def _apply(
        self,
        rule: Rule,
        frame: Frame | _Rewritten,
        from_client: bool,
        now: float,
        actions: list[Action],
    ) -> bool | None:
        """Carry out ``rule`` on ``frame`` (see the Pulsar core's twin):
        None: the frame goes on as usual after what was appended; False: it
        was dealt with here; True: the connection closes."""
        original = frame.frame if isinstance(frame, _Rewritten) else frame
        data = frame.data if isinstance(frame, _Rewritten) else frame.raw
        action = rule.action
        topic = _topic(original) if rule.match.topic is not None else None
        self.tap.event(
            self.conn, FaultInjected(rule.id, str(action), original.name, from_client, topic)
        )
        to = Peer.BROKER if from_client else Peer.CLIENT
        if action is FaultAction.DELAY or action is FaultAction.THROTTLE:
            actions.append(self._pacer.hold(rule, from_client, now, len(data)))
            return None
        if action is FaultAction.DROP:
            return False
        if action is FaultAction.CORRUPT:
            actions.append(Send(to, flip_last_byte(data)))
            if from_client:
                self._track(original, now, {})
            return False
        if action is FaultAction.DISCONNECT:
            actions.append(Send(to, data))
            actions.append(
                self._close("fault", f"fault {rule.id}: disconnecting after {original.name}")
            )
            return True
        # ERROR: answer the request in the broker's place.
        code = rule.code(CURSUS_FAULTS.errors)
        if code is None:  # not a Cursus code (``check`` passes such rules by)
            return None
        words: tuple[str, ...] = ()
        if code == "NOT_LEADER":
            here = self.routing.listener_for(self.upstream)
            if here is not None:
                words = ("LEADER_IS", str(here))
        elif code == "NOT_COORDINATOR":
            here = self.routing.listener_for(self.upstream)
            if here is not None:
                words = (f"host={here.host}", f"port={here.port}")
        words += (f"reason={quote(rule.message)}",) if rule.message else ()
        actions += self._in_turn(own_frame(ErrorReply(code, words)), original.name, now)
        return False

    # --- helpers -------------------------------------------------------------------

    def _unframeable(self, from_client: bool, exc: RemoteProtocolError) -> list[Action]:
        side = "client" if from_client else "broker"
        self.tap.event(self.conn, Invalid(from_client, exc.problem.value, exc.message, fatal=True))
        # An oversize frame: the broker hangs up without a word, and so do we.
        return [
            self._close(
                "unframeable", f"closing: {side} sent an unframeable stream: {exc}", logging.WARNING
            )
        ]

    def _own(self, frame: Frame) -> list[Action]:
        """A frame Sluice writes to the client itself: counted and recorded too."""
        self.tap.frames(self.conn, False, (frame,))
        return [Send(Peer.CLIENT, frame.raw)]

    def _in_turn(self, reply: Frame, name: str, now: float) -> list[Action]:
        """Sluice's own answer to a client's request: now, when nothing
        before it waits for the broker's answer; else queued behind those
        (``_replies_due``), as the client takes answers in order."""
        if self._step is not None:  # answers the compiled step carried: done
            self._taken_back(self._step)
        if self._streaming is not None or not self._requests:
            return self._own(reply)
        self._requests.append(_Request(name, now, None, False, False, reply))
        return []

    def _replies_due(self) -> list[Frame]:
        """Sluice's own answers whose turn has come (every request before
        them answered), taken from the queue: to go right after the
        broker's answer that made it so."""
        due: list[Frame] = []
        while self._requests and self._requests[0].reply is not None:
            reply = self._requests.popleft().reply
            assert reply is not None
            due.append(reply)
        return due

    def _refused_close(self) -> Close:
        """The close a refusal sent in turn (``_closing``) was waiting for."""
        return self._close("invalid", self._closing_why, logging.WARNING)

    def _close(self, reason: str, message: str = "", level: int = logging.INFO) -> Close:
        self.state = State.CLOSED
        return Close(reason, message, level)
