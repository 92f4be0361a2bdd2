"""A SEND that Sluice refuses is answered after the receipts of the sends
before it, with many sends in flight (the broker paused meanwhile, so
that none of them has its receipt yet when Sluice refuses one):

- for a producer whose SENDs the compiled step seals (the ``encrypt``
  filter alone on its topic), refused when sealing takes it past the frame
  limit;
- on Apache Pulsar, whose receipts of sends that are no batch carry a
  highest_sequence_id of -1 (2**64 - 1 unsigned), with the ``schema``
  filter.

The official client (C++) fails the oldest send it waits for on a
SEND_ERROR: one that overtook the receipt of an earlier send is taken for
the wrong one, and the client drops the connection and sends them again
(or, as seen, crashes: so it runs in a process of its own here)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO

import pytest
from pulsar.schema import AvroSchema

from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.brokers.embedded import EmbeddedBroker, free_port
from tests.helpers.support import ProxyProcess, client, start_proxy, wait_stopped
from tests.test_dashboards import scrape, value
from tests.test_encryption_e2e import make_key_pair
from tests.test_filters_e2e import Order, _avro

pytestmark = pytest.mark.e2e

MAX = 1024 * 1024  # pulsar-lite's message size limit here, and Sluice's
IN_FLIGHT = 30
AFTER = 5
EXPECTED = [
    *[(i, "Ok") for i in range(IN_FLIGHT)],
    (IN_FLIGHT, "ChecksumError"),
    *[(IN_FLIGHT + 1 + i, "Ok") for i in range(AFTER)],
]

# The client: its payloads on its first line in; a producer, 20 good sends
# one at a time (a connection's directions go to the relay thread),
# "ready"; on "go", IN_FLIGHT good sends, the bad one, AFTER good ones, all
# at once; then each answer as it comes, a JSON line (index, result).
CLIENT = """
import json, logging, sys, pulsar
logging.basicConfig(level=logging.WARNING)  # (on stderr: stdout is for the answers)
url, topic, in_flight, after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
good, bad, properties = json.loads(sys.stdin.readline())
good, bad = bytes.fromhex(good), bytes.fromhex(bad)
client = pulsar.Client(url, operation_timeout_seconds=10, logger=logging.getLogger("client"))
producer = client.create_producer(topic, batching_enabled=False)
for i in range(20):
    producer.send(good)
print("ready", flush=True)
sys.stdin.readline()
def answered(i):
    return lambda result, _: print(json.dumps([i, result.name]), flush=True)
for i in range(in_flight):
    producer.send_async(good, answered(i))
producer.send_async(bad, answered(in_flight), properties=properties)
for i in range(after):
    producer.send_async(good, answered(in_flight + 1 + i))
producer.flush()
sys.stdin.readline()
"""


def refused_among_in_flight(
    broker_pid: int | None,
    proxy: ProxyProcess,
    admin: int,
    topic: str,
    good: bytes,
    bad: bytes,
    properties: dict[str, str] | None = None,
) -> tuple[list[tuple[int, str]], dict[str, float]]:
    """The client's answers, in the order it got them, and the sends Sluice
    refused by reason while the broker was paused."""
    url = f"pulsar://127.0.0.1:{proxy.port}"
    process = subprocess.Popen(
        [sys.executable, "-c", CLIENT, url, topic, str(IN_FLIGHT), str(AFTER)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None and broker_pid is not None
    try:
        process.stdin.write(json.dumps([good.hex(), bad.hex(), properties or {}]) + "\n")
        process.stdin.flush()
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True).start()
        assert lines.get(timeout=60) == "ready\n"
        os.kill(broker_pid, signal.SIGSTOP)
        try:
            wait_stopped(broker_pid)
            process.stdin.write("go\n")
            process.stdin.flush()
            deadline = time.monotonic() + 20
            while not _rejected(proxy, admin) and time.monotonic() < deadline:
                time.sleep(0.05)
            refused = _rejected(proxy, admin)
        finally:
            os.kill(broker_pid, signal.SIGCONT)
        answers: list[tuple[int, str]] = []
        deadline = time.monotonic() + 20
        while len(answers) < len(EXPECTED):
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if not line:  # the client ended (it may crash)
                break
            index, result = json.loads(line)
            answers.append((index, result))
        return answers, refused
    finally:
        process.kill()
        process.wait()


def test_a_refused_send_of_a_compiled_sealed_producer_waits_for_earlier_receipts(
    tmp_path: Path,
) -> None:
    keys = make_key_pair(tmp_path, "k")
    spec = {"topics": ["persistent://public/default/h1-*"], "direction": "produce",
            "settings": {"public_keys": {"k": str(keys.public)}}}  # fmt: skip
    admin = free_port()
    topic = f"persistent://public/default/h1-{uuid.uuid4().hex[:8]}"
    with EmbeddedBroker(max_message_size=MAX) as broker:
        proxy = start_proxy(
            broker.url, tmp_path, "--filter", f"encrypt:{json.dumps(spec)}",
            "--max-message-size", str(MAX), "--admin", f"127.0.0.1:{admin}",
        )  # fmt: skip
        try:
            # The bad one is just under Sluice's frame limit as sent;
            # encrypted, past it: Sluice refuses it (too_large), and sends
            # none of it on.
            answers, refused = refused_among_in_flight(
                broker.pid, proxy, admin, topic, b"x" * 1000, b"y" * (MAX - 64),
                {"p": "z" * 10_190},
            )  # fmt: skip
            assert refused == {"too_large": 1.0}
            assert answers == EXPECTED
            # The compiled loop carried reads of this connection by itself.
            metrics = scrape(proxy, admin)
            assert value(metrics, "sluice_relay_thread_reads_total", path="compiled") > 0
        finally:
            proxy.kill()
    assert "Traceback" not in proxy.log(), proxy.log()


def test_a_refused_send_waits_for_apache_pulsars_receipts(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    spec = json.dumps({"topics": ["persistent://public/default/h1-*"], "direction": "produce"})
    admin = free_port()
    proxy = start_proxy(apache_pulsar.url, tmp_path, "--filter", f"schema:{spec}",
                        "--admin", f"127.0.0.1:{admin}")  # fmt: skip
    try:
        topic = f"persistent://public/default/h1-{uuid.uuid4().hex[:8]}"
        schema = AvroSchema(Order)
        with client(apache_pulsar.url) as c:  # a typed producer gives the topic its schema
            c.create_producer(topic, schema=schema).send(Order(id=1, item="typed"))
        good = _avro({"id": 2, "item": "raw"}, json.loads(schema.schema_info().schema()))
        answers, refused = refused_among_in_flight(
            apache_pulsar.pid, proxy, admin, topic, good, b"not avro at all"
        )
        assert refused == {"not_avro": 1.0}
        assert answers == EXPECTED
    finally:
        proxy.kill()
    assert "Traceback" not in proxy.log(), proxy.log()


def _rejected(proxy: ProxyProcess, admin: int) -> dict[str, float]:
    """sluice_filter_rejected_total by reason."""
    return {
        dict(labels)["reason"]: count
        for (name, labels), count in scrape(proxy, admin).items()
        if name == "sluice_filter_rejected_total"
    }


def _read_lines(stream: IO[str], lines: queue.Queue[str]) -> None:
    """Each line of ``stream`` into ``lines``, then "" at its end."""
    for line in stream:
        lines.put(line)
    lines.put("")
