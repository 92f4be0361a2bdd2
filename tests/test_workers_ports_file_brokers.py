"""--workers with --broker-ports-file: the brokers an earlier run's file
gives ports are written by the supervisor in the workers' routes journal as
learned at start, so that the workers forget them as any learned broker
(an hour on, unless named; tests/test_forgetting_brokers_with_workers.py
runs that hour in-process). Seen from outside: such a broker is a learned
one in the workers, which a CONNECT naming it is relayed to."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.protocols.pulsar import Type, command, encode, pb
from tests.helpers.support import RawClient, start_proxy, worker_pids
from tests.test_workers import stop_workers

pytestmark = pytest.mark.e2e


def test_a_ports_file_broker_is_learned_by_every_worker(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    low = free_port()
    kept = tmp_path / "broker-ports"
    # The broker by another name: not the configured one, which is always allowed.
    kept.write_text(f"{low} localhost {broker.port} plain\n")
    proxy = start_proxy(broker.url, tmp_path, "--workers", "2", "--listener-ports",
                        f"{low}-{low}", "--broker-ports-file", str(kept))  # fmt: skip
    try:
        assert sorted(worker_pids(proxy, 2)) == [0, 1], proxy.log()
        for _ in range(4):  # whichever worker takes each
            raw = RawClient(proxy.port)
            hello = pb.CommandConnect(client_version="tests", protocol_version=21,
                                      proxy_to_broker_url=f"localhost:{broker.port}")  # fmt: skip
            raw.send(encode(command(Type.Value("CONNECT"), hello)))
            reply = raw.receive()
            raw.sock.close()
            assert reply is not None and reply.name == "CONNECTED", (reply, proxy.log())
    finally:
        stop_workers(proxy)
