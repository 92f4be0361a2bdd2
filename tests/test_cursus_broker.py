"""The Cursus test broker: the real ``cursus-client`` against it (standalone
and cluster, across leader and coordinator moves), and raw sockets for every
reply form and for malformed input."""

from __future__ import annotations

import asyncio
import gzip
import struct
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import cursus.consumer
import cursus.producer
import pytest
import trio
from cursus import (
    AsyncProducer,
    Consumer,
    ConsumerConfig,
    ConsumerMode,
    Producer,
    ProducerConfig,
)
from cursus import Message as ClientMessage
from cursus.connection.sync_conn import SyncConnection
from cursus.protocol import encoder as client_encoder

from sluice.protocols.cursus import (
    BROKER_MAX_FRAME_SIZE,
    KEEPALIVE,
    Batch,
    BatchAck,
    BatchCommit,
    CommitOffset,
    Compression,
    Consume,
    Create,
    Delete,
    ErrorReply,
    FetchOffset,
    FindCoordinator,
    Frame,
    FrameDecoder,
    Heartbeat,
    JoinGroup,
    Keepalive,
    LeaveGroup,
    List,
    Message,
    Metadata,
    OkReply,
    Stream,
    StreamControl,
    SyncGroup,
    encode_batch,
    encode_request,
    frame,
)
from sluice.protocols.cursus.commands import Command
from tests.helpers.cursus_broker import BrokerThread, Cluster, open_cluster
from tests.helpers.poll import wait_until_in_trio

T = TypeVar("T")
LIMIT = 60  # seconds any one client scenario may take


@pytest.fixture
async def standalone() -> AsyncIterator[Cluster]:
    async with open_cluster(1, keepalive=0.3) as cluster:
        yield cluster


@pytest.fixture
async def cluster3() -> AsyncIterator[Cluster]:
    async with open_cluster(3, keepalive=0.3) as cluster:
        yield cluster


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run blocking client code without blocking the broker."""
    with trio.fail_after(LIMIT):
        return await trio.to_thread.run_sync(partial(fn, *args), abandon_on_cancel=True)


async def collect_all(
    address: str, topic: str, group: str, mode: ConsumerMode, payloads: list[str], waiting_for: str
) -> Collector:
    """Read ``payloads`` back with a consumer group, all of them (closed after)."""
    collector = Collector(address, topic, group, mode).start()
    try:
        await wait_until_in_trio(
            lambda: len(collector.got) >= len(payloads), 20, waiting_for, step=0.02
        )
    finally:
        await in_thread(collector.close)
    assert collector.payloads == sorted(payloads)
    return collector


# --- the real client -------------------------------------------------------------------


def client_speaks_tls(monkeypatch: pytest.MonkeyPatch, ca_file: Path, client_pem: Path) -> None:
    """Make the real cursus-client dial over TLS, trusting ``ca_file``, with
    ``client_pem`` as its certificate and key.

    cursus-client 0.1.1 takes ``tls_cert_path``/``tls_key_path`` in its
    configs but never hands them to its connections; its connection class
    has the TLS code (a client certificate, the system's trust store, the
    host name checked), so they are handed over here, and the trust store
    pointed at the test CA."""
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    with_tls = partial(SyncConnection, tls_cert_path=str(client_pem), tls_key_path=str(client_pem))
    monkeypatch.setattr(cursus.producer, "SyncConnection", with_tls)
    monkeypatch.setattr(cursus.consumer, "SyncConnection", with_tls)


def produce(address: str, topic: str, payloads: list[str], partitions: int) -> int:
    producer = Producer(
        ProducerConfig(
            topic=topic,
            brokers=[address],
            partitions=partitions,
            linger_ms=5,
            flush_timeout_ms=10_000,
        )
    )
    try:
        for p in payloads:
            producer.send(p)
        producer.flush()
        return producer.unique_ack_count
    finally:
        producer.close()


class Collector:
    """A consumer in a thread of its own, keeping every message it is given."""

    def __init__(
        self, address: str, topic: str, group: str, mode: ConsumerMode, name: str = "m1"
    ) -> None:
        self.consumer = Consumer(
            ConsumerConfig(
                topic=topic,
                brokers=[address],
                group_id=group,
                consumer_id=name,
                mode=mode,
                heartbeat_interval_ms=200,
                auto_commit_interval_s=0.3,
            )
        )
        self.got: list[ClientMessage] = []
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            for message in self.consumer:
                self.got.append(message)
        except BaseException as exc:  # reported by the test
            self.failure = exc

    def start(self) -> Collector:
        self._thread.start()
        return self

    @property
    def payloads(self) -> list[str]:
        return sorted(m.payload for m in self.got)

    def close(self) -> None:
        self.consumer.close()
        self._thread.join(10)
        assert not self._thread.is_alive()


async def test_produce_and_stream_with_a_group_standalone(standalone: Cluster) -> None:
    payloads = [f"m{i}" for i in range(20)]
    assert await in_thread(produce, standalone.address, "orders", payloads, 4) == 20
    collector = await collect_all(standalone.address, "orders", "g1", ConsumerMode.STREAMING,
                                  payloads, "20 streamed messages")  # fmt: skip
    assert collector.failure is None
    group = standalone.groups["g1"]
    assert sum(group.committed.values()) == 20  # committed on close
    assert group.members == []  # and left
    assert standalone.sent["BATCH"] >= 4 and standalone.sent["ACK"] >= 4
    assert standalone.sent["STREAM_CONTROL:removed"] >= 1


async def test_poll_with_a_group_standalone(standalone: Cluster) -> None:
    payloads = [f"p{i}" for i in range(7)]
    assert await in_thread(produce, standalone.address, "polled", payloads, 2) == 7
    await collect_all(standalone.address, "polled", "g2", ConsumerMode.POLLING, payloads,
                      "7 polled messages")  # fmt: skip
    assert standalone.sent["STREAM_CONTROL:removed"] == 0  # CONSUME, not STREAM


async def test_two_consumers_split_a_topic_through_a_rebalance(standalone: Cluster) -> None:
    assert await in_thread(produce, standalone.address, "split-topic", [], 4) == 0  # creates it
    first = Collector(standalone.address, "split-topic", "g6", ConsumerMode.STREAMING).start()
    second: Collector | None = None
    try:
        await wait_until_in_trio(
            lambda: standalone.groups.get("g6") is not None, 20, "the first join", step=0.02
        )
        second = Collector(
            standalone.address, "split-topic", "g6", ConsumerMode.STREAMING, name="m2"
        ).start()
        await wait_until_in_trio(
            lambda: len(standalone.groups["g6"].members) == 2, 20, "the second join", step=0.02
        )
        # The first member's next heartbeat is a generation behind: it rejoins.
        await wait_until_in_trio(
            lambda: standalone.sent["GEN_MISMATCH"] >= 1, 20, "a GEN_MISMATCH", step=0.02
        )
        await wait_until_in_trio(
            lambda: standalone.sent["STREAM_CONTROL:removed"] >= 1,
            20,
            "a stream removed",
            step=0.02,
        )
        payloads = [f"r{i}" for i in range(16)]
        assert await in_thread(produce, standalone.address, "split-topic", payloads, 4) == 16
        await wait_until_in_trio(
            lambda: len(first.got) + len(second.got) >= 16, 20, "16 messages", step=0.02
        )
    finally:
        await in_thread(first.close)
        if second is not None:
            await in_thread(second.close)
    assert second is not None
    assert sorted(first.payloads + second.payloads) == sorted(payloads)
    assert first.got and second.got  # both had partitions


async def test_a_broker_advertising_localhost_is_followed() -> None:
    # What the real broker does even standalone; the client resolves it.
    async with open_cluster(2, advertise_host="localhost", keepalive=0.3) as cluster:
        assert cluster.addresses[0].startswith("localhost:")
        assert await in_thread(produce, cluster.address, "named", ["a", "b"], 2) == 2
        assert _nodes_dialled(cluster) == {0, 1}


def _nodes_dialled(cluster: Cluster) -> set[int]:
    return {node for node, _ in cluster.connections}


async def test_a_cluster_spreads_leaders_and_the_client_follows_them(cluster3: Cluster) -> None:
    payloads = [f"c{i}" for i in range(12)]
    assert await in_thread(produce, cluster3.address, "spread", payloads, 3) == 12
    leaders = {cluster3.leader_of("spread", p).index for p in range(3)}
    assert leaders == {0, 1, 2}
    assert [len(p.log) for p in cluster3.topics["spread"].partitions] == [4, 4, 4]
    assert _nodes_dialled(cluster3) == {0, 1, 2}  # the client went to each leader
    assert cluster3.sent["NOT_LEADER"] == 0
    await collect_all(cluster3.address, "spread", "g3", ConsumerMode.STREAMING, payloads,
                      "12 messages from 3 leaders")  # fmt: skip


def produce_across_a_move(
    address: str, topic: str, ready: threading.Event, moved: threading.Event
) -> int:
    async def main() -> int:
        producer = AsyncProducer(
            ProducerConfig(topic=topic, brokers=[address], partitions=3, linger_ms=5)
        )
        await producer.start()
        try:
            for i in range(6):
                await producer.send(f"before-{i}")
            await producer.flush()
            ready.set()
            await asyncio.to_thread(moved.wait, 20)
            for i in range(6):
                await producer.send(f"after-{i}")
            await producer.flush()
            return producer.unique_ack_count
        finally:
            await producer.close()

    return asyncio.run(main())


async def test_a_leader_change_while_producing_and_streaming(cluster3: Cluster) -> None:
    collector: Collector | None = None
    ready, moved = threading.Event(), threading.Event()
    acked: list[int] = []

    async def producing() -> None:
        acked.append(
            await in_thread(produce_across_a_move, cluster3.address, "moving", ready, moved)
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producing)
        await wait_until_in_trio(ready.is_set, 20, "the first half produced", step=0.02)
        collector = Collector(cluster3.address, "moving", "g4", ConsumerMode.STREAMING).start()
        try:
            await wait_until_in_trio(
                lambda: len(collector.got) >= 6, 20, "the first half streamed", step=0.02
            )
            old = cluster3.leader_of("moving", 0).address
            new = cluster3.move_leader("moving", 0)
            assert new != old
            moved.set()
            await wait_until_in_trio(
                lambda: len(collector.got) >= 12, 20, "the second half streamed", step=0.02
            )
            # A client that starts after the move asks METADATA and goes straight there.
            before = cluster3.sent["NOT_LEADER"]
            assert await in_thread(produce, cluster3.address, "moving", ["late"] * 3, 3) == 3
            assert cluster3.sent["NOT_LEADER"] == before
            await wait_until_in_trio(
                lambda: len(collector.got) >= 15, 20, "the late messages streamed", step=0.02
            )
        finally:
            await in_thread(collector.close)
    assert acked == [12]
    # The old leader told the open stream and the producer where to go.
    assert cluster3.sent["NOT_LEADER"] >= 2
    assert sorted(m.payload for m in collector.got if m.payload != "late") == sorted(
        [f"before-{i}" for i in range(6)] + [f"after-{i}" for i in range(6)]
    )
    assert cluster3.topics["moving"].partitions[0].epoch == 1


async def test_a_coordinator_move_gives_not_coordinator_and_the_client_follows(
    cluster3: Cluster,
) -> None:
    assert await in_thread(produce, cluster3.address, "coord", ["a", "b", "c"], 3) == 3
    collector = Collector(cluster3.address, "coord", "g5", ConsumerMode.STREAMING).start()
    try:
        await wait_until_in_trio(lambda: len(collector.got) >= 3, 20, "3 messages", step=0.02)
        cluster3.move_coordinator("g5")
        await wait_until_in_trio(
            lambda: cluster3.sent["NOT_COORDINATOR"] >= 1, 20, "a NOT_COORDINATOR", step=0.02
        )
        heartbeats = cluster3.sent["OK"]
        await wait_until_in_trio(
            lambda: cluster3.sent["OK"] > heartbeats + 2,
            20,
            "heartbeats at the new node",
            step=0.02,
        )
        assert await in_thread(produce, cluster3.address, "coord", ["d", "e", "f"], 3) == 3
        await wait_until_in_trio(lambda: len(collector.got) >= 6, 20, "3 more messages", step=0.02)
    finally:
        await in_thread(collector.close)
    assert collector.payloads == ["a", "b", "c", "d", "e", "f"]
    assert sum(cluster3.groups["g5"].committed.values()) == 6


def test_the_broker_runs_in_a_thread_for_code_that_is_not_trio() -> None:
    with BrokerThread(nodes=2) as broker:
        assert produce(broker.cluster.address, "threaded", ["x", "y"], 2) == 2
        moved = broker.call(broker.cluster.move_leader, "threaded", 0)
        assert moved == broker.cluster.addresses[1]


# --- raw sockets: every reply form ---------------------------------------------------


class Wire:
    """One raw client connection."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(from_client=False)

    @classmethod
    async def open(cls, address: str) -> Wire:
        host, port = address.rsplit(":", 1)
        return cls(await trio.open_tcp_stream(host, int(port)))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def ask(self, cmd: Command | Batch, **kw: Any) -> Frame:
        await self.send(encode_request(cmd, **kw))
        return await self.receive()

    async def text(self, cmd: Command | Batch, **kw: Any) -> str:
        f = await self.ask(cmd, **kw)
        assert f.ok, f.error
        return f.body.decode()

    async def receive(self) -> Frame:
        with trio.fail_after(10):
            while True:
                event = self.decoder.next_event()
                if isinstance(event, Frame):
                    return event
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError("closed by the broker")
                self.decoder.receive_data(data)

    async def closed(self) -> bool:
        """Whether the broker hung up (after any frames already read)."""
        with trio.fail_after(10):
            try:
                return await self.stream.receive_some(65536) == b""
            except trio.BrokenResourceError:
                return True

    async def aclose(self) -> None:
        await self.stream.aclose()


def one_batch(topic: str, partition: int, acks: str = "1", payload: bytes = b"hi") -> Batch:
    message = Message(0, 1, "p1", "", 1, payload)
    return Batch(topic, partition, acks, False, 1, 1, (message,))


async def test_every_reply_form_standalone(standalone: Cluster) -> None:
    address = standalone.address
    w = await Wire.open(address)
    host, port = address.rsplit(":", 1)
    assert await w.text(Create(topic="demo", partitions=1), envelope_topic="admin") == (
        "OK topic=demo partitions=1 cleanup_policy=delete partitioner=hash_key"
    )
    assert await w.text(Create(topic="gone", partitions=2)) == (
        "OK topic=gone partitions=2 cleanup_policy=delete partitioner=hash_key"
    )
    assert await w.text(Delete(topic="gone")) == "OK topic=gone deleted=true"
    assert await w.text(Metadata(topic="demo")) == (
        f"OK topic=demo partitions=1 leaders={address} epochs=0"
    )
    assert await w.text(FindCoordinator(group="g")) == (
        f"OK coordinator_id=standalone coordinator_type=group host={host} port={port}"
    )
    assert await w.text(one_batch("demo", 0)) == (
        '{"status":"OK","last_offset":0,"producer_epoch":1,"producer_id":"p1",'
        '"seq_start":1,"seq_end":1}'
    )
    assert await w.text(one_batch("demo", 0, acks="0")) == "OK"
    joined = await w.text(JoinGroup(topic="demo", group="g", member="m1"))
    reply = OkReply(tuple(joined.split()[1:]))
    member = reply.get("member")
    assert member is not None and member.startswith("m1-") and len(member) == len("m1-8260")
    assert joined == f"OK generation=1 member={member} assignments=[0]"
    assert await w.text(SyncGroup(topic="demo", group="g", member=member, generation=1)) == joined
    assert await w.text(Heartbeat(topic="demo", group="g", member=member, generation=1)) == (
        f"OK member={member} generation=1"
    )
    assert await w.text(Heartbeat(topic="demo", group="g", member=member, generation=99)) == (
        f"ERROR: GEN_MISMATCH current=1 requested=99 group=g member={member}"
    )
    commit = CommitOffset(
        topic="demo", partition=0, group="g", offset=1, generation=1, member=member
    )
    assert await w.text(commit) == "OK"
    batched = BatchCommit(topic="demo", group="g", member=member, generation=1, offsets=((0, 2),))
    assert await w.text(batched) == "OK batched=1"
    assert await w.text(FetchOffset(topic="demo", partition=0, group="g")) == "OK offset=2"
    assert (await w.text(Create(topic="demo2", partitions=1))).startswith("OK topic=demo2")
    assert await w.text(JoinGroup(topic="demo2", group="g", member="m2")) == (
        "ERROR: topic_not_assigned_to_group expected=demo actual=demo2"
    )
    assert await w.text(List()) == "OK count=3 topics=demo,demo2,__consumer_offsets"
    consumed = await w.ask(Consume(topic="demo", partition=0, offset=0))
    assert isinstance(consumed.message, Batch) and len(consumed.message.messages) == 2
    assert [m.offset for m in consumed.message.messages] == [0, 1]
    empty = await w.ask(Consume(topic="demo", partition=0, offset=2))
    assert isinstance(empty.message, Batch) and empty.message.messages == ()
    assert await w.text(Consume(topic="demo", partition=0, offset=9)) == (
        "ERROR: OFFSET_OUT_OF_RANGE requested=9 earliest=0 latest=2"
    )
    assert await w.text(LeaveGroup(topic="demo", group="g", member=member)) == (
        f"OK group=g member={member} left=true"
    )
    # A bare (not enveloped) command is a command too.
    assert await w.text(List(), envelope_topic=None) == (
        "OK count=3 topics=demo,demo2,__consumer_offsets"
    )
    await w.aclose()


async def test_cluster_redirections(cluster3: Cluster) -> None:
    w = await Wire.open(cluster3.addresses[0])
    await w.text(Create(topic="t", partitions=3))
    meta = await w.text(Metadata(topic="t"))
    assert f"leaders={','.join(cluster3.addresses)} epochs=0,0,0" in meta
    leader1 = cluster3.addresses[1]
    # Node 0 leads only partition 0.
    for request in (one_batch("t", 1), Consume(topic="t", partition=1, offset=0)):
        assert await w.text(request) == f"ERROR: NOT_LEADER LEADER_IS {leader1}"
    ack = (await w.ask(one_batch("t", 0))).message
    assert isinstance(ack, BatchAck) and ack.leader is not None
    assert ack.leader not in cluster3.addresses  # a Raft address, never dialled
    coordinator = cluster3.coordinator_of("g")
    other = cluster3.nodes[(coordinator.index + 1) % 3]
    w2 = await Wire.open(other.address)
    assert await w2.text(JoinGroup(topic="t", group="g", member="m")) == (
        f"ERROR: NOT_COORDINATOR host={coordinator.advertise_host} port={coordinator.port}"
    )
    found = await w2.text(FindCoordinator(group="g"))
    assert found.startswith(f"OK coordinator_id=broker-{coordinator.index + 1} ")
    stream = await Wire.open(cluster3.addresses[0])
    assert await stream.text(Stream(topic="t", partition=2, group="g", member="m")) == (
        f"ERROR: NOT_LEADER LEADER_IS {cluster3.addresses[2]}"
    )
    for wire in (w, w2, stream):
        await wire.aclose()


async def test_streams_push_keep_alive_and_end(cluster3: Cluster) -> None:
    w = await Wire.open(cluster3.coordinator_of("g").address)
    await w.text(Create(topic="s", partitions=1))
    producer = await Wire.open(cluster3.address)  # node 0 leads partition 0
    await producer.text(one_batch("s", 0))
    joined = await w.text(JoinGroup(topic="s", group="g", member="m"))
    member = joined.split("member=")[1].split()[0]
    s1 = await Wire.open(cluster3.address)
    await s1.send(
        encode_request(Stream(topic="s", partition=0, group="g", member=member, generation=1))
    )
    first = await s1.receive()
    assert isinstance(first.message, Batch) and first.message.messages[0].payload == b"hi"
    assert (await s1.receive()).message == Keepalive()  # nothing new: a keepalive
    await producer.text(one_batch("s", 0, payload=b"more"))
    pushed = await s1.receive()
    assert isinstance(pushed.message, Batch) and pushed.message.messages[0].offset == 1
    # The same member streaming the same partition again replaces the first stream.
    s2 = await Wire.open(cluster3.address)
    await s2.send(
        encode_request(Stream(topic="s", partition=0, group="g", member=member, offset=2))
    )
    assert await _skip_keepalives(s1) == StreamControl("CLOSE", "replaced", 2)
    assert await s1.closed()
    # A leader move tells the open stream where to go, and hangs up.
    new = cluster3.move_leader("s", 0)
    assert (await _skip_keepalives(s2)) == ErrorReply.of("NOT_LEADER", "LEADER_IS", new)
    assert await s2.closed()
    # On the new leader: an offset past the end, then a member leaving.
    s3 = await Wire.open(new)
    await s3.send(
        encode_request(Stream(topic="s", partition=0, group="g", member=member, offset=7))
    )
    assert await _skip_keepalives(s3) == StreamControl(
        "CLOSE", "offset_out_of_range", 7, requested=7, earliest=0, latest=2
    )
    s4 = await Wire.open(new)
    await s4.send(
        encode_request(Stream(topic="s", partition=0, group="g", member=member, offset=2))
    )
    # Open on the broker before the member leaves (a fixed sleep could be
    # too short: the leave came first, and no stream was there to close).
    with trio.fail_after(10):
        while not any(o.member == member and o.ending is None for o in cluster3._streams):
            await trio.sleep(0.01)
    await w.text(LeaveGroup(topic="s", group="g", member=member))
    assert await _skip_keepalives(s4) == StreamControl("CLOSE", "removed", 2)
    for wire in (w, producer, s1, s2, s3, s4):
        await wire.aclose()


async def _skip_keepalives(w: Wire) -> object:
    while isinstance(message := (await w.receive()).message, Keepalive):
        pass
    return message


async def test_a_broker_stopping_ends_streams_with_stopped() -> None:
    async with open_cluster(1, keepalive=5) as cluster:
        w = await Wire.open(cluster.address)
        await w.text(Create(topic="x", partitions=1))
        s = await Wire.open(cluster.address)
        await s.send(encode_request(Stream(topic="x", partition=0, group="g", member="m")))
        await wait_until_in_trio(
            lambda: len(cluster._streams) == 1, 20, "the stream to open", step=0.02
        )
    assert (await s.receive()).message == StreamControl("CLOSE", "stopped", 0)
    await w.aclose()
    await s.aclose()


# --- raw sockets: malformed input -------------------------------------------------------


async def test_a_corrupt_batch_is_refused_and_the_connection_stays(standalone: Cluster) -> None:
    w = await Wire.open(standalone.address)
    await w.text(Create(topic="c", partitions=1))
    body = encode_batch(one_batch("c", 0))
    await w.send(frame(body[:-3]))
    reply = await w.receive()
    text = reply.body.decode()
    assert text.startswith('ERROR: decode_failed reason="') and text.endswith('"')
    assert await w.text(List()) == "OK count=1 topics=c"
    assert standalone.topics["c"].partitions[0].log == []
    await w.aclose()


async def test_a_gzip_batch_to_a_plain_broker(standalone: Cluster) -> None:
    w = await Wire.open(standalone.address)
    await w.text(Create(topic="z", partitions=1))
    client_body = client_encoder.encode_batch("z", 0, "1", False, [ClientMessage(0, 1, "x")])
    await w.send(frame(gzip.compress(client_body)))
    assert (await w.receive()).body == b'ERROR: decode_failed reason="invalid topic length"'
    await w.aclose()


@pytest.mark.parametrize(
    "body",
    [
        b"\x00\x00hello there",  # an envelope with no topic
        b"\x00\x01t",  # an envelope with no payload
        b"\x00\x00BEGIN_TXN id=1",  # a command this broker does not know
    ],
)
async def test_malformed_input_is_refused_and_closed(standalone: Cluster, body: bytes) -> None:
    w = await Wire.open(standalone.address)
    await w.send(frame(body))
    reply = await w.receive()
    assert reply.body == b"ERROR: malformed_input reason=missing_topic_or_payload"
    assert await w.closed()
    await w.aclose()


async def test_garbage_is_an_invalid_topic_length(standalone: Cluster) -> None:
    w = await Wire.open(standalone.address)
    await w.send(frame(b"\xff\xfe garbage"))
    assert (await w.receive()).body == b'ERROR: decode_failed reason="invalid topic length"'
    assert await w.text(List()) == "OK count=0 topics="
    await w.aclose()


async def test_an_oversize_frame_is_closed_without_a_word(standalone: Cluster) -> None:
    w = await Wire.open(standalone.address)
    await w.send(struct.pack(">I", BROKER_MAX_FRAME_SIZE + 1) + b"x" * 1024)
    assert await w.closed()
    assert standalone.sent["closed:size"] == 1
    await w.aclose()
    # Exactly the limit is read and answered.
    w = await Wire.open(standalone.address)
    padded = b"LIST" + b" " * (BROKER_MAX_FRAME_SIZE - 4)
    await w.send(frame(padded, max_frame_size=BROKER_MAX_FRAME_SIZE))
    assert (await w.receive()).body == b"OK count=0 topics="
    await w.aclose()


async def test_client_keepalives_are_ignored(standalone: Cluster) -> None:
    w = await Wire.open(standalone.address)
    await w.send(KEEPALIVE)
    assert await w.text(List()) == "OK count=0 topics="
    await w.aclose()


async def test_a_gzip_broker_decompresses_everything() -> None:
    async with open_cluster(1, compression=Compression.GZIP) as cluster:
        w = await Wire.open(cluster.address)
        gz = {"compression": Compression.GZIP}
        assert (await w.text(Create(topic="g", partitions=1), **gz)).startswith("OK topic=g")
        ack = (await w.ask(one_batch("g", 0), **gz)).message
        assert isinstance(ack, BatchAck) and ack.status == "OK"
        # Plain text to a gzip broker does not decompress; replies are never compressed.
        assert (await w.text(List())).startswith('ERROR: decode_failed reason="gzip')
        await w.aclose()


@pytest.mark.e2e
def test_python_dash_m_runs_the_broker() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.cursus_broker", "--nodes", "2", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(LIMIT, proc.kill)  # a broker that never prints is killed
    watchdog.start()
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        addresses = [line.split(": ", 1)[1].strip() for line in lines]
        assert len(set(addresses)) == 2
        count = produce(addresses[0], "manual", ["one", "two"], 2)
        assert count == 2
    finally:
        watchdog.cancel()
        proc.terminate()
        proc.wait(10)
