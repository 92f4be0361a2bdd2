"""What fuzzing found, as plain tests: every input that broke a harness
(``crashes/<harness>/``, named for what it showed) runs clean through it
now, and each finding has a test of its own on the bytes that show it."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.protocols.core import Action, Close, Peer, Send
from sluice.protocols.pulsar import Frame, command, decode_frame, decode_stream, encode, pb
from sluice.protocols.pulsar.errors import Problem, RemoteProtocolError
from sluice.protocols.pulsar.payload import compress, decompress
from sluice.protocols.pulsar.redact import loggable
from sluice.recording.format import PayloadPolicy
from sluice.recording.pulsar import FrameRecorder
from tests.fuzz import fuzz_pulsar_proxy as proxy
from tests.fuzz.common import HERE

T = pb.BaseCommand
CRASHES = HERE / "crashes"
FOUND = sorted(CRASHES.glob("*/*"))


def test_the_inputs_fuzzing_found_are_kept() -> None:
    assert len(FOUND) >= 16, FOUND


@pytest.mark.parametrize("path", FOUND, ids=[f"{p.parent.name}/{p.name}" for p in FOUND])
def test_each_input_fuzzing_found_runs_clean(path: Path) -> None:
    harness = importlib.import_module(f"tests.fuzz.fuzz_{path.parent.name}")
    harness.TestOneInput(path.read_bytes())


def framed(body: bytes) -> bytes:
    """A frame around a serialized BaseCommand (which may lack what encode() insists on)."""
    return (len(body) + 4).to_bytes(4, "big") + len(body).to_bytes(4, "big") + body


def answer_bytes(body: bytes) -> bytes:
    """An upstream answer as the harness takes it: the frame without its length prefix."""
    return framed(body)[4:]


def with_bad_utf8(raw: bytes, placeholder: bytes = b"\x01HOST\x01") -> bytes:
    """``raw`` with a placeholder inside a string field made invalid UTF-8 (same length)."""
    assert placeholder in raw
    return raw.replace(placeholder, b"\xff" * len(placeholder))


def to_client(actions: list[Action]) -> list[Frame]:
    data = b"".join(a.data for a in actions if isinstance(a, Send) and a.to is Peer.CLIENT)
    return decode_stream(data, 1 << 30)


# --- the codecs (fixed here) -------------------------------------------------------------


def test_a_connect_that_does_not_name_its_type_is_invalid_and_never_recorded() -> None:
    # BaseCommand.type is required; a missing one reads as CONNECT, the enum's
    # first value. With a complete CONNECT body the decoder took it for a
    # valid CONNECT, and the recorder, re-encoding it without its token,
    # raised LocalProtocolError (found by fuzz_pulsar_proxy).
    connect = pb.CommandConnect(client_version="c", protocol_version=21,
                                auth_method_name="token", auth_data=b"TOKEN-SECRET")  # fmt: skip
    raw = framed(pb.BaseCommand(connect=connect).SerializePartialToString())
    frame = decode_frame(raw)
    assert frame.error is not None and frame.error.problem is Problem.MISSING_FIELD
    assert "no type" in frame.error.message
    record = FrameRecorder(PayloadPolicy.FULL).record(1, 0, 1, 1, frame)
    assert b"TOKEN-SECRET" not in record["raw"] and record["s"]["withheld"]


def test_a_connect_without_its_client_version_is_recorded_not_raised() -> None:
    # redact.sensitive() (since 37dffe3) sizes the command to find fields the
    # schema does not know; protobuf refuses to size a message that lacks a
    # required field, so any CONNECT without client_version raised
    # EncodeError in the recorder and in log lines (found by pulsar_codec).
    connect = pb.CommandConnect(protocol_version=20, auth_method_name="none")
    command_ = pb.BaseCommand(type=T.CONNECT, connect=connect)
    frame = decode_frame(framed(command_.SerializePartialToString()))
    assert frame.error is not None and "client_version" in frame.error.message
    record = FrameRecorder(PayloadPolicy.FULL).record(1, 0, 1, 1, frame)
    assert record["n"] == len(frame.raw)
    loggable(frame)


@pytest.mark.e2e
def test_a_payload_that_expands_past_its_promised_size_is_stopped_there() -> None:
    # A ZSTD payload of 16 KiB that unpacks to 512 MiB, its metadata saying
    # 10 bytes: decompress() unpacked it whole (1 GiB of memory with the
    # copy) before comparing sizes. Now it stops one byte past the promise.
    code = """if True:
        import resource, cramjam
        from sluice.protocols.pulsar import pb
        from sluice.protocols.pulsar.errors import RemoteProtocolError
        from sluice.protocols.pulsar.payload import decompress
        bomb = bytes(cramjam.zstd.compress(bytes(512 << 20)))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            decompress(pb.ZSTD, bomb, 10)
        except RemoteProtocolError as exc:
            grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
            print(len(bomb), exc.problem.value, grown // 1024)
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    size, problem, grown_mib = done.stdout.split()
    assert int(size) < 64 * 1024 and problem == "parse"
    assert int(grown_mib) < 64, f"decompressing grew the process by {grown_mib} MiB"


def test_an_lz4_block_is_read_back_whole() -> None:
    # Five literals, a run of one byte, six literals: a valid block (the one
    # pulsar_payload found), which cramjam's decompress_block_into read back
    # as 111 wrong bytes of 115.
    body = b"\x00\x00\x00/\x00" + b"\xff" * 104 + b"\x00\xf4\x00\x00\x00 "
    packed = compress(pb.LZ4, body)
    assert decompress(pb.LZ4, packed, len(body)) == body
    for wrong in (len(body) - 1, len(body) + 1):
        with pytest.raises(RemoteProtocolError):
            decompress(pb.LZ4, packed, wrong)


# --- the proxy core (connection.py, urls.py) -----------------------------------------------


def proxied() -> proxy.Session:
    """A proxied connection past the client's CONNECT, the upstream dialled."""
    session = proxy.Session(0)
    (opened,) = session.step(proxy.CLIENT, proxy.client_connect(proxied=True))
    assert session.upstream is not None, opened
    return session


def relaying() -> proxy.Session:
    session = proxied()
    connected = pb.CommandConnected(server_version="broker", protocol_version=21)
    session.step(proxy.BROKER, encode(command(T.CONNECTED, connected)))
    assert session.core.established
    return session


def looking_up() -> proxy.Session:
    session = proxy.Session(0)
    (connected,) = to_client(session.step(proxy.CLIENT, proxy.client_connect(proxied=False)))
    assert connected.name == "CONNECTED"
    return session


def test_a_broker_connected_that_does_not_parse_fails_the_upstream() -> None:
    # The broker's answer to CONNECT is a CONNECTED whose command does not
    # parse: its body is None, and `frame.body.HasField` raised AttributeError.
    session = proxied()
    connected = pb.CommandConnected(server_version="b")
    good = T(type=T.CONNECTED, connected=connected).SerializeToString()
    actions = session.step(proxy.BROKER, framed(good[:-1]))  # the last field cut short
    (error,) = to_client(actions)
    assert error.name == "ERROR" and error.ok
    assert isinstance(actions[-1], Close)


@pytest.mark.parametrize("size", [0, -1])
def test_a_broker_connected_with_no_room_for_messages_fails_the_upstream(size: int) -> None:
    # CONNECTED.max_message_size went straight to the decoders, whose setter
    # raised ValueError for a size that is not positive.
    session = proxied()
    connected = pb.CommandConnected(server_version="b", protocol_version=21, max_message_size=size)
    actions = session.step(proxy.BROKER, encode(command(T.CONNECTED, connected)))
    (error,) = to_client(actions)
    assert error.name == "ERROR" and error.ok
    assert isinstance(actions[-1], Close)


def test_an_invalid_answer_to_a_lookup_fails_that_lookup_only() -> None:
    # The upstream answers PARTITIONED_METADATA with a frame that has a
    # request_id but lacks required fields: re-encoding it for the client
    # raised LocalProtocolError out of answered().
    session = looking_up()
    asked = pb.CommandPartitionedTopicMetadata(topic="persistent://public/default/t", request_id=7)
    session.step(proxy.CLIENT, encode(command(T.PARTITIONED_METADATA, asked)))
    assert len(session.asked) == 1
    invalid = T(type=T.LOOKUP, lookupTopic=pb.CommandLookupTopic(request_id=1))
    actions = session.step(proxy.ANSWER, answer_bytes(invalid.SerializePartialToString()))
    (answer,) = to_client(actions)
    assert answer.ok and answer.body.request_id == 7
    assert not any(isinstance(a, Close) for a in actions)


def test_a_lookup_answer_naming_a_url_that_is_not_utf8_fails_that_lookup_only() -> None:
    # protobuf hands a string field that is not UTF-8 over as bytes, and
    # parse_broker_url raised TypeError on it.
    session = looking_up()
    asked = pb.CommandLookupTopic(topic="persistent://public/default/t", request_id=7)
    session.step(proxy.CLIENT, encode(command(T.LOOKUP, asked)))
    result = pb.CommandLookupTopicResponse(
        request_id=1, response=pb.CommandLookupTopicResponse.Connect,
        brokerServiceUrl="pulsar://\x01HOST\x01:6650",
    )  # fmt: skip
    answer = T(type=T.LOOKUP_RESPONSE, lookupTopicResponse=result).SerializeToString()
    actions = session.step(proxy.ANSWER, answer_bytes(with_bad_utf8(answer)))
    (reply,) = to_client(actions)
    assert reply.ok and reply.body.request_id == 7
    assert not any(isinstance(a, Close) for a in actions)


def test_a_broker_naming_a_url_that_is_not_utf8_is_relayed_not_raised() -> None:
    # CLOSE_PRODUCER names where the producer should go next; a URL that is
    # not UTF-8 raised TypeError where an unusable one is logged.
    session = relaying()
    url = "pulsar://\x01HOST\x01:6650"
    close = pb.CommandCloseProducer(producer_id=1, request_id=2, assignedBrokerServiceUrl=url)
    raw = with_bad_utf8(encode(command(T.CLOSE_PRODUCER, close)))
    actions = session.step(proxy.BROKER, raw)
    assert [f.name for f in to_client(actions)] == ["CLOSE_PRODUCER"]
