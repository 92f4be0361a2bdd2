"""``--record-retain-bytes SIZE``: the recording directory never holds more
than SIZE, at any moment, whatever the other recording options.

The real recorder (several of them sharing one directory, as ``--workers``
do) is fed real frames as fast as it takes them, and a thread samples the
directory's size every 2 ms; then the same through ``sluice proxy`` with
the real client at full rate.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulsar
import pytest
import trio

from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.protocols.core import Conn
from sluice.protocols.pulsar import Frame, Type, command, decode_frame, encode_payload, pb
from sluice.recording.format import (
    PayloadPolicy,
    read_records,
    recording_files,
    recordings_below,
)
from sluice.recording.writer import Recorder, RecorderConfig, SnapshotError
from tests.helpers.support import (
    QUIET,
    SLUICE,
    holds_a_client,
    one_client_per_worker,
    start_proxy,
    wait_ready,
    worker_pids,
)
from tests.test_dashboards import scrape, value

KiB, MiB = 1024, 1024 * 1024


class SizeSampler:
    """Samples the recording files' total size every ``every`` seconds in a
    thread. A sample never exceeds what the directory held at some moment:
    only files listed both before and after their sizes were read count
    (files only grow while they exist, and names are never reused)."""

    def __init__(self, directory: Path, every: float = 0.002) -> None:
        self.directory = directory
        self.every = every
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _listing(self) -> set[Path]:
        return set(recordings_below(self.directory))

    def size(self) -> int:
        before = self._listing()
        sizes: dict[Path, int] = {}
        for path in before:
            try:
                sizes[path] = os.stat(path).st_size
            except FileNotFoundError:  # removed meanwhile
                continue
        after = self._listing()
        return sum(size for path, size in sizes.items() if path in after)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.size())
            time.sleep(self.every)

    @property
    def largest(self) -> int:
        return max(self.samples, default=0)

    def __enter__(self) -> SizeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def send_frame(payload_size: int, sequence: int = 0) -> Frame:
    meta = pb.MessageMetadata(producer_name="bound", sequence_id=sequence, publish_time=1)
    cmd = command(Type.Value("SEND"), pb.CommandSend(producer_id=1, sequence_id=sequence))
    frame = decode_frame(encode_payload(cmd, meta, os.urandom(payload_size)))
    assert frame.error is None
    return frame


@dataclass
class Case:
    cap: int = 2 * MiB
    max_file: int = 256 * MiB  # --record-max-bytes (its default)
    payloads: PayloadPolicy = PayloadPolicy.FULL
    writers: int = 1  # --workers: recorders sharing the directory
    retain_age: float | None = None
    ring: int | None = None  # --record-ring SIZE: snapshots instead of files
    lossless: bool = False
    payload: int = 10 * KiB  # each SEND's
    big_every: int = 0  # every Nth read also carries a frame too large for a quantum
    extra: dict[str, Any] = field(default_factory=dict)


NONE, HASH = PayloadPolicy.NONE, PayloadPolicy.HASH
CASES = {
    "files, default max-bytes, full": Case(),
    "files, max-bytes 1/64 of the cap, full": Case(max_file=32 * KiB),
    "files, max-bytes 1/64, none": Case(max_file=32 * KiB, payloads=NONE, payload=64 * KiB),
    "files, max-bytes 1/64, 3 workers": Case(max_file=32 * KiB, writers=3),
    "2 workers, hash, retain-age": Case(writers=2, payloads=HASH, retain_age=60, payload=KiB),
    "files, max-bytes 1/64, 2 workers, lossless": Case(max_file=32 * KiB, writers=2, lossless=True),
    "files, frames larger than a quantum": Case(cap=512 * KiB, big_every=10),
    "ring, snapshots": Case(ring=MiB),
    "ring, 2 workers, snapshots at once": Case(ring=384 * KiB, writers=2),
}


async def drive(directory: Path, case: Case, seconds: float) -> tuple[list[Recorder], int]:
    """Recorders fed as fast as they take frames for ``seconds`` (and, with
    a ring, snapshotting all the while); how many snapshots were written."""
    # A queue of 8 MiB, not 64: at the end each recorder writes what it holds,
    # a pass every share, which takes long under a small cap.
    config = RecorderConfig(directory, payloads=case.payloads, lossless=case.lossless,
                            max_file_bytes=case.max_file, flush_interval=0.1,
                            queue_bytes=8 * MiB, retain_bytes=case.cap,
                            retain_age=case.retain_age, ring_bytes=case.ring)  # fmt: skip
    recorders = [Recorder(config, writers=case.writers) for _ in range(case.writers)]
    read = [send_frame(case.payload, n) for n in range(8)]
    big = [send_frame(case.cap // 2)]
    conn = Conn(1, "127.0.0.1:1", "plain", "pulsar")
    snapshots = 0

    async def feed(recorder: Recorder, stop: float) -> None:
        reads = 0
        while trio.current_time() < stop:
            if case.lossless:
                await recorder.room()
            reads += 1
            recorder.frames(conn, True, read)
            if case.big_every and reads % case.big_every == 0:
                recorder.frames(conn, True, big)
            await trio.sleep(0)

    async def snapshot(recorder: Recorder, stop: float) -> None:
        nonlocal snapshots
        while trio.current_time() < stop:
            await trio.sleep(0.05)
            try:
                await recorder.snapshot()
            except SnapshotError:
                continue
            snapshots += 1

    async with trio.open_nursery() as nursery:
        for recorder in recorders:
            await nursery.start(recorder.run)
            recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
        stop = trio.current_time() + seconds
        async with trio.open_nursery() as traffic:
            for recorder in recorders:
                traffic.start_soon(feed, recorder, stop)
                if case.ring is not None:
                    traffic.start_soon(snapshot, recorder, stop)
        await trio.sleep(0.3)  # the last writes
        nursery.cancel_scope.cancel()
    return recorders, snapshots


@pytest.mark.parametrize("name", CASES)
async def test_the_directory_never_holds_more_than_its_cap(
    tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    case = CASES[name]
    directory = tmp_path / "rec"
    with SizeSampler(directory) as sampler:
        recorders, snapshots = await drive(directory, case, seconds=2.0)
    samples = sampler.samples
    written = sum(r.bytes_written for r in recorders)
    removed = sum(r.removed_bytes_total for r in recorders)
    print(f"{name}: largest {sampler.largest} of {case.cap} bytes in {len(samples)} samples; "
          f"{written} written, {removed} removed, {snapshots} snapshots")  # fmt: skip
    assert len(samples) >= 50  # sampled throughout (every 2 ms, less when the GIL is busy)
    over = [s for s in samples if s > case.cap]
    assert not over, f"{len(over)} samples over the cap, the largest {max(over)}"
    assert sampler.size() <= case.cap
    # Not vacuous: the directory filled up and retention made room.
    assert sampler.largest > case.cap // 4
    assert removed > 0 and sum(r.removed_files_total for r in recorders) > 0
    if case.ring is not None:
        assert snapshots >= 2
    if case.big_every:  # too large to fit: not recorded, and said so
        assert sum(r.dropped_total for r in recorders) > 0
        assert "is larger than a writer may write between two passes" in caplog.text
    for path in recording_files(directory):  # what is left reads
        assert next(iter(read_records(path)))["k"] == "header"


@pytest.mark.parametrize(
    ("options", "why"),
    [
        (["--record-ring", "4M", "--record-retain-bytes", "8M", "--workers", "2"],
         "shared by 2 workers"),
        (["--record-retain-bytes", "200K"], "--record-retain-bytes 204800 is too small for 1"),
        (["--record-retain-bytes", "1M", "--workers", "8"], "give at least 2097152"),
    ],
)  # fmt: skip
@pytest.mark.e2e
def test_what_the_bound_cannot_serve_is_refused_at_start(
    tmp_path: Path, options: list[str], why: str
) -> None:
    """A ring that fits the cap once but not once per worker (each worker
    writes its own snapshot), or a cap too small for a file's header and a
    few frames per worker: refused in one line."""
    args = ["proxy", "--broker", "pulsar://127.0.0.1:1", "--no-check-broker", "--record",
            str(tmp_path / "r"), *options]  # fmt: skip
    refused = subprocess.run([*SLUICE, *args], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert why in refused.stderr and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("workers", [1, 2])
def test_through_the_proxy_at_full_rate_with_small_files(
    broker: EmbeddedBroker, tmp_path: Path, topic: str, workers: int
) -> None:
    """As a user would: --record-max-bytes well under a quarter of the cap,
    payloads kept, producers sending as fast as they can."""
    cap = 4 * MiB
    record, admin = tmp_path / "rec", free_port()
    proxy = start_proxy(broker.url, tmp_path, "--record", str(record), "--record-payloads",
                        "full", "--record-retain-bytes", str(cap), "--record-max-bytes",
                        str(64 * KiB), "--admin", f"127.0.0.1:{admin}", "--workers",
                        str(workers))  # fmt: skip
    clients: list[pulsar.Client] = []
    try:
        wait_ready(admin)
        pids = worker_pids(proxy, workers) if workers > 1 else {}

        def connect() -> None:
            clients.append(pulsar.Client(proxy.url, operation_timeout_seconds=30, logger=QUIET))
            clients[-1].create_producer(topic).flush()

        one_client_per_worker(pids, connect)
        while len(clients) < 2:
            connect()
        assert all(holds_a_client(p, proxy.port) for p in pids.values())
        producers = [c.create_producer(topic, batching_enabled=False, block_if_queue_full=True,
                                       max_pending_messages=500) for c in clients]  # fmt: skip
        payload = os.urandom(20 * KiB)
        with SizeSampler(record) as sampler:
            stop = time.monotonic() + 4
            while time.monotonic() < stop:
                for producer in producers:
                    producer.send_async(payload, None)
            for producer in producers:
                producer.flush()
        while clients:
            clients.pop().close()
        samples = scrape(proxy, admin)
        assert proxy.terminate() == 0
    finally:
        for c in clients:
            c.close()
        proxy.kill()
    print(f"largest {sampler.largest} of {cap} bytes in {len(sampler.samples)} samples")
    assert len(sampler.samples) >= 100
    assert sampler.largest <= cap
    assert sampler.largest > cap // 2
    assert value(samples, "sluice_recorder_removed_files_total") > 0
