"""Encryption on the compiled path (rust/src/seal.rs, in the relay step)
against the Python path, the reference (``FilterGate.send`` with the
``encrypt`` filter's sealer), on the same bytes: with the IV fixed, each
SEND comes out byte for byte the same either way, and so do the metrics.
Reads the step must not seal (recording, a key past its time, a SEND that
sealed would be too large) come back untouched for the Python path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from sluice.filters import crypto
from sluice.filters.chain import Filters, make_filters
from sluice.filters.config import parse_flag
from sluice.protocols import registry
from sluice.protocols.core import Conn, OnInvalid, Taps
from sluice.protocols.filtering import PRODUCE
from sluice.protocols.pulsar import command, encode, encode_payload, pb
from sluice.protocols.pulsar import filtering as pulsar_filtering
from sluice.protocols.pulsar.connection import PulsarConnection, PulsarSettings, Routing
from sluice.protocols.pulsar.decoder import COMPILED
from sluice.protocols.pulsar.payload import build_batch, compress
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.metrics import Metrics
from sluice.recording.writer import Recorder, RecorderConfig
from tests import test_quick_step as quick_step


def test_the_compiled_path_is_built() -> None:
    """Every install builds rust/ into the package: without it these tests
    must fail, not skip."""
    assert COMPILED is not None, "sluice._frames is not built: pip install -e . (./dev)"


T = pb.BaseCommand
SEALED_TOPIC = "persistent://public/default/secret"
PLAIN_TOPIC = "persistent://public/default/plain"
IV = bytes(range(12))


@pytest.fixture(autouse=True)
def fixed_iv(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The Python path's IVs fixed as the compiled Seal's are."""
    monkeypatch.setattr(crypto, "new_iv", lambda: IV)
    yield


@pytest.fixture
def filters(tmp_path: Path) -> Filters:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = tmp_path / "k.pub.pem"
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    spec = {"topics": [SEALED_TOPIC], "direction": "produce",
            "settings": {"public_keys": {"k": str(public)}}}  # fmt: skip
    made = make_filters([parse_flag("encrypt:" + json.dumps(spec))], registry.get("pulsar"))
    # The compiled key of this filter, with the fixed IV.
    assert COMPILED is not None
    sealer = made.loaded[0].filter.sealer(PRODUCE)
    assert sealer is not None
    pulsar_filtering._SEALS[sealer] = COMPILED.seal("encrypt", IV)
    return made


def seal_of(filters: Filters) -> Any:
    sealer = filters.loaded[0].filter.sealer(PRODUCE)
    assert sealer is not None
    return pulsar_filtering._SEALS[sealer]


def core(filters: Filters, taps: Taps) -> PulsarConnection:
    """A relaying connection: producer 1 on the sealed topic, 2 on a plain one."""
    conn = Conn(1, "127.0.0.1:50000", "127.0.0.1:6650", "pulsar")
    settings = PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5, filtering=filters)
    c = PulsarConnection(conn, settings, Routing(parse_broker_url("pulsar://127.0.0.1:6650")), taps)
    hello = pb.CommandConnect(client_version="t", protocol_version=20,
                              proxy_to_broker_url="127.0.0.1:6650")  # fmt: skip
    c.receive_client(encode(command(T.CONNECT, hello)), 0.0)
    connected = pb.CommandConnected(server_version="t", protocol_version=20)
    c.receive_broker(encode(command(T.CONNECTED, connected)), 0.0)
    c.receive_client(b"".join(
        encode(command(T.PRODUCER, pb.CommandProducer(topic=t, producer_id=i, request_id=i)))
        for i, t in ((1, SEALED_TOPIC), (2, PLAIN_TOPIC))
    ), 0.0)  # fmt: skip
    c.receive_broker(b"".join(
        encode(command(T.PRODUCER_SUCCESS,
                       pb.CommandProducerSuccess(request_id=i, producer_name=f"p{i}")))
        for i in (1, 2)
    ), 0.0)  # fmt: skip
    assert c.established
    return c


def send(producer: int, sequence: int, payloads: list[bytes], checksum: bool = True) -> bytes:
    body = pb.CommandSend(producer_id=producer, sequence_id=sequence, num_messages=len(payloads))
    meta = pb.MessageMetadata(producer_name=f"p{producer}", sequence_id=sequence, publish_time=1)
    if len(payloads) == 1:
        data = payloads[0]
    else:
        entries = [(pb.SingleMessageMetadata(payload_size=len(p)), p) for p in payloads]
        raw = build_batch(entries)
        meta.num_messages_in_batch, meta.compression = len(payloads), pb.LZ4
        meta.uncompressed_size = len(raw)
        data = compress(pb.LZ4, raw)
    return encode_payload(command(T.SEND, body), meta, data, checksum=checksum)


def client_encrypted(sequence: int) -> bytes:
    meta = pb.MessageMetadata(producer_name="p1", sequence_id=sequence, publish_time=1,
                              encryption_param=b"\1" * 12)  # fmt: skip
    meta.encryption_keys.add(key="theirs", value=b"wrapped")
    body = pb.CommandSend(producer_id=1, sequence_id=sequence)
    return encode_payload(command(T.SEND, body), meta, b"ciphertext")


def receipt(producer: int, sequence: int) -> bytes:
    body = pb.CommandSendReceipt(producer_id=producer, sequence_id=sequence)
    return encode(command(T.SEND_RECEIPT, body))


READS = [
    (True, send(1, 0, [b"first: the key is made here"])),  # Python seals, arms the step
    (True, send(1, 1, [b"x" * 1024]) + send(2, 0, [b"plain"]) + send(1, 2, [b"y" * 100])),
    (False, receipt(1, 0) + receipt(1, 1) + receipt(2, 0) + receipt(1, 2)),
    (True, send(1, 3, [b"a", b"bb", b"ccc"]) + send(1, 4, [b"no checksum"], checksum=False)),
    (True, client_encrypted(5) + send(2, 1, [b"plain again"])),
    (False, receipt(1, 3) + receipt(1, 4) + receipt(1, 5) + receipt(2, 1)),
]


def relay(
    filters: Filters, reads: list[tuple[bool, bytes]], quick: bool, recorder: Recorder | None = None
) -> tuple[Any, int]:
    """``reads`` through the connection, by the step where it carries them
    (``quick``), else by the core (tests/test_quick_step.py's relay): what
    came out each way, the metrics and the send table; and how many reads
    the step carried."""
    return quick_step.relay(reads, quick, recorder, lambda taps: core(filters, taps))


def test_the_step_seals_sends_as_the_python_path_does(filters: Filters) -> None:
    # The first SEND goes the Python way (no key yet): sealing it makes the
    # key and arms the step's; every read after it is carried.
    by_step, carried = relay(filters, READS, quick=True)
    assert carried == len(READS) - 1
    by_core, none = relay(filters, READS, quick=False)
    assert none == 0
    assert by_step == by_core
    sent = by_core[0][True]  # what went to the broker
    assert b"first: the key" not in sent and b"x" * 64 not in sent and b"plain again" in sent
    assert b"ciphertext" in sent  # what the client encrypted, as it was
    assert 'sluice_filter_replaced_total{direction="client_to_broker",filter="encrypt"' in "".join(
        by_step[2]
    )


def test_one_frame_sealed_by_the_seal_is_the_python_paths(filters: Filters) -> None:
    metrics = Metrics()
    c = core(filters, Taps([metrics]))
    seal = seal_of(filters)
    assert seal.seal(send(1, 9, [b"z"]), 1.0) is None  # not armed yet
    for frame in (send(1, 0, [b"q" * 300]), send(1, 1, [b"a", b"b"]), send(1, 2, [b"n"], False)):
        (python,) = [a.data for a in c.receive_client(frame, 1.0)]  # type: ignore[union-attr]
        assert seal.seal(frame, 1.0) == python
    assert seal.seal(client_encrypted(3), 1.0) is None
    assert seal.seal(send(1, 4, [b"late"]), seal.until) is None  # past its time


def test_reads_go_the_python_way_when_recorded_or_the_key_is_due(
    filters: Filters, tmp_path: Path
) -> None:
    by_core, _ = relay(filters, READS, quick=False)  # the key made, the step armed
    recorder = Recorder(RecorderConfig(tmp_path / "rec"))
    by_step, carried = relay(filters, READS, quick=True, recorder=recorder)
    # Only reads without a sealed SEND are carried while recording: the
    # filter's records are Python's to write.
    assert carried == 2
    assert by_step[0] == by_core[0]
    # A key past its time: the read is given back, and the Python path
    # seals it and arms the key again.
    seal = seal_of(filters)
    seal.arm(b"\0" * 32, b"", 0.0)
    by_step, carried = relay(filters, READS[1:2], quick=True)
    assert carried == 0 and seal.until > 1.5


def counted_send(sequence: int, num_messages: int | None, in_batch: int | None) -> bytes:
    """A SEND of producer 1 with these counts (None: the field left out)."""
    body = pb.CommandSend(producer_id=1, sequence_id=sequence)
    if num_messages is not None:
        body.num_messages = num_messages
    meta = pb.MessageMetadata(producer_name="p1", sequence_id=sequence, publish_time=1)
    if in_batch is not None:
        meta.num_messages_in_batch = in_batch
    return encode_payload(command(T.SEND, body), meta, b"payload")


@pytest.mark.parametrize(
    ("num_messages", "in_batch", "counted"),
    [
        (None, 5, 5),  # the batch's count, not the command's absent num_messages (1)
        (0, 3, 3),
        (-1, None, 1),  # a negative num_messages wrapped the compiled counter to 2**64 - 1
        (2, -1, 0),  # a negative batch count made the Python path's Counter.inc raise
    ],
)
def test_sealed_sends_count_their_batch_messages_on_both_paths(
    filters: Filters,
    caplog: pytest.LogCaptureFixture,
    num_messages: int | None,
    in_batch: int | None,
    counted: int,
) -> None:
    """sluice_filter_replaced_total counts what the Python path counts: the
    metadata's num_messages_in_batch (1 without one, none below zero),
    whichever path sealed the SEND."""
    reads = [(True, send(1, 0, [b"first"])), (True, counted_send(1, num_messages, in_batch))]
    by_step, carried = relay(filters, reads, quick=True)
    assert carried == 1  # the second SEND sealed by the step
    by_core, _ = relay(filters, reads, quick=False)
    assert by_step == by_core
    replaced = [line for line in by_core[2] if line.startswith("sluice_filter_replaced_total{")]
    assert replaced == [
        'sluice_filter_replaced_total{direction="client_to_broker",filter="encrypt",'
        f'protocol="pulsar"}} {1.0 + counted}'
    ]
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_closed_producers_id_on_another_topic_is_not_sealed_by_the_step(
    filters: Filters,
) -> None:
    """A client that closes a sealed producer and gives its id to one on a
    topic without the filter: the compiled step went on sealing that id's
    SENDs with the old topic's key (and would skip the new topic's other
    filters, a schema's among them)."""
    again = pb.CommandProducer(topic=PLAIN_TOPIC, producer_id=1, request_id=11)
    reads = [
        (True, send(1, 0, [b"sealed: the key is made here"])),
        (True, send(1, 1, [b"sealed by the step"])),
        (False, receipt(1, 0) + receipt(1, 1)),
        (True, encode(command(T.CLOSE_PRODUCER, pb.CommandCloseProducer(producer_id=1,
                                                                        request_id=10)))),
        (False, encode(command(T.SUCCESS, pb.CommandSuccess(request_id=10)))),
        (True, encode(command(T.PRODUCER, again))),
        (False, encode(command(T.PRODUCER_SUCCESS,
                               pb.CommandProducerSuccess(request_id=11, producer_name="p1")))),
        (True, send(1, 0, [b"plain from now on"])),
    ]  # fmt: skip
    by_step, _ = relay(filters, reads, quick=True)
    sent = by_step[0][True]
    assert b"sealed by the step" not in sent and b"plain from now on" in sent
    by_core, _ = relay(filters, reads, quick=False)
    assert by_step == by_core


def test_a_producer_sluice_encrypts_for_is_marked_encrypted_to_the_broker(
    filters: Filters,
) -> None:
    """Apache Pulsar refuses every message of a producer marked encrypted
    that comes without encryption keys: a backstop behind Sluice's gate,
    and what a namespace that requires encryption asks of producers."""
    from sluice.protocols.core import Peer
    from tests.test_pulsar_core import sent

    c = core(filters, Taps([]))
    for pid, topic, marked in ((3, SEALED_TOPIC, True), (4, PLAIN_TOPIC, False)):
        body = pb.CommandProducer(topic=topic, producer_id=pid, request_id=pid)
        (frame,) = sent(c.receive_client(encode(command(T.PRODUCER, body)), 1.0), Peer.BROKER)
        assert frame.body.encrypted is marked and frame.body.topic == topic
