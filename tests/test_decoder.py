"""The decoder's validation, case by case."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from sluice.protocols.pulsar import (
    CLOSED,
    DEFAULT_MAX_MESSAGE_SIZE,
    NEED_DATA,
    Frame,
    FrameDecoder,
    LocalProtocolError,
    Problem,
    RemoteProtocolError,
    Type,
    command,
    decode_frame,
    decode_stream,
    encode,
    encode_payload,
    error_reply,
    max_frame_size,
    pb,
)
from sluice.protocols.pulsar.payload import compress, decompress, messages, split_batch

T = Type.Value


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def frame_from_command_bytes(cmd: bytes, rest: bytes = b"") -> bytes:
    return u32(4 + len(cmd) + len(rest)) + u32(len(cmd)) + cmd + rest


def send(seq: int = 7, payload: bytes = b"hello", **kw: object) -> bytes:
    return encode_payload(
        command(T("SEND"), pb.CommandSend(producer_id=1, sequence_id=seq)),
        pb.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=1),
        payload,
        **kw,  # type: ignore[arg-type]
    )


def problem(raw: bytes) -> Problem | None:
    frame = decode_frame(raw)
    return None if frame.error is None else frame.error.problem


def test_valid_send_is_decoded() -> None:
    frame = decode_frame(send(payload=b"abc"))
    assert frame.ok and frame.name == "SEND"
    assert frame.body.sequence_id == 7
    assert bytes(frame.payload) == b"abc"
    assert frame.metadata is not None and frame.metadata.producer_name == "p"
    assert frame.checksum is not None


def test_checksum_mismatch_keeps_the_decoded_frame() -> None:
    raw = bytearray(send(payload=b"abc"))
    raw[-1] ^= 0xFF
    frame = decode_frame(bytes(raw))
    assert frame.error is not None
    assert frame.error.problem is Problem.CHECKSUM
    assert frame.error.server_error == pb.ChecksumError
    assert not frame.error.fatal
    # Still decoded as far as it goes: the proxy needs the sequence id to answer.
    assert frame.body.sequence_id == 7


def test_frame_without_checksum_is_valid() -> None:
    frame = decode_frame(send(checksum=False))
    assert frame.ok and frame.checksum is None


def test_broker_entry_metadata_is_decoded() -> None:
    bem = pb.BrokerEntryMetadata(broker_timestamp=5, index=9)
    frame = decode_frame(send(broker_entry_metadata=bem))
    assert frame.ok
    assert frame.broker_entry_metadata == bem


def test_command_size_larger_than_frame() -> None:
    raw = u32(10) + u32(50) + b"\x08\x12" + b"\x00" * 4
    assert problem(raw) is Problem.FRAMING


def test_frame_too_short_for_a_command_size() -> None:
    assert problem(u32(2) + b"\x00\x00") is Problem.FRAMING


def test_command_that_does_not_parse() -> None:
    assert problem(frame_from_command_bytes(b"\xff\xff\xff")) is Problem.PARSE


def test_missing_required_field() -> None:
    body = pb.CommandSend(producer_id=1)  # no sequence_id
    cmd = pb.BaseCommand(type=pb.BaseCommand.SEND)
    cmd.send.CopyFrom(body)
    raw = frame_from_command_bytes(cmd.SerializePartialToString())
    frame = decode_frame(raw)
    assert frame.error is not None and frame.error.problem is Problem.MISSING_FIELD
    assert "sequence_id" in frame.error.message


def test_missing_body_for_type() -> None:
    raw = frame_from_command_bytes(pb.BaseCommand(type=pb.BaseCommand.PING).SerializeToString())
    assert problem(raw) is Problem.MISSING_FIELD


def test_command_without_type() -> None:
    assert problem(frame_from_command_bytes(b"")) is Problem.MISSING_FIELD


def test_send_without_metadata() -> None:
    cmd = command(T("SEND"), pb.CommandSend(producer_id=1, sequence_id=1))
    assert problem(frame_from_command_bytes(cmd.SerializeToString())) is Problem.MISSING_FIELD


def test_metadata_missing_required_field() -> None:
    meta = pb.MessageMetadata(producer_name="p", sequence_id=1)  # no publish_time
    cmd = command(T("SEND"), pb.CommandSend(producer_id=1, sequence_id=1)).SerializeToString()
    m = meta.SerializePartialToString()
    raw = frame_from_command_bytes(cmd, u32(len(m)) + m + b"x")
    frame = decode_frame(raw)
    assert frame.error is not None and frame.error.problem is Problem.MISSING_FIELD
    assert "publish_time" in frame.error.message


def test_metadata_that_does_not_parse() -> None:
    cmd = command(T("SEND"), pb.CommandSend(producer_id=1, sequence_id=1)).SerializeToString()
    assert problem(frame_from_command_bytes(cmd, u32(3) + b"\xff\xff\xff")) is Problem.PARSE


def test_metadata_size_overrunning_the_frame() -> None:
    cmd = command(T("SEND"), pb.CommandSend(producer_id=1, sequence_id=1)).SerializeToString()
    assert problem(frame_from_command_bytes(cmd, u32(1000) + b"\x0a\x00")) is Problem.FRAMING


def test_unknown_command_type_is_kept_and_flagged() -> None:
    raw = frame_from_command_bytes(b"\x08\x63\x12\x00")  # type 99 and some body
    frame = decode_frame(raw)
    assert frame.type == 99 and frame.name == "UNKNOWN(99)"
    assert frame.error is not None and frame.error.problem is Problem.UNKNOWN_TYPE
    assert frame.raw == raw


def test_trailing_bytes_after_simple_command() -> None:
    ping = encode(command(T("PING")))
    raw = u32(len(ping) - 4 + 3) + ping[4:] + b"abc"
    assert problem(raw) is Problem.TRAILING


def test_stream_ending_mid_frame_is_fatal() -> None:
    data = send()
    decoder = FrameDecoder()
    decoder.receive_data(data[:-3])
    assert decoder.next_event() is NEED_DATA
    decoder.receive_data(b"")
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_event()
    assert info.value.problem is Problem.TRUNCATED and info.value.fatal


def test_clean_end_of_stream() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(send())
    decoder.receive_data(b"")
    assert isinstance(decoder.next_event(), Frame)
    assert decoder.next_event() is CLOSED


def test_oversized_frame_is_fatal_and_sticky() -> None:
    decoder = FrameDecoder(max_message_size=1024)
    decoder.receive_data(u32(max_frame_size(1024)) + b"\x00" * 16)
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_event()
    assert info.value.problem is Problem.TOO_LARGE and info.value.fatal
    assert info.value.server_error == pb.NotAllowedError
    with pytest.raises(RemoteProtocolError):
        decoder.next_event()


def test_default_limit_and_raising_it() -> None:
    big = send(payload=b"x" * (DEFAULT_MAX_MESSAGE_SIZE + 20_000), max_message_size=8 << 20)
    with pytest.raises(RemoteProtocolError):
        decode_stream(big)
    # What CONNECTED.max_message_size does for a connection.
    assert decode_stream(big, max_message_size=8 << 20)[0].ok


def test_largest_default_frame_is_accepted() -> None:
    payload = b"x" * DEFAULT_MAX_MESSAGE_SIZE
    assert decode_stream(send(payload=payload))[0].ok


def test_one_byte_at_a_time() -> None:
    data = send() + encode(command(T("PING"))) + send(seq=8)
    decoder = FrameDecoder()
    got = []
    for i in range(len(data)):
        decoder.receive_data(data[i : i + 1])
        got += list(decoder.frames())
    assert [f.name for f in got] == ["SEND", "PING", "SEND"]
    assert decoder.buffered == 0


def test_what_is_buffered_can_be_taken_and_given_back_at_any_cut() -> None:
    data = send() + encode(command(T("PING"))) + send(seq=8)
    for first in range(1, len(data)):
        for second in range(first, len(data), 7):
            decoder = FrameDecoder()
            got = []
            for chunk in (data[:first], data[first:second]):  # a head and a tail
                if chunk:  # (b"" is the end of the stream)
                    decoder.receive_data(chunk)
                    got += list(decoder.frames())
            done = sum(len(f.raw) for f in got)
            start = decoder.take_buffered()
            assert start == data[done:second] and decoder.buffered == 0
            assert decoder.next_event() is NEED_DATA
            decoder.receive_data(start + data[second:])
            got += list(decoder.frames())
            assert [f.name for f in got] == ["SEND", "PING", "SEND"], (first, second)


def test_invalid_max_message_size() -> None:
    with pytest.raises(ValueError):
        FrameDecoder(max_message_size=0)


# --- replies ---------------------------------------------------------------


def test_send_error_reply_for_a_bad_send() -> None:
    frame = decode_frame(send(seq=42))
    reply = error_reply(frame, pb.ChecksumError, "bad checksum")
    assert reply is not None
    answer = decode_frame(reply.raw)
    assert answer.name == "SEND_ERROR"
    assert answer.body.sequence_id == 42 and answer.body.producer_id == 1
    assert answer.body.error == pb.ChecksumError


def test_lookup_gets_a_failed_lookup_response() -> None:
    lookup = encode(command(T("LOOKUP"), pb.CommandLookupTopic(topic="t", request_id=5)))
    reply = error_reply(decode_frame(lookup), pb.TooManyRequests, "slow down")
    assert reply is not None
    answer = decode_frame(reply.raw)
    assert answer.name == "LOOKUP_RESPONSE"
    assert answer.body.response == pb.CommandLookupTopicResponse.Failed
    assert answer.body.request_id == 5 and answer.body.error == pb.TooManyRequests


def test_other_requests_get_error_with_their_request_id() -> None:
    producer = encode(
        command(T("PRODUCER"), pb.CommandProducer(topic="t", producer_id=1, request_id=9))
    )
    reply = error_reply(decode_frame(producer), pb.ServiceNotReady, "no")
    assert reply is not None
    answer = decode_frame(reply.raw)
    assert answer.name == "ERROR" and answer.body.request_id == 9


# Requests a broker fails with their own answer type: (request, its body,
# the answer's name, its error field, the fields it repeats from the request).
_TXN = {"txnid_least_bits": 7, "txnid_most_bits": 3}


def _in_txn(body: Any) -> Any:
    for name, value in _TXN.items():
        setattr(body, name, value)
    return body


OWN_ANSWERS = [
    ("ACK", _in_txn(pb.CommandAck(consumer_id=4, ack_type=pb.CommandAck.Individual,
                                  request_id=9)),
     "ACK_RESPONSE", "error", {"consumer_id": 4, **_TXN}),
    ("CONSUMER_STATS", pb.CommandConsumerStats(request_id=9, consumer_id=4),
     "CONSUMER_STATS_RESPONSE", "error_code", {}),
    ("GET_SCHEMA", pb.CommandGetSchema(request_id=9, topic="t"), "GET_SCHEMA_RESPONSE",
     "error_code", {}),
    ("TC_CLIENT_CONNECT_REQUEST", pb.CommandTcClientConnectRequest(request_id=9, tc_id=0),
     "TC_CLIENT_CONNECT_RESPONSE", "error", {}),
    ("NEW_TXN", pb.CommandNewTxn(request_id=9), "NEW_TXN_RESPONSE", "error", {}),
    ("ADD_PARTITION_TO_TXN", _in_txn(pb.CommandAddPartitionToTxn(request_id=9)),
     "ADD_PARTITION_TO_TXN_RESPONSE", "error", _TXN),
    ("ADD_SUBSCRIPTION_TO_TXN", _in_txn(pb.CommandAddSubscriptionToTxn(request_id=9)),
     "ADD_SUBSCRIPTION_TO_TXN_RESPONSE", "error", _TXN),
    ("END_TXN", _in_txn(pb.CommandEndTxn(request_id=9)), "END_TXN_RESPONSE", "error", _TXN),
    ("END_TXN_ON_PARTITION", _in_txn(pb.CommandEndTxnOnPartition(request_id=9, topic="t")),
     "END_TXN_ON_PARTITION_RESPONSE", "error", _TXN),
    ("END_TXN_ON_SUBSCRIPTION", _in_txn(pb.CommandEndTxnOnSubscription(request_id=9)),
     "END_TXN_ON_SUBSCRIPTION_RESPONSE", "error", _TXN),
]  # fmt: skip


@pytest.mark.parametrize(("request_name", "body", "answer_name", "error_field", "repeated"),
                         OWN_ANSWERS, ids=[case[0] for case in OWN_ANSWERS])  # fmt: skip
def test_requests_with_an_answer_of_their_own_get_it_failed(
    request_name: str, body: Any, answer_name: str, error_field: str, repeated: dict[str, int]
) -> None:
    """As a broker answers them: clients wait for that answer type (a Java
    client's acknowledgements and transaction calls never see an ERROR and
    wait out their timeout)."""
    reply = error_reply(decode_frame(encode(command(T(request_name), body))),
                        pb.NotAllowedError, "refused")  # fmt: skip
    assert reply is not None
    answer = decode_frame(reply.raw)  # (decodes: every required field is set)
    assert answer.name == answer_name
    assert answer.body.request_id == 9
    assert getattr(answer.body, error_field) == pb.NotAllowedError
    assert "refused" in (answer.body.message if error_field == "error" else
                         answer.body.error_message)  # fmt: skip
    for name, value in repeated.items():
        assert getattr(answer.body, name) == value, name


def test_an_ack_without_a_request_id_gets_nothing() -> None:
    ack = pb.CommandAck(consumer_id=4, ack_type=pb.CommandAck.Individual)
    assert error_reply(decode_frame(encode(command(T("ACK"), ack))), pb.UnknownError, "x") is None


def test_frames_nothing_can_answer() -> None:
    assert error_reply(decode_frame(encode(command(T("PING")))), pb.UnknownError, "x") is None
    unknown = frame_from_command_bytes(b"\x08\x63")
    assert error_reply(decode_frame(unknown), pb.UnknownError, "x") is None


# --- encoder ---------------------------------------------------------------


def test_encoder_refuses_incomplete_commands() -> None:
    with pytest.raises(LocalProtocolError) as info:
        encode(command(T("LOOKUP"), pb.CommandLookupTopic(topic="t")))
    assert "request_id" in info.value.message


def test_encoder_refuses_payload_on_simple_commands_and_vice_versa() -> None:
    meta = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1)
    with pytest.raises(LocalProtocolError):
        encode_payload(command(T("PING")), meta, b"")
    with pytest.raises(LocalProtocolError):
        encode(command(T("SEND"), pb.CommandSend(producer_id=1, sequence_id=1)))


def test_encoder_refuses_oversized_frames() -> None:
    with pytest.raises(LocalProtocolError) as info:
        send(payload=b"x" * (DEFAULT_MAX_MESSAGE_SIZE + 20_000))
    assert info.value.problem is Problem.TOO_LARGE


def test_encoder_refuses_unknown_types() -> None:
    with pytest.raises(LocalProtocolError):
        command(99)


# --- payloads --------------------------------------------------------------


@pytest.mark.parametrize("codec", sorted(pb.CompressionType.values()))
def test_every_codec_round_trips(codec: int) -> None:
    data = b"pulsar " * 500
    assert decompress(codec, compress(codec, data), len(data)) == data


@pytest.mark.parametrize("codec", [pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY])
def test_corrupt_compressed_payload_is_a_typed_error(codec: int) -> None:
    with pytest.raises(RemoteProtocolError):
        decompress(codec, b"\xff" * 40, 100)


def test_uncompressed_size_must_match() -> None:
    data = b"abc" * 100
    with pytest.raises(RemoteProtocolError) as info:
        decompress(pb.ZLIB, compress(pb.ZLIB, data), len(data) + 1)
    assert info.value.problem is Problem.FRAMING


def test_absurd_uncompressed_size_is_refused() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decompress(pb.LZ4, b"\x00", 2**40)
    assert info.value.problem is Problem.TOO_LARGE


def test_batch_errors_are_typed() -> None:
    entry = pb.SingleMessageMetadata(payload_size=3).SerializeToString()
    good = u32(len(entry)) + entry + b"abc"
    assert [m.payload for m in split_batch(good, 1)] == [b"abc"]
    with pytest.raises(RemoteProtocolError, match="ends after 1 of 2"):
        split_batch(good, 2)
    with pytest.raises(RemoteProtocolError) as info:
        split_batch(good + b"zz", 1)
    assert info.value.problem is Problem.TRAILING
    with pytest.raises(RemoteProtocolError):
        split_batch(u32(len(entry)) + entry + b"a", 1)


def test_messages_of_a_compressed_batch() -> None:
    bodies = [b"one", b"two", b"three"]
    from sluice.protocols.pulsar.payload import build_batch

    plain = build_batch([(pb.SingleMessageMetadata(payload_size=len(b)), b) for b in bodies])
    meta = pb.MessageMetadata(
        producer_name="p",
        sequence_id=1,
        publish_time=1,
        compression=pb.ZSTD,
        uncompressed_size=len(plain),
        num_messages_in_batch=3,
    )
    raw = encode_payload(
        command(T("SEND"), pb.CommandSend(producer_id=1, sequence_id=1, num_messages=3)),
        meta,
        compress(pb.ZSTD, plain),
    )
    assert [m.payload for m in messages(decode_frame(raw))] == bodies


def test_a_stream_that_is_not_pulsar_says_how_it_starts() -> None:
    # An HTTP answer read as a Pulsar frame: "HTTP" is a length of 1.2 GB.
    decoder = FrameDecoder()
    decoder.receive_data(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_event()
    assert info.value.problem is Problem.TOO_LARGE and info.value.fatal
    assert "not the Pulsar binary protocol: the stream starts 'HTTP'" in str(info.value)
