"""The proxy's Prometheus metrics.

Everything is prefixed ``sluice_`` and uses base units. What happens per
frame or per message is kept in plain numbers and turned into metrics only
when Prometheus scrapes: frame and byte counts in integer lists indexed by
command type (one list increment per frame, not a locked ``Counter.inc()``),
the request and relay latencies in ``Histograms`` (a bisect and two
additions per observation, where prometheus-client's ``Histogram`` takes two
locks). Everything else (connections, lookups, per-topic counts once per
read) uses prometheus-client directly, with label children bound once.

Latency, honestly: ``sluice_request_duration_seconds{command}`` runs from the
moment the proxy read a request to the moment it read the answer, so it is
the broker's time plus the network between proxy and broker.
``sluice_relay_delay_seconds{direction}`` is the proxy's own share: from
reading a chunk to having written it on. For lookups, which the proxy answers
itself, ``sluice_lookup_duration_seconds{part}`` splits the total from the
time spent waiting on the upstream. FLOW to first MESSAGE is not a latency
(messages wait for producers, not for the broker) and is not measured.
"""

from __future__ import annotations

import itertools
import math
import platform
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from sluice import __version__
from sluice.protocols.core import (
    Accepted,
    Answered,
    AnsweredMany,
    Authenticated,
    Closed,
    Conn,
    Dialed,
    Event,
    FaultInjected,
    Filtered,
    Invalid,
    LookupDone,
    Opened,
    Rejected,
    Relayed,
    TopicTraffic,
)
from sluice.protocols.errors import Problem
from sluice.protocols.haproxy import REASONS as HEADER_REFUSALS
from sluice.protocols.http import KINDS, STATUS_CLASSES
from sluice.protocols.http.websocket import ENDINGS, OPCODES
from sluice.protocols.registry import DEFAULT_PROTOCOL, ProtocolSpec, get

_Figures: Any
try:  # what compiled relay steps count (rust/src/step.rs), folded in at scrape time
    from sluice._frames import Figures as _Figures
except ImportError:  # a source tree nobody built
    _Figures = None

if TYPE_CHECKING:
    from sluice.proxy.relay_thread import RelayThread
    from sluice.recording.writer import Recorder

# How prometheus-client writes a bucket's bound as its "le" label.
_le: Callable[[float], str] = floatToGoString

CLIENT_TO_BROKER = "client_to_broker"
BROKER_TO_CLIENT = "broker_to_client"
DIRECTIONS = (CLIENT_TO_BROKER, BROKER_TO_CLIENT)
# Indexed by "from the client".
DIRECTION = (BROKER_TO_CLIENT, CLIENT_TO_BROKER)
# Command types are small numbers; anything else counts as UNKNOWN (slot 0),
# as do the types a protocol does not name.
TYPE_SLOTS = 256
UNKNOWN = "UNKNOWN"
OTHER_TOPIC = "other"
# Error codes with a label of their own in sluice_broker_errors_total; later
# ones share OTHER_TOPIC. Pulsar's are an enum; a Cursus broker's a string
# off the wire, any number of them.
MAX_ERROR_LABELS = 100

# Up to 30 s: Pulsar's clients give up on a request (operation and send
# timeouts) after 30 s by default; slower answers than the highest bound
# read as that bound in a quantile.
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
# The proxy's own time runs to the write's end, a slow reader's socket
# included (backpressure): up to a second, so that a wait shows as one.
_RELAY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
)  # fmt: skip
# Why connections close (recordings' close reasons); anything else, an
# exception's name, is counted as "error" so that the label stays bounded.
CLOSE_REASONS = frozenset({
    "closed", "broker_closed", "lost", "drained", "idle", "handshake", "handshake_timeout",
    "relay_refused", "upstream", "invalid", "unframeable", "fault", "no_listener", "error", "auth",
})  # fmt: skip
# --auth-mode proxy: the methods a client may use, and what became of it.
AUTH_METHODS = frozenset({"token", "tls"})
AUTH_OUTCOMES = ("ok", "failed", "refreshed", "expired")


class TrafficCounts(Collector):
    """Frames and bytes per command type and direction, as plain integers.

    ``frames[from_client][type]``: index 1 counts frames from clients, 0
    frames from brokers (and frames the proxy wrote to clients itself).
    """

    def __init__(self, command_name: Callable[[int], str] | None = None) -> None:
        self.command_name = command_name or str
        self.frames = ([0] * TYPE_SLOTS, [0] * TYPE_SLOTS)
        self.bytes = ([0] * TYPE_SLOTS, [0] * TYPE_SLOTS)
        # Protocols whose commands are names, not numbers:
        # (from_client, name) -> [frames, bytes].
        self.named: dict[tuple[bool, str], list[int]] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        frames = CounterMetricFamily(
            "sluice_frames",
            "Frames relayed, by command and direction",
            labels=["command", "direction"],
        )
        sizes = CounterMetricFamily(
            "sluice_bytes", "Bytes relayed (whole frames), by command and direction",
            labels=["command", "direction"],
        )  # fmt: skip
        command_name = self.command_name
        for index, direction in enumerate(DIRECTION):
            counts, volume = self.frames[index], self.bytes[index]
            # A type the protocol does not know ("UNKNOWN(99)") is counted
            # as UNKNOWN: a client picks it, and would add series at will.
            tallies: dict[str, list[int]] = {}
            for slot in range(TYPE_SLOTS):
                if counts[slot]:
                    name = command_name(slot) if slot else UNKNOWN
                    if name.startswith(UNKNOWN):
                        name = UNKNOWN
                    tally = tallies.setdefault(name, [0, 0])
                    tally[0] += counts[slot]
                    tally[1] += volume[slot]
            for name, (count, size) in tallies.items():
                frames.add_metric([name, direction], count)
                sizes.add_metric([name, direction], size)
        for (from_client, name), (count, size) in self.named.items():
            frames.add_metric([name, DIRECTION[from_client]], count)
            sizes.add_metric([name, DIRECTION[from_client]], size)
        yield frames
        yield sizes

    def describe(self) -> Iterable[CounterMetricFamily]:
        return []


class FilterMessages(Collector):
    """Messages each filter's hook ran on, from the tally the filters keep
    themselves (``seen``: (filter id, "produce" or "deliver") -> messages,
    ``Seen`` in filters/chain.py), read at each scrape."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], int] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "sluice_filter_messages",
            "Messages a filter's hook ran on (passed, changed or refused), by filter and direction",
            labels=["filter", "direction"],
        )
        for (name, direction), count in list(self.seen.items()):
            way = CLIENT_TO_BROKER if direction == "produce" else BROKER_TO_CLIENT
            family.add_metric([name, way], count)
        yield family

    def describe(self) -> Iterable[CounterMetricFamily]:
        return []


# Up to this many times at once, each is put in its bucket by a search of
# its own; more are sorted first.
_ONE_BY_ONE = 8


class TopicCounts(Collector):
    """Messages and bytes per topic label and direction, as plain integers
    exported at scrape time: a prometheus_client counter's inc() cost more
    than the rest of a read's accounting.

    ``tallies[(label, direction)]``: [messages, bytes].
    """

    def __init__(self) -> None:
        self.tallies: dict[tuple[str, str], list[int]] = {}

    def tally(self, label: str, direction: str) -> list[int]:
        """The [messages, bytes] of a label and direction, to add to."""
        return self.tallies.setdefault((label, direction), [0, 0])

    def collect(self) -> Iterator[CounterMetricFamily]:
        messages = CounterMetricFamily(
            "sluice_topic_messages", "Messages per topic (batches counted by their messages)",
            labels=["topic", "direction"],
        )  # fmt: skip
        sizes = CounterMetricFamily(
            "sluice_topic_bytes", "Bytes of SEND and MESSAGE frames per topic",
            labels=["topic", "direction"],
        )  # fmt: skip
        for (label, direction), (count, size) in list(self.tallies.items()):
            messages.add_metric([label, direction], count)
            sizes.add_metric([label, direction], size)
        yield messages
        yield sizes

    def describe(self) -> Iterable[CounterMetricFamily]:
        return []


class Timer:
    """One child of ``Histograms``: counts per bucket (not cumulative) and the sum."""

    __slots__ = ("_bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self._bounds, seconds)] += 1
        self.total += seconds

    def add(self, counts: Sequence[int], total: float) -> None:
        """Counts per bucket and their sum, counted elsewhere with the same bounds."""
        mine = self.counts
        for bucket, count in enumerate(counts):
            mine[bucket] += count
        self.total += total

    def observe_all(self, seconds: Sequence[float]) -> None:
        counts, bounds = self.counts, self._bounds
        if len(seconds) <= _ONE_BY_ONE:
            for value in seconds:
                # The first bucket whose upper bound is >= value, as Prometheus counts.
                counts[bisect_left(bounds, value)] += 1
        else:
            # A full read's receipts: sorted once, then one search per bucket
            # (the values up to each bound, less those up to the one before)
            # rather than one per value.
            ordered = sorted(seconds)
            below = 0
            for bucket, bound in enumerate(bounds):
                upto = bisect_right(ordered, bound, below)
                counts[bucket] += upto - below
                below = upto
                if below == len(ordered):
                    break
        self.total += sum(seconds)


class Histograms(Collector):
    """A histogram with one label whose values are known up front, kept as
    plain numbers (``Timer``s) and exported as a histogram at scrape time.
    Every child is present from the start, at zero."""

    def __init__(
        self,
        name: str,
        documentation: str,
        label: str,
        values: Iterable[str],
        buckets: tuple[float, ...],
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.label = label
        self.bounds = (*buckets, math.inf)
        self._les = [_le(bound) for bound in self.bounds]
        self.children = {value: Timer(self.bounds) for value in values}

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, timer in self.children.items():
            cumulative = itertools.accumulate(timer.counts)
            family.add_metric([value], list(zip(self._les, cumulative, strict=True)), timer.total)
        yield family

    def describe(self) -> Iterable[HistogramMetricFamily]:
        return []


def label_text(text: str) -> str:
    """``text`` as a label value Prometheus can serve: what a protocol
    decoded with ``surrogateescape`` (bytes that were not UTF-8 on the
    wire: a Cursus topic or error code) gets U+FFFD for those bytes, where
    it would otherwise fail every scrape."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return text


# The longest name (a topic, an error code) a label is given: longer ones,
# which only a client or broker making them up has (a Cursus batch names
# its topic in up to 65,535 bytes), share OTHER_TOPIC, or a hundred of them
# would make every scrape megabytes.
MAX_LABEL_LENGTH = 512


class TopicLabels:
    """At most ``limit`` topics get their own label; the rest share ``other``,
    and are not remembered (a proxy sees any number of topics in its life);
    so do names longer than ``MAX_LABEL_LENGTH``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._known: dict[str, str] = {}

    def __call__(self, topic: str) -> str:
        label = self._known.get(topic)
        if label is None:
            if len(self._known) >= self.limit or len(topic) > MAX_LABEL_LENGTH:
                return OTHER_TOPIC
            label = self._known[topic] = label_text(topic)
        return label


class WithProtocol(Collector):
    """Every metric of ``registry`` with a ``protocol`` label added, at
    scrape time: one proxy fronts one protocol, and dashboards and alerts
    can tell one protocol's proxies from another's by it."""

    def __init__(
        self, registry: CollectorRegistry, protocol: str, before: Callable[[], None]
    ) -> None:
        self.registry = registry
        self.protocol = protocol
        self._before = before

    def collect(self) -> Iterator[Metric]:
        self._before()
        for family in self.registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                labels = {**sample.labels, "protocol": self.protocol}
                out.add_sample(sample.name, labels, sample.value, sample.timestamp,
                               sample.exemplar)  # fmt: skip
            yield out

    def describe(self) -> Iterable[Metric]:
        return []


# sluice_config_refused_timestamp_seconds: while above 0, what Sluice was
# last asked to load (the mounted file, SIGHUP, POST /config/reload) is not
# in force. (SluiceConfigReloadRefused fires on it: a count of refusals
# over a window ended the alert while the refused change still stood.)
REFUSED_HELP = (
    "When the reload that stands refused was refused (Unix time); 0 when none stands: "
    "since start, or since a reload applied a configuration or found it in force"
)
# What a configuration reload came to (sluice_config_reloads_total{outcome}).
RELOAD_OUTCOMES = ("applied", "unchanged", "refused")


class Metrics:
    def __init__(self, topic_limit: int = 100, protocol: ProtocolSpec | None = None) -> None:
        spec = protocol if protocol is not None else get(DEFAULT_PROTOCOL)
        self.protocol = spec.name
        self.registry = registry = CollectorRegistry()
        # What /metrics serves: the registry's metrics, labelled with the protocol.
        self.exposed = CollectorRegistry()
        self.exposed.register(WithProtocol(registry, spec.name, self.absorb))
        self._counted = spec.counted
        if spec.counted is not None:
            self.frames = self._named_frames  # type: ignore[method-assign]
        self.traffic = TrafficCounts(spec.command_name)
        registry.register(self.traffic)
        self.topic_label = TopicLabels(topic_limit)
        self.error_label = TopicLabels(MAX_ERROR_LABELS)

        info = Gauge(
            "sluice_build_info", "Always 1; labels say what is running",
            ["version", "python"], registry=registry,
        )  # fmt: skip
        info.labels(__version__, platform.python_version()).set(1)
        self.connections_active = Gauge(
            "sluice_connections_active", "Client connections open now", ["listener"],
            registry=registry,
        )  # fmt: skip
        self.connections_opened = Counter(
            "sluice_connections_opened", "Client connections accepted", ["listener"],
            registry=registry,
        )  # fmt: skip
        self.connections_closed = Counter(
            "sluice_connections_closed", "Client connections closed, by listener and why",
            ["listener", "reason"], registry=registry,
        )  # fmt: skip
        self.sessions = Counter(
            "sluice_sessions", "Connections by what the client used them for",
            ["kind"], registry=registry,
        )  # fmt: skip
        self.connections_rejected = Counter(
            "sluice_connections_rejected",
            "Connections refused or dropped before relaying, by reason",
            ["reason"], registry=registry,
        )  # fmt: skip
        self.auth = Counter(
            "sluice_auth", "Clients authenticated by Sluice itself (--auth-mode proxy), by "
            "method and outcome (ok, failed, refreshed, expired)",
            ["method", "outcome"], registry=registry,
        )  # fmt: skip
        self.validation_failures = Counter(
            "sluice_validation_failures", "Invalid frames, by problem and direction",
            ["kind", "direction"], registry=registry,
        )  # fmt: skip
        self.lookups = Counter(
            "sluice_lookups", "Topic lookups by outcome (answered, redirected, failed, rejected)",
            ["outcome"], registry=registry,
        )  # fmt: skip
        self.broker_errors = Counter(
            "sluice_broker_errors", "Failures brokers answered with, by request and ServerError",
            ["command", "error"], registry=registry,
        )  # fmt: skip
        self.request_duration = Histograms(
            "sluice_request_duration_seconds",
            "Request to answer, as seen at the proxy (broker plus network time)",
            "command", spec.timed,
            _LATENCY_BUCKETS,
        )  # fmt: skip
        registry.register(self.request_duration)
        self.lookup_duration = Histogram(
            "sluice_lookup_duration_seconds",
            "Lookups the proxy answered: total, and the part spent waiting on the upstream",
            ["part"], buckets=_LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.relay_delay = Histograms(
            "sluice_relay_delay_seconds", "Proxy's own time from reading a chunk to writing it on",
            "direction", DIRECTIONS, _RELAY_BUCKETS,
        )  # fmt: skip
        registry.register(self.relay_delay)
        self.topics = TopicCounts()
        registry.register(self.topics)
        # (topic, direction) -> its label's tally in self.topics.
        self._topic_tallies: dict[tuple[str, str], list[int]] = {}
        self.upstream_dial = Histogram(
            "sluice_upstream_dial_seconds", "Connecting to a broker, TLS and handshake included",
            buckets=_LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.upstream_dial_failures = Counter(
            "sluice_upstream_dial_failures", "Broker connections that could not be made",
            registry=registry,
        )  # fmt: skip
        self.faults_injected = Counter(
            "sluice_faults_injected", "Frames a fault rule acted on, by rule id and action",
            ["rule", "action"], registry=registry,
        )  # fmt: skip
        self.filter_errors = Counter(
            "sluice_filter_errors", "Messages a filter raised on (it then failed open or "
            "closed, as configured), by filter", ["filter"], registry=registry,
        )  # fmt: skip
        self.filter_rejected = Counter(
            "sluice_filter_rejected", "Messages a filter refused (a SEND answered with "
            "SEND_ERROR, a delivery skipped), by filter, topic and reason",
            ["filter", "topic", "reason", "direction"], registry=registry,
        )  # fmt: skip
        self.filter_replaced = Counter(
            "sluice_filter_replaced",
            "Messages a filter changed (encryption and decryption included), by filter "
            "and direction",
            ["filter", "direction"], registry=registry,
        )  # fmt: skip
        self._replaced: dict[tuple[str, bool], Any] = {}
        # sluice_filter_messages_total: the filters count into filter_seen.
        self._filter_messages = FilterMessages()
        registry.register(self._filter_messages)
        self.filter_seen = self._filter_messages.seen
        self.reloads = Counter(
            "sluice_config_reloads", "Configuration reloads, by outcome (applied, unchanged, "
            "refused)", ["outcome"], registry=registry,
        )  # fmt: skip
        self._generation = Gauge(
            "sluice_config_generation", "The configuration generation in force (1 at start)",
            registry=registry,
        )  # fmt: skip
        self._loaded = Gauge(
            "sluice_config_loaded_timestamp_seconds",
            "When the configuration in force was loaded (Unix time)", registry=registry,
        )  # fmt: skip
        self.config_refused = Gauge(
            "sluice_config_refused_timestamp_seconds", REFUSED_HELP, registry=registry
        )
        self.upstream_up = Gauge(
            "sluice_upstream_up", "1 when the configured broker answered the last probe",
            registry=registry,
        )  # fmt: skip
        self._recorder_figures = RecorderFigures()
        registry.register(self._recorder_figures)
        self._relay_figures = RelayThreadFigures()
        registry.register(self._relay_figures)

        # Children bound once, for the per-request paths, and per connection.
        self._request_timers = self.request_duration.children
        self._listeners: dict[str, tuple[Any, Any]] = {}
        self._closed: dict[tuple[str, str], Any] = {}
        self._sessions: dict[str, Any] = {}
        self.relay_delay_by_direction = self.relay_delay.children
        # What compiled relay steps count in place of this tap (Taps.figures),
        # with the same buckets; folded in by absorb().
        self.figures: Any = None
        if _Figures is not None:
            self.figures = _Figures(
                list(self.request_duration.bounds), list(self.relay_delay.bounds)
            )
        for reason in (
            "limit", "relay_refused", "untrusted_broker", "handshake_timeout", "handshake", "tls",
            "sni_unknown", "sni_invalid", *(f"proxy_header_{r}" for r in HEADER_REFUSALS),
            *spec.rejections,
        ):  # fmt: skip
            self.connections_rejected.labels(reason)
        for outcome in ("answered", "redirected", "failed", "rejected"):
            self.lookups.labels(outcome)
        # Present from the start at zero: increase() and rate() need a sample
        # before the first failure, or alerts miss it.
        for problem in Problem:
            for direction in DIRECTIONS:
                self.validation_failures.labels(problem.value, direction)
        for part in ("total", "upstream"):
            self.lookup_duration.labels(part)
        for outcome in RELOAD_OUTCOMES:  # SluiceConfigReloadRefused's first refusal
            self.reloads.labels(outcome)

    def filters_configured(self, names: Iterable[str]) -> None:
        """Each configured filter's error count, present at zero from the
        start (or the reload that adds it): SluiceFilterRaising's increase()
        needs a sample before the first error, or it misses it."""
        for name in names:
            self.filter_errors.labels(name)

    # --- the tap -------------------------------------------------------------

    def frames(self, conn: Conn, from_client: bool, frames: Sequence[Any]) -> None:
        counts = self.traffic.frames[from_client]
        sizes = self.traffic.bytes[from_client]
        if type(frames) is not list:
            # A batch the compiled scanner counted: (type, frames, bytes) each.
            tallied: list[tuple[int, int, int]] | None = getattr(frames, "counts", None)
            if tallied is not None:
                for t, n, size in tallied:
                    slot = t if t < TYPE_SLOTS else 0
                    counts[slot] += n
                    sizes[slot] += size
                return
        for frame in frames:
            t = frame.type
            slot = t if t < TYPE_SLOTS else 0
            counts[slot] += 1
            sizes[slot] += len(frame.raw)

    def _named_frames(self, conn: Conn, from_client: bool, frames: Sequence[Any]) -> None:
        """``frames`` for protocols whose commands are names."""
        named = self.traffic.named
        counted = self._counted
        assert counted is not None
        for frame in frames:
            name = frame.name
            tally = named.get((from_client, name))
            if tally is None:
                # Unknown words stay one label: a client cannot grow the series.
                name = name if name in counted else "UNKNOWN"
                tally = named.setdefault((from_client, name), [0, 0])
            tally[0] += 1
            tally[1] += len(frame.raw)

    def event(self, conn: Conn | None, event: Event) -> None:
        kind = type(event)
        # The most frequent first: one Relayed per read.
        if kind is Relayed:
            assert isinstance(event, Relayed)
            self.relay_delay_by_direction[DIRECTION[event.from_client]].observe(event.seconds)
        elif kind is Answered:
            assert isinstance(event, Answered)
            timer = self._request_timers.get(event.request)
            if timer is not None:
                timer.observe(event.seconds)
            if event.error is not None:
                self.broker_errors.labels(event.request, self.error_label(event.error)).inc()
        elif kind is AnsweredMany:
            assert isinstance(event, AnsweredMany)
            timer = self._request_timers.get(event.request)
            if timer is not None:
                timer.observe_all(event.seconds)
        elif kind is TopicTraffic:
            assert isinstance(event, TopicTraffic)
            self.topic_traffic(
                event.topic, DIRECTION[event.from_client], event.messages, event.size
            )
        elif kind is Accepted:
            assert conn is not None
            opened, active = self._listener(conn.listener)
            opened.inc()
            active.inc()
        elif kind is Closed:
            assert conn is not None
            assert isinstance(event, Closed)
            reason = event.reason if event.reason in CLOSE_REASONS else "error"
            closed = self._closed.get((conn.listener, reason))
            if closed is None:
                closed = self.connections_closed.labels(conn.listener, reason)
                self._closed[(conn.listener, reason)] = closed
            closed.inc()
            self._listener(conn.listener)[1].dec()
        elif kind is Opened:
            assert conn is not None
            session = self._sessions.get(conn.kind)
            if session is None:
                session = self._sessions[conn.kind] = self.sessions.labels(conn.kind)
            session.inc()
        elif kind is Rejected:
            assert isinstance(event, Rejected)
            self.connections_rejected.labels(event.reason).inc()
        elif kind is Authenticated:
            assert isinstance(event, Authenticated)
            method = event.method if event.method in AUTH_METHODS else "other"
            self.auth.labels(method, event.outcome).inc()
        elif kind is Invalid:
            assert isinstance(event, Invalid)
            self.validation_failures.labels(event.problem, DIRECTION[event.from_client]).inc()
        elif kind is LookupDone:
            assert isinstance(event, LookupDone)
            self.lookups.labels(event.outcome).inc()
            if event.outcome in ("answered", "failed"):
                self.lookup_duration.labels("total").observe(event.total)
                self.lookup_duration.labels("upstream").observe(event.upstream)
        elif kind is FaultInjected:
            assert isinstance(event, FaultInjected)
            self.faults_injected.labels(event.rule, event.action).inc()
        elif kind is Filtered:
            assert isinstance(event, Filtered)
            if event.action == "error":
                self.filter_errors.labels(event.filter).inc()
            elif event.action == "rejected":
                topic = self.topic_label(event.topic) if event.topic else ""
                direction = DIRECTION[event.from_client]
                self.filter_rejected.labels(event.filter, topic, event.reason, direction).inc(
                    event.messages
                )
            else:  # replaced, encrypted, decrypted: messages changed
                key = (event.filter, event.from_client)
                child = self._replaced.get(key)
                if child is None:  # labels() once per filter and direction, not per frame
                    child = self.filter_replaced.labels(event.filter, DIRECTION[event.from_client])
                    self._replaced[key] = child
                child.inc(event.messages)
        elif kind is Dialed:
            assert isinstance(event, Dialed)
            if event.seconds is None:
                self.upstream_dial_failures.inc()
            else:
                self.upstream_dial.observe(event.seconds)

    def absorb(self) -> None:
        """Fold in what compiled relay steps counted since the last time
        (``figures``); every scrape does this first."""
        if self.figures is None:
            return
        frames, topics, answered, relay = self.figures.take()
        for from_client, t, count, size in frames:
            slot = t if t < TYPE_SLOTS else 0
            self.traffic.frames[from_client][slot] += count
            self.traffic.bytes[from_client][slot] += size
        for topic, from_client, messages, size in topics:
            self.topic_traffic(topic, DIRECTION[from_client], messages, size)
        for request, counts, total in answered:
            timer = self._request_timers.get(request)
            if timer is not None:
                timer.add(counts, total)
        for from_client, counts, total in relay:
            self.relay_delay_by_direction[DIRECTION[from_client]].add(counts, total)
        for name, messages in self.figures.take_sealed():  # encrypted on the compiled path
            self.filter_replaced.labels(name, DIRECTION[True]).inc(messages)
        named = self.traffic.named
        for from_client, name, count, size in self.figures.take_named():  # Cursus
            tally = named.setdefault((from_client, name), [0, 0])
            tally[0] += count
            tally[1] += size

    def _listener(self, listener: str) -> tuple[Any, Any]:
        """A listener's opened and active children, bound once: ``labels()``
        costs more than the increment, and every connection needs them."""
        found = self._listeners.get(listener)
        if found is None:
            found = (self.connections_opened.labels(listener),
                     self.connections_active.labels(listener))  # fmt: skip
            self._listeners[listener] = found
        return found

    def topic_traffic(self, topic: str, direction: str, messages: int, size: int) -> None:
        tally = self._topic_tallies.get((topic, direction))
        if tally is None:
            # Its label's tally: a topic past the label limit adds to "other",
            # and is not kept here (only topics with their own label are).
            label = self.topic_label(topic)
            tally = self.topics.tally(label, direction)
            if label != OTHER_TOPIC:
                self._topic_tallies[(topic, direction)] = tally
        tally[0] += messages
        tally[1] += size

    def generation(self, generation: Any) -> None:
        """The configuration in force (a ``reload.Generation``)."""
        self._generation.set(generation.number)
        self._loaded.set(generation.loaded_at)

    def watch(self, recorder: Recorder) -> None:
        """Export the recorder's figures (read at scrape time)."""
        self._recorder_figures.recorder = recorder

    def watch_relay(self, thread: RelayThread | None) -> None:
        """Export the relay thread's figures (read at scrape time)."""
        self._relay_figures.thread = thread


class RelayThreadFigures(Collector):
    """The relay thread's own figures, as sluice_relay_thread_* metrics."""

    def __init__(self) -> None:
        self.thread: RelayThread | None = None  # zero while there is none
        # The most python reads a scrape has said: see _reads.
        self._python_said = 0

    def collect(self) -> Iterator[Any]:
        t = self.thread
        yield GaugeMetricFamily(
            "sluice_relay_thread_carried",
            "Connection directions the relay thread reads now (two per established "
            "plain-TCP connection, less those handed back to trio for the moment)",
            value=t.carried() if t else 0,
        )
        yield CounterMetricFamily(
            "sluice_relay_thread_handbacks",
            "Times the relay thread handed a direction back to trio: an action other than a "
            "write, the end of a connection, a write the Python read step could not finish",
            value=t.handed_back if t else 0,
        )
        yield CounterMetricFamily(
            "sluice_relay_thread_write_waits",
            "Writes the relay thread waited to finish itself, reading nothing more from "
            "their source meanwhile: a socket that did not take a write whole (a slow reader)",
            value=t.write_waits if t else 0,
        )
        parked = CounterMetricFamily(
            "sluice_relay_thread_connections",
            "Client connections the relay thread served from their first byte, with no trio "
            "task (a protocol whose clients connect per request: Cursus), by where they ended: "
            "thread (there), or trio (handed over: they lived on, or needed trio)",
            labels=["ended"],
        )
        parked.add_metric(["thread"], t.parked_ended if t else 0)
        parked.add_metric(["trio"], t.parked_adopted if t else 0)
        yield parked
        yield from self._reads(t)

    def _reads(self, t: RelayThread | None) -> Iterator[CounterMetricFamily]:
        reads = CounterMetricFamily(
            "sluice_relay_thread_reads",
            "Reads the relay thread carried, by how: compiled (by its compiled loop alone, "
            "with no Python code) or python (through the relay's Python read step)",
            labels=["path"],
        )
        compiled = t.compiled_runs if t else 0
        # All reads less the compiled ones, both counted by the relay thread
        # while this runs: a read counted between the two (or in all reads
        # before it is counted as compiled) makes this one too high and the
        # next lower, and Prometheus takes a counter that goes down for a
        # restart (an increase of its whole value). Never less than said.
        python = max(self._python_said, (t.steps_run - compiled) if t else 0)
        self._python_said = python
        reads.add_metric(["compiled"], compiled)
        reads.add_metric(["python"], python)
        yield reads

    def describe(self) -> Iterable[Any]:
        return []


class RecorderFigures(Collector):
    """The recorder's own counters, as sluice_recorder_* metrics."""

    def __init__(self) -> None:
        self.recorder: Recorder | None = None  # all zero while recording is off

    def collect(self) -> Iterator[Any]:
        r = self.recorder
        yield CounterMetricFamily(
            "sluice_recorder_frames", "Frames written to recordings",
            value=r.frames_written if r else 0,
        )  # fmt: skip
        yield CounterMetricFamily(
            "sluice_recorder_bytes", "Bytes written to recording files",
            value=r.bytes_written if r else 0,
        )  # fmt: skip
        yield CounterMetricFamily(
            "sluice_recorder_failures",
            "Episodes of disk trouble (unwritable or full) while recording",
            value=r.failures_total if r else 0,
        )
        yield CounterMetricFamily(
            "sluice_recorder_dropped_frames",
            "Frames not recorded because the writer fell behind or failed",
            value=r.dropped_total if r else 0,
        )
        yield CounterMetricFamily(
            "sluice_recorder_removed_files",
            "Recording files removed to keep --record-retain-bytes / --record-retain-age",
            value=r.removed_files_total if r else 0,
        )
        yield CounterMetricFamily(
            "sluice_recorder_removed_bytes", "Bytes of the recording files removed by retention",
            value=r.removed_bytes_total if r else 0,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "sluice_recorder_ring_bytes",
            "Bytes the flight recorder's ring holds in memory (--record-ring)",
            value=r.ring_bytes if r else 0,
        )
        snapshots = CounterMetricFamily(
            "sluice_snapshots", "Flight-recorder snapshots written, by reason (on_demand, or "
            "the --snapshot-on rule that fired)", labels=["reason"],
        )  # fmt: skip
        for reason, count in sorted((r.snapshots_total if r else {}).items()):
            snapshots.add_metric([reason], count)
        yield snapshots
        yield GaugeMetricFamily(
            "sluice_recorder_queue_frames", "Frames waiting for the recording writer",
            value=r.queued if r else 0,
        )  # fmt: skip

    def describe(self) -> Iterable[Any]:
        return []


# The HTTP listener's latency buckets: admin calls (topic creation, policies
# written to the metadata store) take longer than frames; up to the default
# --http-request-timeout (300 s), when Sluice answers 504.
_HTTP_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
# Why the HTTP listener answered a request itself, or refused a connection.
HTTP_REFUSALS = (
    "malformed", "header_too_large", "body_too_large", "connection_limit", "timeout",
    "upstream_unreachable", "upstream_error", "redirects", "upgrade", "unauthorized",
    "fault", "filtered",
)  # fmt: skip


class HttpMetrics:
    """The HTTP listener's metrics (``--http-listen``), in the proxy's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "sluice_http_requests", "HTTP requests answered, by kind (admin, lookup, websocket, "
            "other) and status class (2xx, 4xx, ...)", ["kind", "status"], registry=registry,
        )  # fmt: skip
        self.duration = Histogram(
            "sluice_http_request_duration_seconds",
            "HTTP request read to answer written, redirects followed included, by kind",
            ["kind"], buckets=_HTTP_BUCKETS, registry=registry,
        )  # fmt: skip
        self.redirects = Counter(
            "sluice_http_redirects_followed", "Broker redirects (307/308) Sluice followed itself",
            registry=registry,
        )  # fmt: skip
        self.bytes = Counter(
            "sluice_http_bytes", "Bytes read from and written to HTTP clients, by direction",
            ["direction"], registry=registry,
        )  # fmt: skip
        self.refused = Counter(
            "sluice_http_refused", "HTTP requests Sluice answered itself with an error, and "
            "connections it refused, by reason", ["reason"], registry=registry,
        )  # fmt: skip
        self.active = Gauge(
            "sluice_http_connections_active", "HTTP client connections open now",
            registry=registry,
        )  # fmt: skip
        for kind in KINDS:
            self.duration.labels(kind)
            for status in STATUS_CLASSES:
                self.requests.labels(kind, status)
        for direction in DIRECTIONS:
            self.bytes.labels(direction)
        for reason in HTTP_REFUSALS:
            self.refused.labels(reason)
        self.bytes_in = self.bytes.labels(CLIENT_TO_BROKER)
        self.bytes_out = self.bytes.labels(BROKER_TO_CLIENT)
        # The WebSocket API (sluice/proxy/websocket.py), after the upgrade.
        self.ws_sessions = Counter(
            "sluice_http_websocket_sessions", "WebSocket sessions relayed (the broker answered "
            "101)", registry=registry,
        )  # fmt: skip
        self.ws_active = Gauge(
            "sluice_http_websocket_sessions_active", "WebSocket sessions open now",
            registry=registry,
        )  # fmt: skip
        self.ws_ended = Counter(
            "sluice_http_websocket_sessions_ended", "WebSocket sessions ended, by how (closed, "
            "hangup, or why Sluice ended them)", ["reason"], registry=registry,
        )  # fmt: skip
        self.ws_frames = Counter(
            "sluice_http_websocket_frames", "Whole WebSocket frames relayed, by direction and "
            "opcode (text, binary, close, ping, pong)", ["direction", "opcode"], registry=registry,
        )  # fmt: skip
        self.ws_messages = Counter(
            "sluice_http_websocket_messages", "Whole WebSocket data messages relayed, by "
            "direction", ["direction"], registry=registry,
        )  # fmt: skip
        self.ws_bytes = Counter(
            "sluice_http_websocket_bytes", "Bytes relayed after WebSocket upgrades (frames as "
            "they came), by direction", ["direction"], registry=registry,
        )  # fmt: skip
        for direction in DIRECTIONS:
            self.ws_messages.labels(direction)
            self.ws_bytes.labels(direction)
            for opcode in OPCODES:
                self.ws_frames.labels(direction, opcode)
        for ending in ENDINGS:
            self.ws_ended.labels(ending)
