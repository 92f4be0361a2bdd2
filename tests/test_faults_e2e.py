"""Fault injection with the real pulsar-client through `sluice proxy`, in
front of the real pulsar-lite broker (and Apache Pulsar, where a test takes
``any_broker``): what a client experiences when a rule fires, and what the
proxy's metrics and recording say about it."""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar
import pytest

from sluice.brokers import Broker
from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.commands.faults import call
from sluice.protocols.pulsar import pb
from sluice.recording.reader import load
from tests.helpers.support import SLUICE, ProxyProcess, client, start_proxy
from tests.test_dashboards import scrape, value

pytestmark = pytest.mark.broker

TOKEN = "fault-test-token-8c1e"


@dataclass
class FaultyProxy:
    proxy: ProxyProcess
    admin: str
    token_file: Path
    record: Path

    def add(self, **rule: Any) -> str:
        answer = call(self.admin, "POST", "/faults", TOKEN, rule)
        return str(answer["id"])

    def rules(self) -> list[dict[str, Any]]:
        return list(call(self.admin, "GET", "/faults")["rules"])

    def cli(self, *args: str) -> str:
        command = [*SLUICE, "faults", args[0], "--admin", self.admin,
                   "--admin-token-file", str(self.token_file), *args[1:]]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout


def faulty_proxy(broker: Broker, tmp_path: Path, *extra: str) -> FaultyProxy:
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    admin = f"127.0.0.1:{free_port()}"
    record = tmp_path / "rec"
    proxy = start_proxy(broker.url, tmp_path, "--admin", admin, "--admin-token-file",
                        str(token_file), "--record", str(record), "--record-payloads", "full",
                        "--record-flush-interval", "0.2", *extra)  # fmt: skip
    return FaultyProxy(proxy, admin, token_file, record)


@pytest.fixture
def faulty(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[FaultyProxy]:
    yield from faulty_fixture(broker, tmp_path)


@pytest.fixture
def any_faulty(any_broker: Broker, tmp_path: Path) -> Iterator[FaultyProxy]:
    yield from faulty_fixture(any_broker, tmp_path)


def faulty_fixture(broker: Broker, tmp_path: Path) -> Iterator[FaultyProxy]:
    p = faulty_proxy(broker, tmp_path)
    yield p
    p.proxy.kill()
    log = p.proxy.log()
    assert "Traceback" not in log, log
    assert TOKEN not in log


def send_latencies(producer: pulsar.Producer, n: int, tag: str) -> list[float]:
    out = []
    for i in range(n):
        started = time.monotonic()
        producer.send(f"{tag}-{i}".encode())
        out.append(time.monotonic() - started)
    return out


def test_delayed_receipts_slow_the_client_down_and_back(
    any_faulty: FaultyProxy, topic: str
) -> None:
    faulty = any_faulty
    with client(faulty.proxy.url) as c:
        producer = c.create_producer(topic, batching_enabled=False)
        send_latencies(producer, 5, "warm")
        before = statistics.median(send_latencies(producer, 20, "before"))
        assert before < 0.05, before
        added = faulty.cli("add", "--command", "SEND_RECEIPT", "--delay", "300ms")
        assert added.startswith("added f1: delay 300ms on command=SEND_RECEIPT"), added
        during = statistics.median(send_latencies(producer, 10, "during"))
        assert during >= 0.3, during
        listed = faulty.cli("list")
        assert "f1" in listed and "delay 300ms" in listed
        (rule,) = faulty.rules()
        assert rule["hits"] >= 10
        faulty.cli("clear")
        after = statistics.median(send_latencies(producer, 20, "after"))
        assert after < 0.05, after
        assert faulty.rules() == []
    admin_port = int(faulty.admin.rsplit(":", 1)[1])
    samples = scrape(faulty.proxy, admin_port)
    hits = value(samples, "sluice_faults_injected_total", rule="f1", action="delay")
    assert hits == rule["hits"] or hits >= 10
    faulty.proxy.terminate()
    # The recording says which anomalies were injected: inspect shows them.
    shown = subprocess.run([*SLUICE, "inspect", str(faulty.record)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("FAULT delay by rule f1 on SEND_RECEIPT") == hits
    summary = subprocess.run([*SLUICE, "inspect", str(faulty.record), "--summary"],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert f"injected faults: f1 delay x{int(hits)}" in summary.stdout


def test_clearing_a_delay_lets_go_of_what_it_held(faulty: FaultyProxy, topic: str) -> None:
    """A receipt held by a 60 s delay, and the rule cleared: the receipt
    goes at once (it stayed held for its whole minute, and everything after
    it on that connection with it)."""
    with client(faulty.proxy.url) as c:
        producer = c.create_producer(topic, batching_enabled=False, send_timeout_millis=90_000)
        send_latencies(producer, 3, "warm")
        faulty.add(match={"command": "SEND_RECEIPT"}, action="delay", delay_ms=60_000)
        sent: list[float] = []
        started = time.monotonic()
        producer.send_async(b"held", lambda result, _: sent.append(time.monotonic()))
        deadline = time.monotonic() + 30
        while not faulty.rules()[0]["hits"]:  # the receipt is held now
            assert time.monotonic() < deadline, "the receipt was never held"
            time.sleep(0.05)
        assert not sent
        faulty.cli("clear")
        producer.flush()
        assert sent and sent[0] - started < 15, sent
        assert statistics.median(send_latencies(producer, 10, "after")) < 0.05


def test_disconnect_after_the_hundredth_send_loses_no_acknowledged_message(
    any_broker: Broker, tmp_path: Path, topic: str
) -> None:
    broker = any_broker
    rules = tmp_path / "faults.json"
    rules.write_text(json.dumps([{"id": "cut", "match": {"command": "SEND"},
                                  "action": "disconnect", "after": 99, "times": 1}]))  # fmt: skip
    faulty = faulty_proxy(broker, tmp_path, "--faults", str(rules))
    try:
        with client(faulty.proxy.url) as consuming, client(faulty.proxy.url) as producing:
            consumer = consuming.subscribe(
                topic, "s", initial_position=pulsar.InitialPosition.Earliest
            )
            producer = producing.create_producer(
                topic, batching_enabled=False, block_if_queue_full=True, send_timeout_millis=30_000
            )
            acked = set()
            for i in range(300):
                payload = f"m-{i}".encode()
                producer.send(payload)  # raises if the send failed for good
                acked.add(payload)
            received: set[bytes] = set()
            deadline = time.monotonic() + 60
            while not acked <= received and time.monotonic() < deadline:
                try:
                    message = consumer.receive(timeout_millis=2000)
                except pulsar.Timeout:
                    continue
                received.add(message.data())
                consumer.acknowledge(message)
            assert acked <= received, f"{len(acked - received)} acknowledged messages lost"
        (rule,) = faulty.rules()
        assert (rule["id"], rule["hits"], rule["seen"]) == ("cut", 1, rule["seen"])
        assert rule["seen"] >= 100
    finally:
        faulty.proxy.terminate()
    # The producer's first connection ended by the fault; it came back through Sluice.
    recording = load(faulty.record)
    cut = [c for c in recording.connections if any(f.rule == "cut" for f in c.faults)]
    assert len(cut) == 1
    producers = [c for c in recording.connections if c.kind == "proxied"
                 and any(f.frame.name == "SEND" for f in c.frames)]  # fmt: skip
    assert len(producers) >= 2


def test_an_error_on_the_first_producer_is_retried_by_the_client(
    faulty: FaultyProxy, topic: str, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    faulty.add(match={"command": "PRODUCER"}, action="error", times=1)
    with client(faulty.proxy.url) as c:
        producer = c.create_producer(topic, batching_enabled=False)
        producer.send(b"after the retry")
    (rule,) = faulty.rules()
    assert rule["hits"] == 1 and rule["error"] == "ServiceNotReady"
    faulty.proxy.terminate()
    recording = load(faulty.record)
    answers = [f.frame for c in recording.connections for f in c.frames
               if not f.from_client and f.frame.name == "ERROR"]  # fmt: skip
    assert [a.body.error for a in answers] == [pb.ServiceNotReady]
    # Replay keeps the annotation: the transcript says where the fault was.
    transcript = tmp_path / "transcript.txt"
    replayed = subprocess.run([*SLUICE, "replay", str(faulty.record), "--broker", broker.url,
                               "--transcript", str(transcript), "--quiet", "--timeout", "5"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert replayed.returncode in (0, 1), replayed.stderr
    assert "holds 1 faults injected while recording" in replayed.stdout
    assert "FAULT error by rule f1 on C→B PRODUCER (when recorded)" in transcript.read_text()


def test_a_corrupted_message_is_caught_by_the_consumers_checksum(
    faulty: FaultyProxy, topic: str
) -> None:
    faulty.add(match={"command": "MESSAGE"}, action="corrupt", times=1, id="flip")
    sent = {f"c-{i}".encode() for i in range(5)}
    with client(faulty.proxy.url) as c:
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = c.create_producer(topic, batching_enabled=False)
        for payload in sorted(sent):
            producer.send(payload)
        received: list[bytes] = []
        # The client drops the corrupted message; pulsar-lite 0.2.0 takes its
        # ChecksumMismatch ACK as an ack and does not redeliver, so four is
        # what arrives: wait a little for a fifth, not long.
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and len(set(received)) < len(sent):
            try:
                message = consumer.receive(timeout_millis=1000)
            except pulsar.Timeout:
                continue
            received.append(message.data())
            consumer.acknowledge(message)
    # Nothing corrupted reached the application.
    assert set(received) <= sent
    (rule,) = faulty.rules()
    assert rule["hits"] == 1
    faulty.proxy.terminate()
    # The client noticed: it answered the corrupted MESSAGE with an ACK that
    # carries validation_error ChecksumMismatch.
    recording = load(faulty.record)
    acks = [f.frame.body for c in recording.connections for f in c.frames
            if f.from_client and f.frame.name == "ACK"]  # fmt: skip
    checks = [a.validation_error for a in acks if a.HasField("validation_error")]
    assert checks == [pb.CommandAck.ChecksumMismatch]


def test_dropped_pongs_make_the_clients_keepalive_give_up(faulty: FaultyProxy, topic: str) -> None:
    admin_port = int(faulty.admin.rsplit(":", 1)[1])
    with client(faulty.proxy.url) as c:
        producer = c.create_producer(topic, batching_enabled=False)
        producer.send(b"before")
        faulty.add(match={"command": "PONG", "direction": "to_client"}, action="drop")
        closed_before = sum(
            v for (name, _), v in scrape(faulty.proxy, admin_port).items()
            if name == "sluice_connections_closed_total"
        )  # fmt: skip
        # The client pings every 30 s and gives up when a ping is still
        # unanswered at the next one.
        deadline = time.monotonic() + 100
        closed = closed_before
        while closed == closed_before and time.monotonic() < deadline:
            time.sleep(1)
            closed = sum(
                v for (name, _), v in scrape(faulty.proxy, admin_port).items()
                if name == "sluice_connections_closed_total"
            )  # fmt: skip
        assert closed > closed_before, "the client never noticed its pings went unanswered"
        call(faulty.admin, "DELETE", "/faults", TOKEN)
        producer.send(b"after")  # it reconnected through the proxy
