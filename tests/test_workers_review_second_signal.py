"""`sluice proxy --workers N`: a second SIGTERM to the supervisor stops at
once, as a lone proxy's does, and like it the workers close their
recordings rather than being killed with it unwritten (real processes on
loopback, pulsar-lite as the broker, every process stopped by PID)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from sluice.proxy.workers import STOP_GRACE
from sluice.recording.format import Unfinished, read_records, recording_files
from tests.helpers.support import (
    RawClient,
    client,
    kill_with_workers,
    start_proxy,
    wait_stopped,
    worker_pids,
)

pytestmark = pytest.mark.e2e


def test_a_second_sigterm_stops_the_workers_at_once_with_their_recordings_written(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    """Sends recorded (flushed only every minute), then SIGTERM, and a
    second one while the workers drain (`kill; kill`, an impatient
    operator): the supervisor SIGKILLed every worker, and what the
    recorders held was lost (the recording file was empty, not even its
    header); a lone proxy closes its recording on the second signal. The
    stop is still at once (well within the drain timeout)."""
    record = tmp_path / "rec"
    proxy = start_proxy(broker.url, tmp_path, "--workers", "2", "--record", str(record),
                        "--record-flush-interval", "60", "--drain-timeout", "30")  # fmt: skip
    pids: dict[int, int] = {}
    held: RawClient | None = None
    try:
        pids = worker_pids(proxy, 2)
        assert len(pids) == 2, proxy.log()
        with client(proxy.url) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            for i in range(10):
                producer.send(f"m-{i}".encode())
        held = RawClient(proxy.port)
        assert held.connect().name == "CONNECTED"
        proxy.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while proxy.log().count("the supervisor drains: draining") < 2:
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.05)
        started = time.monotonic()
        proxy.process.send_signal(signal.SIGTERM)
        proxy.process.wait(20)
        assert time.monotonic() - started < 10, proxy.log()  # at once, not the drain's 30 s
        for pid in pids.values():  # gone, and reaped
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        frames = []
        for path in recording_files(record):
            try:
                frames += [r for r in read_records(path) if r.get("k") == "frame"]
            except Unfinished as exc:  # (an empty file: its writer killed)
                raise AssertionError(f"{exc}\n{proxy.log()}") from None
        # Each send and its receipt at least, besides the handshakes.
        assert len(frames) >= 20, (len(frames), proxy.log())
    finally:
        if held is not None:
            with contextlib.suppress(OSError):
                held.sock.close()
        kill_with_workers(proxy, pids)


def test_a_second_sigterm_kills_a_worker_that_does_not_stop_within_the_grace(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """A worker that cannot act on the word to stop (stopped, SIGSTOP) is
    killed once STOP_GRACE has passed, named in the log: the second signal
    does not wait for the drain timeout."""
    proxy = start_proxy(broker.url, tmp_path, "--workers", "2", "--drain-timeout", "30")
    pids: dict[int, int] = {}
    try:
        pids = worker_pids(proxy, 2)
        assert len(pids) == 2, proxy.log()
        os.kill(pids[0], signal.SIGSTOP)
        wait_stopped(pids[0])
        proxy.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while "w1 sluice.workers: the supervisor drains" not in proxy.log():
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.05)
        started = time.monotonic()
        proxy.process.send_signal(signal.SIGTERM)
        proxy.process.wait(20)
        took = time.monotonic() - started
        log = proxy.log()
        assert STOP_GRACE - 0.5 < took < STOP_GRACE + 5, (took, log)
        assert f"worker 0 (pid {pids[0]}) killed: did not stop within 3s of the second" in log
        assert f"worker 1 (pid {pids[1]}) killed" not in log, log  # it stopped when told
        with pytest.raises(ProcessLookupError):
            os.kill(pids[0], 0)
    finally:
        kill_with_workers(proxy, pids)
