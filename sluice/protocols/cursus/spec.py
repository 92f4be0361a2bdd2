"""Cursus as the registry knows it (``sluice.protocols.registry``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from sluice.errors import ConfigError
from sluice.protocols.cursus.batch import Batch
from sluice.protocols.cursus.commands import KNOWN
from sluice.protocols.cursus.compression import Compression
from sluice.protocols.cursus.decoder import decode_frame
from sluice.protocols.cursus.frame import DEFAULT_PORT, Frame
from sluice.protocols.cursus.urls import SCHEMES, parse_cursus_url
from sluice.protocols.faults import ProtocolFaults
from sluice.protocols.registry import Option, ProtocolSpec

# What fault rules may name for Cursus: its commands and replies, and the
# ERROR: codes an ``error`` rule answers with (NOT_LEADER first: the
# "leader moved" recipe).
CURSUS_FAULTS = ProtocolFaults(
    "cursus",
    frozenset(KNOWN) | {"BATCH", "OK", "ERROR", "ACK", "STREAM_CONTROL", "KEEPALIVE", "MESSAGE"},
    ("NOT_LEADER", "NOT_COORDINATOR", "GEN_MISMATCH", "OFFSET_OUT_OF_RANGE", "decode_failed",
     "malformed_input", "topic_not_found", "topic_not_assigned_to_group"),
)  # fmt: skip

# Requests whose latency is tracked (replies come in request order): every
# command the broker knows, so that each request the client sends (the
# event store's and the admin ones too) has its series.
TIMED_COMMANDS = (
    "CREATE",
    "DELETE",
    "LIST",
    "PUBLISH",
    "METADATA",
    "FIND_COORDINATOR",
    "BATCH",
    "CONSUME",
    "STREAM",
    "JOIN_GROUP",
    "SYNC_GROUP",
    "HEARTBEAT",
    "LEAVE_GROUP",
    "COMMIT_OFFSET",
    "BATCH_COMMIT",
    "FETCH_OFFSET",
    "APPEND_STREAM",
    "READ_STREAM",
    "SAVE_SNAPSHOT",
    "READ_SNAPSHOT",
    "STREAM_VERSION",
)

OPTIONS = (
    Option(
        ("--max-frame-size",),
        {
            "type": int,
            "dest": "max_frame_size",
            "metavar": "BYTES",
            "help": "largest frame a Cursus client may send (the broker's own limit; "
            "its spec says 64 MiB)",
        },
    ),
    Option(
        ("--broker-compression",),
        {
            "choices": [c.value for c in Compression],
            "dest": "broker_compression",
            "help": "the compression the Cursus broker applies to every frame it receives "
            "(its broker-wide setting)",
        },
    ),
)


def check(config: Any) -> None:
    """What a Cursus proxy cannot do."""
    if config.auth_mode != "passthrough":
        raise ConfigError("--auth-mode proxy is for Pulsar: a Cursus broker has no proxy roles")


def decode(raw: bytes, from_client: bool) -> Frame:
    """A recorded frame, decoded again (never raises: a frame that does not
    decode carries its error)."""
    return decode_frame(raw, from_client=from_client)


def recorded(config: Any) -> dict[str, Any]:
    """What a recording's header keeps for its frames to decode as the proxy
    decoded them: the broker-wide compression, when there is one."""
    compression = Compression.parse(getattr(config, "broker_compression", None) or "none")
    return {} if compression is Compression.NONE else {"compression": compression.value}


def decoder(settings: Mapping[str, Any]) -> Callable[[bytes, bool], Frame]:
    """``decode`` for a recording whose header says ``settings`` (its
    ``decoding``): client frames decompressed with its ``compression``
    (missing: none). A value this Sluice does not know decodes as none (its
    client frames then carry their errors)."""
    try:
        compression = Compression.parse(str(settings.get("compression") or "none"))
    except ValueError:
        compression = Compression.NONE

    def decode_compressed(raw: bytes, from_client: bool) -> Frame:
        return decode_frame(raw, from_client=from_client, compression=compression)

    return decode_compressed


def detail(raw: bytes, out: dict[str, Any], decode: Callable[[bytes, bool], Frame]) -> Any:
    """A recorded frame for sluice view: its text (a command without its
    envelope's topic bytes), and what it decodes to: a command's or a
    reply's fields, a batch's header and messages (payloads cut at 2000
    bytes, shown as text). ``out["dir"]`` says who sent it; ``decode``
    decodes as the proxy did (its recording's broker compression)."""
    if not raw:
        return {"text": ""}
    frame = decode(raw, out.get("dir") != "B→C")
    shown: dict[str, Any] = {}
    message: Any = frame.message if frame.error is None or frame.head is None else None
    if isinstance(message, Batch):
        shown["batch"] = _fields(message, messages=False)
        shown["batch"]["messages"] = [_fields(m) for m in message.messages[:_MESSAGES]]
        if len(message.messages) > _MESSAGES:
            shown["batch"]["messages_cut"] = len(message.messages)
        return shown
    body = frame.body
    if frame.envelope is not None:  # [u16 length][topic][command]: the command
        shown["envelope"] = frame.envelope
        body = body[2 + len(frame.envelope.encode("utf-8", "surrogateescape")) :]
    text = body[:2000].decode("utf-8", errors="replace")
    shown["text"] = "".join(c if c.isprintable() else "·" for c in text)
    if dataclasses.is_dataclass(message) and not isinstance(message, type):
        shown["fields"] = _fields(message)
    if frame.error is not None:
        shown["invalid"] = frame.error.message
    return shown


_MESSAGES = 100


def _fields(value: Any, messages: bool = True) -> dict[str, Any]:
    """A decoded command, reply, batch or message as JSON can show it."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(value):
        item = getattr(value, field.name)
        if field.name == "messages" and not messages:
            continue
        if isinstance(item, bytes):
            text = item[:2000].decode("utf-8", errors="replace")
            item = {"size": len(item), "text": text, "cut": len(item) > 2000}
        elif isinstance(item, tuple):
            item = [list(i) if isinstance(i, tuple) else i for i in item]
        elif not isinstance(item, str | int | float | bool | None):
            item = str(item)
        out[field.name] = item
    return out


PROTOCOL = ProtocolSpec(
    name="cursus",
    title="Cursus",
    schemes=SCHEMES,
    default_port=DEFAULT_PORT,
    parse_url=parse_cursus_url,
    faults=CURSUS_FAULTS,
    timed=TIMED_COMMANDS,
    counted=CURSUS_FAULTS.commands | {"INVALID"},
    messages=frozenset({"BATCH"}),
    command_name=None,
    decode=decode,
    recorded=recorded,
    decoder=decoder,
    backend="sluice.proxy.cursus:CursusBackend",
    check_broker="sluice.proxy.backend:check_reachable",
    summarizer="sluice.recording.cursus:CursusSummarizer",
    options=OPTIONS,
    check=check,
    port_per_broker=True,
    # A client dialling the main listener for a broker that has no
    # listener of its own yet (connection.py).
    rejections=("no_listener",),
    pcap_note="Sluice recording of Cursus traffic: each frame is [u32 big-endian length][body]; "
    "Wireshark has no Cursus dissector, so read the TCP payloads (Follow TCP Stream) "
    "or use sluice inspect",
    detail=detail,
    replay="sluice.replay.cursus:replay_run",
    serve="sluice.replay.cursus:serve",
)
