"""Cursus as the registry knows it (``sluice.protocols.registry``)."""

from __future__ import annotations

from typing import Any

from sluice.errors import ConfigError
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


def detail(raw: bytes, out: dict[str, Any]) -> Any:
    """A recorded frame for sluice view: its body as text (frames are
    ``[u32 length][text command or reply]``)."""
    text = raw[4:].decode("utf-8", errors="replace")
    return {"text": "".join(c if c.isprintable() else "·" for c in text[:2000])}


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
    backend="sluice.proxy.cursus:CursusBackend",
    check_broker="sluice.proxy.backend:check_reachable",
    summarizer="sluice.recording.cursus:CursusSummarizer",
    options=OPTIONS,
    check=check,
    port_per_broker=True,
    pcap_note="Sluice recording of Cursus traffic: each frame is [u32 big-endian length][body]; "
    "Wireshark has no Cursus dissector, so read the TCP payloads (Follow TCP Stream) "
    "or use sluice inspect",
    detail=detail,
    replay="sluice.replay.cursus:replay_run",
    serve="sluice.replay.cursus:serve",
)
