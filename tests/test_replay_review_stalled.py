"""`sluice replay` against a broker that stops reading: bounded, not a hang.

A broker that accepts connections but takes nothing more (hung, paused,
its process stopped) must cost a --timeout, not the rest of time: a client
frame that cannot go out within --timeout gives its connection up."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers.support import SLUICE, client, recorded_session

TOPIC = "persistent://public/default/review-stalled"
SIZE = 100_000
COUNT = 300  # 30 MB of SENDs: more than loopback's socket buffers hold


def produce(url: str) -> None:
    with client(url) as c:
        producer = c.create_producer(TOPIC, batching_enabled=False)
        for i in range(COUNT):
            producer.send_async(bytes([i % 256]) * SIZE, lambda res, mid: None)
        producer.flush()


@pytest.mark.e2e
def test_a_broker_that_stops_reading_costs_a_timeout_not_a_hang(tmp_path: Path) -> None:
    recording = recorded_session(tmp_path, produce)
    with EmbeddedBroker() as broker:
        assert broker.pid is not None
        os.kill(broker.pid, signal.SIGSTOP)  # accepts (the kernel's backlog), reads nothing
        try:
            started = time.monotonic()
            try:
                result = subprocess.run(
                    [*SLUICE, "replay", str(recording), "--broker", broker.url,
                     "--timeout", "2"],
                    capture_output=True, text=True, timeout=60, check=False,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                pytest.fail("replay still running after 60 s against a broker that reads nothing")
            took = time.monotonic() - started
        finally:
            os.kill(broker.pid, signal.SIGCONT)
    assert result.returncode == 1, result.stderr
    assert "DIVERGED" in result.stdout
    assert "took nothing for 2s" in result.stderr, result.stderr
    # One line per connection given up, not one per frame it had left.
    assert result.stderr.count("given up") <= 2, result.stderr
    assert took < 40
