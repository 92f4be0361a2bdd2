"""Cursus batches checked in compiled code (rust/src/cursus.rs) against the
reference decoder (sluice/protocols/cursus/batch.py) on the same bytes:
golden streams both ways, every cut of a stream, mutated batches, and the
proxy's core relaying the same reads either way."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.addresses import Address
from sluice.protocols.core import Conn, OnInvalid, Taps
from sluice.protocols.cursus import (
    Batch,
    Compression,
    FrameDecoder,
    Keepalive,
    Message,
    decode_frame,
    encode_batch,
    encode_reply,
    encode_request,
)
from sluice.protocols.cursus import decoder as decoder_module
from sluice.protocols.cursus.batch import BatchHead
from sluice.protocols.cursus.connection import CursusConnection, CursusRouting, CursusSettings
from sluice.protocols.cursus.frame import BatchFrame, Frame
from tests.helpers.cursus_strategies import batches, commands, replies

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def test_the_compiled_check_is_built() -> None:
    assert decoder_module.COMPILED, "sluice._frames is not built: run ./dev setup"


def same(got: Frame, want: Frame) -> None:
    """What a frame says, the compiled way and the reference way."""
    assert (got.raw, got.body, got.envelope, got.name) == (want.raw, want.body, want.envelope,
                                                           want.name)  # fmt: skip
    assert (got.error is None) == (want.error is None)
    if want.error is not None:
        assert got.error is not None
        assert (got.error.problem, got.error.message) == (want.error.problem, want.error.message)
    assert got.head == want.head
    assert got.message == want.message


def decoded(
    data: bytes, from_client: bool, compiled: bool, cuts: tuple[int, ...] = ()
) -> list[Frame]:
    decoder = FrameDecoder(from_client=from_client, compiled=compiled)
    got: list[Frame] = []
    start = 0
    for point in [*sorted({c % (len(data) + 1) for c in cuts}), len(data)]:
        if point > start:
            decoder.receive_data(data[start:point])
            start = point
        got += decoder.frames()
    return got


GOLDEN = Batch(
    topic="orders",
    partition=3,
    acks="-1",
    idempotent=True,
    seq_start=10,
    seq_end=12,
    messages=tuple(
        Message(
            offset=100 + i,
            seq_num=10 + i,
            producer_id="p-1",
            key=f"k{i}",
            epoch=2,
            payload=bytes([i]) * (i * 300),
            event_type="created",
            schema_version=1,
            aggregate_version=i,
            metadata='{"a":1}',
        )
        for i in range(3)
    ),
)


@pytest.mark.parametrize("from_client", [True, False])
def test_a_golden_stream_decodes_alike_and_batches_are_checked_in_compiled_code(
    from_client: bool,
) -> None:
    items: list[Any] = [GOLDEN, Batch(topic="t", partition=0), Keepalive(), GOLDEN]
    encode = encode_request if from_client else encode_reply
    data = b"".join(encode(i) for i in items)
    compiled, reference = decoded(data, from_client, True), decoded(data, from_client, False)
    assert len(compiled) == len(reference) == 4
    for got, want in zip(compiled, reference, strict=True):
        same(got, want)
    assert [type(f) for f in compiled] == [BatchFrame, BatchFrame, Frame, BatchFrame]
    assert compiled[0].head == BatchHead("orders", 3, 3, 102)
    assert compiled[1].head == BatchHead("t", 0, 0, None)
    assert all(type(f) is Frame for f in reference)


def test_a_batch_frame_decodes_its_messages_only_when_asked() -> None:
    frame = decode_frame(encode_request(GOLDEN), from_client=True)
    assert isinstance(frame, BatchFrame)
    assert Frame.__dict__["message"].__get__(frame, Frame) is None  # not decoded yet
    assert frame.name == "BATCH" and frame.head.count == 3 and frame.ok
    assert frame.message == GOLDEN
    assert frame.message is frame.message  # decoded once


@SETTINGS
@given(
    items=st.lists(st.one_of(commands(), batches(), st.just(Keepalive())), max_size=6),
    cuts=st.lists(st.integers(min_value=0), max_size=10),
)
def test_a_client_stream_cut_anywhere_decodes_alike(items: list[Any], cuts: list[int]) -> None:
    data = b"".join(encode_request(i) for i in items)
    compiled, reference = decoded(data, True, True, tuple(cuts)), decoded(data, True, False)
    assert len(compiled) == len(reference) == len(items)
    for got, want in zip(compiled, reference, strict=True):
        same(got, want)


@SETTINGS
@given(items=st.lists(st.one_of(replies(), batches()), max_size=6))
def test_a_broker_stream_decodes_alike(items: list[Any]) -> None:
    data = b"".join(encode_reply(i) for i in items)
    for got, want in zip(decoded(data, False, True), decoded(data, False, False), strict=True):
        same(got, want)


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=batches(), from_client=st.booleans(), data=st.data())
def test_a_mutated_batch_is_vouched_for_only_when_the_reference_takes_it(
    batch: Batch, from_client: bool, data: st.DataObject
) -> None:
    """Bytes changed, dropped or added anywhere in a batch's body: the
    compiled check calls valid only what the reference decodes, with the
    same head; everything else is the reference's, error and all."""
    body = bytearray(encode_batch(batch))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(body)))
        action = data.draw(st.sampled_from(["set", "drop", "add"]))
        if action == "set" and at < len(body):
            body[at] = data.draw(st.integers(0, 255))
        elif action == "drop" and at < len(body):
            del body[at]
        else:
            body.insert(at, data.draw(st.integers(0, 255)))
    raw = len(body).to_bytes(4, "big") + bytes(body)
    got = decode_frame(raw, from_client=from_client)
    want = decode_frame(raw, from_client=from_client, compiled=False)
    same(got, want)
    if isinstance(got, BatchFrame):
        assert want.ok and isinstance(want.message, Batch)


def test_a_compressed_batch_is_checked_after_the_broker_would_decompress_it() -> None:
    from sluice.protocols.cursus import compress

    body = compress(encode_batch(GOLDEN), Compression.GZIP)
    raw = len(body).to_bytes(4, "big") + body
    got = decode_frame(raw, from_client=True, compression=Compression.GZIP)
    want = decode_frame(raw, from_client=True, compression=Compression.GZIP, compiled=False)
    same(got, want)
    assert isinstance(got, BatchFrame) and got.message == GOLDEN


class Events:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def frames(self, conn: Conn, from_client: bool, frames: Any) -> None:
        self.seen += [(from_client, f.name, f.head, len(f.raw)) for f in frames]

    def event(self, conn: Conn | None, event: Any) -> None:
        self.seen.append(event if not hasattr(event, "seconds") else type(event).__name__)


def relayed(reads: list[tuple[bool, bytes]], compiled: bool, monkeypatch: Any) -> Any:
    if not compiled:
        monkeypatch.setattr(decoder_module, "_compiled_head", None)
    events = Events()
    core = CursusConnection(
        Conn(1, "127.0.0.1:5000", "plain", "cursus"),
        CursusSettings(OnInvalid.REJECT),
        CursusRouting(Address("127.0.0.1", 9000)),
        Taps([events]),
    )
    out = []
    core.receive_client(reads[0][1], 0.0)
    out.append(core.upstream_ready(0.5))
    for from_client, data in reads[1:]:
        receive = core.receive_client if from_client else core.receive_broker
        out.append(receive(data, 1.0))
    monkeypatch.undo()
    return out, events.seen


def test_the_core_relays_and_tells_the_taps_the_same_either_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A producer's batches and a stream's deliveries through the core:
    the same bytes on, the same requests answered and timed, the same
    traffic by topic, and the frames the taps see name the same heads."""
    from sluice.protocols.cursus.commands import Stream
    from sluice.protocols.cursus.replies import BatchAck

    ack = BatchAck(status="OK", last_offset=102, seq_start=10, seq_end=12)
    batch = encode_request(GOLDEN)
    reads = [
        (True, batch[:7]),
        (True, batch[7:] + batch),
        (False, encode_reply(ack) * 2),
        (True, encode_request(Stream(topic="orders", partition=3, group="g", offset=0))),
        (False, encode_reply(GOLDEN) + encode_reply(Keepalive()) + encode_reply(GOLDEN)[:9]),
        (False, encode_reply(GOLDEN)[9:]),
    ]
    compiled = relayed(reads, True, monkeypatch)
    reference = relayed(reads, False, monkeypatch)
    assert compiled == reference
    heads = [s[2] for s in compiled[1] if isinstance(s, tuple) and s[1] == "BATCH"]
    assert heads == [BatchHead("orders", 3, 3, 102)] * 4
