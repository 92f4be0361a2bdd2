"""Frames Sluice writes to a Pulsar client itself (``_own``: a drain's
CLOSE_PRODUCER, refusals, keepalives, lookup answers) are recorded as its
own (``own: true`` in the summary), and replay does not expect from a live
broker those no broker would send in answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluice.protocols.core import Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.decoder import decode_frame
from sluice.protocols.pulsar.encoder import command, encode, own_frame
from sluice.recording.format import PayloadPolicy, read_records, recording_files
from sluice.recording.pulsar import FrameRecorder
from sluice.recording.reader import RecordedConnection, RecordedFrame
from sluice.recording.writer import Recorder, RecorderConfig
from sluice.replay.pulsar import withheld_of
from tests.test_pulsar_core import (
    T,
    frame_bytes,
    make,
    names,
    with_producer,
)

NO_REQUEST = 2**64 - 1


async def _recorded(tmp_path: Path, payloads: PayloadPolicy, drive: Any) -> list[dict[str, Any]]:
    """The frame records of one connection that ``drive(core)`` makes, as read back."""
    recorder = Recorder(RecorderConfig(tmp_path / "rec", payloads))
    recorder.open_connection(1, client="127.0.0.1:5000", kind="proxied", listener="plain")
    core, _ = make(tap=recorder)
    drive(core)
    recorder._take_queued()
    await recorder._write_packed()
    await recorder._close_file()
    return [
        record
        for path in recording_files(tmp_path / "rec")
        for record in read_records(path)
        if record.get("k") == "frame"
    ]


def _drained(core: Any) -> None:
    connect = pb.CommandConnect(
        client_version="c", protocol_version=21, proxy_to_broker_url="127.0.0.1:6650"
    )
    core.receive_client(frame_bytes("CONNECT", connect), 0.0)
    connected = pb.CommandConnected(server_version="broker", protocol_version=21)
    core.receive_broker(frame_bytes("CONNECTED", connected), 0.5)
    with_producer(core)
    assert names(core.drain(), Peer.CLIENT) == ["CLOSE_PRODUCER"]


@pytest.mark.parametrize("payloads", list(PayloadPolicy))
async def test_a_drains_close_producer_is_recorded_as_sluices_own(
    tmp_path: Path, payloads: PayloadPolicy
) -> None:
    records = await _recorded(tmp_path, payloads, _drained)
    by_name = {r["s"]["cmd"]: r["s"] for r in records}
    assert list(by_name) == ["CONNECT", "CONNECTED", "PRODUCER", "PRODUCER_SUCCESS",
                             "CLOSE_PRODUCER"]  # fmt: skip
    assert by_name["CLOSE_PRODUCER"].get("own") is True
    # What the broker sent and the client sent is not (read as before the mark).
    assert [name for name, s in by_name.items() if "own" in s] == ["CLOSE_PRODUCER"]
    assert all("own" not in r for r in records)  # taken into the summary


def test_own_frames_are_marked_and_decoded_ones_are_not() -> None:
    assert own_frame(T("PING")).own is True
    assert decode_frame(encode(command(T("PING")))).own is False


@pytest.mark.parametrize("payloads", list(PayloadPolicy))
def test_the_recorder_marks_own_frames_whichever_way_it_lays_them_out(
    payloads: PayloadPolicy,
) -> None:
    recorder = FrameRecorder(payloads)
    close = pb.CommandCloseProducer(producer_id=0, request_id=NO_REQUEST)
    own = own_frame(T("CLOSE_PRODUCER"), close)
    relayed = decode_frame(own.raw)
    assert recorder.record(1, 1, 5, 6, own)["own"] is True
    assert "own" not in recorder.record(1, 1, 5, 6, relayed)
    import msgpack  # the recording's encoding

    packed = [msgpack.unpackb(r) for r in recorder.packed(1, 1, 5, 6, [relayed, own, relayed])]
    assert [r.get("own") for r in packed] == [None, True, None]
    assert [r["raw"] for r in packed] == [own.raw] * 3


# --- replay ---------------------------------------------------------------------------


def _conn(kind: str, frames: list[tuple[bool, bytes, bool]]) -> RecordedConnection:
    conn = RecordedConnection(("cap", 1), kind, "127.0.0.1:5000", "127.0.0.1:6650")
    for index, (from_client, raw, own) in enumerate(frames):
        summary: dict[str, Any] = {"own": True} if own else {}
        conn.frames.append(
            RecordedFrame(from_client, index, index, decode_frame(raw), summary, index)
        )
    return conn


CONNECT = frame_bytes("CONNECT", pb.CommandConnect(client_version="c", protocol_version=21))
CONNECTED = frame_bytes("CONNECTED", pb.CommandConnected(server_version="b", protocol_version=21))
PRODUCER = frame_bytes("PRODUCER", pb.CommandProducer(topic="persistent://t/n/a", producer_id=0,
                                                       request_id=1))  # fmt: skip
SUCCESS = pb.CommandProducerSuccess(request_id=1, producer_name="p")
PRODUCER_SUCCESS = frame_bytes("PRODUCER_SUCCESS", SUCCESS)


def test_replay_does_not_expect_a_drains_closes_from_the_broker() -> None:
    close_producer = pb.CommandCloseProducer(producer_id=0, request_id=NO_REQUEST)
    close_consumer = pb.CommandCloseConsumer(consumer_id=3, request_id=NO_REQUEST)
    conn = _conn("proxied", [
        (True, CONNECT, False), (False, CONNECTED, False),
        (True, PRODUCER, False), (False, PRODUCER_SUCCESS, False),
        (False, frame_bytes("CLOSE_PRODUCER", close_producer), True),
        (False, frame_bytes("CLOSE_CONSUMER", close_consumer), True),
    ])  # fmt: skip
    withheld = withheld_of(conn)
    assert withheld.injected == {4, 5}
    assert withheld.held == set()


def test_a_broker_close_producer_is_still_expected() -> None:
    close = pb.CommandCloseProducer(producer_id=0, request_id=NO_REQUEST)
    conn = _conn("proxied", [(True, PRODUCER, False), (False, PRODUCER_SUCCESS, False),
                             (False, frame_bytes("CLOSE_PRODUCER", close), False)])  # fmt: skip
    assert withheld_of(conn).injected == set()


def test_lookup_answers_sluice_gave_itself_are_expected_of_the_broker() -> None:
    """Replay connects straight to the broker, which answers a CONNECT and a
    lookup in kind: Sluice's own CONNECTED and LOOKUP_RESPONSE on a lookup
    connection stay expected, keepalives stay ignored."""
    lookup = frame_bytes("LOOKUP", pb.CommandLookupTopic(topic="persistent://t/n/a",
                                                         request_id=7))  # fmt: skip
    answer = frame_bytes("LOOKUP_RESPONSE", pb.CommandLookupTopicResponse(
        request_id=7, brokerServiceUrl="pulsar://127.0.0.1:6650",
        response=pb.CommandLookupTopicResponse.Connect))  # fmt: skip
    conn = _conn("lookup", [
        (True, CONNECT, False), (False, CONNECTED, True),
        (True, lookup, False), (False, answer, True),
        (False, frame_bytes("PING"), True), (True, frame_bytes("PONG"), False),
        # the client's PING, answered by Sluice
        (True, frame_bytes("PING"), False), (False, frame_bytes("PONG"), True),
    ])  # fmt: skip
    withheld = withheld_of(conn)
    assert withheld.injected == set()
    assert withheld.held == set()


def test_refusals_sluice_wrote_on_a_proxied_connection_are_not_expected() -> None:
    """The handshake refusal (ERROR without a request), a refresh's
    AUTH_CHALLENGE, and an answer to a request Sluice kept from the broker
    (an id already open): the request is not sent, the answer not expected."""
    down = pb.CommandError(request_id=NO_REQUEST, error=pb.ServiceNotReady, message="down")
    refused = frame_bytes("ERROR", down)
    challenge = frame_bytes("AUTH_CHALLENGE", pb.CommandAuthChallenge(
        challenge=pb.AuthData(auth_method_name="token", auth_data=b"refresh"),
        protocol_version=21))  # fmt: skip
    again = frame_bytes("PRODUCER", pb.CommandProducer(topic="persistent://t/n/b",
                                                        producer_id=0, request_id=2))  # fmt: skip
    no = frame_bytes("ERROR", pb.CommandError(request_id=2, error=pb.NotAllowedError,
                                              message="open"))  # fmt: skip
    conn = _conn("proxied", [
        (True, CONNECT, False), (False, CONNECTED, False),
        (True, PRODUCER, False), (False, PRODUCER_SUCCESS, False),
        (True, again, False), (False, no, True),
        (False, challenge, True), (False, refused, True),
    ])  # fmt: skip
    withheld = withheld_of(conn)
    assert withheld.injected == {5, 6, 7}
    assert withheld.held == {4}
