"""`sluice replay` with the real client's recording and fresh real brokers."""

from __future__ import annotations

import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pulsar
import pytest

from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.pulsar import Type, command, decode_frame, encode, encode_payload, pb
from sluice.recording import format as fmt
from sluice.recording.format import read_records, recording_files
from sluice.recording.reader import load
from tests.helpers.support import SLUICE, client, recorded_session, start_proxy

T = Type.Value
TOPIC = "persistent://public/default/replayed"


def session(url: str) -> None:
    """Lookups, a producer unbatched and one batched, a consumer with acks, a reader."""
    with client(url) as c:
        plain = c.create_producer(TOPIC, batching_enabled=False)
        for i in range(8):
            plain.send(f"plain-{i}".encode())
        batched = c.create_producer(TOPIC, batching_enabled=True, batching_max_messages=4,
                                    batching_max_publish_delay_ms=1000)  # fmt: skip
        done = threading.Semaphore(0)
        for i in range(8):
            batched.send_async(f"batched-{i}".encode(), lambda res, mid: done.release())
        batched.flush()
        for _ in range(8):
            assert done.acquire(timeout=10)
        # Subscribed after publishing (pulsar-lite then dispatches each entry once).
        consumer = c.subscribe(TOPIC, "s", initial_position=pulsar.InitialPosition.Earliest)
        ids = []
        for _ in range(16):
            msg = consumer.receive(timeout_millis=10_000)
            ids.append(msg.message_id())
            consumer.acknowledge(msg)
        # A reader positioned at a message id (what seeking does for readers;
        # pulsar-lite answers an explicit SEEK but does not reposition).
        reader = c.create_reader(TOPIC, ids[3])
        for _ in range(3):
            reader.read_next(timeout_millis=10_000)
        consumer.seek(ids[0])


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recorded_session(tmp_path_factory.mktemp("replay"), session)


def replay(
    recording: Path, broker: EmbeddedBroker, *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SLUICE, "replay", str(recording), "--broker", broker.url, "--timeout", "3", *extra],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def test_replay_against_fresh_brokers_is_equivalent_and_repeatable(
    recording: Path, tmp_path: Path
) -> None:
    transcripts = []
    for i in range(2):
        with EmbeddedBroker() as fresh:
            result = replay(recording, fresh, "--transcript", str(tmp_path / f"t{i}.txt"))
        assert result.returncode == 0, result.stdout + result.stderr
        assert (
            "equivalent:" in result.stdout
            and " 0 diverged, 0 missing, 0 unexpected" in result.stdout
        )
        transcripts.append((tmp_path / f"t{i}.txt").read_bytes())
    assert transcripts[0] == transcripts[1]
    text = transcripts[0].decode()
    # The transcript covers the whole session, credentials-free and normalised.
    for needed in ("LOOKUP", "PRODUCER_SUCCESS", "SEND_RECEIPT", "MESSAGE", "ACK", "SEEK"):
        assert needed in text


@pytest.mark.e2e
def test_a_connection_closed_in_the_recording_is_closed_in_the_replay(tmp_path: Path) -> None:
    """A consumer whose client goes away (its connection closed, no
    CLOSE_CONSUMER), then another on the same exclusive subscription: the
    replay closes the first connection where the recording does, so the
    second subscribes and gets the messages, as recorded. (Every connection
    was kept open to the end: the broker refused the second consumer and
    gave the messages to the dead one; and a session of many short
    connections ran out of file descriptors.)"""
    topic = "persistent://public/default/replay-restart"
    # The first client subscribes, then its process ends at once: its
    # connection closes with no CLOSE_CONSUMER, so the broker keeps the
    # consumer until the connection is gone.
    dies = (
        "import os, sys, pulsar\n"
        "c = pulsar.Client(sys.argv[1], logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))\n"
        "c.subscribe(sys.argv[2], 'ex', consumer_type=pulsar.ConsumerType.Exclusive)\n"
        "os._exit(0)\n"
    )

    def restart(url: str) -> None:
        subprocess.run([sys.executable, "-c", dies, url, topic], check=True, timeout=60)
        with client(url) as again:
            producer = again.create_producer(topic, batching_enabled=False)
            for i in range(3):
                producer.send(f"m-{i}".encode())
            earliest = pulsar.InitialPosition.Earliest
            consumer = again.subscribe(topic, "ex", consumer_type=pulsar.ConsumerType.Exclusive,
                                       initial_position=earliest)  # fmt: skip
            for _ in range(3):
                consumer.acknowledge(consumer.receive(timeout_millis=10_000))

    recorded = recorded_session(tmp_path, restart)
    closes = [r for p in recording_files(recorded) for r in read_records(p) if r["k"] == "close"]
    assert closes  # the first client's connections ended before the second's began
    with EmbeddedBroker() as fresh:
        result = replay(recorded, fresh)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 diverged, 0 missing, 0 unexpected" in result.stdout, result.stdout


def tamper(recording: Path, tmp_path: Path, change: Any) -> Path:
    """A copy of the recording with ``change(record)`` applied to every frame
    record; a change may return a list of records to put in its place."""
    out = tmp_path / "tampered"
    out.mkdir()
    for path in recording_files(recording):
        records: list[dict[str, Any]] = []
        for r in read_records(path):
            changed = change(r) if r["k"] == "frame" else r
            records += changed if isinstance(changed, list) else [changed]
        (out / path.name).write_bytes(fmt.dumps(records))
    return out


def test_a_receipt_turned_into_an_error_is_reported(recording: Path, tmp_path: Path) -> None:
    state = {"done": False}

    def change(record: dict[str, Any]) -> dict[str, Any]:
        if state["done"] or record["s"]["cmd"] != "SEND_RECEIPT":
            return record
        state["done"] = True
        body = decode_frame(record["raw"]).body
        error = pb.CommandSendError(producer_id=body.producer_id, sequence_id=body.sequence_id,
                                    error=pb.PersistenceError, message="disk on fire")  # fmt: skip
        return {**record, "raw": encode(command(T("SEND_ERROR"), error))}

    tampered = tamper(recording, tmp_path, change)
    with EmbeddedBroker() as fresh:
        result = replay(tampered, fresh)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "DIVERGED" in result.stdout and "SEND_ERROR" in result.stdout
    assert "PersistenceError" in result.stdout  # both frames shown side by side


def test_replay_through_a_proxy_names_the_live_broker(recording: Path, tmp_path: Path) -> None:
    """--broker is a proxy (here a second Sluice): its lookup answers say
    proxy_through_service_url, so the proxied connection's CONNECT names the
    broker they named, not the recorded one (nor none, which a proxy takes
    for a lookup-only connection: PRODUCER "is not served" there)."""
    with EmbeddedBroker() as fresh:
        p = start_proxy(fresh.url, tmp_path)
        try:
            result = subprocess.run(
                [*SLUICE, "replay", str(recording), "--broker", p.url, "--timeout", "3"],
                capture_output=True, text=True, timeout=180, check=False,
            )  # fmt: skip
        finally:
            p.kill()
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 diverged, 0 missing, 0 unexpected" in result.stdout, result.stdout


def test_a_changed_payload_is_reported(recording: Path, tmp_path: Path) -> None:
    state = {"done": False}

    def change(record: dict[str, Any]) -> dict[str, Any]:
        if state["done"] or record["s"]["cmd"] != "MESSAGE":
            return record
        state["done"] = True
        frame = decode_frame(record["raw"])
        assert frame.command is not None and frame.metadata is not None
        raw = encode_payload(frame.command, frame.metadata, b"tampered payload",
                             checksum=frame.checksum is not None)  # fmt: skip
        return {**record, "raw": raw}

    tampered = tamper(recording, tmp_path, change)
    with EmbeddedBroker() as fresh:
        result = replay(tampered, fresh)
    assert result.returncode == 1
    assert "DIVERGED c" in result.stdout and " MESSAGE\n" in result.stdout


def test_recorded_redeliveries_are_counted_not_waited_for(recording: Path, tmp_path: Path) -> None:
    """A broker that redelivered while recording (pulsar-lite does under load)
    need not do it again: replay neither waits --timeout for each redelivery
    nor calls the replay diverged, and says how many there were."""
    copies = {"left": 3}

    def change(record: dict[str, Any]) -> Any:
        if copies["left"] == 0 or record["s"]["cmd"] != "MESSAGE":
            return record
        copies["left"] -= 1
        return [record, dict(record)]  # the same message sent to the consumer again

    tampered = tamper(recording, tmp_path, change)
    assert copies["left"] == 0
    with EmbeddedBroker() as fresh:
        result = replay(tampered, fresh, "--transcript", str(tmp_path / "t.txt"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 recorded, 0 live" in result.stdout
    assert "ran out" not in result.stdout  # no wait for what the live broker never sent
    assert (tmp_path / "t.txt").read_text().count("REDELIVERED WHEN RECORDED") == 3


def test_frames_that_never_come_at_the_end_cost_one_timeout_in_all(
    recording: Path, tmp_path: Path
) -> None:
    """Ten deliveries recorded after the consumer's last client frame, of
    messages the topic never had: the wait for what is left ends after one
    --timeout of silence, not after ten."""
    out = tmp_path / "more"
    out.mkdir()
    for path in recording_files(recording):
        records = list(read_records(path))
        last = max(
            i for i, r in enumerate(records) if r["k"] == "frame" and r["s"]["cmd"] == "MESSAGE"
        )
        conn = records[last]["c"]
        close = next(i for i, r in enumerate(records) if r["k"] == "close" and r["c"] == conn)
        frame = decode_frame(records[last]["raw"])
        assert frame.command is not None and frame.metadata is not None
        extra = []
        for i in range(10):
            cmd = pb.BaseCommand()
            cmd.CopyFrom(frame.command)
            cmd.message.message_id.entryId += 1000 + i
            raw = encode_payload(cmd, frame.metadata, frame.payload, checksum=True)
            extra.append({**records[last], "raw": raw})
        (out / path.name).write_bytes(fmt.dumps(records[:close] + extra + records[close:]))
    with EmbeddedBroker() as fresh:
        started = time.monotonic()
        result = replay(out, fresh)
        elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stdout + result.stderr
    assert " 10 missing, 0 unexpected" in result.stdout, result.stdout
    # --timeout is 3: one timeout and the replay itself, far from ten timeouts.
    assert elapsed < 20, f"{elapsed:.1f} s"


@pytest.mark.e2e
def test_deliveries_a_broker_does_not_have_cost_one_timeout_not_one_per_ack(
    tmp_path: Path,
) -> None:
    """Only the consumer went through the proxy (its producer went straight
    to the broker), so a fresh broker has nothing to deliver. The consumer
    acknowledged each of its 16 messages: once one wait for a delivery has
    run out and the connection has stayed silent, the ACKs after it go out
    without a wait each (that was 16 timeouts)."""
    topic = "persistent://public/default/consumed-only"
    with EmbeddedBroker() as broker:
        p = start_proxy(broker.url, tmp_path, "--record", str(tmp_path / "rec"),
                        "--record-payloads", "full")  # fmt: skip
        try:
            with client(broker.url) as direct, client(p.url) as proxied:
                consumer = proxied.subscribe(topic, "s")
                producer = direct.create_producer(topic, batching_enabled=False)
                for i in range(16):
                    producer.send(f"m-{i}".encode())
                for _ in range(16):
                    consumer.acknowledge(consumer.receive(timeout_millis=10_000))
            assert p.terminate() == 0
        finally:
            p.kill()
    with EmbeddedBroker() as fresh:
        started = time.monotonic()
        result = replay(tmp_path / "rec", fresh)
        elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stdout + result.stderr
    assert " 16 missing, 0 unexpected" in result.stdout, result.stdout
    assert "note: 1 waits for a broker frame ran out" in result.stdout, result.stdout
    # --timeout is 3: one timeout and the replay itself, not sixteen timeouts.
    assert elapsed < 20, f"{elapsed:.1f} s"


def test_a_connection_the_broker_closes_costs_no_waits(recording: Path, tmp_path: Path) -> None:
    """After the consumer's first MESSAGE the client sends a frame that is
    not protobuf: the broker hangs up, so what that connection still
    expected never comes, and no wait is spent on it (it was one timeout
    per expected answer)."""
    state = {"done": False}

    def change(record: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        if state["done"] or record["s"]["cmd"] != "MESSAGE":
            return record
        state["done"] = True
        garbage = struct.pack(">II", 8, 4) + b"\xff" * 4
        return [record, {**record, "d": 0, "raw": garbage, "n": len(garbage)}]

    tampered = tamper(recording, tmp_path, change)
    with EmbeddedBroker() as fresh:
        started = time.monotonic()
        result = replay(tampered, fresh)
        elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stdout + result.stderr
    assert "MISSING" in result.stdout and "Traceback" not in result.stderr, result.stdout
    assert "ran out" not in result.stdout, result.stdout
    assert elapsed < 10, f"{elapsed:.1f} s"


def test_a_broker_with_other_state_diverges(recording: Path) -> None:
    with EmbeddedBroker() as busy:
        with client(busy.url) as c:  # the topic already holds messages
            producer = c.create_producer(TOPIC, batching_enabled=False)
            for i in range(3):
                producer.send(f"already-there-{i}".encode())
        result = replay(recording, busy)
    assert result.returncode == 1, result.stdout
    assert "DIVERGED" in result.stdout


def test_usage_errors_exit_2(tmp_path: Path, recording: Path) -> None:
    hashed = tmp_path / "hashed"
    with EmbeddedBroker() as broker:
        p = start_proxy(broker.url, tmp_path, "--record", str(hashed))
        try:
            with client(p.url) as c:
                c.create_producer("persistent://public/default/h").send(b"x")
            p.terminate()
        finally:
            p.kill()
        no_payloads = replay(hashed, broker)
        missing = replay(tmp_path / "nothing-here", broker)
    assert no_payloads.returncode == 2 and "--record-payloads full" in no_payloads.stderr
    assert missing.returncode == 2
    from sluice.brokers.embedded import free_port

    dead = subprocess.run(
        [*SLUICE, "replay", str(recording), "--broker", f"pulsar://127.0.0.1:{free_port()}",
         "--timeout", "1"], capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert dead.returncode == 1 and "cannot reach broker" in dead.stderr  # a broker down
    for result in (no_payloads, missing, dead):
        errors = [ln for ln in result.stderr.splitlines() if not ln.startswith("[replay]")]
        assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr


def test_an_address_that_is_not_a_pulsar_broker_is_a_usage_error(recording: Path) -> None:
    # A web port given for the binary one: what answers is not Pulsar, which
    # is not a divergence of the broker (exit 1) but a mistake (exit 2).
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    done = threading.Event()

    def answer_http() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # (a timeout: look at done again)
                continue
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=answer_http, daemon=True)
    thread.start()
    try:
        result = subprocess.run(
            [*SLUICE, "replay", str(recording), "--broker", f"pulsar://127.0.0.1:{port}",
             "--timeout", "3"], capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        done.set()
        thread.join(5)
        listener.close()
    assert result.returncode == 2, result.stdout + result.stderr
    assert "does not speak the Pulsar protocol" in result.stderr
    assert "Traceback" not in result.stderr and "DIVERGED" not in result.stdout


# --- an incomplete recording: what it explains is said, not counted as divergence ---


def test_frames_the_recorder_dropped_are_said_not_counted_as_divergence(
    recording: Path, tmp_path: Path
) -> None:
    """Three SENDs of the recording are replaced by the gap record the
    recorder writes when it drops frames: their receipts, and the messages
    the consumer got from them, do not come live."""
    out = tmp_path / "gapped"
    out.mkdir()
    sends = 0
    for path in recording_files(recording):
        records: list[dict[str, Any]] = []
        for r in read_records(path):
            if r["k"] == "frame" and r["d"] == 0 and r["s"]["cmd"] == "SEND":
                sends += 1
                if sends == 3:
                    records.append({"k": "gap", "t": r["t"], "w": r["w"], "dropped": 3})
                if 3 <= sends <= 5:
                    continue
            records.append(r)
        (out / path.name).write_bytes(fmt.dumps(records))
    assert sends > 5
    transcript = tmp_path / "transcript.txt"
    with EmbeddedBroker() as fresh:
        result = replay(out, fresh, "--transcript", str(transcript))
    report = result.stdout
    assert result.returncode == 0, report + result.stderr
    assert "note: the recording is incomplete: 3 frames were not recorded" in report, report
    assert "EXPECTED" in report and "MISSING" in report  # the receipts that did not come
    assert "equivalent where the recording is complete" in report, report
    assert " 0 diverged, 0 missing, 0 unexpected" in report, report
    assert "~~~ GAP 3 frames not recorded here" in transcript.read_text()


def test_connections_recorded_from_mid_stream_are_said(broker: EmbeddedBroker,
                                                       tmp_path: Path) -> None:  # fmt: skip
    """Small segments, the first gone (as --record-retain-bytes removes the
    oldest): the connections it opened are restated by the next one and
    replayed from there, without their CONNECT."""
    directory = tmp_path / "rec"
    proxy = start_proxy(broker.url, tmp_path, "--record", str(directory),
                        "--record-payloads", "full", "--record-max-bytes", "4096")  # fmt: skip
    try:
        session(proxy.url)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    first, *rest = recording_files(directory)
    assert len(rest) >= 2
    first.unlink()
    transcript = tmp_path / "transcript.txt"
    with EmbeddedBroker() as fresh:
        result = replay(directory, fresh, "--transcript", str(transcript))
    report = result.stdout
    assert result.returncode == 0, report + result.stderr
    late = [conn.name for conn in load(directory).connections if conn.late]
    assert late and f"{', '.join(late)} recorded from mid-stream" in report, report
    assert "EXPECTED" in report, report
    assert "RECORDED FROM MID-STREAM" in transcript.read_text()


@pytest.mark.e2e
def test_a_connection_the_recording_proxy_refused_is_not_replayed(
    recording: Path, tmp_path: Path
) -> None:
    """A client whose first frame was no CONNECT (a PING here) was refused by
    the recording proxy itself, answered with the proxy's own ERROR: the
    broker never saw it, so replay neither sends it nor waits for that
    ERROR (it was reported MISSING, after a --timeout, and DIVERGED)."""
    out = tmp_path / "refused"
    out.mkdir()
    ping = encode(command(T("PING")))
    refusal = pb.CommandError(request_id=2**64 - 1, error=pb.NotAllowedError,
                              message="expected CONNECT, got PING")  # fmt: skip
    error = encode(command(T("ERROR"), refusal))
    for n, path in enumerate(recording_files(recording)):
        records = list(read_records(path))
        if n == 0:
            first = next(r for r in records if r["k"] == "conn")
            t, w = first["t"], first["w"]
            refused = [
                {**first, "c": 9999, "kind": "invalid"},
                {"k": "frame", "c": 9999, "d": 0, "t": t, "w": w, "n": len(ping), "raw": ping,
                 "s": {"cmd": "PING"}},
                {"k": "frame", "c": 9999, "d": 1, "t": t, "w": w, "n": len(error), "raw": error,
                 "s": {"cmd": "ERROR"}},
                {"k": "close", "c": 9999, "t": t, "w": w, "reason": "handshake"},
            ]  # fmt: skip
            records[1:1] = refused
        (out / path.name).write_bytes(fmt.dumps(records))
    transcript = tmp_path / "t.txt"
    with EmbeddedBroker() as fresh:
        result = replay(out, fresh, "--transcript", str(transcript))
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 diverged, 0 missing, 0 unexpected" in result.stdout, result.stdout
    assert "c9999 were refused by the recording proxy" in result.stdout, result.stdout
    assert "ran out" not in result.stdout, result.stdout
    assert "c9999 ~~~ REFUSED BY THE RECORDING PROXY" in transcript.read_text()
