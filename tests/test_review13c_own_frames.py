"""Review of e50de2f (frames Sluice writes itself recorded ``own``; replay
leaves them unexpected and, on proxied connections, holds back the request
they answer): what the proxy really records, read back and given to
``withheld_of``, for requests Sluice answered itself."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.brokers.apache_pulsar import hs256_token
from sluice.filters.config import FilterSpec
from sluice.protocols.core import Conn, OnInvalid, Peer
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.auth import ProxyAuth
from sluice.protocols.pulsar.connection import PulsarConnection, PulsarSettings, Routing
from sluice.protocols.pulsar.decoder import decode_frame
from sluice.protocols.pulsar.encoder import command, encode_payload, error_reply, own_frame
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.recording.format import PayloadPolicy
from sluice.recording.reader import RecordedConnection, load
from sluice.recording.writer import Recorder, RecorderConfig
from sluice.replay.outcome import Outcome, report
from sluice.replay.pulsar import compare, withheld_of
from tests.test_filters import TOPIC, WORDS, _batch, _filters
from tests.test_pulsar_core import (
    MiB,
    T,
    connect_body,
    frame_bytes,
    names,
    send_frame,
    sent,
    with_producer,
)

SECRET = b"0123456789abcdef0123456789abcdef"


async def _recorded(
    tmp_path: Path, settings: PulsarSettings, drive: Callable[[PulsarConnection], None]
) -> RecordedConnection:
    """The one connection ``drive(core)`` makes through a real recorder, read back."""
    recorder = Recorder(RecorderConfig(tmp_path / "rec", PayloadPolicy.FULL))
    core = PulsarConnection(
        Conn(1, "127.0.0.1:5000", "plain", "pulsar"),
        settings,
        Routing(parse_broker_url("pulsar://127.0.0.1:6650")),
        recorder,
    )
    drive(core)
    recorder._take_queued()
    await recorder._write_packed()
    await recorder._close_file()
    (conn,) = load(tmp_path / "rec").connections
    assert conn.kind == "proxied"
    return conn


def _index(conn: RecordedConnection, cmd: str, from_client: bool, nth: int = 0) -> int:
    return [rf.index for rf in conn.frames
            if rf.summary["cmd"] == cmd and rf.from_client == from_client][nth]  # fmt: skip


def _proxied(core: PulsarConnection, client_version: str = "Pulsar-CPP-v3.7.0") -> None:
    hello = connect_body(proxy_to_broker_url="127.0.0.1:6650")
    hello.client_version = client_version
    core.receive_client(frame_bytes("CONNECT", hello), 0.0)
    connected = pb.CommandConnected(server_version="b", protocol_version=21)
    core.receive_broker(frame_bytes("CONNECTED", connected), 0.1)


# --- (1) an id already open: the answer is recorded before the request ----------------


async def test_a_producer_refused_for_an_id_open_elsewhere_is_not_sent_on_replay(
    tmp_path: Path,
) -> None:
    def drive(core: PulsarConnection) -> None:
        _proxied(core)
        with_producer(core)  # producer id 1 on persistent://t/n/p
        again = pb.CommandProducer(topic="persistent://t/n/other", producer_id=1, request_id=2)
        out = core.receive_client(frame_bytes("PRODUCER", again), 2.0)
        assert names(out, Peer.CLIENT) == ["ERROR"] and names(out, Peer.BROKER) == []

    conn = await _recorded(tmp_path, PulsarSettings(OnInvalid.REJECT, 5 * MiB, 5), drive)
    refused, answer = _index(conn, "PRODUCER", True, 1), _index(conn, "ERROR", False)
    assert conn.frames[answer].summary.get("own") is True
    withheld = withheld_of(conn)
    assert answer in withheld.injected  # its answer is not expected ...
    # ... and the PRODUCER the broker never got is not sent either (docs/replay.md: NOT SENT).
    assert refused in withheld.held
    assert refused < answer  # recorded as it came: the request, then Sluice's answer


async def test_a_request_recorded_after_sluices_answer_in_its_read_is_not_sent(
    tmp_path: Path,
) -> None:
    """Recordings made before the fix hold the refused PRODUCER right after
    Sluice's ERROR answering it (the rest of its read): still held."""

    def drive(core: PulsarConnection) -> None:
        _proxied(core)
        with_producer(core)
        again = pb.CommandProducer(topic="persistent://t/n/other", producer_id=1, request_id=2)
        request = decode_frame(frame_bytes("PRODUCER", again))
        reply = error_reply(request, pb.NotAllowedError, "producer id 1 is open")
        assert reply is not None
        core.tap.frames(core.conn, False, (reply,))  # as the older proxy recorded them
        core.tap.frames(core.conn, True, (request,))
        later = pb.CommandProducer(topic="persistent://t/n/q", producer_id=2, request_id=3)
        core.receive_client(frame_bytes("PRODUCER", later), 3.0)

    conn = await _recorded(tmp_path, PulsarSettings(OnInvalid.REJECT, 5 * MiB, 5), drive)
    refused, answer = _index(conn, "PRODUCER", True, 1), _index(conn, "ERROR", False)
    assert answer < refused
    withheld = withheld_of(conn)
    assert answer in withheld.injected
    assert refused in withheld.held
    assert _index(conn, "PRODUCER", True, 2) not in withheld.held  # sent on: the broker got it


# --- (1) a filter's SEND_ERROR to a Java batch: answered by the highest sequence id ----


async def test_a_java_batch_a_filter_refused_is_not_sent_on_replay(tmp_path: Path) -> None:
    def drive(core: PulsarConnection) -> None:
        _proxied(core, "Pulsar-Java-v4.0.0")
        producer = pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1)
        core.receive_client(frame_bytes("PRODUCER", producer), 0.2)
        ok = pb.CommandProducerSuccess(request_id=1, producer_name="p")
        core.receive_broker(frame_bytes("PRODUCER_SUCCESS", ok), 0.3)
        body = pb.CommandSend(producer_id=1, sequence_id=5, highest_sequence_id=7, num_messages=3)
        meta, data = _batch([b"a", b"bad", b"c"])
        out = core.receive_client(encode_payload(command(T("SEND"), body), meta, data), 1.0)
        (error,) = sent(out, Peer.CLIENT)
        assert (error.name, error.body.sequence_id) == ("SEND_ERROR", 7)
        assert names(out, Peer.BROKER) == []

    settings = PulsarSettings(OnInvalid.REJECT, 5 * MiB, 5, filtering=_filters(FilterSpec(WORDS)))
    conn = await _recorded(tmp_path, settings, drive)
    send, answer = _index(conn, "SEND", True), _index(conn, "SEND_ERROR", False)
    withheld = withheld_of(conn)
    assert answer in withheld.injected
    assert send in withheld.held  # the broker never got it: replay must not send it


# --- (1) an auth refresh: Sluice's challenge is injected, the client's answer still sent --


async def test_the_clients_answer_to_sluices_refresh_is_not_sent_on_replay(
    tmp_path: Path,
) -> None:
    (tmp_path / "secret.key").write_bytes(SECRET)
    (tmp_path / "sluice.token").write_text(hs256_token(SECRET, "sluice") + "\n")
    auth = ProxyAuth.load(secret_key=tmp_path / "secret.key", public_key=None,
                          role_claim="sub", own_token=tmp_path / "sluice.token",
                          tls_roles=False, forward_auth_data=False)  # fmt: skip
    token = hs256_token(SECRET, "app", time.time() + 2)

    def drive(core: PulsarConnection) -> None:
        hello = connect_body(proxy_to_broker_url="127.0.0.1:6650", auth_method_name="token",
                             auth_data=token.encode())  # fmt: skip
        core.receive_client(frame_bytes("CONNECT", hello), 0.0)
        connected = pb.CommandConnected(server_version="b", protocol_version=21)
        core.receive_broker(frame_bytes("CONNECTED", connected), 0.1)
        assert names(core.keepalive(2.0, 10.0), Peer.CLIENT) == ["AUTH_CHALLENGE"]
        fresh = hs256_token(SECRET, "app", time.time() + 60)
        answer: Any = pb.CommandAuthResponse(
            response=pb.AuthData(auth_method_name="token", auth_data=fresh.encode())
        )
        out = core.receive_client(frame_bytes("AUTH_RESPONSE", answer), 2.5)
        assert names(out, Peer.BROKER) == []  # Sluice's to verify, never passed on

    conn = await _recorded(tmp_path, PulsarSettings(OnInvalid.REJECT, 5 * MiB, 5, auth), drive)
    challenge, response = _index(conn, "AUTH_CHALLENGE", False), _index(conn, "AUTH_RESPONSE", True)
    withheld = withheld_of(conn)
    assert challenge in withheld.injected
    assert response in withheld.held


async def test_the_clients_answer_to_a_brokers_challenge_after_sluices_is_sent(
    tmp_path: Path,
) -> None:
    """After Sluice's own challenge, a broker's: the next AUTH_RESPONSE
    answers the broker's, which got it: replay sends it."""

    def drive(core: PulsarConnection) -> None:
        _proxied(core)
        ask = pb.CommandAuthChallenge(
            challenge=pb.AuthData(auth_method_name="token", auth_data=b"refresh")
        )
        core.tap.frames(core.conn, False, (own_frame(T("AUTH_CHALLENGE"), ask),))
        core.tap.frames(core.conn, False, (decode_frame(frame_bytes("AUTH_CHALLENGE", ask)),))
        answer: Any = pb.CommandAuthResponse(
            response=pb.AuthData(auth_method_name="token", auth_data=b"fresh")
        )
        core.tap.frames(core.conn, True, (decode_frame(frame_bytes("AUTH_RESPONSE", answer)),))

    conn = await _recorded(tmp_path, PulsarSettings(OnInvalid.REJECT, 5 * MiB, 5), drive)
    own, broker = _index(conn, "AUTH_CHALLENGE", False), _index(conn, "AUTH_CHALLENGE", False, 1)
    assert conn.frames[own].summary.get("own") and not conn.frames[broker].summary.get("own")
    withheld = withheld_of(conn)
    assert own in withheld.injected and broker not in withheld.injected
    assert _index(conn, "AUTH_RESPONSE", True) not in withheld.held


# --- the transcript says why a request was not sent ---------------------------------


async def test_a_request_sluice_refused_itself_is_not_blamed_on_a_fault_rule_or_filter(
    tmp_path: Path,
) -> None:
    def drive(core: PulsarConnection) -> None:
        _proxied(core)
        with_producer(core)
        bad = bytearray(send_frame(sequence_id=4))
        bad[-1] ^= 1  # a bad checksum: refused under --on-invalid reject
        out = core.receive_client(bytes(bad), 2.0)
        assert names(out, Peer.CLIENT) == ["SEND_ERROR"] and names(out, Peer.BROKER) == []

    conn = await _recorded(tmp_path, PulsarSettings(OnInvalid.REJECT, 5 * MiB, 5), drive)
    assert not conn.faults and not conn.filters
    withheld = withheld_of(conn)
    assert _index(conn, "SEND", True) in withheld.held  # held, as the commit intends
    recording = load(tmp_path / "rec")
    transcript = compare(recording, {}, Outcome.of(recording), {conn.key: withheld})
    (line,) = [line for line in transcript if "NOT SENT" in line]
    assert "fault rule or filter" not in line, line
    assert "the recording proxy answered it itself" in line, line


def test_the_report_says_which_frames_the_recording_proxy_answered_itself() -> None:
    out = io.StringIO()
    report(Outcome(withheld=3, answered_itself=2), out)
    (note,) = [line for line in out.getvalue().splitlines() if "were not sent" in line]
    assert "1 a fault rule dropped" in note, note
    assert "2 the recording proxy answered itself" in note, note
    out = io.StringIO()
    report(Outcome(withheld=2, answered_itself=2), out)
    (note,) = [line for line in out.getvalue().splitlines() if "were not sent" in line]
    assert "fault rule" not in note, note
