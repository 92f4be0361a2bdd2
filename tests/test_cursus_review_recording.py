"""Cursus recordings keep application data only with --record-payloads full:
batches were left out, but payloads in other frames were written whole."""

from __future__ import annotations

import hashlib
import json

import pytest

from sluice.protocols.cursus import (
    Batch,
    EnvelopeMessage,
    Message,
    OkReply,
    Publish,
    decode_frame,
    encode_batch,
    encode_request,
    frame,
)
from sluice.protocols.cursus.encoder import envelope
from sluice.recording.cursus import CursusSummarizer
from sluice.recording.format import PayloadPolicy

SECRET = "card-4111-1111-1111-1111"


def _corrupt_batch() -> bytes:
    body = encode_batch(Batch("orders", 0, messages=(Message(payload=SECRET.encode()),)))
    return frame(body + b"\x00")  # one byte after the last message: TRAILING


def _requests() -> list[bytes]:
    return [
        _corrupt_batch(),
        encode_request(Publish(topic="orders", message=f"hello {SECRET}")),
        encode_request(EnvelopeMessage("orders", SECRET.encode())),
        frame(envelope("", f"APPEND_STREAM topic=t key=k version=1 message={SECRET}".encode())),
        frame(envelope("", f"SAVE_SNAPSHOT topic=t key=k version=1 message={SECRET}".encode())),
    ]


def _replies() -> list[bytes]:
    snapshot = json.dumps({"version": 1, "payload": SECRET})
    read_stream = json.dumps({"status": "OK", "snapshot": {"version": 1, "payload": SECRET}})
    return [frame(f"OK snapshot={snapshot}".encode()), frame(read_stream.encode())]


@pytest.mark.parametrize("policy", [PayloadPolicy.HASH, PayloadPolicy.NONE])
def test_payloads_outside_batches_are_left_out_unless_asked_for(policy: PayloadPolicy) -> None:
    summarizer = CursusSummarizer(policy)
    for raw, from_client in [(r, True) for r in _requests()] + [(r, False) for r in _replies()]:
        f = decode_frame(raw, from_client=from_client)
        (packed,) = summarizer.packed(1, 0 if from_client else 1, 1, 1, [f])
        assert SECRET.encode() not in packed, f
        record = summarizer.record(1, 0 if from_client else 1, 1, 1, f)
        assert record["n"] == len(raw) and record["raw"] == b""
        info = record["s"]["payload"]
        assert info["size"] == len(f.body)
        if policy is PayloadPolicy.HASH:
            assert info["sha256"] == hashlib.sha256(f.body).hexdigest()
        else:
            assert "sha256" not in info


def test_frames_without_application_data_are_kept_whole() -> None:
    summarizer = CursusSummarizer(PayloadPolicy.NONE)
    for raw, from_client in [
        (encode_request(Publish(topic="orders")), True),
        (frame(OkReply.of(topic="t", partitions=1).text.encode()), False),
        (frame(b'{"status":"OK","last_offset":1,"producer_epoch":1}'), False),
    ]:
        record = summarizer.record(1, 0, 1, 1, decode_frame(raw, from_client=from_client))
        assert record["raw"] == raw


def test_full_keeps_every_frame_whole() -> None:
    summarizer = CursusSummarizer(PayloadPolicy.FULL)
    for raw in _requests():
        record = summarizer.record(1, 0, 1, 1, decode_frame(raw, from_client=True))
        assert record["raw"] == raw and "payload" not in record["s"]
