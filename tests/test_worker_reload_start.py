"""A reload with ``--workers`` while workers are starting (at the proxy's
start, or a worker restarted after it died)."""

from __future__ import annotations

import pytest
import trio

from sluice.addresses import Address
from sluice.brokers.embedded import free_port
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.workers import Supervisor

pytestmark = pytest.mark.e2e


async def test_a_reload_while_the_workers_start_kills_none() -> None:
    """The supervisor's SIGHUP reaches a worker still starting Python (before
    it can take the signal): it is not killed by it (it was, its default
    action, and the reload was refused naming it restarted); it takes the
    reload once it runs, and every worker runs the new generation."""
    broker = parse_broker_url(f"pulsar://127.0.0.1:{free_port()}")
    config = ProxyConfig(broker=broker, listen=Address("127.0.0.1", 0), drain_timeout=1)
    new = config.replace(max_connections=77)
    supervisor = Supervisor(config, 2, log_level="warning", load=lambda: new)
    await supervisor.open()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            with trio.fail_after(4):
                while not all(w.running for w in supervisor.workers):
                    await trio.sleep(0.001)
                outcome = await supervisor.reload_from_source("SIGHUP")
            assert outcome.outcome == "applied", outcome.summary()
            assert outcome.generation.number == 2
            assert [w.restarts for w in supervisor.workers] == [0, 0]
            supervisor.stop()
    finally:
        supervisor.stop()
