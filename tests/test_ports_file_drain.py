"""A proxy started in place of one that drains takes its
``--broker-ports-file`` at once: the draining proxy (lone, or a supervisor
and its workers) lets the file go as its drain begins, with its
listeners, and gives no broker a port from then on. A file that cannot be
locked is refused in one line."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pulsar
import pytest

from sluice.addresses import Address
from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.proxy.shared import BROKER_PORTS_LOCK, SharedBrokerPorts, stop_giving_ports
from tests.helpers.support import (
    QUIET,
    kill_with_workers,
    start_proxy,
    wait_stopped,
    worker_pids,
)
from tests.test_dashboards import scrape


def test_a_draining_holder_lets_the_file_go_and_gives_no_port(tmp_path: Path) -> None:
    path = tmp_path / "ports"
    lone = SharedBrokerPorts(path, held=True)
    assert lone.assign(Address("b1", 6650), [7000, 7001]) == 7000
    lone.let_go()
    assert lone.assign(Address("b1", 6650), [7000, 7001]) == 7000  # known: kept
    with pytest.raises(ValueError, match="draining"):
        lone.assign(Address("b2", 6650), [7000, 7001])
    # Let go: the next proxy holds it, while this one still has it open.
    after = SharedBrokerPorts(path, held=True)
    assert after.assign(Address("b2", 6650), [7000, 7001]) == 7001
    after.close()
    lone.close()
    # A supervisor's drain: its workers give no port either.
    lock = tmp_path / BROKER_PORTS_LOCK
    worker = SharedBrokerPorts(tmp_path / "workers-ports", lock=lock)
    assert worker.assign(Address("b1", 6650), [7000, 7001]) == 7000
    stop_giving_ports(lock)
    with pytest.raises(ValueError, match="draining"):
        worker.assign(Address("b2", 6650), [7000, 7001])
    assert worker.assign(Address("b1", 6650), [7000, 7001]) == 7000  # known: kept
    worker.close()


@pytest.mark.e2e
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_proxy_restarted_while_the_old_one_drains_takes_the_ports_file(
    tmp_path: Path, workers: str
) -> None:
    ports = tmp_path / "broker-ports"
    low = free_port()
    keep = ("--listener-ports", f"{low}-{low + 4}", "--broker-ports-file", str(ports),
            "--no-check-broker", "--workers", workers)  # fmt: skip
    # A broker of its own, stopped below so that a send stays in flight and
    # the old proxy drains for as long as --drain-timeout lets it.
    with EmbeddedBroker() as broker:
        stop = broker.pid
        assert stop is not None
        listen, admin = free_port(), free_port()
        old = start_proxy(broker.url, tmp_path, *keep, "--drain-timeout", "60",
                          "--admin", f"127.0.0.1:{admin}", port=listen)  # fmt: skip
        new = None
        pids: dict[int, int] = {}
        client = pulsar.Client(f"pulsar://127.0.0.1:{listen}", operation_timeout_seconds=60,
                               logger=QUIET)  # fmt: skip
        try:
            if workers == "2":
                pids = worker_pids(old, 2)
            producer = client.create_producer("persistent://public/default/h8-drain",
                                              batching_enabled=False)  # fmt: skip
            producer.send(b"before")
            os.kill(stop, signal.SIGSTOP)
            try:
                # Stopped before the send goes (a broker still running then
                # answered it, and the drain had nothing to wait for).
                wait_stopped(stop)
                producer.send_async(b"in flight", lambda result, message: None)
                # On its way to the stopped broker before SIGTERM (else the
                # drain has nothing to wait for, and may be over at once).
                sends = ("sluice_frames_total",
                         (("command", "SEND"), ("direction", "client_to_broker")))  # fmt: skip
                deadline = time.monotonic() + 30
                while scrape(old, admin).get(sends, 0) < 2:
                    assert time.monotonic() < deadline, old.log()
                    time.sleep(0.05)
                old.process.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + 30
                while "draining" not in old.log():
                    assert time.monotonic() < deadline, old.log()
                    time.sleep(0.05)
                new = start_proxy(broker.url, tmp_path, *keep, port=listen)
                assert old.process.poll() is None, old.log()  # still draining
                if workers == "2":
                    assert len(worker_pids(new, 2)) == 2, new.log()
                assert "let go" in old.log(), old.log()
                assert new.process.poll() is None, new.log()
                assert "another sluice proxy" not in new.log()
            finally:
                os.kill(stop, signal.SIGCONT)
            assert old.process.wait(90) == 0, old.log()
            assert new.terminate() == 0, new.log()
        finally:
            client.close()
            kill_with_workers(old, pids)
            if new is not None:
                new.kill()
    assert "Traceback" not in old.log()
