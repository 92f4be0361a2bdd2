"""Credentials never reach a recording, even in frames that do not parse.

Redaction finds credentials by parsing a frame; a frame whose command (or
metadata, or trailing bytes) does not parse cannot be searched, so none of
its bytes are recorded: the record keeps its size, what did parse of it,
and why the bytes were left out. Hostile frames are sent by hand to a
running proxy that records; the files' bytes are then searched for the
secrets, and every reader of recordings reads them.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from pathlib import Path

import pytest
import trio

from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.core import Conn
from sluice.protocols.pulsar import (
    Frame,
    Type,
    command,
    decode_frame,
    encode,
    encode_payload,
    pb,
)
from sluice.protocols.pulsar.errors import Problem
from sluice.recording.format import PayloadPolicy, read_records, recording_files
from sluice.recording.pulsar import FrameRecorder
from sluice.recording.reader import load
from sluice.recording.writer import Recorder, RecorderConfig
from sluice.replay.pulsar import Answers, normalise
from sluice.view.index import Index
from tests.helpers.support import SLUICE, RawClient, start_proxy

T = Type.Value
TOKEN = b"eyJhbGciOiJIUzI1NiJ9.cmVjb3JkZWQ.never-in-a-recording-0042"
PASSWORD = b"metadata-password-0043"
UNKNOWN_SECRET = b"unknown-type-secret-0044"
SECRETS = (TOKEN, b"never-in-a-recording-0042", PASSWORD, UNKNOWN_SECRET)


def _framed(cmd: bytes, rest: bytes = b"") -> bytes:
    """A frame around command bytes as they are (encode() would check them)."""
    return (4 + len(cmd) + len(rest)).to_bytes(4, "big") + len(cmd).to_bytes(4, "big") + cmd + rest


def truncated_connect() -> bytes:
    """A CONNECT with a token whose last field is cut short: its length
    prefixes say where it ends, but the command does not parse."""
    body = pb.CommandConnect(client_version="hostile", protocol_version=21,
                             auth_method_name="token", auth_data=TOKEN,
                             original_principal="someone")  # fmt: skip
    cmd = command(T("CONNECT"), body).SerializeToString()
    return _framed(cmd[:-3])


def partial_connect() -> bytes:
    """A CONNECT that parses, with a token, but lacks its required client_version."""
    cmd = pb.BaseCommand(type=T("CONNECT"))
    cmd.connect.auth_method_name = "token"
    cmd.connect.auth_data = TOKEN
    return _framed(cmd.SerializePartialToString())


def truncated_auth_response() -> bytes:
    cmd = pb.BaseCommand(type=T("AUTH_RESPONSE"))
    cmd.authResponse.response.auth_method_name = "token"
    cmd.authResponse.response.auth_data = TOKEN
    return _framed(cmd.SerializeToString()[:-2])


def send_with_unparseable_metadata() -> bytes:
    """A SEND whose metadata, with a password property, ends in a field cut short."""
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    meta.properties.add(key="password", value=PASSWORD.decode())
    cmd = command(T("SEND"), pb.CommandSend(producer_id=0, sequence_id=0))
    return encode_payload(cmd, meta.SerializeToString() + b"\x0a\x09ab", b"payload")


def unknown_type() -> bytes:
    """A command of a type this Sluice does not know, with a secret in a field."""
    field_100 = b"\xa2\x06" + bytes([len(UNKNOWN_SECRET)]) + UNKNOWN_SECRET
    return _framed(b"\x08\xe7\x07" + field_100)  # type 999


HANDSHAKE = {"truncated CONNECT": truncated_connect, "partial CONNECT": partial_connect,
             "unknown type": unknown_type}  # fmt: skip
AFTER_CONNECT = {"truncated AUTH_RESPONSE": truncated_auth_response,
                 "SEND, metadata does not parse": send_with_unparseable_metadata}  # fmt: skip


def test_the_hostile_frames_are_what_they_claim() -> None:
    """Each frame decodes as the case it stands for (else the test below proves nothing)."""
    frame = decode_frame(truncated_connect())
    assert (frame.command, frame.type, frame.error and frame.error.problem) == (
        None, T("CONNECT"), Problem.PARSE)  # fmt: skip
    frame = decode_frame(partial_connect())
    assert frame.command is not None and frame.error is not None
    assert frame.error.problem is Problem.MISSING_FIELD and TOKEN in frame.raw
    frame = decode_frame(truncated_auth_response())
    assert frame.command is None and frame.type == T("AUTH_RESPONSE")
    frame = decode_frame(send_with_unparseable_metadata())
    assert frame.command is not None and frame.metadata is None and PASSWORD in frame.raw
    assert frame.error is not None and frame.error.problem is Problem.PARSE
    frame = decode_frame(unknown_type())
    assert frame.command is None and frame.type == 999 and UNKNOWN_SECRET in frame.raw


def hand_in(port: int, frames: dict[str, bytes], connect_first: bool) -> None:
    """Each frame on its own connection (after a valid CONNECT if asked),
    until the proxy answers or hangs up."""
    for data in frames.values():
        raw = RawClient(port)
        try:
            if connect_first:
                assert raw.connect().name == "CONNECTED"
            raw.send(data)
            raw.send(encode(command(T("PING"))))
            deadline = time.monotonic() + 10
            while (frame := raw.receive(timeout=10)) is not None and frame.name != "PONG":
                assert time.monotonic() < deadline
        finally:
            raw.sock.close()


@pytest.mark.parametrize("payloads", ["full", "hash"])
def test_frames_that_do_not_parse_are_recorded_without_their_bytes(
    broker: EmbeddedBroker, tmp_path: Path, payloads: str
) -> None:
    rec = tmp_path / "rec"
    proxy = start_proxy(broker.url, tmp_path, "--record", str(rec), "--record-payloads", payloads)
    try:
        hand_in(proxy.port, {k: v() for k, v in HANDSHAKE.items()}, connect_first=False)
        hand_in(proxy.port, {k: v() for k, v in AFTER_CONNECT.items()}, connect_first=True)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    data = b"".join(path.read_bytes() for path in recording_files(rec))
    for secret in SECRETS:
        assert secret not in data, secret
    assert "could not record" not in proxy.log()  # the partial CONNECT was no recorder bug
    frames = [r for p in recording_files(rec) for r in read_records(p) if r["k"] == "frame"]
    withheld = [r for r in frames if "withheld" in r["s"]]
    sizes = sorted(len(v()) for v in (*HANDSHAKE.values(), *AFTER_CONNECT.values()))
    assert sorted(r["n"] for r in withheld) == sizes  # each one, with its size on the wire
    assert all(r["raw"] == b"" and r["d"] == 0 and r["s"]["invalid"] for r in withheld)
    by_cmd = {r["s"]["cmd"]: r["s"] for r in withheld}
    assert set(by_cmd) == {"CONNECT", "AUTH_RESPONSE", "SEND", "UNKNOWN(999)"}
    assert by_cmd["SEND"]["pid"] == 0 and "metadata did not parse" in by_cmd["SEND"]["withheld"]
    assert "could not be found" in by_cmd["AUTH_RESPONSE"]["withheld"]
    readers_read(rec, len(frames), len(withheld))


def readers_read(rec: Path, frames: int, withheld: int) -> None:
    """inspect (timeline, JSON, pcap), view, replay's loader and the
    pipeline read a recording with withheld frames."""
    timeline = subprocess.run([*SLUICE, "inspect", str(rec)], capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    assert timeline.returncode == 0, timeline.stderr
    assert timeline.stdout.count("bytes not recorded: ") == withheld
    as_json = subprocess.run([*SLUICE, "inspect", str(rec), "--json", "--with-bytes"],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    lines = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert sum("withheld" in line for line in lines) == withheld
    pcap = subprocess.run([*SLUICE, "inspect", str(rec), "--pcap", str(rec.parent / "out.pcapng")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert pcap.returncode == 0, pcap.stderr
    index = Index(rec)
    index.build()
    assert not index.error and index.frames == frames
    details = [index.detail(i) for i in range(index.frames)]
    left_out = [d for d in details if "bytes not recorded" in d["command"]]
    assert len(left_out) == withheld and all(d["raw_size"] == 0 for d in left_out)
    loaded = load(rec, need_payloads=False)  # replay's and serve's reader
    assert loaded.frames == frames
    Answers.of(loaded)
    transcript = [normalise(f.frame) for c in loaded.connections for f in c.frames]
    assert len(transcript) == frames
    from sluice.analyze.decode import decode_segment

    for path in recording_files(rec):
        rows = [row for batch in decode_segment(str(path), path.read_bytes())
                for row in batch.to_pylist()]  # fmt: skip
        assert not any(row.get("damaged") for row in rows), rows


# --- the recorder alone, on the decoder's frames ---------------------------------------------


def test_fields_unknown_to_sluice_are_left_out_of_handshake_frames() -> None:
    """A CONNECT or AUTH_RESPONSE that parses may still hold a credential
    where this Sluice's schema has no field (a newer client's field, or a
    token sent with the wire type of another field): those go too."""
    connect = pb.CommandConnect()  # field 99 holds the token
    connect.ParseFromString(
        pb.CommandConnect(client_version="newer", protocol_version=21).SerializeToString()
        + b"\x9a\x06"
        + bytes([len(TOKEN)])
        + TOKEN
    )
    data = pb.AuthData()  # auth_data (2) as a fixed32, not bytes: an unknown field
    data.ParseFromString(pb.AuthData(auth_method_name="token").SerializeToString() + b"\x15"
                         + TOKEN[:4])  # fmt: skip
    response = pb.CommandAuthResponse(response=data)
    cmds = [command(T("CONNECT"), connect), command(T("AUTH_RESPONSE"), response)]
    for cmd in cmds:
        frame = decode_frame(encode(cmd))
        assert frame.error is None and frame.command is not None, frame
        assert TOKEN[:4] in frame.raw
        for policy in PayloadPolicy:
            record = FrameRecorder(policy).record(1, 0, 1, 1, frame)
            assert TOKEN[:4] not in record["raw"] and record["redacted"]
            assert decode_frame(record["raw"]).type == frame.type


def test_a_frame_too_large_for_the_default_limit_is_still_redacted() -> None:
    """A broker may allow messages over 5 MiB: a SEND that size with a
    credential-like property is recorded redacted (re-encoding it used to
    fail on the default limit, and the recorder dropped the read)."""
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    meta.properties.add(key="api-token", value=PASSWORD.decode())
    cmd = command(T("SEND"), pb.CommandSend(producer_id=0, sequence_id=0))
    frame = decode_frame(encode_payload(cmd, meta, b"x" * (6 * 1024 * 1024),
                                        max_message_size=8 * 1024 * 1024))  # fmt: skip
    assert frame.error is None
    for policy in PayloadPolicy:
        (packed,) = FrameRecorder(policy).packed(1, 0, 1, 1, [frame])
        assert PASSWORD not in packed and b"<redacted>" in packed


async def test_the_recorder_tap_withholds_what_it_cannot_redact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tap fed with the decoder's frames of one read: the valid ones
    recorded as always, the hostile ones without bytes, nothing dropped."""
    ping = encode(command(T("PING")))
    hostile = [f() for f in (*HANDSHAKE.values(), *AFTER_CONNECT.values())]
    frames: list[Frame] = [decode_frame(data) for data in (ping, *hostile, ping)]
    recorder = Recorder(RecorderConfig(tmp_path, payloads=PayloadPolicy.FULL, flush_interval=0.05))
    conn = Conn(1, "127.0.0.1:1", "plain", "pulsar")
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    with caplog.at_level(logging.ERROR):
        recorder.frames(conn, True, frames)
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run)
            with trio.fail_after(10):
                while recorder.frames_written < len(frames):
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert recorder.dropped_total == 0 and not caplog.records
    data = b"".join(path.read_bytes() for path in recording_files(tmp_path))
    for secret in SECRETS:
        assert secret not in data, secret
    records = [r for p in recording_files(tmp_path) for r in read_records(p) if r["k"] == "frame"]
    assert [r["raw"] for r in records] == [ping, *[b""] * len(hostile), ping]
    assert [r["n"] for r in records] == [len(d) for d in (ping, *hostile, ping)]
