"""A Cursus capture made in front of a broker that compresses (``sluice proxy
--broker-compression``) says so in its header, and is read back with it:
its client frames decode (not INVALID), and serve tells its requests apart.
Recorded with the real client through ``sluice proxy`` in front of the
scripted broker, run as ``python -m tests.helpers.cursus_broker``."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import trio
from cursus import Producer, ProducerConfig

from sluice.addresses import Address
from sluice.protocols import registry
from sluice.protocols.cursus.commands import Create, List
from sluice.protocols.cursus.compression import Compression
from sluice.protocols.cursus.decoder import decode_frame
from sluice.protocols.cursus.encoder import encode_request
from sluice.recording.format import read_records, recording_files
from sluice.recording.reader import load
from sluice.replay.cursus import CursusStub, normalise
from sluice.view.index import Index
from tests.helpers.support import start_proxy
from tests.test_cursus_broker import Wire

LIMIT = 60


def _create(address: str, kind: Compression) -> str:
    async def main() -> str:
        with trio.fail_after(20):
            wire = await Wire.open(address)
            text = await wire.text(Create(topic="z", partitions=1), compression=kind)
            await wire.aclose()
            return text

    return trio.run(main)


def record(tmp_path: Path, kind: Compression) -> Path:
    """A topic created, then 3 messages produced by the real client
    (compressing as the broker wants), through a recording proxy."""
    broker = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.cursus_broker", "--port", "0",
         "--compression", kind.value],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    watchdog = threading.Timer(LIMIT, broker.kill)  # a broker that never prints is killed
    watchdog.start()
    try:
        assert broker.stdout is not None
        address = broker.stdout.readline().split(": ", 1)[1].strip()
        options = ("--broker-compression", kind.value, "--record", str(tmp_path / "rec"),
                   "--record-payloads", "full")  # fmt: skip
        proxy = start_proxy(f"cursus://{address}", tmp_path, *options)
        try:
            at = f"127.0.0.1:{proxy.port}"
            assert _create(at, kind).startswith("OK topic=z")
            producer = Producer(
                ProducerConfig(topic="z", brokers=[at], partitions=1, linger_ms=5,
                               flush_timeout_ms=10_000, compression_type=kind.value)
            )  # fmt: skip
            try:
                for i in range(3):
                    producer.send(f"m{i}")
                producer.flush()
                assert producer.unique_ack_count == 3
            finally:
                producer.close()
            assert proxy.terminate() == 0, proxy.log()
        finally:
            proxy.kill()
    finally:
        watchdog.cancel()
        broker.kill()
        broker.wait(10)
    return tmp_path / "rec"


@pytest.mark.e2e
@pytest.mark.parametrize("kind", [Compression.GZIP])  # (the client compresses gzip only)
def test_a_capture_of_a_compressing_broker_is_read_with_its_compression(
    kind: Compression, tmp_path: Path
) -> None:
    rec = record(tmp_path, kind)
    headers = [next(read_records(path)) for path in recording_files(rec)]
    assert headers and all(h["decoding"] == {"compression": kind.value} for h in headers)
    # The registry's hook decodes with what the header says.
    decode = registry.get("cursus").decode_with(headers[0]["decoding"])
    client = [r for path in recording_files(rec) for r in read_records(path)
              if r["k"] == "frame" and r["d"] == 0]  # fmt: skip
    # (The real client compresses its batches, not its commands: a gzip
    # broker refuses those, and so did the proxy when recorded.)
    assert {r["s"]["cmd"] for r in client} >= {"CREATE", "BATCH"}
    assert [decode(r["raw"], True).name for r in client] == [r["s"]["cmd"] for r in client]
    # Read without it, every frame the broker took reads INVALID.
    took = [r["raw"] for r in client if r["s"]["cmd"] != "INVALID"]
    assert all(decode_frame(raw, from_client=True).name == "INVALID" for raw in took)
    # Replay and serve read it so: frames as the proxy read them, requests
    # told apart.
    recording = load(rec)
    sent = [rf for c in recording.connections for rf in c.frames if rf.from_client]
    assert [rf.frame.name for rf in sent] == [rf.summary["cmd"] for rf in sent]
    stub = CursusStub(recording, Address("127.0.0.1", 9))
    keys = {normalise(rf.frame) for rf in sent if rf.summary["cmd"] != "INVALID"}
    assert keys and not any(key.startswith("INVALID") for key in keys), keys
    assert keys <= set(stub.answers)
    # sluice view's frame detail decodes them as the proxy did, too.
    index = Index(rec)
    index.build()
    rows = [index.row(i) for i in range(index.frames)]
    took = [row for row in rows if row["dir"] == "C→B" and row["cmd"] != "INVALID"]
    assert {row["cmd"] for row in took} >= {"CREATE", "BATCH"}, rows
    for row in took:
        shown = index.detail(row["i"])["command"]
        assert "invalid" not in shown, shown


def test_a_capture_without_the_field_decodes_as_none() -> None:
    spec = registry.get("cursus")
    plain = encode_request(List())
    assert spec.decode_with(None)(plain, True).error is None
    assert spec.decode_with({})(plain, True).error is None
    assert spec.decode_with({"compression": "none"})(plain, True).error is None
