"""The protocols Sluice speaks, each described once by its own package.

A protocol package (``sluice/protocols/<name>/``) holds a ``ProtocolSpec`` in
its ``spec.py``: its name, URL schemes and default port, what fault rules may
name, which commands are timed and counted, its own proxy settings, how its
frames read in a capture, and where its I/O-level parts are (backend,
summarizer, recording loader, replay, serve). Everything above
``sluice/protocols/`` asks this registry for what differs and never names a
protocol; it is asked at set-up, never per frame.

Protocol packages are layer 1 (no trio, nothing above them), so the parts of
a protocol that do I/O or build on ``sluice.recording`` are named here as
``"module:attr"`` strings, imported on first use by ``ProtocolSpec.load``.

Protocols come from two places: the table below (the ones that ship with
Sluice) and the entry points of group ``sluice.protocols`` of any installed
distribution, each a ``ProtocolSpec``. A name given twice is an error.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from sluice.errors import ConfigError
from sluice.protocols.faults import ProtocolFaults
from sluice.protocols.urls import BrokerUrl

ENTRY_POINT_GROUP = "sluice.protocols"

# The registry's table: the protocols that ship with Sluice, the first the
# default (a bare host:port broker, a recording that names none).
BUILTIN = ("sluice.protocols.pulsar.spec:PROTOCOL", "sluice.protocols.cursus.spec:PROTOCOL")
DEFAULT_PROTOCOL = "pulsar"


@dataclass(frozen=True)
class Option:
    """One of a protocol's own ``sluice proxy`` flags: its flags and the
    keywords of ``argparse``'s ``add_argument`` (``dest`` names the
    ``ProxyConfig`` field it fills; its default is that field's)."""

    flags: tuple[str, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProtocolSpec:
    """What makes a protocol a protocol, for the parts of Sluice above it."""

    name: str
    title: str  # how people write it: "Pulsar"
    # URL schemes: (plain, TLS); a bare host:port is the plain one.
    schemes: tuple[str, str]
    default_port: int
    parse_url: Callable[..., BrokerUrl]  # (text, *, what) -> BrokerUrl
    # What fault rules and --snapshot-on triggers may name.
    faults: ProtocolFaults
    # Requests whose answer time is a metric (sluice_request_duration_seconds).
    timed: tuple[str, ...]
    # Frames are counted by name (a frame's ``name``) when this is given, the
    # names outside it as UNKNOWN; otherwise by number (a frame's ``type``),
    # named for metrics by ``command_name``.
    counted: frozenset[str] | None
    command_name: Callable[[int], str] | None
    # Frames that carry messages, counted in a summary's ``msgs``
    # (sluice analyze's per-topic message counts).
    messages: frozenset[str]
    # A recorded frame's bytes decoded again, (raw, from_client) -> frame
    # (never raises: a frame that does not decode carries its error).
    decode: Callable[[bytes, bool], Any]
    # --- I/O-level parts, "module:attr", imported on use -------------------
    # (config, services) -> the proxy's ``Backend`` (sluice/proxy/backend.py).
    backend: str
    # async (config) -> None when the broker answers, else why not:
    # sluice proxy's startup check (sluice.proxy.backend.check_reachable: a
    # TCP connect).
    check_broker: str
    # (payload policy) -> the recorder's ``Summarizer`` (None: frames are
    # summarized by their ``name`` alone, sluice.recording.format.NamedFrames).
    summarizer: str | None = None
    # () -> what fills in, as a recording is read, the summaries of frames
    # the summarizer wrote without one: ``opened(conn record)``,
    # ``closed(close record)``, ``fill(frame record)`` (None: every frame
    # record has its summary).
    summaries: str | None = None
    # --- pure parts ----------------------------------------------------------
    # The protocol's own flags, in a group of their own (its title, else the
    # protocol's name, and what the group is about).
    # A publish and the frames that answer it, paired by (producer id,
    # sequence id) rather than by request id: sluice analyze's latencies.
    publish: tuple[str, frozenset[str]] | None = None
    options: tuple[Option, ...] = ()
    options_title: str = ""
    options_help: str = ""
    # Checks of a ProxyConfig (any object with its fields) for this protocol.
    check: Callable[[Any], None] | None = None
    # Clients find brokers by addresses inside answers, each broker reached
    # through a listener of its own (port-per-broker, sluice/proxy/ports.py),
    # which speaks what the main listener (the first of --listen,
    # --listen-tls) speaks unless the backend asks for the other kind;
    # --listener-ports and --broker-ports-file apply.
    port_per_broker: bool = False
    # With port_per_broker: the main listener stands for the configured
    # broker, so the proxy listens one way only (plain or TLS), as the
    # per-broker listeners do. False: the main listener serves clients the
    # protocol's own way (Pulsar's: lookups), and only the brokers answers
    # name get listeners (Pulsar's: those its HTTP lookups name, so only
    # with --http-listen).
    main_is_broker_listener: bool = True
    # Its brokers also serve a web port (an admin REST API, HTTP lookups)
    # that sluice proxy --http-listen relays (sluice/proxy/http.py).
    web: bool = False
    # How a capture of this protocol reads in Wireshark (its pcapng comment).
    pcap_note: str = ""
    # A recorded frame's bytes as they stand alone on the wire, for the
    # pcapng export: a frame recorded cut where its payload starts has its
    # framing made to say so. None: recorded bytes always stand alone.
    standalone: Callable[[bytes], bytes] | None = None
    # Its cores run message filters (--filter, sluice/filters/) on the
    # messages its frames carry; otherwise a proxy with filters refuses to start.
    filters: bool = False
    # Why its cores refuse connections, besides the reasons every core has
    # (labels of sluice_connections_rejected_total, present from the start).
    rejections: tuple[str, ...] = ()
    # sluice record anonymize: "module:attr" of a pair (frame, summary): the
    # frame's bytes with its names replaced, cut where its payload starts,
    # and the payload it held ((raw, Pseudonyms) -> (bytes, payload | None)
    # | None when it does not parse); a summary with its names replaced. None:
    # its captures cannot be anonymized.
    anonymize: str | None = None
    # A recorded frame's bytes decoded for sluice view's frame detail, (raw,
    # the row shown, its file's ``decode_with``) -> what to show.
    detail: Callable[[bytes, dict[str, Any], Callable[[bytes, bool], Any]], Any] | None = None
    # What the protocol's frames decode with besides their bytes, taken from
    # a proxy's settings, (ProxyConfig) -> {name: value} (JSON types), kept
    # in a recording's header (``decoding``) so that its readers decode as
    # the proxy did: Cursus's broker-wide compression. None, or {}: nothing.
    recorded: Callable[[Any], dict[str, Any]] | None = None
    # ``decode`` with those settings, (the header's ``decoding``) -> (raw,
    # from_client) -> frame; None: ``decode`` whatever they say.
    decoder: Callable[[Mapping[str, Any]], Callable[[bytes, bool], Any]] | None = None
    # sluice replay: (args, say) -> (Outcome, transcript lines), async;
    # sluice serve: (recording path, Listening) -> Report, async (the
    # types are sluice.replay's: outcome.py, serve.py).
    replay: str | None = None
    serve: str | None = None

    def load(self, ref: str) -> Any:
        """The object a ``"module:attr"`` reference names."""
        return load(ref)

    def decode_with(self, settings: Mapping[str, Any] | None) -> Callable[[bytes, bool], Any]:
        """``decode`` for the frames of a recording whose header says
        ``settings`` (its ``decoding``; missing in older recordings: None)."""
        if self.decoder is None or not settings:
            return self.decode
        return self.decoder(settings)

    def url(self, text: str, *, what: str) -> BrokerUrl:
        return self.parse_url(text, what=what)


def load(ref: str) -> Any:
    """The object a ``"module:attr"`` reference names, imported now."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _resolve(ref: str) -> ProtocolSpec:
    spec = load(ref)
    if not isinstance(spec, ProtocolSpec):
        raise ConfigError(f"protocol {ref}: not a ProtocolSpec")
    return spec


@functools.cache
def protocols() -> dict[str, ProtocolSpec]:
    """Every protocol known, by name: the built-ins, then the entry points'."""
    found: dict[str, ProtocolSpec] = {}
    installed = [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]
    for ref in [*BUILTIN, *(ref for ref in installed if ref not in BUILTIN)]:
        spec = _resolve(ref)
        if spec.name in found:
            raise ConfigError(f"protocol {spec.name!r} is registered twice ({ref})")
        found[spec.name] = spec
    return found


def refresh() -> None:
    """Forget what was found: the next call looks at the entry points again."""
    protocols.cache_clear()


def get(name: str) -> ProtocolSpec:
    known = protocols()
    spec = known.get(name)
    if spec is None:
        raise ConfigError(f"--protocol must be one of {', '.join(known)}, not {name!r}")
    return spec


def names() -> tuple[str, ...]:
    return tuple(protocols())


def by_url(text: str) -> ProtocolSpec:
    """The protocol a broker URL's scheme names (a bare host:port: the default)."""
    scheme, sep, _ = text.strip().partition("://")
    if sep:
        for spec in protocols().values():
            if scheme in spec.schemes:
                return spec
    return get(DEFAULT_PROTOCOL)


def message_commands() -> frozenset[str]:
    """Every protocol's frames that carry messages (``ProtocolSpec.messages``)."""
    return frozenset().union(*(spec.messages for spec in protocols().values()))


def publishes() -> tuple[tuple[str, ...], frozenset[str]]:
    """Every protocol's publishing commands (``ProtocolSpec.publish``), in a
    fixed order, and the commands that answer them."""
    pairs = sorted(spec.publish for spec in protocols().values() if spec.publish is not None)
    return tuple(name for name, _ in pairs), frozenset().union(*(a for _, a in pairs))


def prepare_reading() -> None:
    """Import now what reading any protocol's recordings takes (its entry and
    ``summaries``): for a process that reads in a thread while it answers,
    so that the first answers do not wait on imports."""
    for spec in protocols().values():
        if spec.summaries is not None:
            spec.load(spec.summaries)


def all_faults() -> dict[str, ProtocolFaults]:
    """What fault rules may name, by protocol (and "http", the web port of
    the protocols that have one)."""
    found = {name: spec.faults for name, spec in protocols().items()}
    if any(spec.web for spec in protocols().values()):
        from sluice.protocols.http import HTTP_FAULTS  # a web port's own rules

        found[HTTP_FAULTS.name] = HTTP_FAULTS
    return found


def web_redaction() -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """What takes the credentials out of a recorded web exchange (an ``http``
    record), for the protocols that have a web port; None without one."""
    if not any(spec.web for spec in protocols().values()):
        return None
    from sluice.protocols.http.anonymize import redacted_record  # the web port's own

    return redacted_record
