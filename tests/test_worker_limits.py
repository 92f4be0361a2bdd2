"""``--workers``: the connection limits are totals over the workers, in a
table each worker counts its own row of (``sluice/proxy/shared.py``)."""

from __future__ import annotations

import os
import signal
import socket
import struct

import pytest
import trio

from sluice.addresses import Address
from sluice.brokers.embedded import free_port
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.shared import BUCKETS, LIMITS_FILE
from sluice.proxy.workers import Supervisor

pytestmark = pytest.mark.e2e


def counted(supervisor: Supervisor) -> list[int]:
    """Each worker's count of the connections it holds, in the shared table."""
    data = (supervisor._state / LIMITS_FILE).read_bytes()
    return [struct.unpack_from("q", data, i * (BUCKETS + 1) * 8)[0]
            for i in range(supervisor.count)]  # fmt: skip


async def test_a_dead_workers_connections_no_longer_count() -> None:
    """A worker that died holds no connection: its count is let go as it is
    seen dead, not only once its successor has started (after a pause of up
    to 30 s when it keeps dying), so its clients, dialling again, are not
    refused by a limit their lost connections still filled."""
    broker = parse_broker_url(f"pulsar://127.0.0.1:{free_port()}")
    config = ProxyConfig(broker=broker, listen=Address("127.0.0.1", 0), drain_timeout=1)
    supervisor = Supervisor(config, 2, log_level="warning")
    await supervisor.open()
    address = supervisor.addresses["plain"]
    client = socket.socket()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            with trio.fail_after(15):  # (a few seconds unloaded)
                while not all(w.said_ready for w in supervisor.workers):
                    await trio.sleep(0.01)
                client.connect((address.host, address.port))
                while sum(counted(supervisor)) != 1:
                    await trio.sleep(0.01)
                holder = counted(supervisor).index(1)
                worker = supervisor.workers[holder]
                assert worker.process is not None
                os.kill(worker.process.pid, signal.SIGKILL)
                while worker.restarts < 1:
                    await trio.sleep(0.001)
            # Before its successor is started (a pause of 0.5 s at least).
            assert counted(supervisor) == [0, 0]
            supervisor.stop()
    finally:
        client.close()
        supervisor.stop()
