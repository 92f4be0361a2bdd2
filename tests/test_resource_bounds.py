"""What one connection's input may cost the proxy: the work and memory a
frame makes, bounded whatever a client (or broker) sends."""

from __future__ import annotations

import struct
import tracemalloc

import pytest

from sluice.filters.config import FilterSpec
from sluice.protocols.core import Answered, Conn, Filtered, Peer
from sluice.protocols.pulsar import Frame, FrameDecoder, Problem, RemoteProtocolError, pb
from sluice.protocols.pulsar.decoder import NEED_DATA, decode_frame
from sluice.protocols.pulsar.encoder import command, encode_payload
from sluice.protocols.pulsar.payload import (
    MAX_BATCH_MESSAGES,
    build_batch,
    compress,
    messages,
    split_batch,
)
from sluice.protocols.registry import get
from sluice.proxy.metrics import MAX_ERROR_LABELS, OTHER_TOPIC, Metrics
from tests.test_filters import WORDS, _core, _receipt, _send
from tests.test_pulsar_core import names, sent

T = pb.BaseCommand


def test_a_large_frame_in_small_reads_is_joined_once_not_at_every_read() -> None:
    """Each read of the Python path asks the decoder for a scanned batch
    (``take_batch``) and then its frames, as ``PulsarConnection._relay``
    does. A 4 MiB frame sent 1,000 bytes a read was copied whole at every
    read (4,195 reads, 8.8 GB copied, 2 s of CPU): the bytes the decoder's
    contiguous buffer held, summed over the reads, grew as the square of
    the frame's size."""
    size = 4 * 1024 * 1024
    frame = struct.pack(">I", size - 4) + bytes(size - 4)
    decoder = FrameDecoder()
    held = 0
    reads = 0
    out: list[Frame] = []
    for i in range(0, size, 1000):
        decoder.receive_data(frame[i : i + 1000])
        reads += 1
        batch = decoder.take_batch()
        if batch is not None:
            out.extend(batch)
        out.extend(decoder.frames())
        held += len(decoder._head)
    assert [len(f.raw) for f in out] == [size]
    assert decoder.next_event() is NEED_DATA
    # Linear: each byte is in the contiguous buffer about once (here: the
    # first read's bytes at every read, then the frame once, joined whole).
    assert reads == 4195
    assert held < reads * 1000 + 2 * size, held


def _empty_entries(count: int) -> tuple[pb.MessageMetadata, bytes]:
    """A ZSTD batch of ``count`` empty messages: six bytes each unpacked,
    next to nothing packed."""
    data = build_batch([(pb.SingleMessageMetadata(payload_size=0), b"")]) * count
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                              compression=pb.ZSTD, uncompressed_size=len(data),
                              num_messages_in_batch=count)  # fmt: skip
    return meta, compress(pb.ZSTD, data)


def _bomb(sequence_id: int, count: int) -> bytes:
    meta, data = _empty_entries(count)
    body = pb.CommandSend(producer_id=1, sequence_id=sequence_id, num_messages=count)
    return encode_payload(command(T.SEND, body), meta, data)


def test_a_batch_of_more_messages_than_a_filter_takes_is_refused_unopened() -> None:
    """A SEND on a filtered topic is taken apart message by message. A
    batch of 2.8 million empty messages is 1.4 KB of ZSTD; taken apart it
    held the proxy's Python thread 24 s and 1.3 GB. Past
    ``MAX_BATCH_MESSAGES`` it is refused before it is decompressed."""
    core, rec = _core(FilterSpec(WORDS))
    assert names(core.receive_client(_send(0, [b"fine"] * 1000), 1.0), Peer.BROKER) == ["SEND"]
    core.receive_broker(_receipt(0), 1.1)
    over = core.receive_client(_bomb(1, MAX_BATCH_MESSAGES + 1), 1.2)
    assert not sent(over, Peer.BROKER)
    (error,) = sent(over, Peer.CLIENT)
    assert error.type == T.SEND_ERROR
    assert f"at most {MAX_BATCH_MESSAGES}" in error.body.message
    (event,) = rec.of(Filtered)
    assert (event.action, event.reason, event.messages) == (
        "rejected",
        "unreadable",
        MAX_BATCH_MESSAGES + 1,
    )
    bomb = _bomb(2, 16 * 1024 * 1024 // 6)
    assert len(bomb) < 4096
    tracemalloc.start()
    try:
        out = core.receive_client(bomb, 1.3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert names(out, Peer.CLIENT) == ["SEND_ERROR"]
    assert peak < 1024 * 1024, peak


def test_a_batch_says_its_count_before_it_is_decompressed() -> None:
    meta, _ = _empty_entries(3)
    meta.num_messages_in_batch = MAX_BATCH_MESSAGES + 1
    body = pb.CommandSend(producer_id=1, sequence_id=0, num_messages=3)
    # Not ZSTD at all: the count is refused first.
    frame = decode_frame(encode_payload(command(T.SEND, body), meta, b"not zstd"))
    with pytest.raises(RemoteProtocolError) as raised:
        messages(frame)
    assert raised.value.problem is Problem.TOO_LARGE
    with pytest.raises(RemoteProtocolError):
        split_batch(b"", MAX_BATCH_MESSAGES + 1, MAX_BATCH_MESSAGES)
    # At the bound, a batch is taken apart.
    meta, data = _empty_entries(MAX_BATCH_MESSAGES)
    frame = decode_frame(encode_payload(command(T.SEND, body), meta, data))
    assert len(messages(frame)) == MAX_BATCH_MESSAGES
    # Offline (sluice record anonymize) a recording's batch of any size is read.
    entries = build_batch([(pb.SingleMessageMetadata(payload_size=0), b"")])
    over = MAX_BATCH_MESSAGES + 1
    assert len(split_batch(entries * over, over)) == over


def test_error_codes_a_broker_makes_up_get_a_bounded_number_of_labels() -> None:
    """A Cursus broker's error code is a string off the wire: each new one
    was a new ``sluice_broker_errors_total`` series, kept for the life of
    the process (10,000 codes: 10,000 series on every scrape)."""
    metrics = Metrics(protocol=get("cursus"))
    conn = Conn(1, "127.0.0.1:5000", "plain", "cursus")
    for i in range(10_000):
        metrics.event(conn, Answered("PUBLISH", 0.001, f"CODE_{i}"))
    samples = [
        s
        for family in metrics.broker_errors.collect()
        for s in family.samples
        if s.name.endswith("_total")
    ]
    assert len(samples) <= MAX_ERROR_LABELS + 1
    assert sum(s.value for s in samples) == 10_000
    assert {"CODE_0", OTHER_TOPIC} <= {s.labels["error"] for s in samples}
