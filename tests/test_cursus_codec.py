"""The Cursus codec: golden bytes from the real client and the broker's
observed replies, classification as the broker does it, refusals, address
rewriting, Hypothesis round trips and fuzzing."""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable

import pytest
from cursus.protocol import decoder as client_decoder
from cursus.protocol import encoder as client_encoder
from cursus.protocol.command import CommandBuilder
from cursus.types import Message as ClientMessage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.protocols import errors as neutral
from sluice.protocols.cursus import (
    BROKER_MAX_FRAME_SIZE,
    CLOSED,
    KEEPALIVE,
    NEED_DATA,
    Batch,
    BatchAck,
    BatchCommit,
    CommitOffset,
    Compression,
    Consume,
    Create,
    EnvelopeMessage,
    ErrorReply,
    FetchOffset,
    FindCoordinator,
    Frame,
    FrameDecoder,
    Heartbeat,
    JoinGroup,
    Keepalive,
    LeaveGroup,
    LocalProtocolError,
    Message,
    Metadata,
    OkReply,
    OtherCommand,
    Problem,
    Publish,
    RemoteProtocolError,
    Stream,
    StreamControl,
    SyncGroup,
    addresses_in,
    decode_frame,
    decode_stream,
    encode_batch,
    encode_reply,
    encode_request,
    frame,
    parse_command,
    refusal,
    refusal_frame,
    rewrite_addresses,
)
from tests.helpers.cursus_strategies import batches, commands, replies

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def client_frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def one(data: bytes, *, from_client: bool, **kw: object) -> Frame:
    frames = decode_stream(data, from_client=from_client, **kw)  # type: ignore[arg-type]
    assert len(frames) == 1
    return frames[0]


# --- golden bytes: what the real client writes --------------------------------------

CLIENT_COMMANDS = [
    (
        "admin",
        CommandBuilder.create("orders", 4),
        Create(topic="orders", partitions=4),
    ),
    (
        "admin",
        CommandBuilder.create("es", 1, event_sourcing=True),
        Create(topic="es", partitions=1, event_sourcing=True),
    ),
    ("", "METADATA topic=orders", Metadata(topic="orders")),
    ("", "FIND_COORDINATOR group=g1", FindCoordinator(group="g1")),
    (
        "",
        CommandBuilder.consume("orders", 2, 17, "m1-8260", group="g1", generation=3),
        Consume(topic="orders", partition=2, offset=17, member="m1-8260", group="g1", generation=3),
    ),
    (
        "",
        CommandBuilder.stream("orders", 0, "g1", "m1-8260", 1, offset=5),
        Stream(topic="orders", partition=0, group="g1", member="m1-8260", generation=1, offset=5),
    ),
    (
        "",
        CommandBuilder.stream("orders", 0, "g1", "m1-8260", 1),
        Stream(topic="orders", partition=0, group="g1", member="m1-8260", generation=1),
    ),
    (
        "",
        CommandBuilder.join_group("orders", "g1", "consumer-1"),
        JoinGroup(topic="orders", group="g1", member="consumer-1"),
    ),
    (
        "",
        CommandBuilder.sync_group("orders", "g1", "m1-8260", 1),
        SyncGroup(topic="orders", group="g1", member="m1-8260", generation=1),
    ),
    (
        "",
        CommandBuilder.heartbeat("orders", "g1", "m1-8260", 1),
        Heartbeat(topic="orders", group="g1", member="m1-8260", generation=1),
    ),
    (
        "",
        CommandBuilder.leave_group("orders", "g1", "m1-8260"),
        LeaveGroup(topic="orders", group="g1", member="m1-8260"),
    ),
    (
        "",
        CommandBuilder.commit_offset("orders", "g1", 1, 9, 2, "m1-8260"),
        CommitOffset(
            topic="orders", partition=1, group="g1", offset=9, generation=2, member="m1-8260"
        ),
    ),
    (
        "",
        CommandBuilder.batch_commit("orders", "g1", "m1-8260", 2, {0: 5, 3: 11}),
        BatchCommit(
            topic="orders", group="g1", member="m1-8260", generation=2, offsets=((0, 5), (3, 11))
        ),
    ),
    (
        "",
        CommandBuilder.fetch_offset("orders", 3, "g1"),
        FetchOffset(topic="orders", partition=3, group="g1"),
    ),
]


@pytest.mark.parametrize(("topic", "text", "expected"), CLIENT_COMMANDS)
def test_client_commands_decode_and_encode_to_the_same_bytes(
    topic: str, text: str, expected: object
) -> None:
    wire = client_frame(client_encoder.encode_message(topic, text))
    got = one(wire, from_client=True)
    assert got.ok, got.error
    assert got.message == expected
    assert got.envelope == topic
    assert encode_request(got.message, envelope_topic=topic) == wire  # type: ignore[arg-type]


def test_the_envelope_layout_is_pinned() -> None:
    wire = encode_request(Metadata(topic="t"))
    assert wire == b"\x00\x00\x00\x12" + b"\x00\x00" + b"METADATA topic=t"
    wire = encode_request(Create(topic="t", partitions=1), envelope_topic="admin")
    assert wire[:11] == b"\x00\x00\x00\x22\x00\x05admin"


def test_a_bare_text_command_is_a_command_without_envelope() -> None:
    got = one(client_frame(b"LIST"), from_client=True)
    assert got.ok and got.name == "LIST" and got.envelope is None
    got = one(encode_request(Metadata(topic="x"), envelope_topic=None), from_client=True)
    assert got.message == Metadata(topic="x") and got.envelope is None


def _client_batch() -> tuple[bytes, Batch]:
    msgs = [
        ClientMessage(offset=0, seq_num=1, payload="hello", key="k1", producer_id="p1", epoch=7),
        ClientMessage(
            offset=0,
            seq_num=2,
            payload="wörld",
            producer_id="p1",
            epoch=7,
            event_type="e",
            schema_version=3,
            aggregate_version=9,
            metadata="m",
        ),
    ]
    body = client_encoder.encode_batch("orders", 2, "1", True, msgs)
    expected = Batch(
        topic="orders",
        partition=2,
        acks="1",
        idempotent=True,
        seq_start=1,
        seq_end=2,
        messages=(
            Message(0, 1, "p1", "k1", 7, b"hello"),
            Message(0, 2, "p1", "", 7, "wörld".encode(), "e", 3, 9, "m"),
        ),
    )
    return body, expected


def test_the_client_batch_decodes_field_by_field_and_encodes_identically() -> None:
    body, expected = _client_batch()
    got = one(client_frame(body), from_client=True)
    assert got.ok, got.error
    assert got.message == expected
    assert encode_batch(expected) == body


def test_the_batch_layout_is_pinned() -> None:
    batch = Batch("t", 1, "1", False, 5, 5, (Message(0, 5, "p", "", 1, b"x"),))
    assert encode_batch(batch).hex() == (
        "ba7c" "0001" "74" "00000001" "01" "31" "00"
        "0000000000000005" "0000000000000005" "00000001"
        "0000000000000000" "0000000000000005" "0001" "70" "0000"
        "0000000000000001" "00000001" "78" "0000" "00000000" "0000000000000000" "0000"
    )  # fmt: skip


def test_the_client_reads_our_batches() -> None:
    _, batch = _client_batch()
    msgs, topic, partition = client_decoder.decode_batch(encode_batch(batch))
    assert (topic, partition) == ("orders", 2)
    assert [m.payload for m in msgs] == ["hello", "wörld"]
    assert [m.seq_num for m in msgs] == [1, 2]
    assert msgs[1].aggregate_version == 9 and msgs[1].metadata == "m"


# --- replies as the broker writes them ----------------------------------------------

OBSERVED = [
    "OK topic=t partitions=1 cleanup_policy=delete partitioner=hash_key",
    "OK count=2 topics=demo,__consumer_offsets",
    "OK topic=t deleted=true",
    "OK topic=t partitions=4 leaders=localhost:9000,localhost:9000,localhost:9000,"
    "localhost:9000 epochs=0,0,0,0",
    "OK coordinator_id=standalone coordinator_type=group host=localhost port=9000",
    "OK generation=1 member=m1-8260 assignments=[0]",
    "ERROR: GEN_MISMATCH current=1 requested=99 group=g member=m1-8260",
    "OK member=m1-8260 generation=1",
    "OK",
    "OK batched=1",
    "OK offset=1",
    "OK group=g member=m left=true",
    "ERROR: topic_not_assigned_to_group expected=demo actual=demo2",
    "ERROR: NOT_LEADER LEADER_IS localhost:9001",
    "ERROR: NOT_COORDINATOR host=localhost port=9002",
    "ERROR: OFFSET_OUT_OF_RANGE requested=9 earliest=0 latest=3",
    "STREAM_CONTROL type=CLOSE reason=stopped offset=4",
    'ERROR: decode_failed reason="invalid topic length"',
    "ERROR: malformed_input reason=missing_topic_or_payload",
]


@pytest.mark.parametrize("text", OBSERVED)
def test_observed_replies_decode_and_encode_to_the_same_bytes(text: str) -> None:
    wire = client_frame(text.encode())
    got = one(wire, from_client=False)
    assert got.ok, got.error
    assert encode_reply(got.message) == wire  # type: ignore[arg-type]


def test_reply_fields_are_typed() -> None:
    meta = one(client_frame(OBSERVED[3].encode()), from_client=False).message
    assert isinstance(meta, OkReply) and meta.get("partitions") == "4"
    join = OkReply(("generation=2", "member=m-1", "assignments=[0", "2]"))
    assert one(encode_reply(join), from_client=False).message == OkReply(
        ("generation=2", "member=m-1", "assignments=[0 2]")
    )
    assert OkReply.of(assignments="[0 2]").assignments == [0, 2]
    assert OkReply.of(assignments="[1,3]").assignments == [1, 3]
    gen = one(client_frame(OBSERVED[6].encode()), from_client=False).message
    assert isinstance(gen, ErrorReply) and gen.code == "GEN_MISMATCH"
    assert gen.get("current") == "1" and gen.get("member") == "m1-8260"
    moved = one(client_frame(OBSERVED[13].encode()), from_client=False).message
    assert isinstance(moved, ErrorReply) and moved.leader_is == "localhost:9001"
    control = one(client_frame(OBSERVED[16].encode()), from_client=False).message
    assert control == StreamControl("CLOSE", "stopped", 4)
    failed = one(client_frame(OBSERVED[17].encode()), from_client=False).message
    assert isinstance(failed, ErrorReply) and failed.get("reason") == "invalid topic length"


def test_the_json_ack_is_written_as_the_broker_writes_it() -> None:
    observed = (
        '{"status":"OK","last_offset":0,"producer_epoch":1,"producer_id":"p1",'
        '"seq_start":1,"seq_end":1}'
    )
    ack = one(client_frame(observed.encode()), from_client=False).message
    assert ack == BatchAck("OK", 0, 1, "p1", 1, 1)
    assert encode_reply(ack) == client_frame(observed.encode())
    clustered = BatchAck("OK", 3, 1, "p1", 1, 2, leader="10.0.0.1:7000")
    assert client_decoder.decode_ack(encode_reply(clustered)[4:]).leader == "10.0.0.1:7000"


def test_keepalives_both_ways() -> None:
    for from_client in (True, False):
        frames = decode_stream(KEEPALIVE * 2, from_client=from_client)
        assert [f.message for f in frames] == [Keepalive(), Keepalive()]
    assert encode_reply(Keepalive()) == KEEPALIVE


def test_client_stream_control_reader_agrees() -> None:
    control = StreamControl("CLOSE", "offset_out_of_range", 4, requested=9, earliest=0, latest=3)
    body = encode_reply(control)[4:]
    theirs = client_decoder.decode_stream_control(body)
    assert (theirs.type, theirs.reason, theirs.offset, theirs.latest) == (
        "CLOSE",
        "offset_out_of_range",
        4,
        3,
    )


# --- classification and refusals ------------------------------------------------------


def refused(f: Frame) -> tuple[str | None, bool]:
    assert f.error is not None
    answer = refusal(f.error)
    return answer.text, answer.close


def test_a_magic_with_an_empty_topic_is_no_batch() -> None:
    # 0xBA7C as a topic length overruns the body: the broker's decode_failed.
    got = one(client_frame(b"\xba\x7c\x00\x00rest"), from_client=True)
    assert refused(got) == ('ERROR: decode_failed reason="invalid topic length"', False)


def test_a_gzip_batch_to_a_plain_broker_is_an_invalid_topic_length() -> None:
    body, expected = _client_batch()
    wire = client_frame(gzip.compress(body))
    plain = one(wire, from_client=True)
    assert refused(plain) == ('ERROR: decode_failed reason="invalid topic length"', False)
    zipped = one(wire, from_client=True, compression=Compression.GZIP)
    assert zipped.ok and zipped.message == expected


def test_a_gzip_broker_decompresses_text_commands_too() -> None:
    text = encode_request(Metadata(topic="t"))
    assert not one(text, from_client=True, compression=Compression.GZIP).ok
    zipped = encode_request(Metadata(topic="t"), compression=Compression.GZIP)
    assert one(zipped, from_client=True, compression=Compression.GZIP).message == Metadata(
        topic="t"
    )


@pytest.mark.parametrize("kind", list(Compression))
def test_every_compression_round_trips(kind: Compression) -> None:
    _, batch = _client_batch()
    got = one(encode_request(batch, compression=kind), from_client=True, compression=kind)
    assert got.message == batch


def test_envelopes_without_topic_or_payload_are_malformed_and_close() -> None:
    for body in (b"\x00\x00", b"\x00\x01t", b"\x00\x00hello world"):
        got = one(client_frame(body), from_client=True)
        assert refused(got) == ("ERROR: malformed_input reason=missing_topic_or_payload", True)


def test_a_topic_and_a_payload_is_a_plain_message() -> None:
    got = one(client_frame(b"\x00\x01thello"), from_client=True)
    assert got.ok and got.message == EnvelopeMessage("t", b"hello") and got.envelope == "t"


def test_unknown_commands_in_an_envelope_are_left_to_the_broker() -> None:
    got = one(client_frame(b"\x00\x00BEGIN_TXN id=1"), from_client=True)
    assert isinstance(got.message, OtherCommand) and not got.message.known
    assert got.error is not None and got.error.problem is Problem.UNKNOWN_TYPE
    got = one(client_frame(b"\x00\x00READ_STREAM topic=t key=k"), from_client=True)
    assert got.ok and isinstance(got.message, OtherCommand) and got.message.known


def test_spec_only_commands_are_not_bare_commands() -> None:
    # SUBSCRIBE and COMMIT are in the written spec, not in what the broker knows.
    got = one(client_frame(b"COMMIT t g 0 5"), from_client=True)
    assert got.error is not None and got.error.code == "decode_failed"


def test_short_bodies_are_invalid_topic_lengths() -> None:
    got = one(client_frame(b"x"), from_client=True)
    assert refused(got) == ('ERROR: decode_failed reason="invalid topic length"', False)


def test_bad_command_fields() -> None:
    got = one(encode_request(OtherCommand(command="CONSUME")), from_client=True)
    assert got.error is not None and got.error.problem is Problem.MISSING_FIELD
    got = one(client_frame(b"\x00\x00CONSUME topic=t partition=x offset=0"), from_client=True)
    assert got.error is not None and got.error.problem is Problem.PARSE
    text, close = refused(got)
    assert text is not None and text.startswith("ERROR: invalid_command reason=") and not close


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-1],  # cut inside the last message
        lambda b: b + b"\x00",  # trailing byte
        lambda b: b[:35] + b"\xff\xff\xff\xff" + b[39:],  # huge message count
    ],
)
def test_a_corrupt_batch_is_decode_failed(damage: object) -> None:
    body, _ = _client_batch()
    bad = damage(body)  # type: ignore[operator]
    got = one(client_frame(bad), from_client=True)
    assert got.error is not None and not got.error.fatal
    assert isinstance(got.error, neutral.RemoteProtocolError)
    text, close = refused(got)
    assert text is not None and text.startswith('ERROR: decode_failed reason="') and not close
    data, closes = refusal_frame(got.error)
    assert data is not None and data[4:] == text.encode() and not closes


def test_frames_over_the_broker_limit_lose_framing() -> None:
    decoder = FrameDecoder(from_client=True)
    decoder.receive_data(struct.pack(">I", BROKER_MAX_FRAME_SIZE))
    assert decoder.next_event() is NEED_DATA  # exactly the limit is fine
    decoder = FrameDecoder(from_client=True)
    decoder.receive_data(struct.pack(">I", BROKER_MAX_FRAME_SIZE + 1) + b"x")
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_event()
    assert info.value.fatal and info.value.problem is Problem.TOO_LARGE
    assert refusal(info.value).text is None and refusal(info.value).close
    with pytest.raises(RemoteProtocolError):
        decoder.next_event()  # stays broken
    # Replies may be as large as the client accepts (64 MiB).
    replies_side = FrameDecoder(from_client=False)
    replies_side.receive_data(struct.pack(">I", BROKER_MAX_FRAME_SIZE + 1))
    assert replies_side.next_event() is NEED_DATA


def test_a_stream_ending_inside_a_frame_is_truncated() -> None:
    decoder = FrameDecoder(from_client=False)
    decoder.receive_data(encode_reply(OkReply())[:-1])
    decoder.receive_data(b"")
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_event()
    assert info.value.problem is Problem.TRUNCATED and info.value.fatal
    clean = FrameDecoder(from_client=False)
    clean.receive_data(encode_reply(OkReply()))
    clean.receive_data(b"")
    assert isinstance(clean.next_event(), Frame) and clean.next_event() is CLOSED


def test_gzip_bombs_are_bounded() -> None:
    bomb = client_frame(gzip.compress(b"\x00" * (1 << 20)))
    got = decode_frame(bomb, from_client=True, compression=Compression.GZIP, max_frame_size=1000)
    assert got.error is not None and got.error.problem is Problem.TOO_LARGE


def test_encoders_refuse_what_would_not_read_back() -> None:
    with pytest.raises(LocalProtocolError):
        encode_request(Metadata(topic="two words"))
    with pytest.raises(LocalProtocolError):
        encode_batch(Batch("", 0))
    with pytest.raises(LocalProtocolError):
        encode_batch(Batch("t", 0, messages=(Message(offset=-1),)))
    with pytest.raises(LocalProtocolError):
        encode_reply(OkReply(("a b",)))
    with pytest.raises(LocalProtocolError):
        frame(b"x" * 10, max_frame_size=9)


def test_parse_command_raises_typed_errors() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        parse_command("hello")
    assert info.value.problem is Problem.UNKNOWN_TYPE
    assert parse_command("PUBLISH topic=t message=a  b ") == Publish(topic="t", message="a  b ")


# --- address rewriting ---------------------------------------------------------------


def _to_proxy(host: str, port: int) -> tuple[str, int]:
    return "127.0.0.1", port + 10000


@pytest.mark.parametrize(
    ("reply", "rewritten"),
    [
        (
            "OK topic=t partitions=2 leaders=localhost:9000,broker-2:9001 epochs=0,3",
            "OK topic=t partitions=2 leaders=127.0.0.1:19000,127.0.0.1:19001 epochs=0,3",
        ),
        (
            "OK coordinator_id=standalone coordinator_type=group host=localhost port=9000",
            "OK coordinator_id=standalone coordinator_type=group host=127.0.0.1 port=19000",
        ),
        (
            "ERROR: NOT_COORDINATOR host=b2 port=9001",
            "ERROR: NOT_COORDINATOR host=127.0.0.1 port=19001",
        ),
        ("ERROR: NOT_LEADER LEADER_IS b3:9002", "ERROR: NOT_LEADER LEADER_IS 127.0.0.1:19002"),
        (
            'ERROR: produce_failed reason="NOT_LEADER LEADER_IS b3:9002 retry"',
            'ERROR: produce_failed reason="NOT_LEADER LEADER_IS 127.0.0.1:19002 retry"',
        ),
        ("OK leaders=,b1:9000", "OK leaders=,127.0.0.1:19000"),
    ],
)
def test_every_address_a_client_routes_by_is_rewritten(reply: str, rewritten: str) -> None:
    assert rewrite_addresses(reply.encode(), _to_proxy) == rewritten.encode()
    # Through the client's own parsing, only proxy addresses are left.
    assert all(host == "127.0.0.1" for host, _ in addresses_in(rewritten.encode()))


def test_a_coordinator_in_brackets_is_an_ipv6_address_written_back_in_them() -> None:
    reply = b"OK coordinator_id=c host=[fd00::7] port=9000"
    assert addresses_in(reply) == [("fd00::7", 9000)]  # dialled without its brackets
    assert rewrite_addresses(reply, lambda host, port: ("::1", port + 1)) == (
        b"OK coordinator_id=c host=[::1] port=9001"
    )
    assert rewrite_addresses(reply, _to_proxy) == b"OK coordinator_id=c host=127.0.0.1 port=19000"


@pytest.mark.parametrize(
    "body",
    [
        b'{"status":"OK","last_offset":0,"producer_epoch":1,"producer_id":"p",'
        b'"seq_start":1,"seq_end":1,"leader":"10.0.0.1:7000"}',
        b"OK topic=t deleted=true",
        b"ERROR: GEN_MISMATCH current=1 requested=99 group=g member=host=x",
        b"STREAM_CONTROL type=CLOSE reason=stopped offset=1",
        b"",
    ],
)
def test_replies_without_routing_addresses_are_left_alone(body: bytes) -> None:
    assert rewrite_addresses(body, _to_proxy) is None


def test_batches_are_never_rewritten() -> None:
    batch = Batch("t", 0, messages=(Message(payload=b"ERROR: NOT_LEADER LEADER_IS a:1"),))
    assert rewrite_addresses(encode_batch(batch), _to_proxy) is None


def test_addresses_in_lists_what_the_client_would_dial() -> None:
    body = b"OK topic=t partitions=3 leaders=a:1,b:2,[::1]:3 epochs=0,0,0"
    assert addresses_in(body) == [("a", 1), ("b", 2), ("::1", 3)]
    assert addresses_in(b"OK coordinator_id=n1 host=h port=5") == [("h", 5)]


_REPLY_WORDS = [
    "OK",
    "ERROR:",
    "NOT_LEADER",
    "LEADER_IS",
    "NOT_COORDINATOR",
    "host=h",
    "host=",
    "port=9",
    "port=99999",
    "port=x",
    "leaders=a:1,b:2",
    "leaders=,c:3,",
    "a:1",
    "[::1]:5",
    'reason="NOT_LEADER',
    "LEADER_IS]",
    "x",
]


@SETTINGS
@given(
    words=st.lists(st.sampled_from(_REPLY_WORDS), max_size=8),
    sep=st.sampled_from([" ", "  ", "\t"]),
    junk=st.binary(max_size=8),
)
def test_rewriting_leaves_no_upstream_address_and_never_raises(
    words: list[str], sep: str, junk: bytes
) -> None:
    for body in (sep.join(words).encode(), junk, sep.join(words).encode() + junk):
        out = rewrite_addresses(body, _to_proxy)
        result = body if out is None else out
        assert all(host == "127.0.0.1" for host, _ in addresses_in(result))
        if out is None:
            assert addresses_in(body) == []


# --- properties -----------------------------------------------------------------------


@SETTINGS
@given(cmd=commands(), topic=st.none() | st.sampled_from(["", "admin", "t"]))
def test_commands_round_trip(cmd: object, topic: str | None) -> None:
    got = one(encode_request(cmd, envelope_topic=topic), from_client=True)  # type: ignore[arg-type]
    assert got.ok, got.error
    assert got.message == cmd
    assert got.envelope == topic


@SETTINGS
@given(batch=batches(), kind=st.sampled_from([Compression.NONE, Compression.GZIP]))
def test_batches_round_trip_both_ways(batch: Batch, kind: Compression) -> None:
    sent = one(encode_request(batch, compression=kind), from_client=True, compression=kind)
    assert sent.ok and sent.message == batch
    delivered = one(encode_reply(batch), from_client=False)
    assert delivered.ok and delivered.message == batch


@SETTINGS
@given(reply=replies())
def test_replies_round_trip(reply: object) -> None:
    wire = encode_reply(reply)  # type: ignore[arg-type]
    got = one(wire, from_client=False)
    assert got.ok, got.error
    assert got.message == reply


@SETTINGS
@given(
    items=st.lists(st.one_of(commands(), batches(), st.just(Keepalive())), max_size=6),
    cuts=st.lists(st.integers(min_value=0), max_size=10),
)
def test_a_stream_split_anywhere_decodes_to_the_same_frames(
    items: list[object], cuts: list[int]
) -> None:
    data = b"".join(encode_request(i) for i in items)  # type: ignore[arg-type]
    points = sorted({c % (len(data) + 1) for c in cuts})
    decoder = FrameDecoder(from_client=True)
    got: list[Frame] = []
    start = 0
    for point in [*points, len(data)]:
        if point > start:
            decoder.receive_data(data[start:point])
            start = point
        got += decoder.frames()
    decoder.receive_data(b"")
    assert decoder.next_event() is CLOSED
    assert [f.message for f in got] == items
    assert b"".join(f.raw for f in got) == data


def _only_typed_errors(chunks: list[bytes], from_client: bool, compression: Compression) -> None:
    decoder = FrameDecoder(from_client=from_client, max_frame_size=4096, compression=compression)
    try:
        for chunk in [*(c for c in chunks if c), b""]:
            decoder.receive_data(chunk)
            for f in decoder.frames():
                assert f.error is None or isinstance(f.error, neutral.RemoteProtocolError)
                assert f.error is not None or f.message is not None
                if f.error is not None:
                    refusal(f.error)  # always answerable
    except neutral.ProtocolError as exc:
        assert exc.fatal


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunks=st.lists(st.binary(max_size=64), max_size=8),
    from_client=st.booleans(),
    compression=st.sampled_from(list(Compression)),
)
def test_arbitrary_bytes_only_ever_give_typed_errors(
    chunks: list[bytes], from_client: bool, compression: Compression
) -> None:
    _only_typed_errors(chunks, from_client, compression)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    item=st.one_of(commands(), batches(), replies()),
    data=st.data(),
)
def test_mutated_frames_only_ever_give_typed_errors(item: object, data: st.DataObject) -> None:
    if isinstance(item, OkReply | ErrorReply | StreamControl | BatchAck):
        raw = bytearray(encode_reply(item))
        from_client = False
    else:
        raw = bytearray(encode_request(item))  # type: ignore[arg-type]
        from_client = True
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    _only_typed_errors([bytes(raw[:cut]), bytes(raw[cut:])], from_client, Compression.NONE)


def test_the_word_split_matches_the_character_reading() -> None:
    """``tokens`` splits plain lines with a regex and reads quoted ones a
    character at a time: both give the same words, positions and keys on
    lines built from every kind of word (keys, bare words, ``=`` first or
    twice, Unicode spaces, a rest-of-line key, non-UTF-8 bytes kept by
    surrogateescape)."""
    import random

    from sluice.protocols.cursus.text import _tokens_by_char, decode_text, tokens

    pieces = ["OK", "topic=t1", "=x", "a=b=c", "=", "message=hello world", "k=", "p=0",
              "\u00a0", "\u2003", " ", "  ", "\t", "\n", "offset=12345", "x\u3000y",
              decode_text(b"t=\xff\xfe"), "LIST", "group=g"]  # fmt: skip
    draw = random.Random(59)
    rest = frozenset({"message"})
    for _ in range(3000):
        text = "".join(draw.choice(pieces) + draw.choice(["", " ", "\t"]) for _ in range(6))
        for rest_of_line in (frozenset(), rest):
            expected = _tokens_by_char(text, rest_of_line, False)
            assert tokens(text, rest_of_line=rest_of_line) == expected, text
            assert tokens(text, rest_of_line=rest_of_line, quoted=True) == expected, text


def test_a_command_line_is_split_as_its_tokens_say() -> None:
    """``parse_command`` splits a line with no rest-of-line key with
    str.split(): the same command word, ``key=value`` pairs and bare words,
    in order, as the character reading gives, and the same refusal where
    no command word comes first."""
    import random

    from sluice.protocols.cursus.commands import _fields
    from sluice.protocols.cursus.text import REST_OF_LINE, _tokens_by_char, decode_text

    def by_characters(text: str) -> tuple[str, list[tuple[str, str]], list[str]] | None:
        words = _tokens_by_char(text, REST_OF_LINE, False)
        if not words or words[0].key is not None:
            return None
        pairs = [(w.key, w.value(text)) for w in words[1:] if w.key is not None]
        args = [w.raw(text) for w in words[1:] if w.key is None]
        return words[0].raw(text), pairs, args

    pieces = ["COMMIT_OFFSET", "topic=t1", "=x", "a=b=c", "=", "k=", "p=0", "\u00a0", "\u2003",
              " ", "\t", "\n", "offset=12345", "x\u3000y", decode_text(b"t=\xff\xfe"), "LIST",
              "group=g", "P0:5,P1:7", "message=hello world", "xmessage=1"]  # fmt: skip
    draw = random.Random(5959)
    for _ in range(3000):
        text = "".join(draw.choice(pieces) + draw.choice(["", " ", "\t"]) for _ in range(6))
        expected = by_characters(text)
        try:
            got: object = _fields(text)
        except RemoteProtocolError:
            got = None
        assert got == expected, text


def test_a_reply_line_is_split_as_its_tokens_say() -> None:
    """``parse_reply_text`` splits a line with no quoted value with
    str.split(): the reply made of the words the character reading gives."""
    import random

    from sluice.protocols.cursus.replies import _reply_of, parse_reply_text
    from sluice.protocols.cursus.text import _tokens_by_char

    def read(parse: Callable[..., object], *args: object) -> object:
        try:
            return parse(*args)
        except RemoteProtocolError as exc:
            return exc.problem

    pieces = ["OK", "ERROR", "ERROR:", "ERROR:GEN_MISMATCH", "count=2", "=x", "a=b=c", "k=",
              "\u00a0", "\u2003", " ", "\t", "\n", "topics=a,b", "x\u3000y", "host=h"]  # fmt: skip
    draw = random.Random(595959)
    for _ in range(3000):
        text = "".join(draw.choice(pieces) + draw.choice(["", " ", "\t"]) for _ in range(5))
        words = [w.raw(text) for w in _tokens_by_char(text, frozenset(), True)]
        blank = Problem.UNKNOWN_TYPE
        expected = read(_reply_of, words[0], tuple(words[1:])) if words else blank
        assert read(parse_reply_text, text) == expected, text
