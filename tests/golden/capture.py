"""Capture golden byte vectors from the real client and the real broker.

    python tests/golden/capture.py [--out tests/golden/data]

Starts the embedded ``pulsar-lite`` broker and a small recording relay in
front of it, then runs one scenario per sub-directory with the official
``pulsar-client``: a producer and a consumer with batching off and on, each
compression codec, acknowledgements individual and cumulative. Every byte
each side sent is stored per connection as ``c<N>-client.bin`` (client to
broker) and ``c<N>-broker.bin`` (broker to client), plus ``manifest.json``
naming the messages each scenario sent, so the tests can check content and
not only framing.

The relay forwards client bytes untouched. Broker bytes are forwarded frame
by frame so that LOOKUP answers can point at the relay instead of the broker
(otherwise the client would dial the broker directly and the capture would
miss its producers and consumers); the stored file holds what the broker
actually sent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulsar

from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.pulsar import FrameDecoder, Type, command, encode, pb

HERE = Path(__file__).resolve().parent


@dataclass
class Connection:
    number: int
    client_bytes: bytearray = field(default_factory=bytearray)
    broker_bytes: bytearray = field(default_factory=bytearray)


class RecordingRelay:
    """Loopback TCP relay that keeps a copy of every byte, per connection."""

    def __init__(self, broker: tuple[str, int]) -> None:
        self.broker = broker
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"pulsar://127.0.0.1:{self.port}"
        self.connections: list[Connection] = []
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.broker)
            conn = Connection(len(self.connections))
            self.connections.append(conn)
            pumps = (
                (self._pump_client, client, upstream),
                (self._pump_broker, upstream, client),
            )
            for pump, src, dst in pumps:
                thread = threading.Thread(target=pump, args=(src, dst, conn), daemon=True)
                thread.start()
                self._threads.append(thread)

    @staticmethod
    def _pump_client(src: socket.socket, dst: socket.socket, conn: Connection) -> None:
        try:
            while data := src.recv(65536):
                conn.client_bytes += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _half_close(dst)

    def _pump_broker(self, src: socket.socket, dst: socket.socket, conn: Connection) -> None:
        decoder = FrameDecoder()
        try:
            while data := src.recv(65536):
                conn.broker_bytes += data
                decoder.receive_data(data)
                for frame in decoder.frames():
                    dst.sendall(self._rewrite(frame.raw, frame.type, frame.command))
        except OSError:
            pass
        finally:
            _half_close(dst)

    def _rewrite(self, raw: bytes, type_: int, cmd: pb.BaseCommand | None) -> bytes:
        if type_ != Type.Value("LOOKUP_RESPONSE") or cmd is None:
            return raw
        answer = pb.CommandLookupTopicResponse()
        answer.CopyFrom(cmd.lookupTopicResponse)
        if answer.response == pb.CommandLookupTopicResponse.Failed:
            return raw
        answer.brokerServiceUrl = self.url
        answer.ClearField("brokerServiceUrlTls")
        return encode(command(type_, answer))

    def close(self) -> None:
        self._closing = True
        self.listener.close()
        for thread in self._threads:
            thread.join(timeout=10)


def _half_close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)


# name -> producer options, consumer acknowledgement style
SCENARIOS: dict[str, dict[str, Any]] = {
    "plain": {"batching_enabled": False},
    "batched": {"batching_enabled": True},
    "lz4": {"batching_enabled": True, "compression_type": pulsar.CompressionType.LZ4},
    "zlib": {"batching_enabled": True, "compression_type": pulsar.CompressionType.ZLib},
    "zstd": {"batching_enabled": True, "compression_type": pulsar.CompressionType.ZSTD},
    "snappy": {"batching_enabled": True, "compression_type": pulsar.CompressionType.SNAPPY},
    "zstd-unbatched": {"batching_enabled": False, "compression_type": pulsar.CompressionType.ZSTD},
}
MESSAGES = 12


def payload(scenario: str, index: int) -> bytes:
    # Repetitive on purpose, so that compression actually shrinks it.
    return (f"{scenario}:{index:03d}:" * 8).encode()


def run_scenario(broker: EmbeddedBroker, name: str, options: dict[str, Any]) -> dict[str, Any]:
    relay = RecordingRelay(broker.address)
    topic = f"persistent://public/default/golden-{name}"
    client = pulsar.Client(
        relay.url,
        operation_timeout_seconds=15,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
    )
    sent = [payload(name, i) for i in range(MESSAGES)]
    try:
        consumer = client.subscribe(
            topic, "golden", initial_position=pulsar.InitialPosition.Earliest
        )
        producer = client.create_producer(
            topic,
            batching_max_messages=4,
            batching_max_publish_delay_ms=50,
            **options,
        )
        if options.get("batching_enabled"):
            done = threading.Semaphore(0)
            for body in sent:
                producer.send_async(body, lambda result, msg_id: done.release())
            producer.flush()
            for _ in sent:
                done.acquire(timeout=15)
        else:
            for body in sent:
                producer.send(body)
        received = []
        cumulative = name == "batched"
        for _ in sent:
            msg = consumer.receive(timeout_millis=15000)
            received.append(msg.data())
            if not cumulative:
                consumer.acknowledge(msg)
        if cumulative:
            consumer.acknowledge_cumulative(msg)
        if received != sent:
            raise SystemExit(f"{name}: consumer received other messages than were sent")
        producer.close()
        consumer.close()
    finally:
        client.close()
        relay.close()
    return {
        "topic": topic,
        "connections": len(relay.connections),
        "messages": [body.decode() for body in sent],
        "batched": bool(options.get("batching_enabled")),
        "compression": str(options.get("compression_type", pulsar.CompressionType.NONE)),
        "_relay": relay,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "data", help="output directory")
    args = parser.parse_args(argv)
    out: Path = args.out
    manifest: dict[str, Any] = {
        "client": f"pulsar-client {pulsar.__version__}",
        "broker": "pulsar-lite (embedded)",
        "scenarios": {},
    }
    with EmbeddedBroker() as broker:
        for name, options in SCENARIOS.items():
            print(f"capturing {name} ...", file=sys.stderr)
            result = run_scenario(broker, name, options)
            relay: RecordingRelay = result.pop("_relay")
            target = out / name
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            for conn in relay.connections:
                (target / f"c{conn.number}-client.bin").write_bytes(conn.client_bytes)
                (target / f"c{conn.number}-broker.bin").write_bytes(conn.broker_bytes)
            manifest["scenarios"][name] = result
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
