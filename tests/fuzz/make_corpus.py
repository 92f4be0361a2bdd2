"""Write the fuzz harnesses' seed corpus from real traffic.

    python -m tests.fuzz.make_corpus [--out tests/fuzz/corpus] [--only NAME ...]

Sources, all real bytes:

- the golden captures (``tests/golden/data``: the official pulsar-client and
  pulsar-lite, every compression codec, batched and not), for the proxy
  core as proxied and as lookup connections, the two sides taken in turns;
- a session recorded here through ``sluice proxy`` (payloads kept): the
  official pulsar-client in front of pulsar-lite, producing batched (LZ4)
  and unbatched, consuming and acknowledging, on a partitioned topic;
- a Cursus session recorded here through ``sluice proxy --protocol cursus``:
  the real cursus-client producing to and streaming from the test broker
  (``tests/helpers/cursus_broker.py``);
- the recordings of ``sluice analyze``'s golden run
  (``tests/golden/analyze/inputs``), and those the two sessions above
  leave, as files (the recording harness).

Each harness gets its input form: a stream with its chunking byte (codecs),
a payload with its metadata's codec, size and entry count (payloads), a
script of both sides (proxy core; the client's CONNECT carries a token for
the harness's key and names the broker it fronts). The directory is
replaced whole; the files are named by their SHA-1, as libFuzzer names its
own.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulsar
import trio
from cursus import ConsumerMode

from sluice.addresses import Address
from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.cursus import Compression, compress
from sluice.protocols.cursus import decode_stream as cursus_stream
from sluice.protocols.cursus import frame as cursus_frame
from sluice.protocols.haproxy import V2_SIGNATURE, v2_header
from sluice.protocols.pulsar import Frame, command, decode_stream, encode, pb
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.server import Proxy
from sluice.recording.format import (
    PayloadPolicy,
    RecordingError,
    dumps,
    read_records,
    recording_files,
)
from sluice.recording.writer import RecorderConfig
from tests.fuzz import fuzz_pulsar_proxy as proxy_harness
from tests.fuzz.common import CORPUS, HARNESSES
from tests.helpers.cursus_broker import open_cluster
from tests.helpers.support import QUIET
from tests.test_cursus_broker import collect_all, in_thread, produce
from tests.test_cursus_recording import recording_proxy

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "data"
ANALYZE_INPUTS = GOLDEN.parent / "analyze" / "inputs"
T = pb.BaseCommand
# Chunkings each codec stream is seeded with: whole reads with a 4 KiB
# limit, reads of up to 4 KiB, single bytes read step by step.
PULSAR_PLANS = (0x80 | 12, 12, 0x40 | 13)
# Cursus: bit 0 says from the client; bits 1-3 pick the compression
# (0: none, 1: gzip); the same chunkings.
CURSUS_PLANS = (12, 0x40 | 26)
ANSWERS = frozenset(
    {
        T.LOOKUP_RESPONSE,
        T.PARTITIONED_METADATA_RESPONSE,
        T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
        T.GET_SCHEMA_RESPONSE,
        T.ERROR,
    }
)


@dataclass
class Session:
    """One recorded connection: its frames in order, either way."""

    kind: str
    frames: list[tuple[bool, bytes]] = field(default_factory=list)  # (from client, raw)

    def stream(self, from_client: bool) -> bytes:
        return b"".join(raw for side, raw in self.frames if side == from_client)


def recorded(directory: Path) -> list[Session]:
    """Every connection of a recording, its frames as recorded."""
    sessions: dict[int, Session] = {}
    for path in recording_files(directory):
        for record in read_records(path):
            if record["k"] == "conn":
                sessions.setdefault(record["c"], Session(record.get("kind", "")))
            elif record["k"] == "frame" and record["c"] in sessions:
                sessions[record["c"]].frames.append((record["d"] == 0, record["raw"]))
    return [s for s in sessions.values() if s.frames]


async def record_proxy(config: ProxyConfig, session: Any) -> None:
    """Run ``session(address)`` in a thread against a recording proxy."""
    async with trio.open_nursery() as nursery:
        proxy: Proxy = await nursery.start(Proxy(config).run)
        await session(str(proxy.addresses["plain"]))
        proxy.stop()


# --- the recordings ---------------------------------------------------------------


def pulsar_client_session(url: str) -> None:
    client = pulsar.Client(url, logger=QUIET, operation_timeout_seconds=30)
    try:
        topic = "persistent://public/default/fuzz-seed"
        consumer = client.subscribe(topic, "seed", consumer_type=pulsar.ConsumerType.Shared)
        batched = client.create_producer(
            topic, batching_enabled=True, compression_type=pulsar.CompressionType.LZ4
        )
        for i in range(6):
            batched.send_async(f"batched {i} {'x' * 40}".encode(), None, properties={"n": str(i)})
        batched.flush()
        plain = client.create_producer(topic, batching_enabled=False)
        for i in range(4):
            plain.send(f"plain {i}".encode(), partition_key=f"k{i}")
        for _ in range(10):
            message = consumer.receive(timeout_millis=20_000)
            consumer.acknowledge(message)
        for closable in (plain, batched, consumer):
            closable.close()
    finally:
        client.close()


def record_pulsar(directory: Path) -> list[Session]:
    with EmbeddedBroker() as broker:
        config = ProxyConfig(
            broker=parse_broker_url(broker.url),
            listen=Address("127.0.0.1", 0),
            record=RecorderConfig(directory, payloads=PayloadPolicy.FULL, flush_interval=0.1),
        )

        async def session(address: str) -> None:
            await trio.to_thread.run_sync(pulsar_client_session, f"pulsar://{address}")

        trio.run(record_proxy, config, session)
    return recorded(directory)


def record_cursus(directory: Path) -> list[Session]:
    async def main() -> None:
        async with open_cluster(1, keepalive=0.3) as cluster:
            config = recording_proxy(cluster.address, directory)
            payloads = [f"seed {i}" for i in range(5)]

            async def session(address: str) -> None:
                assert await in_thread(produce, address, "seed", payloads, 2) == len(payloads)
                mode = ConsumerMode.STREAMING
                await collect_all(address, "seed", "g", mode, payloads, "seeds streamed")

            await record_proxy(config, session)

    trio.run(main)
    return recorded(directory)


# --- seeds per harness ----------------------------------------------------------------


def golden_streams() -> Iterator[bytes]:
    for path in sorted(GOLDEN.glob("*/c*-*.bin")):
        yield path.read_bytes()


def golden_sessions() -> Iterator[Session]:
    """Each golden connection (the client straight to the broker) as a
    proxied connection and as a lookup one: its frames taken in turns."""
    for client in sorted(GOLDEN.glob("*/c*-client.bin")):
        broker = client.with_name(client.name.replace("-client", "-broker"))
        ours = [f.raw for f in decode_stream(client.read_bytes())]
        theirs = [f.raw for f in decode_stream(broker.read_bytes())]
        turns: list[tuple[bool, bytes]] = []
        for i in range(max(len(ours), len(theirs))):
            turns += [(True, raw) for raw in ours[i : i + 1]]
            turns += [(False, raw) for raw in theirs[i : i + 1]]
        for kind in ("proxied", "lookup"):
            yield Session(kind, list(turns))


def pulsar_codec(streams: list[bytes]) -> Iterator[bytes]:
    for stream in streams:
        for plan in PULSAR_PLANS:
            yield bytes([plan]) + stream


def pulsar_payload(streams: list[bytes]) -> Iterator[bytes]:
    for stream in streams:
        for frame in decode_stream(stream):
            meta = frame.metadata
            if meta is None:
                continue
            count = meta.num_messages_in_batch if meta.HasField("num_messages_in_batch") else 0
            head = struct.pack(">BIH", meta.compression, meta.uncompressed_size, count)
            yield head + bytes(frame.payload)


def cursus_codec(sessions: list[Session]) -> Iterator[bytes]:
    for session in sessions:
        client, broker = session.stream(True), session.stream(False)
        for plan in CURSUS_PLANS:
            yield bytes([plan | 1]) + client
            yield bytes([plan]) + broker
        # The same client frames as a broker set to gzip receives them.
        bodies = [frame.body for frame in cursus_stream(client, from_client=True)]
        gzipped = b"".join(cursus_frame(compress(b, Compression.GZIP)) for b in bodies)
        yield bytes([1 | 1 << 1]) + gzipped


def proxied_connect(raw: bytes, to_broker: bool) -> bytes:
    """The recorded CONNECT with the harness's client token (the recording
    holds none), naming the broker the harness fronts when it named one."""
    (frame,) = decode_stream(raw)
    return proxy_harness.client_connect(frame.body, proxied=to_broker)


def upstream_answer(frame: Frame) -> bytes:
    """What the upstream would have answered, without the length prefix:
    a lookup names the broker the harness fronts."""
    body: Any = frame.body
    if frame.type == T.LOOKUP_RESPONSE:
        body.brokerServiceUrl = proxy_harness.BROKER_URL
        body.ClearField("brokerServiceUrlTls")
        body.proxy_through_service_url = False
    return encode(command(frame.type, body))[4:]


def pulsar_proxy(sessions: list[Session]) -> Iterator[bytes]:
    h = proxy_harness
    for session in sessions:
        ops: list[tuple[int, bytes]] = []
        proxied = session.kind == "proxied"
        for index, (from_client, raw) in enumerate(session.frames):
            if index == 0:
                ops.append((h.CLIENT, proxied_connect(raw, proxied)))
            elif proxied:
                ops.append((h.CLIENT if from_client else h.BROKER, raw))
            elif from_client:
                ops.append((h.CLIENT, raw))
            else:
                (frame,) = decode_stream(raw)
                if frame.type in ANSWERS:
                    ops.append((h.ANSWER, upstream_answer(frame)))
        ops += [(h.TICK, b"\x00\x00\x00\x0f"), (h.DRAIN, b"")]
        ops.append((h.CLIENT_EOF, b""))
        yield h.script(0, ops)
        yield h.script(h.FORWARD_AUTH_DATA | h.SMALL_MESSAGES, ops)


def proxy_header() -> Iterator[bytes]:
    """PROXY headers as balancers write them (v1 both families and
    UNKNOWN, v2 PROXY and LOCAL, with TLVs), each followed by what comes
    next on the connection, read in two cuttings."""
    inet = bytes([198, 51, 100, 7, 127, 0, 0, 1]) + struct.pack("!HH", 40000, 6650)
    six = bytes(15) + b"\x01"
    v2 = V2_SIGNATURE + b"\x21\x11" + struct.pack("!H", len(inet) + 14) + inet
    headers = [
        b"PROXY TCP4 198.51.100.7 127.0.0.1 40000 6650\r\n",
        b"PROXY TCP6 2001:db8::7 ::1 40000 6650\r\n",
        b"PROXY UNKNOWN\r\n",
        v2 + b"\xea\x00\x0b\x01vpce-12345",
        V2_SIGNATURE + b"\x21\x21\x00\x24" + six + six + b"\x9c\x40\x19\xfa",
        V2_SIGNATURE + b"\x20\x00\x00\x00",
        v2_header(Address("198.51.100.7", 40000), Address("::1", 6651)),
    ]
    for header in headers:
        for plan in (0, 7):
            yield bytes([plan]) + header + b"\x00\x00\x00\x10 a Pulsar frame"


# Recording segments larger than this are left out of the seeds (libFuzzer
# mutates small inputs better; the recorded sessions' first segments are).
MAX_SEGMENT = 16 * 1024


def recording(directories: list[Path]) -> Iterator[bytes]:
    """Recording segments as they are on disk: the golden captures of
    ``sluice analyze`` (payloads hashed), the sessions recorded here
    (Pulsar and Cursus, payloads kept), and each of those cut to its first
    records (a segment another one follows), so that replay and serve load
    them; one frame of each kept with its summary left out (older files:
    the reader works it out)."""
    files = sorted(ANALYZE_INPUTS.glob("*.sluice"))
    for directory in directories:
        files += recording_files(directory)
    for path in files:
        data = path.read_bytes()
        if len(data) <= MAX_SEGMENT:
            yield data
        try:
            records = list(read_records(path))
        except RecordingError:
            continue  # (garbage.sluice: kept whole above)
        for count in (4, 12):
            yield dumps(records[:count])
        frames = [r for r in records if r["k"] == "frame" and r.get("raw")]
        if frames:
            bare = {k: v for k, v in frames[0].items() if k != "s"}
            yield dumps([*records[:4], bare])
            yield dumps([*records[:12], *besides_frames(frames[-1])])


def besides_frames(frame: dict[str, Any]) -> list[dict[str, Any]]:
    """One record of each kind besides frames that a recording holds
    (docs/recording-format.md), on ``frame``'s connection, after it: what
    fault rules, message filters, the flight recorder and the HTTP listener
    write, which the sessions recorded here do not make."""
    c, t, w = frame["c"], frame["t"] + 1000, frame["w"] + 1000
    on = {"c": c, "d": 0, "t": t, "w": w}
    web = {"t": t, "w": w}
    body = {"h": [["content-type", "application/json"]], "n": 2, "raw": b"{}"}
    return [
        {"k": "fault", **on, "rule": "r1", "action": "drop", "cmd": "SEND", "topic": "t"},
        {"k": "filter", **on, "filter": "mask", "action": "replaced", "n": 1, "reason": "pii",
         "sent": {"n": len(frame["raw"]), "raw": frame["raw"]}},
        {"k": "gap", **web, "dropped": 3},
        {"k": "trigger", "c": c, **web, "rule": "errors", "on": "error"},
        {"k": "snapshot", **web, "ring": 0, "seconds": 60.0, "reason": "errors"},
        {"k": "http", "h": 1, "x": 1, **web, "te": t + 5000, "status": 200,
         "client": "127.0.0.1:5", "method": "GET", "path": "/admin/v2/persistent/t/n/topic",
         "kind": "admin", "req": {"h": [], "n": 0}, "res": body},
        {"k": "ws", "h": 2, "d": 1, **web, "n": 2, "op": "text", "raw": b"{}"},
        {"k": "ws_end", "h": 2, **web, "reason": "closed"},
        {"k": "close", "c": c, **web, "reason": "client"},
    ]  # fmt: skip


def write(out: Path, name: str, seeds: Iterator[bytes]) -> tuple[int, int]:
    directory = out / name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    files = size = 0
    for seed in seeds:
        path = directory / hashlib.sha1(seed).hexdigest()
        if not path.exists():
            path.write_bytes(seed)
            files += 1
            size += len(seed)
    return files, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=CORPUS, help=f"(default: {CORPUS})")
    parser.add_argument("--only", choices=HARNESSES, action="append",
                        help="write these harnesses' seeds only (default: all)")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-corpus-") as scratch:
        recorded_in = [Path(scratch) / "pulsar", Path(scratch) / "cursus"]
        pulsar_sessions = record_pulsar(recorded_in[0])
        cursus_sessions = record_cursus(recorded_in[1])
        segments = list(recording(recorded_in))
    kinds = sorted({s.kind for s in pulsar_sessions})
    assert {"lookup", "proxied"} <= set(kinds), f"the Pulsar session recorded {kinds}"
    streams = list(golden_streams())
    streams += [s.stream(side) for s in pulsar_sessions for side in (True, False)]
    seeds = {
        "pulsar_codec": pulsar_codec(streams),
        "pulsar_payload": pulsar_payload(streams),
        "cursus_codec": cursus_codec(cursus_sessions),
        "pulsar_proxy": pulsar_proxy([*pulsar_sessions, *golden_sessions()]),
        "proxy_header": proxy_header(),
        "recording": iter(segments),
    }
    assert set(seeds) == set(HARNESSES)
    total = 0
    for name, made in seeds.items():
        if args.only and name not in args.only:
            continue
        files, size = write(args.out, name, made)
        total += size
        print(f"{name}: {files} seeds, {size:,} bytes")
    print(f"total: {total:,} bytes in {args.out}")


if __name__ == "__main__":
    main()
