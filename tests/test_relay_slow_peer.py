"""A peer that takes in what Sluice writes slowly but steadily is not a
dead peer: the stall bound (two keepalive intervals without progress)
must not cut it, however long the kernel takes to report room in the
socket (a big send buffer drained at a slow link's pace reports room only
once about a third of it went). Progress is what the peer took in."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.decoder import FrameDecoder
from tests.helpers.support import ProxyProcess, start_proxy
from tests.test_relay_stalled_peer import INTERVAL, Broker, _holds, _receive, _relayed, frame

pytestmark = pytest.mark.e2e

READING = 6.0  # seconds the consumer reads slowly: six stall bounds


@pytest.fixture(params=["thread", "trio"])
def proxy_and_broker(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[ProxyProcess, Broker]]:
    broker = Broker()
    env = {"SLUICE_RELAY_THREAD": "0"} if request.param == "trio" else None
    proxy = start_proxy(
        f"pulsar://127.0.0.1:{broker.port}", tmp_path, "--keepalive-interval", str(INTERVAL),
        "--no-check-broker", env=env,
    )  # fmt: skip
    try:
        yield proxy, broker
    finally:
        proxy.kill()
        broker.close()


def test_a_consumer_that_reads_slowly_but_steadily_is_kept(
    proxy_and_broker: tuple[ProxyProcess, Broker],
) -> None:
    proxy, broker = proxy_and_broker
    with _relayed(proxy, broker) as client:
        decoder = FrameDecoder()
        _receive(client, decoder, "CONNECTED")
        subscribe = pb.CommandSubscribe(
            topic="persistent://t/n/x", subscription="s", subType=pb.CommandSubscribe.Exclusive,
            consumer_id=1, request_id=1,
        )  # fmt: skip
        client.sendall(frame("SUBSCRIBE", subscribe))
        _receive(client, decoder, "SUCCESS")
        client.sendall(frame("FLOW", pb.CommandFlow(consumer_id=1, messagePermits=1_000_000)))
        client.settimeout(5)
        # About 80 KB/s, taken in every 50 ms: never 0.2 s without progress.
        started = time.monotonic()
        taken = 0
        while time.monotonic() - started < READING:
            try:
                data = client.recv(4096)
            except OSError as exc:
                pytest.fail(f"cut after {time.monotonic() - started:.1f}s: {exc}\n{proxy.log()}")
            if not data:
                pytest.fail(f"closed after {time.monotonic() - started:.1f}s, {taken} bytes "
                            f"taken in\n{proxy.log()}")  # fmt: skip
            taken += len(data)
            time.sleep(0.05)
        assert _holds(proxy, client)
        assert "took nothing in" not in proxy.log()
