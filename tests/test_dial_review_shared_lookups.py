"""Sluice's shared lookup connections (``UpstreamPool``, sluice/proxy/pulsar.py)
toward a broker that accepts TCP but does not answer CONNECT (stopped with
SIGSTOP: its kernel still accepts, nothing reads).

Lookups that need the same shared connection (one broker, one set of
credentials) while none is open wait for one attempt to open it: they
should all be answered once that attempt fails, within about one
``--connect-timeout``, not each after an attempt of its own in turn (the
k-th after k timeouts: ten clients reconnecting together against a
stalled broker, with the default 10 s, waited up to 100 s, while the
official clients give up after 30 s and look up again, queueing more).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import trio

from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.pulsar import Type, command, encode, pb
from sluice.protocols.pulsar.connection import UpstreamFailure
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.pulsar import UpstreamPool
from tests.helpers.support import RawClient, start_proxy

CONNECT_TIMEOUT = 1.0
CLIENTS = 5


@pytest.mark.e2e
def test_lookups_waiting_for_one_shared_connection_fail_with_its_attempt(tmp_path: Path) -> None:
    with EmbeddedBroker(data_dir=tmp_path / "broker") as broker:
        proxy = start_proxy(broker.url, tmp_path, "--connect-timeout", str(CONNECT_TIMEOUT))
        assert broker.pid is not None
        clients: list[RawClient] = []
        try:
            # One token for all: one shared connection, none open yet (the
            # proxy's own credential-less one does not serve them).
            for _ in range(CLIENTS):
                client = RawClient(proxy.port)
                clients.append(client)
                client.send_connect(token=b"one-token")
                connected = client.receive()
                assert connected is not None and connected.name == "CONNECTED"
            os.kill(broker.pid, signal.SIGSTOP)
            started = time.monotonic()
            for i, client in enumerate(clients):
                lookup = pb.CommandLookupTopic(topic=f"persistent://public/default/t{i}",
                                               request_id=1)  # fmt: skip
                client.send(encode(command(Type.Value("LOOKUP"), lookup)))
            answered: dict[int, float] = {}

            def wait(i: int, client: RawClient) -> None:
                answer = client.receive_type(
                    "LOOKUP_RESPONSE", timeout=CLIENTS * 4 * CONNECT_TIMEOUT
                )
                assert answer.body.error == pb.ServiceNotReady, answer.body
                answered[i] = time.monotonic() - started

            threads = [threading.Thread(target=wait, args=pair) for pair in enumerate(clients)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert len(answered) == CLIENTS, "a lookup got no answer"
            # One attempt (dial and CONNECT, each within the timeout), with room.
            slowest = max(answered.values())
            assert slowest < 2.5 * CONNECT_TIMEOUT, sorted(answered.values())
        finally:
            os.kill(broker.pid, signal.SIGCONT)
            for client in clients:
                client.close()
            proxy.kill()


@pytest.mark.e2e
def test_a_shared_connection_whose_request_timed_out_is_not_used_again(tmp_path: Path) -> None:
    """A broker that stops answering on an open shared connection (its host
    gone without a word, here stopped) costs one request's timeout: the
    connection is closed then, and the next lookup opens another instead of
    waiting out the timeout again on the dead one."""
    with EmbeddedBroker(data_dir=tmp_path / "broker") as broker:
        assert broker.pid is not None
        address = parse_broker_url(broker.url).address
        lookup = Type.Value("LOOKUP")

        def topic() -> pb.CommandLookupTopic:
            return pb.CommandLookupTopic(topic="persistent://public/default/timed-out")

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                pool = UpstreamPool(nursery, timeout=10.0, tls_for=lambda _: None)
                first = await pool.get(address)
                assert broker.pid is not None
                os.kill(broker.pid, signal.SIGSTOP)
                try:
                    with pytest.raises(UpstreamFailure, match="did not answer within"):
                        await first.request(lookup, topic(), 0.5)
                finally:
                    os.kill(broker.pid, signal.SIGCONT)
                assert first.closed
                second = await pool.get(address)
                assert second is not first
                answer = await second.request(lookup, topic(), 10.0)
                assert answer.name == "LOOKUP_RESPONSE"
                await pool.aclose()
                nursery.cancel_scope.cancel()

        trio.run(main)
