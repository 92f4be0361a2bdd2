"""Pulsar as the registry knows it (``sluice.protocols.registry``)."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from google.protobuf.json_format import MessageToDict

from sluice.protocols.faults import ProtocolFaults
from sluice.protocols.pulsar import pulsar_api_pb2 as pb
from sluice.protocols.pulsar.decoder import decode_frame
from sluice.protocols.pulsar.frame import Frame, command_name
from sluice.protocols.pulsar.redact import loggable
from sluice.protocols.pulsar.urls import DEFAULT_PORTS, SCHEMES, parse_broker_url
from sluice.protocols.registry import ProtocolSpec

# What fault rules may name for Pulsar: its commands, and the ServerError an
# ``error`` rule answers with (ServiceNotReady, the one clients retry, first).
PULSAR_FAULTS = ProtocolFaults(
    "pulsar",
    frozenset(pb.BaseCommand.Type.keys()),
    ("ServiceNotReady", *(n for n, _ in pb.ServerError.items() if n != "ServiceNotReady")),
)

# Request types whose latency is tracked (the answer is matched by the Correlator).
TIMED_COMMANDS = (
    "CONNECT",
    "LOOKUP",
    "PARTITIONED_METADATA",
    "PRODUCER",
    "SUBSCRIBE",
    "SEND",
    "GET_SCHEMA",
    "GET_TOPICS_OF_NAMESPACE",
    "GET_LAST_MESSAGE_ID",
    "SEEK",
    "UNSUBSCRIBE",
    "CLOSE_PRODUCER",
    "CLOSE_CONSUMER",
)


def decode(raw: bytes, from_client: bool) -> Frame:
    """A recorded frame, decoded again."""
    return decode_frame(raw)


def detail(raw: bytes, out: dict[str, Any]) -> Any:
    """A recorded frame decoded for sluice view: its command (credentials
    out), and its message metadata and payload in ``out``."""
    try:
        frame = decode_frame(raw)
    except Exception as exc:  # a recorded invalid frame: its bytes say the rest
        return {"undecodable": str(exc)}
    body = loggable(frame)
    decoded = MessageToDict(body, preserving_proto_field_name=True) if body is not None else {}
    meta = frame.metadata
    if meta is not None:
        out["metadata"] = MessageToDict(meta, preserving_proto_field_name=True)
        payload = bytes(frame.payload)
        if payload and "payload" not in out:
            out["payload"] = {
                "size": len(payload),
                "sha256": hashlib.sha256(payload).hexdigest(),
                "text": payload[:2000].decode("utf-8", errors="replace"),
                "base64": base64.b64encode(payload[:2000]).decode(),
                "cut": len(payload) > 2000,
            }
    return decoded


PROTOCOL = ProtocolSpec(
    name="pulsar",
    title="Pulsar",
    schemes=SCHEMES,
    default_port=DEFAULT_PORTS[0],
    parse_url=parse_broker_url,
    faults=PULSAR_FAULTS,
    timed=TIMED_COMMANDS,
    counted=None,
    messages=frozenset({"SEND", "MESSAGE"}),
    command_name=command_name,
    decode=decode,
    backend="sluice.proxy.pulsar:make_backend",
    check_broker="sluice.proxy.pulsar:check_broker",
    summarizer="sluice.recording.pulsar:FrameRecorder",
    summaries="sluice.recording.pulsar:FrameSummaries",
    pcap_note="Sluice recording of Pulsar traffic: Wireshark decodes TCP port 6650 as Pulsar; "
    "for other ports use Decode As... > TCP port > PULSAR",
    detail=detail,
    replay="sluice.replay.pulsar:replay",
    serve="sluice.replay.pulsar:serve",
)
