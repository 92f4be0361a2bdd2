"""Disk trouble under a recording proxy: the recording directory fills up
(a 2 MiB tmpfs) or stops being a directory mid-run. Traffic goes on, the
failure is counted and logged once per episode, and recording resumes when
the disk is usable again."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pulsar

from sluice.brokers.embedded import EmbeddedBroker
from sluice.recording.format import ReadResult, read_records, recording_files
from tests.helpers.reliability import (
    AdminProxy,
    Produced,
    body,
    pulsar_client,
    run_sluice,
    start_admin_proxy,
    wait_until,
)

FAILED = "recording failed"


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A small tmpfs at ``path`` (needs root, as CI has)."""
    assert os.geteuid() == 0, "this test mounts a tmpfs: run it as root (CI does)"
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> None:
    """Write ``path`` until the file system is full."""
    with contextlib.suppress(OSError), open(path, "wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 4096)


@dataclass
class Traffic:
    """A producer sending 1 KiB messages through the proxy until stopped."""

    url: str
    topic: str
    produced: Produced = field(default_factory=Produced)
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)

    def run(self) -> None:
        try:
            with pulsar_client(self.url) as c:
                producer = c.create_producer(
                    self.topic, batching_enabled=False, send_timeout_millis=30_000
                )
                while not self.stop.is_set():
                    content = body("disk", self.sent)
                    producer.send_async(content, self.produced.callback(content))
                    self.sent += 1
                    time.sleep(0.004)
                producer.flush()
                for _ in range(self.sent):
                    assert self.produced.done.acquire(timeout=60)
        except BaseException as exc:  # reported by the test
            self.error.append(exc)


@dataclass
class DiskOutcome:
    sent: int
    acked: int
    failed: int
    dropped: float  # sluice_recorder_dropped_frames
    failure_lines: int  # "recording failed" log lines
    episodes: int
    resumed_frames: float  # frames written after the last episode ended
    gaps: int  # gap records in the recording
    log: str
    inspect: str = ""
    acked_messages: set[bytes] = field(default_factory=set)


def recorded_frames(proxy: AdminProxy) -> float:
    return proxy.metric("sluice_recorder_frames_total") or proxy.metric("sluice_recorder_frames")


def dropped_frames(proxy: AdminProxy) -> float:
    return proxy.metric("sluice_recorder_dropped_frames_total") or proxy.metric(
        "sluice_recorder_dropped_frames"
    )


def disk_trouble(
    broker: EmbeddedBroker, tmp_path: Path, topic: str, *, episode_seconds: float
) -> DiskOutcome:
    with tmpfs(tmp_path / "disk", "2m") as disk:
        directory = disk / "capture"
        proxy = start_admin_proxy(
            broker.url,
            tmp_path,
            "--record",
            str(directory),
            "--record-payloads",
            "full",
            "--record-max-bytes",
            str(256 * 1024),  # rotate often: new segments meet the trouble too
        )
        traffic = Traffic(proxy.url, topic)
        thread = threading.Thread(target=traffic.run, daemon=True)
        try:
            thread.start()
            wait_until(lambda: recorded_frames(proxy) > 100, 20, "recording to start")
            # Episode 1: the disk fills up.
            filler = disk / "filler"
            fill(filler)
            wait_until(lambda: dropped_frames(proxy) > 50, 20, "frames to be dropped")
            time.sleep(episode_seconds)
            filler.unlink()
            wait_until(lambda: proxy.proxy.log().count("recording resumed") >= 1, 20, "resume 1")
            # Episode 2: the directory is replaced by a file (no new segments).
            written = recorded_frames(proxy)
            wait_until(lambda: recorded_frames(proxy) > written + 100, 20, "writing again")
            dropped = dropped_frames(proxy)
            aside = disk / "aside"
            directory.rename(aside)
            directory.write_text("not a directory")
            wait_until(lambda: dropped_frames(proxy) > dropped + 50, 30, "frames to be dropped")
            time.sleep(episode_seconds)
            directory.unlink()
            aside.rename(directory)
            wait_until(lambda: proxy.proxy.log().count("recording resumed") >= 2, 20, "resume 2")
            resumed_at = recorded_frames(proxy)
            wait_until(lambda: recorded_frames(proxy) > resumed_at + 100, 20, "writing again")
            traffic.stop.set()
            thread.join(90)
            assert not thread.is_alive() and not traffic.error, traffic.error
            assert proxy.proxy.terminate() == 0
            log = proxy.proxy.log()
            gaps = 0
            for path in recording_files(directory):
                if path.stat().st_size:
                    result = ReadResult(path)
                    gaps += sum(r["k"] == "gap" for r in read_records(path, result))
            shown = run_sluice("inspect", str(directory), "--summary")
            assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
            return DiskOutcome(
                sent=traffic.sent,
                acked=len(set(traffic.produced.acked)),
                failed=len(traffic.produced.failed),
                dropped=dropped_frames(proxy) if proxy.proxy.process.poll() is None else dropped,
                failure_lines=log.count(FAILED),
                episodes=2,
                resumed_frames=resumed_at,
                gaps=gaps,
                log=log,
                inspect=shown.stdout,
                acked_messages=set(traffic.produced.acked),
            )
        finally:
            traffic.stop.set()
            thread.join(30)
            proxy.kill()
            shutil.rmtree(disk / "aside", ignore_errors=True)


def test_full_or_unusable_disk_does_not_stop_traffic(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    outcome = disk_trouble(broker, tmp_path, topic, episode_seconds=3.0)
    assert outcome.failed == 0 and outcome.acked == outcome.sent, outcome  # traffic went on
    assert outcome.failure_lines == outcome.episodes, outcome.log[-4000:]  # once per episode
    assert outcome.log.count("recording resumed") == outcome.episodes, outcome.log[-4000:]
    assert outcome.gaps >= outcome.episodes  # the recording says where frames are missing
    assert "NOT RECORDED" in outcome.inspect, outcome.inspect
    assert "Traceback" not in outcome.log, outcome.log[-4000:]


def test_consumers_are_not_slowed_by_a_full_disk(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    """With the disk full from the start, messages still flow both ways."""
    with tmpfs(tmp_path / "disk", "64k") as disk:
        filler = disk / "filler"
        fill(filler)
        proxy = start_admin_proxy(broker.url, tmp_path, "--record", str(disk / "capture"))
        try:
            with pulsar_client(proxy.url) as c:
                consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
                producer = c.create_producer(topic, batching_enabled=False)
                sent = {body("full", i) for i in range(200)}
                for m in sorted(sent):
                    producer.send(m)
                seen: set[bytes] = set()
                while seen != sent:
                    msg = consumer.receive(timeout_millis=10_000)
                    consumer.acknowledge(msg)
                    seen.add(msg.data())
            wait_until(lambda: dropped_frames(proxy) > 0, 10, "drops to be counted")
            assert proxy.proxy.log().count(FAILED) == 1, proxy.proxy.log()[-3000:]
        finally:
            proxy.kill()
