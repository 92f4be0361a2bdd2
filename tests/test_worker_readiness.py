"""``--workers``: the supervisor's ``/readyz`` from what it asks each
worker's."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest
import trio

from sluice.addresses import Address
from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.workers import Supervisor

pytestmark = pytest.mark.e2e


async def test_a_worker_that_stops_answering_is_not_ready(broker: EmbeddedBroker) -> None:
    """A worker stuck (here stopped) answers no readiness check: it is not
    ready, named (it kept the answer it gave before, ready, for ever, and
    the proxy stayed ready with no worker serving)."""
    config = ProxyConfig(broker=parse_broker_url(broker.url), listen=Address("127.0.0.1", 0),
                         admin=Address("127.0.0.1", 0), drain_timeout=1)  # fmt: skip
    supervisor = Supervisor(config, 1, log_level="warning")
    await supervisor.open()
    worker = supervisor.workers[0]
    pid = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            with trio.fail_after(15):  # (a few seconds unloaded)
                while not supervisor.started:
                    await trio.sleep(0.01)
                assert supervisor.readiness() == []
                assert worker.process is not None
                pid = worker.process.pid
                os.kill(pid, signal.SIGSTOP)
                while not supervisor.readiness():
                    await trio.sleep(0.05)
            assert supervisor.readiness() == [
                "worker 0: did not answer its readiness check within 2s"
            ]
            os.kill(pid, signal.SIGCONT)
            supervisor.stop()
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        supervisor.stop()
