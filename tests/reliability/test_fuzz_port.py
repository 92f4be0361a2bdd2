"""Bad input at the port while real traffic flows.

A seeded fuzzer opens connections and sends frames made from the golden
corpus by mutation (wrong length prefixes, truncated headers, garbage
before CONNECT, wrong magic, bad checksums, oversize frames, random
protobuf bytes, bit flips), plus slow byte-at-a-time writers and sockets
left half open. Meanwhile a real producer and consumer go through the same
proxy and lose nothing; the proxy stays up, closes every bad connection,
and its open files and memory come back to where they were.
"""

from __future__ import annotations

import collections
import contextlib
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pulsar
import pytest

from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.pulsar import Type, command, decode_stream, encode, pb
from tests.helpers.reliability import (
    AdminProxy,
    body,
    open_fds,
    pulsar_client,
    rss_bytes,
    start_admin_proxy,
    wait_until,
)

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "data"
HANDSHAKE_TIMEOUT = 1.0
WRONG_LENGTHS = (0, 1, 2**31, 2**32 - 1)


def corpus() -> list[bytes]:
    """Every frame the real client sent in the golden captures, as bytes."""
    frames: list[bytes] = []
    for path in sorted(GOLDEN.glob("*/*-client.bin")):
        frames += [f.raw for f in decode_stream(path.read_bytes())]
    assert len(frames) > 50, "the golden corpus is missing"
    return frames


def connect_frame(proxy_to: str | None = None) -> bytes:
    hello = pb.CommandConnect(client_version="fuzzer", protocol_version=21)
    if proxy_to is not None:
        hello.proxy_to_broker_url = proxy_to
    return encode(command(Type.Value("CONNECT"), hello))


@dataclass
class FuzzStats:
    connections: int = 0
    frames: int = 0
    closed_by_proxy: int = 0  # connections the proxy hung up on (EOF or reset)
    mutations: collections.Counter[str] = field(default_factory=collections.Counter)
    slow_closed: list[float] = field(default_factory=list)  # seconds until the proxy hung up


class Fuzzer:
    """Reproducible: the same seed sends the same bytes."""

    def __init__(self, port: int, broker: str, seed: int) -> None:
        self.port = port
        self.broker = broker
        self.rng = random.Random(seed)
        self.corpus = corpus()
        self.stats = FuzzStats()

    # --- mutations of one frame ------------------------------------------------

    def mutate(self, frame: bytes) -> tuple[str, bytes]:
        rng = self.rng
        kind = rng.choice(
            ["length", "cmd_size", "truncate", "magic", "checksum", "oversize", "protobuf",
             "bitflip", "bitflip", "valid"]
        )  # fmt: skip
        data = bytearray(frame)
        if kind == "length":
            data[0:4] = struct.pack(">I", rng.choice(WRONG_LENGTHS))
        elif kind == "cmd_size":
            data[4:8] = struct.pack(">I", rng.choice([0, 1, 2**31, 2**32 - 1, len(frame)]))
        elif kind == "truncate":
            data = data[: rng.randrange(1, max(2, len(frame)))]
        elif kind == "magic":
            at = data.find(b"\x0e\x01")
            if at < 0:
                return self.mutate(frame)
            data[at : at + 2] = bytes([rng.randrange(256), rng.randrange(256)])
        elif kind == "checksum":
            at = data.find(b"\x0e\x01")
            if at < 0 or at + 6 >= len(data):
                return self.mutate(frame)
            where = rng.randrange(at + 2, len(data))
            data[where] ^= 1 << rng.randrange(8)
        elif kind == "oversize":
            size = 6 * 1024 * 1024 + rng.randrange(1024)
            data = bytearray(struct.pack(">I", size) + data[4:] + bytes(64 * 1024))
        elif kind == "protobuf":
            junk = rng.randbytes(rng.randrange(1, 200))
            data = bytearray(struct.pack(">II", len(junk) + 4, len(junk)) + junk)
        elif kind == "bitflip":
            for _ in range(rng.randrange(1, 4)):
                where = rng.randrange(len(data))
                data[where] ^= 1 << rng.randrange(8)
        return kind, bytes(data)

    # --- connections -----------------------------------------------------------

    def one_connection(self) -> None:
        rng = self.rng
        opening = rng.choice(["lookup", "proxied", "garbage", "mutated", "none"])
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.stats.connections += 1
        try:
            if opening == "lookup":
                sock.sendall(connect_frame())
            elif opening == "proxied":
                sock.sendall(connect_frame(self.broker))
            elif opening == "garbage":  # garbage before a good CONNECT
                sock.sendall(rng.randbytes(rng.randrange(1, 64)) + connect_frame())
                self.stats.frames += 1
                self.stats.mutations["garbage_before_connect"] += 1
            elif opening == "mutated":
                kind, data = self.mutate(connect_frame())
                sock.sendall(data)
                self.stats.frames += 1
                self.stats.mutations[f"connect_{kind}"] += 1
            # Drawn before sending, so that the bytes depend on the seed only
            # (not on when the proxy hangs up).
            batch = [self.mutate(rng.choice(self.corpus)) for _ in range(rng.randrange(1, 40))]
            for kind, _ in batch:
                self.stats.mutations[kind] += 1
                self.stats.frames += 1
            for _, data in batch:
                try:
                    sock.sendall(data)
                except OSError:  # the proxy already hung up: what it should do
                    break
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)  # half-closed: the proxy must finish it
            if self.drain(sock, 5):
                self.stats.closed_by_proxy += 1
        finally:
            sock.close()

    @staticmethod
    def drain(sock: socket.socket, timeout: float) -> bool:
        """Read until the proxy hangs up; whether it did within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if not sock.recv(65536):
                    return True
            except (ConnectionResetError, BrokenPipeError):
                return True
            except TimeoutError:
                return False
        return False

    def slowloris(self, count: int) -> list[threading.Thread]:
        """``count`` writers sending a CONNECT one byte at a time, slower
        than the handshake timeout allows, and as many silent sockets."""

        def slow(data: bytes, delay: float) -> None:
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                for byte in data:
                    try:
                        sock.sendall(bytes([byte]))
                    except OSError:
                        break
                    sock.settimeout(delay)
                    try:
                        if not sock.recv(1024):
                            break
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                else:
                    self.drain(sock, 10)
                self.stats.slow_closed.append(time.monotonic() - started)

        def silent() -> None:
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                self.drain(sock, 10)
                self.stats.slow_closed.append(time.monotonic() - started)

        threads = []
        for i in range(count):
            target = (lambda: slow(connect_frame(), 0.2)) if i % 2 else silent
            threads.append(threading.Thread(target=target, daemon=True))
        for t in threads:
            t.start()
        self.stats.connections += count
        return threads

    def run(self, frames: int, slow: int = 10) -> FuzzStats:
        threads = self.slowloris(slow)
        while self.stats.frames < frames:
            self.one_connection()
        for t in threads:
            t.join(15)
        return self.stats


@dataclass
class FuzzOutcome:
    stats: FuzzStats
    sent: int
    acked: int
    consumed: int
    lost: int
    fds: tuple[int, int]  # before, after
    rss: tuple[int, int]  # after warming up, after the run
    peak_rss: int
    metrics: dict[str, float]
    seconds: float
    log: str


def real_traffic(
    url: str, topic: str, count: int, out: dict[str, int], stop: threading.Event
) -> None:
    """A producer and a consumer through the proxy while the fuzzer runs."""
    with pulsar_client(url) as c:
        consumer = c.subscribe(topic, "real", initial_position=pulsar.InitialPosition.Earliest)
        producer = c.create_producer(topic, batching_enabled=False, send_timeout_millis=30_000)
        acked: set[bytes] = set()
        for i in range(count):
            content = body("real", i, 256)
            producer.send(content)
            acked.add(content)
            if stop.is_set():
                break
            time.sleep(0.01)
        seen: set[bytes] = set()
        while not acked <= seen:
            try:
                msg = consumer.receive(timeout_millis=10_000)
            except pulsar.Timeout:
                break
            consumer.acknowledge(msg)
            seen.add(msg.data())
        out.update(sent=count, acked=len(acked), consumed=len(acked & seen))
        out["lost"] = len(acked - seen)


def fuzz_port(
    tmp_path: Path, topic: str, *, frames: int, seed: int, messages: int, slow: int = 10
) -> FuzzOutcome:
    with EmbeddedBroker() as broker:
        proxy = start_admin_proxy(
            broker.url, tmp_path, "--handshake-timeout", str(HANDSHAKE_TIMEOUT)
        )
        try:
            broker_address = f"127.0.0.1:{broker.port}"
            # Warm up: the first few hundred frames grow the heap once.
            Fuzzer(proxy.proxy.port, broker_address, seed + 1).run(300, slow=2)
            wait_until(lambda: proxy.metric("sluice_connections_active") == 0, 15, "warm-up closed")
            fds_before, rss_before = open_fds(proxy.pid), rss_bytes(proxy.pid)
            traffic: dict[str, int] = {}
            stop = threading.Event()
            real = threading.Thread(
                target=real_traffic, args=(proxy.url, topic, messages, traffic, stop), daemon=True
            )
            started = time.monotonic()
            real.start()
            stats = Fuzzer(proxy.proxy.port, broker_address, seed).run(frames, slow=slow)
            real.join(120)
            assert not real.is_alive(), "the real producer/consumer never finished"
            seconds = time.monotonic() - started
            wait_until(
                lambda: proxy.metric("sluice_connections_active") == 0,
                15,
                "every connection to be closed",
            )
            assert proxy.proxy.process.poll() is None, "the proxy died"
            metrics = summary_metrics(proxy)
            return FuzzOutcome(
                stats=stats,
                sent=traffic.get("sent", 0),
                acked=traffic.get("acked", 0),
                consumed=traffic.get("consumed", 0),
                lost=traffic.get("lost", -1),
                fds=(fds_before, open_fds(proxy.pid)),
                rss=(rss_before, rss_bytes(proxy.pid)),
                peak_rss=rss_bytes(proxy.pid),
                metrics=metrics,
                seconds=seconds,
                log=proxy.proxy.log(),
            )
        finally:
            proxy.kill()


def summary_metrics(proxy: AdminProxy) -> dict[str, float]:
    out = {
        "opened": proxy.metric("sluice_connections_opened_total"),
        "closed": proxy.metric("sluice_connections_closed_total"),
        "active": proxy.metric("sluice_connections_active"),
        "invalid frames": proxy.metric("sluice_validation_failures_total"),
    }
    for (name, labels), value in proxy.scrape().items():
        if name == "sluice_connections_rejected_total" and value:
            out[f"rejected {dict(labels)['reason']}"] = value
    return out


@pytest.mark.e2e
def test_fuzzed_port_with_real_traffic_beside_it(tmp_path: Path, topic: str) -> None:
    outcome = fuzz_port(tmp_path, topic, frames=10_000, seed=17, messages=300)
    stats, metrics = outcome.stats, outcome.metrics
    # The real pair lost nothing.
    assert outcome.acked == outcome.sent == 300 and outcome.lost == 0, outcome
    # Every mutation was tried, and the proxy saw and closed every connection.
    for kind in ("length", "cmd_size", "truncate", "magic", "checksum", "oversize", "protobuf"):
        assert stats.mutations[kind] > 50, stats.mutations
    assert stats.frames >= 10_000
    assert metrics["active"] == 0 and metrics["opened"] == metrics["closed"], metrics
    assert metrics["opened"] >= stats.connections, (metrics, stats.connections)
    assert metrics["invalid frames"] > 0 and metrics["rejected handshake"] > 0, metrics
    assert metrics["rejected handshake_timeout"] >= 10, metrics  # slowloris and silent sockets
    assert all(s < HANDSHAKE_TIMEOUT + 3 for s in stats.slow_closed), stats.slow_closed
    assert len(stats.slow_closed) == 10
    # Nothing leaked: open files back to the baseline, memory close to it.
    before, after = outcome.fds
    assert after <= before + 2, outcome.fds
    grown = outcome.rss[1] - outcome.rss[0]
    assert grown < 20 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB"
    assert "Traceback" not in outcome.log, outcome.log[-3000:]


def test_closed_connections_are_counted_by_reason(broker: EmbeddedBroker, tmp_path: Path) -> None:
    proxy = start_admin_proxy(broker.url, tmp_path, "--handshake-timeout", "0.5")
    try:
        with socket.create_connection(("127.0.0.1", proxy.proxy.port)) as sock:
            assert Fuzzer.drain(sock, 5)  # silent: dropped after the handshake timeout
        with socket.create_connection(("127.0.0.1", proxy.proxy.port)) as sock:
            sock.sendall(struct.pack(">I", 2**31) + bytes(64))  # unframeable
            assert Fuzzer.drain(sock, 5)
        wait_until(lambda: proxy.metric("sluice_connections_active") == 0, 10, "closed")
        closed = {
            dict(labels).get("reason"): value
            for (name, labels), value in proxy.scrape().items()
            if name == "sluice_connections_closed_total" and value
        }
        # (The start-up check that the port is open adds one "closed".)
        assert closed.get("handshake_timeout") == 1, closed
        assert closed.get("unframeable") == 1, closed
    finally:
        proxy.kill()
