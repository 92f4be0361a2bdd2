"""Real frames from pulsar-client and pulsar-lite (see tests/golden/capture.py)."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

from sluice.protocols.pulsar import Frame, Type, decode_stream, encode, encode_payload, pb
from sluice.protocols.pulsar.payload import messages

DATA = Path(__file__).parent / "golden" / "data"
MANIFEST: dict[str, Any] = json.loads((DATA / "manifest.json").read_text())
SCENARIOS = sorted(MANIFEST["scenarios"])
CODECS = {
    "plain": "NONE",
    "batched": "NONE",
    "lz4": "LZ4",
    "zlib": "ZLIB",
    "zstd": "ZSTD",
    "snappy": "SNAPPY",
    "zstd-unbatched": "ZSTD",
}


def streams(scenario: str) -> list[Path]:
    files = sorted((DATA / scenario).glob("*.bin"))
    assert files, f"no captured streams for {scenario}"
    return files


def frames_of(scenario: str, side: str) -> list[Frame]:
    out: list[Frame] = []
    for path in streams(scenario):
        if path.name.endswith(f"-{side}.bin"):
            out += decode_stream(path.read_bytes())
    return out


def test_every_scenario_was_captured() -> None:
    assert set(SCENARIOS) == set(CODECS)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_streams_decode_to_valid_frames_with_identical_bytes(scenario: str) -> None:
    for path in streams(scenario):
        data = path.read_bytes()
        frames = decode_stream(data)
        assert frames, path
        bad = [f for f in frames if not f.ok]
        assert not bad, f"{path.name}: {bad}"
        # Forwarding is byte-exact: the frames tile the stream.
        assert b"".join(f.raw for f in frames) == data


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_reencoding_a_decoded_frame_gives_the_same_bytes(scenario: str) -> None:
    for side in ("client", "broker"):
        for frame in frames_of(scenario, side):
            assert frame.command is not None
            if frame.type in (Type.Value("SEND"), Type.Value("MESSAGE")):
                assert frame.metadata is not None
                again = encode_payload(
                    frame.command,
                    frame.metadata,
                    bytes(frame.payload),
                    checksum=frame.checksum is not None,
                )
            else:
                again = encode(frame.command)
            assert again == frame.raw, f"{scenario}/{side}: {frame.name} re-encodes differently"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_conversation_has_the_expected_shape(scenario: str) -> None:
    info = MANIFEST["scenarios"][scenario]
    client = collections.Counter(f.name for f in frames_of(scenario, "client"))
    broker = collections.Counter(f.name for f in frames_of(scenario, "broker"))
    for name in ("CONNECT", "LOOKUP", "PARTITIONED_METADATA", "PRODUCER", "SUBSCRIBE", "FLOW"):
        assert client[name] >= 1, name
    assert client["ACK"] >= 1
    for name in ("CONNECTED", "LOOKUP_RESPONSE", "PRODUCER_SUCCESS", "SUCCESS"):
        assert broker[name] >= 1, name
    # One receipt per SEND, one MESSAGE per stored entry.
    assert client["SEND"] == broker["SEND_RECEIPT"] == broker["MESSAGE"]
    if info["batched"]:
        assert client["SEND"] < len(info["messages"])
    else:
        assert client["SEND"] == len(info["messages"])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_payloads_decompress_and_unbatch_to_what_was_sent(scenario: str) -> None:
    info = MANIFEST["scenarios"][scenario]
    codec = pb.CompressionType.Value(CODECS[scenario])
    for side, type_name in (("client", "SEND"), ("broker", "MESSAGE")):
        seen: list[str] = []
        for frame in frames_of(scenario, side):
            if frame.name != type_name:
                continue
            assert frame.metadata is not None
            assert frame.metadata.compression == codec
            # Observed: the client checksums every SEND; pulsar-lite sends
            # MESSAGE frames without a checksum.
            assert (frame.checksum is not None) == (side == "client")
            seen += [m.payload.decode() for m in messages(frame)]
        assert seen == info["messages"], f"{side} {type_name} payloads"
