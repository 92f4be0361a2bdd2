"""`sluice proxy` in front of Cursus: the real cursus-client against the
test broker (tests/helpers/cursus_broker.py), through the proxy's own trio layer.

Every connection the client makes must land on a proxy listener — the
broker only ever sees connections the proxy dialled — including after a
leader change (NOT_LEADER LEADER_IS) and a coordinator move
(NOT_COORDINATOR); and a corrupt batch is refused the way the broker
refuses it, without reaching the broker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import ssl
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import cursus.producer
import pytest
import trio
import trustme
from cursus import ConsumerMode
from cursus.connection.sync_conn import SyncConnection
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sluice.addresses import Address
from sluice.brokers.embedded import free_port
from sluice.protocols.core import OnInvalid
from sluice.protocols.cursus import (
    Create,
    Metadata,
    Stream,
    StreamControl,
    decode_stream,
    encode_request,
)
from sluice.protocols.cursus.batch import Batch, Message, encode_batch
from sluice.protocols.cursus.encoder import frame
from sluice.protocols.faults import FaultError, parse_rule
from sluice.protocols.pulsar.urls import BrokerUrl
from sluice.proxy.config import PROTOCOL_FAULTS, ProxyConfig
from sluice.proxy.dial import TlsClientConfig, TlsServerConfig
from sluice.proxy.server import Proxy
from tests.helpers.cursus_broker import Cluster, open_cluster
from tests.helpers.poll import wait_until_in_trio
from tests.helpers.support import kill_with_workers, worker_pids
from tests.helpers.support import start_proxy as start_process
from tests.test_cursus_broker import (
    Collector,
    Wire,
    client_speaks_tls,
    collect_all,
    in_thread,
    produce,
    produce_across_a_move,
)


class Watched:
    """An in-process proxy whose upstream dials are noted, so that a test can
    tell the proxy's broker connections from anyone else's."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.dialled_from: set[int] = set()
        dial = proxy._dial

        async def noting(address: Address, tls: bool, timeout: float) -> trio.abc.Stream:
            stream = await dial(address, tls, timeout)
            sock: Any = stream
            self.dialled_from.add(sock.socket.getsockname()[1])
            return stream

        async def no_probe() -> str | None:
            return None  # readiness probes would be broker connections of their own

        def noting_now(address: Address) -> tuple[int, bool] | None:
            started = connect(address)  # a connection's dial on the relay thread
            if started is not None:
                sock = socket.socket(fileno=started[0])  # (its descriptor: given back)
                self.dialled_from.add(sock.getsockname()[1])
                sock.detach()
            return started

        proxy._dial = noting  # type: ignore[method-assign]
        connect = proxy._parking.connect
        proxy._parking = dataclasses.replace(proxy._parking, connect=noting_now)
        proxy.backend.probe = no_probe  # type: ignore[method-assign]

    @property
    def address(self) -> str:
        return str(self.proxy.addresses["plain"])

    def direct(self, cluster: Cluster) -> list[str]:
        """Broker connections the proxy did not make."""
        return [peer for _, peer in cluster.connections
                if int(peer.rsplit(":", 1)[1]) not in self.dialled_from]  # fmt: skip


@pytest.fixture
async def cluster3() -> AsyncIterator[Cluster]:
    async with open_cluster(3, keepalive=0.3) as cluster:
        yield cluster


async def start_proxy(nursery: trio.Nursery, cluster: Cluster, **options: Any) -> Watched:
    host, port = cluster.address.rsplit(":", 1)
    config = ProxyConfig(
        broker=BrokerUrl(host, int(port), False, "cursus"),
        protocol="cursus",
        listen=Address("127.0.0.1", 0),
        **options,
    )
    proxy = Proxy(config)
    watched = Watched(proxy)
    await nursery.start(proxy.run)
    return watched


async def test_the_client_never_reaches_a_broker_directly(cluster3: Cluster) -> None:
    async with trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster3)
        payloads = [f"c{i}" for i in range(12)]
        assert await in_thread(produce, proxy.address, "spread", payloads, 3) == 12
        # Leaders on three nodes: the main listener and one per other node.
        assert len(proxy.proxy.routing.listeners) == 3
        assert {cluster3.leader_of("spread", p).index for p in range(3)} == {0, 1, 2}

        ready, moved = threading.Event(), threading.Event()
        acked: list[int] = []

        async def producing() -> None:
            acked.append(
                await in_thread(produce_across_a_move, proxy.address, "moving", ready, moved)
            )

        collector = None
        async with trio.open_nursery() as inner:
            inner.start_soon(producing)
            await wait_until_in_trio(ready.is_set, 20, "the first half produced", step=0.02)
            collector = Collector(proxy.address, "moving", "g1", ConsumerMode.STREAMING).start()
            try:
                await wait_until_in_trio(
                    lambda: len(collector.got) >= 6, 20, "the first half streamed", step=0.02
                )
                cluster3.move_leader("moving", 0)
                moved.set()
                await wait_until_in_trio(
                    lambda: len(collector.got) >= 12, 20, "the second half streamed", step=0.02
                )
                cluster3.move_coordinator("g1")
                await wait_until_in_trio(
                    lambda: cluster3.sent["NOT_COORDINATOR"] >= 1,
                    20,
                    "a NOT_COORDINATOR",
                    step=0.02,
                )
                assert await in_thread(produce, proxy.address, "moving", ["late"] * 3, 3) == 3
                await wait_until_in_trio(
                    lambda: len(collector.got) >= 15, 20, "the late messages streamed", step=0.02
                )
            finally:
                await in_thread(collector.close)
        assert acked == [12]
        assert cluster3.sent["NOT_LEADER"] >= 1
        assert cluster3.connections, "the broker saw no connections at all"
        assert proxy.direct(cluster3) == []
        nursery.cancel_scope.cancel()


async def test_a_corrupt_batch_is_refused_the_way_the_broker_refuses_it(
    cluster3: Cluster,
) -> None:
    good = encode_batch(Batch(topic="t", partition=0, acks="1",
                              messages=(Message(offset=0, payload=b"hi"),)))  # fmt: skip
    corrupt = good[:-3]  # cut inside the last message
    async with trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster3, on_invalid=OnInvalid.REJECT)
        host, port = proxy.address.rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        before = len(cluster3.connections)
        await stream.send_all(frame(corrupt))
        with trio.fail_after(10):
            reply = await stream.receive_some(4096)
        assert reply[4:].startswith(b"ERROR: decode_failed"), reply
        # The broker keeps such a connection open; so does the proxy.
        await stream.send_all(b"\x00\x00\x00\x00")  # a keepalive
        with trio.move_on_after(0.3):
            assert await stream.receive_some(4096) != b""
        await stream.aclose()
        # The refused batch never reached a broker.
        topic = cluster3.topics.get("t")
        assert topic is None or all(not p.log for p in topic.partitions)
        assert len(cluster3.connections) <= before + 1
        nursery.cancel_scope.cancel()


async def test_leader_moved_fault_the_client_follows(cluster3: Cluster) -> None:
    """The "leader moved" recipe: one batch answered NOT_LEADER by the proxy
    (naming the listener the client already uses); the client asks for
    metadata again, retries, and every message is acknowledged once."""
    async with trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster3)
        rule = proxy.proxy.faults.add(
            parse_rule(
                {
                    "match": {"protocol": "cursus", "command": "BATCH"},
                    "action": "error",
                    "error": "NOT_LEADER",
                    "times": 1,
                },
                PROTOCOL_FAULTS,
            )
        )
        metadata_before = cluster3.sent["OK"]
        payloads = [f"f{i}" for i in range(9)]
        assert await in_thread(produce, proxy.address, "faulty", payloads, 3) == 9
        assert rule.hits == 1
        assert sum(len(p.log) for p in cluster3.topics["faulty"].partitions) == 9
        assert cluster3.sent["NOT_LEADER"] == 0  # the broker itself never said it
        assert cluster3.sent["OK"] > metadata_before
        assert proxy.direct(cluster3) == []
        nursery.cancel_scope.cancel()


def test_cursus_rules_are_validated() -> None:
    with pytest.raises(FaultError, match="unknown error code 'NOT_A_CODE'"):
        parse_rule({"match": {"protocol": "cursus"}, "action": "error", "error": "NOT_A_CODE"},
                   PROTOCOL_FAULTS)  # fmt: skip
    with pytest.raises(FaultError, match="unknown command 'SEND_RECEIPT' for cursus"):
        parse_rule({"match": {"protocol": "cursus", "command": "SEND_RECEIPT"},
                    "action": "drop"}, PROTOCOL_FAULTS)  # fmt: skip
    rule = parse_rule({"match": {"protocol": "cursus"}, "action": "error"}, PROTOCOL_FAULTS)
    assert rule.error == "NOT_LEADER"


async def test_cursus_metrics_have_the_same_names_and_a_protocol_label(cluster3: Cluster) -> None:
    async with trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster3)
        assert await in_thread(produce, proxy.address, "counted", ["a", "b", "c"], 1) == 3
        families = {
            f.name: f
            for f in text_string_to_metric_families(
                generate_latest(proxy.proxy.metrics.exposed).decode()
            )
        }
        assert all(s.labels.get("protocol") == "cursus"
                   for f in families.values() for s in f.samples)  # fmt: skip
        frames = {(s.labels["command"], s.labels["direction"]): s.value
                  for s in families["sluice_frames"].samples}  # fmt: skip
        assert frames[("BATCH", "client_to_broker")] >= 1
        assert frames[("METADATA", "client_to_broker")] >= 1
        assert frames[("ACK", "broker_to_client")] >= 1
        timed = {s.labels["command"]: s.value for s in families["sluice_request_duration_seconds"]
                 .samples if s.name.endswith("_count")}  # fmt: skip
        assert timed["BATCH"] >= 1 and timed["METADATA"] >= 1
        messages = {s.labels["topic"]: s.value for s in families["sluice_topic_messages"].samples
                    if s.labels["direction"] == "client_to_broker"}  # fmt: skip
        assert messages["counted"] == 3
        nursery.cancel_scope.cancel()


async def test_a_polling_consumer_group_through_the_proxy(cluster3: Cluster) -> None:
    async with trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster3)
        payloads = [f"p{i}" for i in range(9)]
        assert await in_thread(produce, proxy.address, "polled", payloads, 3) == 9
        await collect_all(proxy.address, "polled", "gp", ConsumerMode.POLLING, payloads,
                          "9 messages polled")  # fmt: skip
        assert proxy.direct(cluster3) == []
        nursery.cancel_scope.cancel()


async def test_tls_from_the_client_to_every_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--listen-tls`` and ``cursus+ssl://``: the real client produces across
    three leaders and streams everything back over TLS. Every per-broker
    listener it is sent to must speak TLS, and the nodes speak nothing else."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = ca.issue_cert("127.0.0.1")
    server_pem = tmp_path / "server.pem"
    server.private_key_and_cert_chain_pem.write_to_path(str(server_pem))
    client_pem = tmp_path / "client.pem"
    ca.issue_cert("client.example").private_key_and_cert_chain_pem.write_to_path(str(client_pem))
    client_speaks_tls(monkeypatch, ca_file, client_pem)
    nodes = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.configure_cert(nodes)
    async with open_cluster(3, keepalive=0.3, tls=nodes) as cluster, trio.open_nursery() as nursery:
        host, port = cluster.address.rsplit(":", 1)
        config = ProxyConfig(
            broker=BrokerUrl(host, int(port), True, "cursus+ssl"),
            protocol="cursus",
            listen=None,
            listen_tls=Address("127.0.0.1", 0),
            tls=TlsServerConfig(server_pem, server_pem),
            broker_tls=TlsClientConfig(ca=ca_file),
        )
        proxy = Proxy(config)
        await nursery.start(proxy.run)
        address = str(proxy.addresses["tls"])
        payloads = [f"s{i}" for i in range(12)]
        assert await in_thread(produce, address, "sealed", payloads, 3) == 12
        assert {cluster.leader_of("sealed", p).index for p in range(3)} == {0, 1, 2}
        assert len(proxy.routing.listeners) == 3
        await collect_all(address, "sealed", "g", ConsumerMode.STREAMING, payloads,
                          "12 messages streamed")  # fmt: skip
        # A client without TLS gets nowhere: every listener speaks TLS only.
        monkeypatch.setattr(cursus.producer, "SyncConnection", SyncConnection)
        try:
            plain = await in_thread(produce, address, "plain", ["x"], 1)
        except Exception:  # the client's own error types vary
            plain = 0
        assert plain == 0
        nursery.cancel_scope.cancel()


async def test_sigterm_ends_an_open_stream_where_the_client_was() -> None:
    """A drain reaches Cursus connections too: an open STREAM gets the
    CLOSE a stopping broker sends, at the offset after the last message the
    client was given, and the drain ends once it is said, long before its
    timeout."""
    async with open_cluster(1, keepalive=0.3) as cluster, trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster, drain_timeout=30.0)
        assert await in_thread(produce, proxy.address, "drained", ["a", "b", "c"], 1) == 3
        host, port = proxy.address.rsplit(":", 1)
        client = await trio.open_tcp_stream(host, int(port))
        await client.send_all(encode_request(Stream(topic="drained", partition=0, offset=0)))
        got = bytearray()

        def delivered() -> list[int]:
            try:
                frames = decode_stream(bytes(got), from_client=False)
            except Exception:
                return []  # the last frame is not whole yet
            return [m.offset for f in frames if isinstance(f.message, Batch)
                    for m in f.message.messages]  # fmt: skip

        with trio.fail_after(20):
            while len(delivered()) < 3:
                got += await client.receive_some()
        started = trio.current_time()
        nursery.start_soon(proxy.proxy.drain)
        with trio.fail_after(20):
            while chunk := await client.receive_some():
                got += chunk
        assert trio.current_time() - started < 5  # not the 30 s drain timeout
        frames = decode_stream(bytes(got), from_client=False)
        assert delivered() == [0, 1, 2]
        assert frames[-1].message == StreamControl("CLOSE", "stopped", 3)
        await client.aclose()


# --- port-per-broker: --listener-ports and --broker-ports-file ----------------------


def free_range(size: int) -> tuple[int, int]:
    """``size`` consecutive ports nobody listens on now."""
    for _ in range(50):
        low = free_port()
        if low + size > 65535:
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(low, low + size):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return low, low + size - 1
    raise AssertionError(f"no {size} free ports in a row")


async def leaders_through(address: str, topic: str) -> list[int]:
    """The ports the METADATA answer of the proxy at ``address`` for a new
    3-partition ``topic`` names."""
    wire = await Wire.open(address)
    try:
        assert (await wire.ask(Create(topic=topic, partitions=3))).ok
        reply = await wire.text(Metadata(topic=topic))
    finally:
        await wire.stream.aclose()
    leaders = next(word for word in reply.split() if word.startswith("leaders="))
    return [int(a.rsplit(":", 1)[1]) for a in leaders.removeprefix("leaders=").split(",")]


async def test_damaged_lines_of_the_ports_file_are_ignored_with_a_warning(
    cluster3: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A line with a port no socket can have (a bit flip, a bad edit), one
    outside today's --listener-ports, one that does not parse: each is
    named in a warning and ignored; the proxy starts, and the brokers get
    ports of the range."""
    low, high = free_range(6)
    second, third = (int(a.rsplit(":", 1)[1]) for a in cluster3.addresses[1:])
    journal = tmp_path / "broker-ports"
    journal.write_text(f"99999 127.0.0.1 {second} plain\n"
                       f"{high + 40} 127.0.0.1 {third} plain\n"
                       f"{low} 127.0.0.1 not-a-port plain\n")  # fmt: skip
    caplog.set_level(logging.WARNING, "sluice.proxy")
    async with trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster3, listener_ports=(low, high),
                                  broker_ports_file=journal)  # fmt: skip
        main = int(proxy.address.rsplit(":", 1)[1])
        ports = await leaders_through(proxy.address, "damaged")
        assert sorted(ports) == sorted([main, low, low + 1]), ports
        warned = "\n".join(r.getMessage() for r in caplog.records)
        assert f"{journal}, line 1 (99999 127.0.0.1 {second} plain): ignored: port 99999" in warned
        assert f"line 2 ({high + 40} 127.0.0.1 {third} plain): ignored: port {high + 40} is " \
            f"outside --listener-ports {low}-{high}" in warned  # fmt: skip
        assert "line 3" in warned
        nursery.cancel_scope.cancel()


@pytest.mark.e2e
async def test_workers_never_advertise_a_ports_file_port_nobody_listens_on(
    cluster3: Cluster, tmp_path: Path
) -> None:
    """--workers: the ports file gives a broker a port another program took
    before the proxy started (so the supervisor could not bind it). The
    broker is given another port of the range, never the one nobody of
    Sluice's listens on, and the start says so."""
    low, high = free_range(6)
    second = int(cluster3.addresses[1].rsplit(":", 1)[1])
    journal = tmp_path / "broker-ports"
    journal.write_text(f"{low + 1} 127.0.0.1 {second} plain\n")
    with socket.socket() as other:  # another program, holding the port
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", low + 1))
        other.listen()
        proxy = await in_thread(start_process, f"cursus://{cluster3.address}", tmp_path,
                                "--workers", "2", "--listener-ports", f"{low}-{high}",
                                "--broker-ports-file", str(journal))  # fmt: skip
        pids: dict[int, int] = {}
        try:
            pids = await in_thread(worker_pids, proxy, 2)
            assert len(pids) == 2, proxy.log()
            ports = await leaders_through(f"127.0.0.1:{proxy.port}", "stale")
            assert low + 1 not in ports, proxy.log()
            assert all(p == proxy.port or low <= p <= high for p in ports), ports
            assert f"--listener-ports: {low + 1} in use" in proxy.log()
        finally:
            kill_with_workers(proxy, pids)
    assert "Traceback" not in proxy.log(), proxy.log()


async def test_a_broker_left_without_a_port_is_an_error_reply_not_a_hang_up(
    cluster3: Cluster,
) -> None:
    """--listener-ports with a single port, three leaders: the main port
    stands for the first, the range's port for the second, and none is left
    for the third. The client is answered with an ERROR: line saying so
    (cursus-client reads it as a failed request) rather than a connection
    closed without a word."""
    low, high = free_range(1)
    async with trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster3, listener_ports=(low, high))
        wire = await Wire.open(proxy.address)
        try:
            assert (await wire.ask(Create(topic="crowded", partitions=3))).ok
            reply = await wire.ask(Metadata(topic="crowded"))
        finally:
            await wire.stream.aclose()
        text = reply.body.decode()
        assert text.startswith("ERROR: unavailable reason="), text
        assert f"--listener-ports {low}-{high}" in text, text
        nursery.cancel_scope.cancel()
