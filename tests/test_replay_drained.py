"""A recording made by a proxy stopped with SIGTERM while a client had a
producer open replays as equivalent: the drain's CLOSE_PRODUCER is Sluice's
own (recorded ``own``), not expected from the live broker. (Replay expected
it from the broker and reported it MISSING: DIVERGED, exit 1.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker, free_port, wait_for_port
from sluice.recording.reader import load
from tests.helpers.poll import wait_for_text
from tests.helpers.support import SLUICE, ProxyProcess, start_proxy

TOPIC = "persistent://public/default/drained"

# A client that opens a producer, sends one message, says so and stays
# connected until it is killed.
CLIENT = """
import sys, time, pulsar
c = pulsar.Client(sys.argv[1], operation_timeout_seconds=15,
                  logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
p = c.create_producer(sys.argv[2], batching_enabled=False)
p.send(b"before the drain")
print("sent", flush=True)
while True:
    time.sleep(1)
"""


@pytest.mark.e2e
def test_a_recording_drained_with_a_producer_open_replays_as_equivalent(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    log = tmp_path / "client.log"
    with EmbeddedBroker() as broker:
        proxy = start_proxy(broker.url, tmp_path, "--record", str(record),
                            "--record-payloads", "full")  # fmt: skip
        client: subprocess.Popen[bytes] | None = None
        try:
            with open(log, "wb") as out:
                client = subprocess.Popen([sys.executable, "-c", CLIENT, proxy.url, TOPIC],
                                          stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
            wait_for_text(client, log, "sent", 60, "the client's message")
            # SIGTERM while the client holds its producer: the proxy drains.
            assert proxy.terminate() == 0, proxy.log()
        finally:
            if client is not None and client.poll() is None:
                client.kill()
                client.wait(30)
            proxy.kill()
    closes = [
        rf.summary
        for conn in load(record).connections
        for rf in conn.frames
        if rf.summary["cmd"] == "CLOSE_PRODUCER"
    ]
    assert closes, proxy.log()  # the drain closed the producer, and it was recorded
    assert all(summary.get("own") is True for summary in closes), closes

    with EmbeddedBroker() as fresh:
        replayed = subprocess.run(
            [*SLUICE, "replay", str(record), "--broker", fresh.url, "--timeout", "3",
             "--transcript", str(tmp_path / "transcript.txt")],
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "equivalent:" in replayed.stdout, replayed.stdout
    transcript = (tmp_path / "transcript.txt").read_text()
    assert (
        "INJECTED WHEN RECORDED (not expected from the broker) type: CLOSE_PRODUCER" in transcript
    )

    # And against ``sluice serve`` of the same recording (the install test's way).
    port = free_port()
    with open(tmp_path / "serve.log", "wb") as out:
        process = subprocess.Popen([*SLUICE, "serve", str(record), "--listen", f"127.0.0.1:{port}"],
                                   stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    served = ProxyProcess(process, port, tmp_path / "serve.log")
    try:
        wait_for_port("127.0.0.1", port, 30, process)
        replayed = subprocess.run(
            [*SLUICE, "replay", str(record), "--broker", served.url, "--timeout", "3"],
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert replayed.returncode == 0, (replayed.stdout, replayed.stderr, served.log())
        assert "equivalent" in replayed.stdout, replayed.stdout
        assert served.terminate() == 0, served.log()
    finally:
        served.kill()
