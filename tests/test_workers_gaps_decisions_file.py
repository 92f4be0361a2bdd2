"""``--workers``: the supervisor's reload decision that cannot be written
(its state directory's disk full; here the file a directory) ended the
supervisor, and every worker with it, on an OSError. Now the reload is
refused in one line naming the file, the workers keep the configuration
in force and serve on, and the next reload is put in force by all (real
worker processes on loopback, pulsar-lite as the broker, stopped by PID)."""

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
from sluice.proxy.config import ProxyConfig
from sluice.proxy.workers import RELOAD_DECISIONS, Supervisor, decision_timeout, ready_timeout
from tests.helpers.support import RawClient

pytestmark = pytest.mark.e2e


def connects(port: int) -> bool:
    """A CONNECT through the proxy at ``port`` is answered CONNECTED."""
    with RawClient(port) as raw:
        return raw.connect().name == "CONNECTED"


async def test_a_decision_that_cannot_be_written_refuses_the_reload_and_all_serve_on(
    broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "sluice.workers")
    config = ProxyConfig(broker=parse_broker_url(broker.url), listen=Address("127.0.0.1", 0),
                         admin=Address("127.0.0.1", 0), drain_timeout=1,
                         connect_timeout=1)  # fmt: skip
    limits = iter(range(500, 0, -1))  # every reload reads a changed setting
    supervisor = Supervisor(config, 2, log_level="warning",
                            load=lambda: config.replace(max_connections=next(limits)))  # fmt: skip
    await supervisor.open()
    port = supervisor.addresses["plain"].port
    pids: list[int] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            with trio.fail_after(60):
                while not supervisor.started:
                    await trio.sleep(0.05)
            pids = [w.process.pid for w in supervisor.workers if w.process is not None]
            decisions = supervisor._state / RELOAD_DECISIONS
            decisions.mkdir()  # no file can be written there
            outcome = await supervisor.reload_from_source("admin")
            assert outcome.outcome == "refused", outcome
            assert len(outcome.errors) == 1, outcome.errors
            said = f"cannot tell the workers the decision (commit) in {decisions}"
            assert said in outcome.errors[0], outcome.errors
            assert supervisor.generation.number == 1
            refusals = [r.getMessage() for r in caplog.records
                        if "cannot tell the workers" in r.getMessage()]  # fmt: skip
            assert len(refusals) == 1, refusals
            assert "\n" not in refusals[0]
            assert await trio.to_thread.run_sync(connects, port)
            decisions.rmdir()
            # Once each worker gave up waiting for a word (decision_timeout
            # after it made that reload ready), it takes the next.
            with trio.fail_after(decision_timeout(config) + ready_timeout(config) + 30):
                while (await supervisor.reload_from_source("admin")).outcome != "applied":
                    await trio.sleep(0.5)
            assert supervisor.generation.number == 2
            assert [w.process.pid for w in supervisor.workers if w.process] == pids
            assert [w.restarts for w in supervisor.workers] == [0, 0]
            assert await trio.to_thread.run_sync(connects, port)
            supervisor.stop()
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        supervisor.stop()
