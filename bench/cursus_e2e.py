"""Sluice in front of Cursus: the real cursus-client producing and consuming
through `sluice proxy` and directly, one run.

    python bench/cursus_e2e.py [--messages 20000] [--size 1024] [--rounds 3]
                           [--linger-ms 5] [--connections 1000]

The Cursus test broker (tests/helpers/cursus_broker.py, standalone) runs in
a process of its own, and in front of it two `sluice proxy` (validation
and metrics, no recording): ``sluice``, with batches checked in compiled
code (rust/src/cursus.rs), and ``sluice-python``, the same with
SLUICE_FRAMES=python (the Python reference decodes every batch). Each
round, on a fresh topic per path, the official Python client
(cursus-client) produces ``--messages`` payloads of ``--size`` bytes
(batched by its linger), then a consumer streams them back from the start
(it commits after each delivery, on a connection of its own); the paths
take turns, their order rotated from round to round. A warm-up round
through every path comes first and is not counted.

Printed per workload and path: msg/s over the client's window (the first
send to the last acknowledgement; consuming, from the subscription to the
last message) as the median (min-max) of the rounds and as a ratio to
direct, and the proxy's CPU per message (its process's CPU clock, every
thread, over the same window), with, for ``sluice``, its ratio to
``sluice-python`` in the same round.

Two more workloads take the consumer apart. ``stream`` is its deliveries
alone: one connection that sends the same STREAM command the consumer
sends (from the start of the round's topic) and reads the batches until it
has every message, committing nothing. ``connect`` is what the consumer does
for each commit: ``--connections`` connections one after another, each
opened with the client's own connection class, one command (LIST) and its
reply, closed. Its row gives connections a second and the proxy's CPU per
connection.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peers import process_cpu, spread
from sluice.brokers.embedded import free_port, terminate, wait_for_port
from tests.helpers.support import start_proxy

WORKLOADS = ("produce", "consume", "stream", "connect")
PATHS = ("direct", "sluice", "sluice-python")


def produce(address: str, topic: str, count: int, size: int, linger_ms: int) -> float:
    """Seconds from the first send to the last acknowledgement."""
    from cursus import Producer, ProducerConfig

    producer = Producer(ProducerConfig(topic=topic, brokers=[address], partitions=1,
                                       linger_ms=linger_ms, flush_timeout_ms=60_000,
                                       buffer_size=count + 1))  # fmt: skip
    payload = "x" * size
    try:
        started = time.perf_counter()
        for _ in range(count):
            producer.send(payload)
        producer.flush()
        seconds = time.perf_counter() - started
        acked = producer.unique_ack_count
    finally:
        producer.close()
    if acked != count:
        raise SystemExit(f"bench/cursus_e2e.py: {acked} of {count} acknowledged via {address}")
    return seconds


def consume(address: str, topic: str, count: int) -> float:
    """Seconds from the subscription to the last of ``count`` messages."""
    from cursus import Consumer, ConsumerConfig, ConsumerMode

    got = 0
    done = threading.Event()

    def handler(message: object) -> None:
        nonlocal got
        got += 1
        if got >= count:
            done.set()

    consumer = Consumer(ConsumerConfig(topic=topic, brokers=[address], group_id=f"g-{topic}",
                                       consumer_id="bench", mode=ConsumerMode.STREAMING,
                                       batch_size=500))  # fmt: skip
    started = time.perf_counter()
    thread = threading.Thread(target=consumer.start, args=(handler,), daemon=True)
    thread.start()
    try:
        if not done.wait(120):
            raise SystemExit(f"bench/cursus_e2e.py: consumed {got} of {count} via {address}")
        return time.perf_counter() - started
    finally:
        consumer.close()
        thread.join(10)


def stream(address: str, topic: str, count: int) -> float:
    """Seconds from the STREAM command to the last of ``count`` messages
    (the batches' own counts), read off one connection."""
    import socket

    from sluice.protocols.cursus import FrameDecoder, encode_request
    from sluice.protocols.cursus.commands import Stream

    host, port = address.rsplit(":", 1)
    decoder = FrameDecoder(from_client=False)
    got = 0
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        started = time.perf_counter()
        conn.sendall(encode_request(Stream(topic=topic, partition=0, group=f"s-{topic}",
                                           offset=0)))  # fmt: skip
        while got < count:
            data = conn.recv(1 << 20)
            if not data:
                raise SystemExit(f"bench/cursus_e2e.py: the stream via {address} ended at {got}")
            decoder.receive_data(data)
            for frame in decoder.frames():
                head = frame.head
                if head is not None:
                    got += head.count
                elif frame.name != "KEEPALIVE":
                    raise SystemExit(f"bench/cursus_e2e.py: the stream via {address} sent "
                                     f"{frame.name}: {frame.raw[:80]!r}")  # fmt: skip
        return time.perf_counter() - started


def connect(address: str, count: int) -> float:
    """Seconds for ``count`` connections one after another, each a command
    and its reply, as the consumer makes one per commit."""
    from cursus.connection.sync_conn import SyncConnection
    from cursus.protocol.encoder import encode_message

    request = encode_message("", "LIST")
    started = time.perf_counter()
    for _ in range(count):
        conn = SyncConnection(address)
        conn.connect()
        try:
            conn.write_frame(request)
            reply = conn.read_frame()
        finally:
            conn.close()
        if not reply.startswith(b"OK"):
            raise SystemExit(f"bench/cursus_e2e.py: LIST via {address} answered {reply[:80]!r}")
    return time.perf_counter() - started


def measured(run: Callable[[], float], pid: int | None) -> tuple[float, float | None]:
    """(seconds, proxy CPU seconds over them) of ``run``."""
    before = process_cpu(pid) if pid is not None else 0.0
    seconds = run()
    cpu = process_cpu(pid) - before if pid is not None else None
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="per round (default 20000)")
    parser.add_argument("--size", type=int, default=1024, help="payload bytes (default 1024)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument("--linger-ms", type=int, default=5,
                        help="the producer's linger (default 5)")  # fmt: skip
    parser.add_argument("--connections", type=int, default=1000,
                        help="per round, for the connect workload (default 1000)")  # fmt: skip
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3: each figure is a median with its spread")
    if args.messages < 1 or args.connections < 1:
        parser.error("--messages and --connections must be at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="sluice-bench-cursus-"))
    port = free_port()
    broker = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.cursus_broker", "--port", str(port)],
        cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.DEVNULL,
        stderr=(tmp / "broker.log").open("wb"),
    )  # fmt: skip
    proxies = []
    try:
        wait_for_port("127.0.0.1", port, 30, broker)
        url = f"cursus://127.0.0.1:{port}"
        proxies.append(start_proxy(url, tmp))
        proxies.append(start_proxy(url, tmp, env={"SLUICE_FRAMES": "python"}))
        addresses = {"direct": f"127.0.0.1:{port}"}
        pids: dict[str, int | None] = {"direct": None}
        for name, proxy in zip(PATHS[1:], proxies, strict=True):
            addresses[name] = f"127.0.0.1:{proxy.port}"
            pids[name] = proxy.pid
        results: dict[tuple[str, str], list[tuple[float, float | None]]] = {}
        for number in range(args.rounds + 1):
            paths = PATHS[number % 3 :] + PATHS[: number % 3]
            for path in paths:
                topic = f"bench-{uuid.uuid4().hex[:8]}"
                address, pid = addresses[path], pids[path]
                for workload in WORKLOADS:
                    runs = {
                        "produce": functools.partial(produce, address, topic, args.messages,
                                                     args.size, args.linger_ms),
                        "consume": functools.partial(consume, address, topic, args.messages),
                        "stream": functools.partial(stream, address, topic, args.messages),
                        "connect": functools.partial(connect, address, args.connections),
                    }  # fmt: skip
                    count = args.connections if workload == "connect" else args.messages
                    unit = "conn" if workload == "connect" else "msg"
                    seconds, cpu = measured(runs[workload], pid)
                    rate = count / seconds
                    shown = f"{cpu / count * 1e6:.1f} µs/{unit}" if cpu is not None else ""
                    label = "warm-up" if number == 0 else f"round {number}"
                    print(f"[cursus] {label}: {path:13} {workload:8} {rate:9,.0f} {unit}/s {shown}",
                          flush=True)  # fmt: skip
                    if number:
                        results.setdefault((workload, path), []).append((rate, cpu))
        print()
        print("| workload | path | msg/s | vs direct | proxy CPU µs/msg | vs sluice-python |")
        print("|---|---|---|---|---|---|")
        for workload in WORKLOADS:
            direct = [rate for rate, _ in results[(workload, "direct")]]
            python = [c or 0.0 for _, c in results[(workload, "sluice-python")]]
            for path in PATHS:
                rates = [rate for rate, _ in results[(workload, path)]]
                ratios = [r / d for r, d in zip(rates, direct, strict=True)]
                used = [c or 0.0 for _, c in results[(workload, path)]]
                count = args.connections if workload == "connect" else args.messages
                per = [c / count * 1e6 for c in used] if path != "direct" else []
                versus = spread(ratios) if path != "direct" else ""
                against = [c / p for c, p in zip(used, python, strict=True)]
                than = spread(against) if path == "sluice" else ""
                print(f"| {workload} | {path} | {spread(rates, ',.0f')} | {versus} | "
                      f"{spread(per, '.1f')} | {than} |")  # fmt: skip
        print(f"\n{args.messages} messages of {args.size} B a round, {args.rounds} rounds, "
              f"linger {args.linger_ms} ms; connect: {args.connections} connections a "
              "round, its msg/s connections a second and its CPU per connection; "
              "medians (min-max)")  # fmt: skip
    finally:
        for proxy in proxies:
            proxy.kill()
        terminate(broker, 10)


if __name__ == "__main__":
    main()
