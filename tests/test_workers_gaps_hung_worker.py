"""``--workers``: a worker that hangs while it serves (here stopped with
SIGSTOP) and answers none of its readiness checks for ``HUNG_AFTER`` is
killed, named with its pid and why, and restarted; the port serves on.
Before, it was only marked not ready, and stayed hung for good, holding
its clients and taking its share of new connections (real worker
processes on loopback, pulsar-lite as the broker, every one stopped by
PID)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal

import pytest
import trio

from sluice.addresses import Address
from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy import workers
from sluice.proxy.config import ProxyConfig
from sluice.proxy.workers import Supervisor
from tests.helpers.support import RawClient, gone

pytestmark = pytest.mark.e2e


def connects(port: int) -> bool:
    """A CONNECT through the proxy at ``port`` is answered CONNECTED."""
    with RawClient(port) as raw:
        return raw.connect().name == "CONNECTED"


@pytest.mark.parametrize("count", [1, 2])
async def test_a_hung_worker_is_killed_and_restarted(
    broker: EmbeddedBroker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    count: int,
) -> None:
    monkeypatch.setattr(workers, "HUNG_AFTER", 3.0)
    caplog.set_level(logging.INFO, "sluice.workers")
    config = ProxyConfig(broker=parse_broker_url(broker.url), listen=Address("127.0.0.1", 0),
                         admin=Address("127.0.0.1", 0), drain_timeout=1)  # fmt: skip
    supervisor = Supervisor(config, count, log_level="warning")
    await supervisor.open()
    port = supervisor.addresses["plain"].port
    worker = supervisor.workers[0]
    pids: list[int] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            with trio.fail_after(40):
                while not supervisor.started:
                    await trio.sleep(0.05)
                assert await trio.to_thread.run_sync(connects, port)
                assert worker.process is not None
                hung = worker.process.pid
                pids += [w.process.pid for w in supervisor.workers if w.process is not None]
                os.kill(hung, signal.SIGSTOP)
                if count > 1:  # the others serve meanwhile
                    assert await trio.to_thread.run_sync(connects, port)
                # Replaced: a new process, said ready, and the hung one gone.
                while not (
                    worker.process is not None
                    and worker.process.pid != hung
                    and worker.admin is not None
                ):
                    await trio.sleep(0.05)
                pids.append(worker.process.pid)
                assert await trio.to_thread.run_sync(gone, hung)
                assert await trio.to_thread.run_sync(connects, port)
            assert worker.restarts == 1
            said = [r.getMessage() for r in caplog.records if r.name == "sluice.workers"]
            assert any(
                f"worker 0 (pid {hung}) killed: answered no readiness check for" in line
                and "hung" in line
                for line in said
            ), said
            assert [w.restarts for w in supervisor.workers[1:]] == [0] * (count - 1)
            supervisor.stop()
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        supervisor.stop()
