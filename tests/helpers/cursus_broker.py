"""A small scripted Cursus broker for tests: what the real broker does on the wire.

It exists to exercise Sluice against the real ``cursus-client``, not to be
a broker: an in-memory log per partition, consumer groups with generations,
and the replies, errors, keepalives and stream endings the real Go broker
was seen to send, byte for byte where they were seen. It speaks through
``sluice.protocols.cursus``.

Layouts:

- standalone: one node (``coordinator_id=standalone``, acks without
  ``"leader"``, never NOT_LEADER / NOT_COORDINATOR);
- cluster: several nodes on their own loopback ports in one process, sharing
  one state. Partition ``p`` is led by node ``p % nodes`` and a group is
  coordinated by one node; the others answer ``ERROR: NOT_LEADER LEADER_IS``
  (batches, CONSUME, STREAM) and ``ERROR: NOT_COORDINATOR host= port=``
  (group commands). ``move_leader`` and ``move_coordinator`` change that while
  clients run; open streams on the old leader get NOT_LEADER.

Use from trio (``async with open_cluster(nodes=3) as cluster``), from plain
threads (``with BrokerThread(nodes=3) as broker``), or by hand::

    python -m tests.helpers.cursus_broker --nodes 3 --port 9000

Where the real broker's behaviour was not observed, the choice made here is
marked "not observed" and answers with an ``ERROR:`` the client treats as
one.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
import ssl
import threading
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from sluice.protocols.cursus import (
    BROKER_MAX_FRAME_SIZE,
    CLOSED,
    Batch,
    BatchAck,
    BatchCommit,
    Command,
    CommitOffset,
    Compression,
    Consume,
    Create,
    Delete,
    EnvelopeMessage,
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
    OtherCommand,
    Problem,
    Publish,
    RemoteProtocolError,
    Stream,
    StreamControl,
    SyncGroup,
    encode_reply,
    refusal_reply,
)
from sluice.protocols.cursus.replies import Reply

log = logging.getLogger("tests.helpers.cursus_broker")

T = TypeVar("T")
Answer = Reply | Batch
CONSUMER_OFFSETS = "__consumer_offsets"
# Most messages one CONSUME answer or one STREAM frame carries (not observed).
MAX_BATCH = 100
GROUP_COMMANDS = (
    JoinGroup,
    SyncGroup,
    Heartbeat,
    LeaveGroup,
    CommitOffset,
    BatchCommit,
    FetchOffset,
)


@dataclass
class Partition:
    leader: int
    epoch: int = 0
    log: list[Message] = field(default_factory=list)


@dataclass
class Topic:
    name: str
    partitions: list[Partition]


@dataclass
class Group:
    name: str
    topic: str
    coordinator: int
    generation: int = 0
    members: list[str] = field(default_factory=list)  # in join order
    committed: dict[int, int] = field(default_factory=dict)

    def assignment(self, member: str, partitions: int) -> list[int]:
        if member not in self.members:
            return []
        i = self.members.index(member)
        return [p for p in range(partitions) if p % len(self.members) == i]


@dataclass(eq=False)
class _OpenStream:
    node: int
    topic: str
    partition: int
    group: str
    member: str
    position: int
    ending: Answer | None = None  # the last frame to send, once set


@dataclass
class Node:
    index: int
    host: str
    advertise_host: str
    port: int = 0
    raft_port: int = 0

    @property
    def address(self) -> str:
        """What the node advertises, as clients will dial it."""
        return f"{self.advertise_host}:{self.port}"


class Cluster:
    """The state of every node, and the nodes' servers."""

    def __init__(
        self,
        nodes: int = 1,
        *,
        host: str = "127.0.0.1",
        advertise_host: str | None = None,
        ports: list[int] | None = None,
        keepalive: float = 5.0,
        compression: Compression = Compression.NONE,
        max_frame_size: int = BROKER_MAX_FRAME_SIZE,
        standalone: bool | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        wanted = ports or [0] * nodes
        if len(wanted) != nodes:
            raise ValueError(f"{nodes} nodes need {nodes} ports, not {len(wanted)}")
        self.nodes = [Node(i, host, advertise_host or host, port) for i, port in enumerate(wanted)]
        self.standalone = nodes == 1 if standalone is None else standalone
        self.keepalive = keepalive
        self.compression = compression
        self.max_frame_size = max_frame_size
        self.tls = tls  # every node speaks TLS with this context (cursus+ssl://)
        self.topics: dict[str, Topic] = {}
        self.groups: dict[str, Group] = {}
        # What happened, for tests: replies by kind ("NOT_LEADER", "ACK", …),
        # and connections accepted per node with the peer address.
        self.sent: Counter[str] = Counter()
        self.connections: list[tuple[int, str]] = []
        # Connections opened and closed, in the order they were: (event, peer).
        self.lifetimes: list[tuple[str, str]] = []
        self._streams: list[_OpenStream] = []
        self._changed = trio.Event()
        self._stopping = False
        self._random = random.Random(0)

    # --- addresses and layout -----------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes]

    @property
    def address(self) -> str:
        """The first node: what a client is given as its broker."""
        return self.nodes[0].address

    def node_id(self, node: Node) -> str:
        return "standalone" if self.standalone else f"broker-{node.index + 1}"

    def leader_of(self, topic: str, partition: int) -> Node:
        return self.nodes[self.topics[topic].partitions[partition].leader]

    def coordinator_of(self, group: str) -> Node:
        existing = self.groups.get(group)
        if existing is not None:
            return self.nodes[existing.coordinator]
        return self.nodes[zlib.crc32(group.encode()) % len(self.nodes)]

    def move_leader(self, topic: str, partition: int, to: int | None = None) -> str:
        """Make node ``to`` (default: the next one) lead ``partition``; streams
        open on the old leader are told NOT_LEADER. Returns the new address."""
        part = self.topics[topic].partitions[partition]
        old = part.leader
        part.leader = (old + 1) % len(self.nodes) if to is None else to
        part.epoch += 1
        new = self.nodes[part.leader]
        for s in self._streams:
            if (s.topic, s.partition) == (topic, partition) and s.node != part.leader:
                s.ending = ErrorReply.of("NOT_LEADER", "LEADER_IS", new.address)
        self._notify()
        return new.address

    def move_coordinator(self, group: str, to: int | None = None) -> str:
        """Make node ``to`` (default: the next one) coordinate ``group``."""
        g = self.groups[group]
        g.coordinator = (g.coordinator + 1) % len(self.nodes) if to is None else to
        return self.nodes[g.coordinator].address

    def stop(self) -> None:
        """End every open stream with ``reason=stopped``, as a broker shutting down does."""
        self._stopping = True
        for s in self._streams:
            if s.ending is None:
                s.ending = StreamControl("CLOSE", "stopped", s.position)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # --- serving ---------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on every node's port, then serve until cancelled."""
        listeners: list[tuple[Node, list[trio.abc.Listener[trio.abc.Stream]]]] = []
        for node in self.nodes:
            found = await trio.open_tcp_listeners(node.port, host=node.host)
            node.port = found[0].socket.getsockname()[1]
            node.raft_port = 7000 + node.index  # never dialled: the ack names it only
            tls = self.tls
            wrapped: list[trio.abc.Listener[trio.abc.Stream]] = [
                f if tls is None else trio.SSLListener(f, tls, https_compatible=False)
                for f in found
            ]
            listeners.append((node, wrapped))
        task_status.started()
        async with trio.open_nursery() as nursery:
            for node, serving in listeners:
                nursery.start_soon(trio.serve_listeners, self._handler(node), serving)

    def _handler(self, node: Node) -> Callable[[trio.abc.Stream], Any]:
        async def handle(stream: trio.abc.Stream) -> None:
            await self._connection(node, stream)

        return handle

    async def _connection(self, node: Node, stream: trio.abc.Stream) -> None:
        tcp = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        assert isinstance(tcp, trio.SocketStream)
        peer = tcp.socket.getpeername()
        self.connections.append((node.index, f"{peer[0]}:{peer[1]}"))
        self.lifetimes.append(("open", f"{peer[0]}:{peer[1]}"))
        decoder = FrameDecoder(
            from_client=True, max_frame_size=self.max_frame_size, compression=self.compression
        )
        try:
            while True:
                frame = await _next_frame(stream, decoder)
                if frame is None:
                    return
                if isinstance(frame.message, Stream) and frame.error is None:
                    await self._stream(node, stream, decoder, frame.message)
                    return
                answer, close = self._answer(node, frame)
                if answer is not None:
                    await stream.send_all(self._encode(answer))
                if close:
                    return
        except RemoteProtocolError as exc:
            # Framing lost: over the size limit (the broker hangs up without a
            # word) or a stream cut inside a frame.
            self.sent[f"closed:{exc.problem.value}"] += 1
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.lifetimes.append(("close", f"{peer[0]}:{peer[1]}"))
            await stream.aclose()

    def _encode(self, answer: Answer | Keepalive) -> bytes:
        self.sent[_kind(answer)] += 1
        return encode_reply(answer)

    # --- one request, one answer ------------------------------------------------------

    def _answer(self, node: Node, frame: Frame) -> tuple[Answer | None, bool]:
        """The answer to one frame and whether to hang up after it."""
        message = frame.message
        error = frame.error
        if error is not None:
            if error.problem is Problem.UNKNOWN_TYPE:
                # This broker knows no more commands than it handles: an
                # unknown word in an envelope without a topic is malformed.
                return ErrorReply.of("malformed_input", reason="missing_topic_or_payload"), True
            return refusal_reply(error)
        if isinstance(message, Keepalive):
            return None, False  # not observed from clients; ignored
        if isinstance(message, Batch):
            return self._batch(node, message), False
        if isinstance(message, EnvelopeMessage | OtherCommand | Publish):
            # Not observed: single-message publishes and the event store.
            name = message.name
            return ErrorReply.of("not_supported_by_test_broker", command=name), False
        assert isinstance(message, Command)
        if isinstance(message, GROUP_COMMANDS):
            return self._group_command(node, message), False
        return self._command(node, message), False

    def _command(self, node: Node, cmd: Command) -> Answer:
        if isinstance(cmd, Create):
            return self._create(cmd)
        if isinstance(cmd, Delete):
            if self.topics.pop(cmd.topic, None) is None:
                return _topic_not_found(cmd.topic)
            return OkReply.of(topic=cmd.topic, deleted="true")
        if isinstance(cmd, List):
            names = list(self.topics)
            if self.groups:
                names.append(CONSUMER_OFFSETS)
            return OkReply.of(count=len(names), topics=",".join(names))
        if isinstance(cmd, Metadata):
            topic = self.topics.get(cmd.topic)
            if topic is None:
                return _topic_not_found(cmd.topic)
            return OkReply.of(
                topic=topic.name,
                partitions=len(topic.partitions),
                leaders=",".join(self.nodes[p.leader].address for p in topic.partitions),
                epochs=",".join(str(p.epoch) for p in topic.partitions),
            )
        if isinstance(cmd, FindCoordinator):
            coordinator = self.coordinator_of(cmd.group)
            return OkReply.of(
                coordinator_id=self.node_id(coordinator),
                coordinator_type="group",
                host=coordinator.advertise_host,
                port=coordinator.port,
            )
        if isinstance(cmd, Consume):
            return self._consume(node, cmd)
        return ErrorReply.of("not_supported_by_test_broker", command=cmd.name)

    def _create(self, cmd: Create) -> Answer:
        count = cmd.partitions if cmd.partitions is not None else 1
        if count < 1:
            return ErrorReply.of("invalid_partitions", partitions=count)  # not observed
        topic = self.topics.get(cmd.topic)
        if topic is None:
            parts = [Partition(leader=p % len(self.nodes)) for p in range(count)]
            topic = self.topics[cmd.topic] = Topic(cmd.topic, parts)
        return OkReply.of(
            topic=topic.name,
            partitions=len(topic.partitions),
            cleanup_policy="delete",
            partitioner="hash_key",
        )

    def _partition(self, node: Node, topic: str, partition: int) -> Partition | ErrorReply:
        """The partition, if this node leads it; else the error to answer."""
        t = self.topics.get(topic)
        if t is None:
            return _topic_not_found(topic)
        if not 0 <= partition < len(t.partitions):
            return ErrorReply.of("invalid_partition", topic=topic, partition=partition)
        part = t.partitions[partition]
        if part.leader != node.index:
            return ErrorReply.of("NOT_LEADER", "LEADER_IS", self.nodes[part.leader].address)
        return part

    def _batch(self, node: Node, batch: Batch) -> Answer:
        part = self._partition(node, batch.topic, batch.partition)
        if isinstance(part, ErrorReply):
            return part
        for m in batch.messages:
            part.log.append(dataclasses.replace(m, offset=len(part.log)))
        if batch.messages:
            self._notify()
        if batch.acks == "0":
            return OkReply()
        first = batch.messages[0] if batch.messages else Message()
        return BatchAck(
            status="OK",
            last_offset=len(part.log) - 1,
            producer_epoch=first.epoch,
            producer_id=first.producer_id,
            seq_start=batch.seq_start,
            seq_end=batch.seq_end,
            leader=None if self.standalone else f"{node.host}:{node.raft_port}",
        )

    def _consume(self, node: Node, cmd: Consume) -> Answer:
        part = self._partition(node, cmd.topic, cmd.partition)
        if isinstance(part, ErrorReply):
            return part
        if cmd.group is not None and cmd.generation is not None:
            stale = self._stale(cmd.group, cmd.member or "", cmd.generation)
            if stale is not None:
                return stale
        latest = len(part.log)
        if not 0 <= cmd.offset <= latest:
            return ErrorReply.of(
                "OFFSET_OUT_OF_RANGE", requested=cmd.offset, earliest=0, latest=latest
            )
        return _batch_of(cmd.topic, cmd.partition, part.log[cmd.offset : cmd.offset + MAX_BATCH])

    # --- groups -----------------------------------------------------------------------

    def _stale(self, group: str, member: str, generation: int) -> ErrorReply | None:
        g = self.groups.get(group)
        if g is None or generation == g.generation:
            return None
        return ErrorReply.of(
            "GEN_MISMATCH",
            current=g.generation,
            requested=generation,
            group=group,
            member=member,
        )

    def _group_command(self, node: Node, cmd: Any) -> Answer:
        name: str = cmd.group
        coordinator = self.coordinator_of(name)
        if coordinator.index != node.index:
            return ErrorReply.of(
                "NOT_COORDINATOR", host=coordinator.advertise_host, port=coordinator.port
            )
        topic = self.topics.get(cmd.topic)
        group = self.groups.get(name)
        if group is not None and cmd.topic != group.topic:
            return ErrorReply.of(
                "topic_not_assigned_to_group", expected=group.topic, actual=cmd.topic
            )
        if isinstance(cmd, FetchOffset):
            offset = group.committed.get(cmd.partition, 0) if group is not None else 0
            return OkReply.of(offset=offset)
        if topic is None:
            return _topic_not_found(cmd.topic)
        if group is None:
            group = self.groups[name] = Group(name, cmd.topic, coordinator.index)
        count = len(topic.partitions)
        if isinstance(cmd, JoinGroup):
            member = cmd.member if cmd.member in group.members else self._new_member(cmd.member)
            if member not in group.members:
                group.members.append(member)
                self._rebalance(group, count)
            return _joined(group, member, count)
        if isinstance(cmd, LeaveGroup):
            if cmd.member in group.members:
                group.members.remove(cmd.member)
                self._rebalance(group, count)
            return OkReply.of(group=name, member=cmd.member, left="true")
        generation = cmd.generation
        member = cmd.member
        if member is not None and member not in group.members:
            # Not observed; the client rejoins on it.
            return ErrorReply.of("member_not_found", group=name, member=member)
        if generation is not None:
            stale = self._stale(name, member or "", generation)
            if stale is not None:
                return stale
        if isinstance(cmd, SyncGroup):
            return _joined(group, cmd.member, count)
        if isinstance(cmd, Heartbeat):
            return OkReply.of(member=cmd.member, generation=group.generation)
        if isinstance(cmd, CommitOffset):
            group.committed[cmd.partition] = cmd.offset
            return OkReply()
        assert isinstance(cmd, BatchCommit)
        for partition, offset in cmd.offsets:
            group.committed[partition] = offset
        return OkReply.of(batched=len(cmd.offsets))

    def _new_member(self, requested: str) -> str:
        return f"{requested}-{self._random.randrange(1000, 10000)}"

    def _rebalance(self, group: Group, partitions: int) -> None:
        group.generation += 1
        for s in self._streams:
            mine = group.assignment(s.member, partitions)
            if s.group == group.name and s.ending is None and s.partition not in mine:
                s.ending = StreamControl("CLOSE", "removed", s.position)
        self._notify()

    # --- STREAM ---------------------------------------------------------------------

    async def _stream(
        self, node: Node, stream: trio.abc.Stream, decoder: FrameDecoder, cmd: Stream
    ) -> None:
        part = self._partition(node, cmd.topic, cmd.partition)
        if isinstance(part, ErrorReply):
            await stream.send_all(self._encode(part))
            return
        group = cmd.group or ""
        member = cmd.member or ""
        if cmd.generation is not None:
            stale = self._stale(group, member, cmd.generation)
            if stale is not None:
                await stream.send_all(self._encode(stale))
                return
        start = cmd.offset
        if start is None:
            g = self.groups.get(group)
            start = g.committed.get(cmd.partition, 0) if g is not None else 0
        latest = len(part.log)
        if not 0 <= start <= latest:
            control = StreamControl(
                "CLOSE", "offset_out_of_range", start, requested=start, earliest=0, latest=latest
            )
            await stream.send_all(self._encode(control))
            return
        state = _OpenStream(node.index, cmd.topic, cmd.partition, group, member, start)
        for other in self._streams:
            same = (other.topic, other.partition, other.group, other.member)
            if same == (cmd.topic, cmd.partition, group, member) and other.ending is None:
                other.ending = StreamControl("CLOSE", "replaced", other.position)
        self._streams.append(state)
        self._notify()
        if self._stopping:
            state.ending = StreamControl("CLOSE", "stopped", start)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_closed, stream, decoder, nursery.cancel_scope)
                await self._push(stream, state, part)
                nursery.cancel_scope.cancel()
        finally:
            self._streams.remove(state)

    async def _push(self, stream: trio.abc.Stream, state: _OpenStream, part: Partition) -> None:
        while True:
            changed = self._changed
            if state.ending is not None:
                await stream.send_all(self._encode(state.ending))
                return
            if state.position < len(part.log):
                chunk = part.log[state.position : state.position + MAX_BATCH]
                state.position += len(chunk)
                await stream.send_all(self._encode(_batch_of(state.topic, state.partition, chunk)))
                continue
            with trio.move_on_after(self.keepalive) as waited:
                await changed.wait()
            if waited.cancelled_caught:
                await stream.send_all(self._encode(Keepalive()))


async def _next_frame(stream: trio.abc.Stream, decoder: FrameDecoder) -> Frame | None:
    """The next frame from the client, or ``None`` once it has closed cleanly."""
    while True:
        event = decoder.next_event()  # raises when framing is lost
        if isinstance(event, Frame):
            return event
        if event is CLOSED:
            return None
        decoder.receive_data(await stream.receive_some(65536))


async def _until_closed(
    stream: trio.abc.Stream, decoder: FrameDecoder, scope: trio.CancelScope
) -> None:
    """A streaming client sends nothing more; when it hangs up, stop pushing."""
    try:
        while await stream.receive_some(65536):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    scope.cancel()


def _batch_of(topic: str, partition: int, messages: list[Message]) -> Batch:
    # The header fields of a delivered batch were not observed; the client
    # reads only the topic, the partition and the messages.
    seq = (messages[0].seq_num, messages[-1].seq_num) if messages else (0, 0)
    return Batch(topic, partition, "", False, seq[0], seq[1], tuple(messages))


def _joined(group: Group, member: str, partitions: int) -> OkReply:
    # Go prints a slice as [0 1 2]; only one-element lists were observed.
    assigned = " ".join(str(p) for p in group.assignment(member, partitions))
    return OkReply.of(generation=group.generation, member=member, assignments=f"[{assigned}]")


def _topic_not_found(topic: str) -> ErrorReply:
    return ErrorReply.of("topic_not_found", topic=topic)  # not observed


def _kind(answer: Answer | Keepalive) -> str:
    if isinstance(answer, ErrorReply):
        return answer.code
    if isinstance(answer, StreamControl):
        return f"STREAM_CONTROL:{answer.reason}"
    if isinstance(answer, Batch):
        return "BATCH"
    return str(answer.name)


# --- starting it ------------------------------------------------------------------------


@asynccontextmanager
async def open_cluster(nodes: int = 1, **options: Any) -> AsyncIterator[Cluster]:
    """A running broker (``nodes`` > 1: a cluster) for the body of the block.

    On the way out, open streams are ended with ``reason=stopped`` first.
    """
    cluster = Cluster(nodes, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(cluster.serve)
        try:
            yield cluster
        finally:
            cluster.stop()
            with trio.move_on_after(1):
                while cluster._streams:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()


class BrokerThread:
    """A running broker in a thread of its own, for code that is not trio.

    ``with BrokerThread(nodes=3) as broker: broker.cluster.addresses``; call
    into it with ``broker.call(cluster.move_leader, "t", 0)``.
    """

    def __init__(self, nodes: int = 1, **options: Any) -> None:
        self._nodes = nodes
        self._options = options
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cursus-broker", daemon=True)
        self._token: trio.lowlevel.TrioToken | None = None
        self._done: trio.Event | None = None
        self._failure: BaseException | None = None
        self.cluster: Cluster

    def _run(self) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._done = trio.Event()
            async with open_cluster(self._nodes, **self._options) as cluster:
                self.cluster = cluster
                self._ready.set()
                await self._done.wait()

        try:
            trio.run(main)
        except BaseException as exc:
            self._failure = exc
            self._ready.set()

    def __enter__(self) -> BrokerThread:
        self._thread.start()
        if not self._ready.wait(10) or self._failure is not None:
            raise RuntimeError(f"cursus test broker did not start: {self._failure!r}")
        return self

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the broker's thread (its state is not locked)."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def __exit__(self, *exc: object) -> None:
        if self._done is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._done.set, trio_token=self._token)
        self._thread.join(10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.helpers.cursus_broker", description="Run the Cursus test broker."
    )
    parser.add_argument("--nodes", type=int, default=1, help="nodes (default: 1, standalone)")
    parser.add_argument("--host", default="127.0.0.1", help="listen host (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=9000, help="first node's port (default: 9000)")
    parser.add_argument(
        "--advertise-host", default=None, help="host named in replies (default: --host)"
    )
    parser.add_argument(
        "--keepalive", type=float, default=5.0, help="STREAM keepalive, seconds (default: 5)"
    )
    parser.add_argument(
        "--compression",
        default="none",
        choices=[c.value for c in Compression],
        help="broker-wide compression (default: none)",
    )
    args = parser.parse_args(argv)
    ports = [args.port + i if args.port else 0 for i in range(args.nodes)]

    async def run() -> None:
        async with open_cluster(
            args.nodes,
            host=args.host,
            advertise_host=args.advertise_host,
            ports=ports,
            keepalive=args.keepalive,
            compression=Compression.parse(args.compression),
        ) as cluster:
            for node in cluster.nodes:
                print(f"node {node.index}: {node.address}", flush=True)
            await trio.sleep_forever()

    with suppress(KeyboardInterrupt):
        trio.run(run)


if __name__ == "__main__":
    main()
