"""The proxy's CPU per message on its hot path, without sockets or other processes.

    python bench/hotpath.py [--messages 20000] [--per-read 128] [--repeat 5]
                            [--no-record] [--only produce|consume] [--gc on|freeze|off]
                            [--profile] [--top 30] [--filter SPEC]

Drives one proxied ``PulsarConnection`` the way ``Relay`` does (a read in,
its actions out, a ``Relayed`` event per read) with the proxy's taps:
``Metrics`` and a ``Recorder`` writing to a temporary directory with payloads
hashed (its writer task runs between reads, as in the proxy). Two workloads,
shaped like ``bench/e2e.py``'s 1 KiB unbatched ones and like what the real
client and broker send:

  produce  reads of N SENDs (1 KiB, CRC32-C), answered by reads of N SEND_RECEIPTs
  consume  reads of N MESSAGEs (1 KiB, CRC32-C); a FLOW and an ACK per 1,000

Prints process CPU µs per message (median of the repeats, best in
brackets) and the part of it spent in Python's cyclic garbage collector.
Every frame is still decoded, validated, counted, correlated and recorded;
what is left out is trio's socket I/O, which ``bench/e2e.py`` measures
(through the proxy, the real client's 1 KiB reads held 170-185 frames each,
hence the default ``--per-read``). Being one process with no peers, it is
far less noisy than e2e on a shared machine, so it is the place to compare
changes. ``--profile`` runs one repeat under cProfile and prints the top
functions by own time. ``--gc freeze`` freezes what exists before traffic
starts (``gc.freeze()``, as a proxy could after starting up); ``--gc off``
makes runs repeatable enough to count instructions with valgrind.
``--filter SPEC`` (as ``sluice proxy --filter``, repeatable) runs the
connection with message filters, e.g. ``--filter encrypt:{"settings":
{"public_keys": {"k": "pub.pem"}}}``: what a filtered producer costs on the
Python path.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sluice.filters.chain import make_filters
from sluice.filters.config import FilterSpec, parse_flag
from sluice.protocols import registry
from sluice.protocols.core import Conn, OnInvalid, Relayed, Send, Taps
from sluice.protocols.pulsar import Type, command, encode, encode_payload, pb
from sluice.protocols.pulsar.connection import PulsarConnection, PulsarSettings, Routing
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.metrics import Metrics
from sluice.recording.format import PayloadPolicy
from sluice.recording.writer import Recorder, RecorderConfig

T = Type.Value
TOPIC = "persistent://public/default/bench"
BROKER = "pulsar://127.0.0.1:6650"
PAYLOAD = b"x" * 1024


def send(seq: int) -> bytes:
    cmd = command(T("SEND"), pb.CommandSend(producer_id=0, sequence_id=seq, num_messages=1))
    meta = pb.MessageMetadata(producer_name="producer-0", sequence_id=seq,
                              publish_time=1_795_267_584_681 + seq)  # fmt: skip
    return encode_payload(cmd, meta, PAYLOAD)


def receipt(seq: int) -> bytes:
    mid = pb.MessageIdData(ledgerId=7, entryId=seq, partition=-1)
    body = pb.CommandSendReceipt(producer_id=0, sequence_id=seq, message_id=mid)
    return encode(command(T("SEND_RECEIPT"), body))


def message(seq: int) -> bytes:
    mid = pb.MessageIdData(ledgerId=7, entryId=seq, partition=-1)
    body = pb.CommandMessage(consumer_id=0, message_id=mid, redelivery_count=0)
    meta = pb.MessageMetadata(producer_name="producer-0", sequence_id=seq,
                              publish_time=1_795_267_584_681 + seq)  # fmt: skip
    return encode_payload(command(T("MESSAGE"), body), meta, PAYLOAD)


def ack(first: int, count: int) -> bytes:
    ids = [pb.MessageIdData(ledgerId=7, entryId=first + i) for i in range(count)]
    body = pb.CommandAck(consumer_id=0, ack_type=pb.CommandAck.Individual, message_id=ids)
    return encode(command(T("ACK"), body))


def flow(permits: int) -> bytes:
    return encode(command(T("FLOW"), pb.CommandFlow(consumer_id=0, messagePermits=permits)))


def request(type_: str, body: object) -> bytes:
    return encode(command(T(type_), body))  # type: ignore[arg-type]


def produce_reads(messages: int, per_read: int) -> Iterator[tuple[bool, bytes, int]]:
    """(from_client, read, messages completed) for the produce workload."""
    for start in range(0, messages, per_read):
        seqs = range(start, min(start + per_read, messages))
        yield True, b"".join(send(s) for s in seqs), 0
        yield False, b"".join(receipt(s) for s in seqs), len(seqs)


def consume_reads(messages: int, per_read: int) -> Iterator[tuple[bool, bytes, int]]:
    for start in range(0, messages, per_read):
        seqs = range(start, min(start + per_read, messages))
        yield False, b"".join(message(s) for s in seqs), len(seqs)
        if (start // per_read + 1) * per_read % 1000 < per_read:
            yield True, flow(1000) + ack(start, len(seqs)), 0


FILTERS: list[FilterSpec] = []  # --filter


def connection(taps: Taps, conn_id: int) -> PulsarConnection:
    """A proxied connection past its handshake, with a producer and a consumer."""
    conn = Conn(conn_id, "127.0.0.1:50000", "127.0.0.1:6650", "pulsar")
    filtering = make_filters(FILTERS, registry.get("pulsar")) if FILTERS else None
    settings = PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5, filtering=filtering)
    core = PulsarConnection(conn, settings, Routing(parse_broker_url(BROKER)), taps)
    hello = pb.CommandConnect(client_version="bench", protocol_version=20,
                              proxy_to_broker_url="127.0.0.1:6650")  # fmt: skip
    core.receive_client(request("CONNECT", hello), 0.0)
    connected = pb.CommandConnected(server_version="bench", protocol_version=20)
    core.receive_broker(request("CONNECTED", connected), 0.0)
    producer = pb.CommandProducer(topic=TOPIC, producer_id=0, request_id=1)
    subscribe = pb.CommandSubscribe(topic=TOPIC, subscription="s", consumer_id=0, request_id=2,
                                    subType=pb.CommandSubscribe.Shared)  # fmt: skip
    core.receive_client(request("PRODUCER", producer) + request("SUBSCRIBE", subscribe), 0.0)
    ready = pb.CommandProducerSuccess(request_id=1, producer_name="producer-0")
    core.receive_broker(
        request("PRODUCER_SUCCESS", ready) + request("SUCCESS", pb.CommandSuccess(request_id=2)),
        0.0,
    )
    assert core.established and len(core.correlator.producers) == 1
    return core


async def run_workload(
    reads: list[tuple[bool, bytes, int]], record: bool, conn_id: int
) -> tuple[float, int]:
    """CPU seconds spent relaying ``reads`` (writer included), and messages."""
    metrics = Metrics()
    taps = Taps([metrics])
    with tempfile.TemporaryDirectory() as tmp:
        recorder = None
        if record:
            recorder = Recorder(RecorderConfig(Path(tmp), PayloadPolicy.HASH))
            taps.add(recorder)
        async with trio.open_nursery() as nursery:
            if recorder is not None:
                await nursery.start(recorder.run)
            core = connection(taps, conn_id)
            done = 0
            started = time.process_time()
            for from_client, data, completed in reads:
                now = trio.current_time()
                receive = core.receive_client if from_client else core.receive_broker
                actions = receive(data, now)
                assert len(actions) == 1 and type(actions[-1]) is Send, actions
                taps.event(core.conn, Relayed(from_client, trio.current_time() - now))
                done += completed
                await trio.sleep(0)  # the relay's write: the writer task gets its turn
            if recorder is not None:
                # What is left below the writer's wake-up amounts is taken at
                # its flush interval (a second): wait for it in few, long
                # sleeps, as every wake-up of this loop would count as CPU
                # (1 ms sleeps added some 5 µs per message).
                while recorder.queued:
                    await trio.sleep(0.05)
            used = time.process_time() - started
            nursery.cancel_scope.cancel()
    assert metrics.traffic.frames[True][T("SEND")] or metrics.traffic.frames[False][T("MESSAGE")]
    return used, done


class GcClock:
    """CPU time spent in the cyclic garbage collector."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.seconds += time.process_time() - self._started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--per-read", type=int, default=128, help="frames in one read")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-record", action="store_true", help="no recorder tap")
    parser.add_argument("--only", choices=("produce", "consume"), help="run one workload only")
    parser.add_argument("--gc", choices=("on", "freeze", "off"), default="on")
    parser.add_argument("--profile", action="store_true", help="one repeat under cProfile")
    parser.add_argument("--top", type=int, default=30, help="functions --profile prints")
    parser.add_argument("--filter", action="append", default=[], type=parse_flag,
                        help="a message filter, as sluice proxy --filter (repeatable)")  # fmt: skip
    args = parser.parse_args()
    FILTERS.extend(args.filter)
    record = not args.no_record
    workloads = {
        "produce": list(produce_reads(args.messages, args.per_read)),
        "consume": list(consume_reads(args.messages, args.per_read)),
    }
    if args.only is not None:
        workloads = {args.only: workloads[args.only]}
    if args.gc == "off":
        gc.disable()
    elif args.gc == "freeze":
        gc.freeze()
    collector = GcClock()
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for reads in workloads.values():
            trio.run(run_workload, reads, record, 1)
        profiler.disable()
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(args.top)
        return 0
    print(f"recording: {'on (payloads hashed)' if record else 'off'}; gc {args.gc}; "
          f"{args.messages} messages, {args.per_read} frames per read")  # fmt: skip
    for name, reads in workloads.items():
        per: list[float] = []
        in_gc: list[float] = []
        for i in range(args.repeat):
            collector.seconds = 0.0
            used, done = trio.run(run_workload, reads, record, i + 1)
            per.append(used / done * 1e6)
            in_gc.append(collector.seconds / done * 1e6)
        print(f"{name:<8} proxy CPU µs/msg {statistics.median(per):6.1f} (best {min(per):.1f}), "
              f"of which gc {statistics.median(in_gc):.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
