"""`kill -9` of `sluice proxy --record DIR` under load: inspect, replay and
analyze read everything up to the last flush and report the torn tail as
one counted item, never a traceback."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sluice.analyze.standalone import loopback_env
from sluice.brokers.embedded import EmbeddedBroker
from sluice.recording.format import ReadResult, read_records, recording_files
from tests.helpers.reliability import Produced, body, pulsar_client, run_sluice
from tests.helpers.support import SLUICE, start_proxy

FLUSH_INTERVAL = 1.0  # the default of --record-flush-interval


@dataclass
class KillOutcome:
    directory: Path
    acked_before_cut: int  # receipts the client had one flush interval (+ slack) before the kill
    recorded_sends: set[int]  # sequence ids of SEND frames in the recording
    files: int
    torn_bytes: int  # incomplete record at the end, as the kill left it
    seconds: float


def record_and_kill(
    broker: EmbeddedBroker,
    tmp_path: Path,
    topic: str,
    *,
    seconds: float,
    rate: float = 200,
    extra: tuple[str, ...] = (),
) -> KillOutcome:
    """Produce through a recording proxy for ``seconds``, then SIGKILL it.

    Producer only: what is checked is where the recording stops, and the
    receipts say how far the SENDs had gone."""
    directory = tmp_path / "capture"
    proxy = start_proxy(
        broker.url, tmp_path, "--record", str(directory), "--record-payloads", "full", *extra
    )
    produced = Produced()
    marks: list[tuple[float, int]] = []  # (time, receipts so far)
    try:
        with pulsar_client(proxy.url, cut=True, operation_timeout_seconds=5) as c:
            producer = c.create_producer(
                topic, batching_enabled=False, send_timeout_millis=5000, max_pending_messages=100
            )
            started = time.monotonic()
            i = 0
            while time.monotonic() - started < seconds:
                content = body("kill", i)
                producer.send_async(content, produced.callback(content))
                i += 1
                if i % 10 == 0:
                    marks.append((time.monotonic(), len(produced.acked)))
                time.sleep(1 / rate)
            killed_at = time.monotonic()
            proxy.process.send_signal(signal.SIGKILL)
            proxy.process.wait()
    finally:
        proxy.kill()
    # Receipts the client had this long before the kill: their SENDs went
    # through the proxy before its last flush.
    cut = killed_at - FLUSH_INTERVAL - 0.5
    acked_before_cut = max((n for t, n in marks if t <= cut), default=0)
    sends: set[int] = set()
    torn = 0
    files = recording_files(directory)
    for path in files:
        result = ReadResult(path)
        if path.stat().st_size:
            for record in read_records(path, result):
                if record["k"] == "frame" and record["s"]["cmd"] == "SEND":
                    sends.add(record["s"]["seq"])
        torn += result.truncated_bytes
    return KillOutcome(directory, acked_before_cut, sends, len(files), torn, seconds)


def tear(directory: Path) -> Path:
    """Make sure the last file ends inside a record, as a kill between two
    writes leaves it (whether this kill did depends on timing)."""
    last = recording_files(directory)[-1]
    while True:
        result = ReadResult(last)
        list(read_records(last, result))
        if result.truncated_bytes:
            return last
        data = last.read_bytes()
        last.write_bytes(data[:-7])


def check_inspect(directory: Path, torn: Path) -> None:
    shown = run_sluice("inspect", str(directory))
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in shown.stdout + shown.stderr
    notes = [line for line in shown.stdout.splitlines() if "incomplete record" in line]
    assert len(notes) == 1 and str(torn) in notes[0], shown.stdout[-2000:]
    as_json = run_sluice("inspect", str(directory), "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert "Traceback" not in as_json.stderr
    assert sum("incomplete last record" in line for line in as_json.stderr.splitlines()) == 1
    for line in as_json.stdout.splitlines():
        json.loads(line)
    pcap = run_sluice("inspect", str(directory), "--pcap", str(directory.parent / "out.pcapng"))
    assert pcap.returncode == 0 and "Traceback" not in pcap.stderr, pcap.stderr


def torn_files(directory: Path) -> set[Path]:
    """Files ending inside a record, or empty, as readers should report them."""
    out = set()
    for path in recording_files(directory):
        result = ReadResult(path)
        if path.stat().st_size:
            list(read_records(path, result))
        if result.truncated_bytes or not path.stat().st_size:
            out.add(path)
    return out


def check_replay(directory: Path, broker: EmbeddedBroker) -> None:
    replayed = run_sluice("replay", str(directory), "--broker", broker.url, "--timeout", "1")
    shown = replayed.stdout + replayed.stderr
    assert replayed.returncode in (0, 1), shown[-3000:]  # equivalent or diverged
    assert "Traceback" not in shown, shown[-3000:]
    notes = [line for line in replayed.stdout.splitlines() if "incomplete record" in line]
    assert len(notes) == len(torn_files(directory)), shown[-3000:]
    for path in torn_files(directory):
        assert any(str(path) in line for line in notes), (path, notes)


def check_analyze(directory: Path, out: Path) -> None:
    result = subprocess.run(
        [*SLUICE, "analyze", str(directory), "--out", str(out), "--master", "local[1]"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=loopback_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "1 truncated" in result.stderr, result.stderr[-2000:]


def test_kill_9_while_recording_loses_only_the_last_flush(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    outcome = record_and_kill(broker, tmp_path, topic, seconds=3.0, extra=())
    assert outcome.acked_before_cut > 50, "too little traffic to tell"
    missing = set(range(outcome.acked_before_cut)) - outcome.recorded_sends
    assert not missing, f"{len(missing)} SENDs from before the last flush are not recorded"
    torn = tear(outcome.directory)
    check_inspect(outcome.directory, torn)
    check_replay(outcome.directory, broker)
    check_analyze(outcome.directory, tmp_path / "analysis")


def test_a_segment_killed_before_its_first_flush_is_one_counted_item(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    """Killed right after opening a segment (rotation), the writer leaves it
    empty, its header still in the file's buffer: readers count it and go on."""
    outcome = record_and_kill(broker, tmp_path, topic, seconds=1.5)
    files = recording_files(outcome.directory)
    capture = files[-1].name.split("-")[2]
    empty = outcome.directory / f"sluice-20990101T000000-{capture}-{len(files) + 1:04d}.sluice"
    empty.write_bytes(b"")
    shown = run_sluice("inspect", str(outcome.directory), "--summary")
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in shown.stdout + shown.stderr
    notes = [line for line in shown.stdout.splitlines() if "incomplete record" in line]
    assert len(notes) == len(torn_files(outcome.directory))
    assert any(str(empty) in line for line in notes), shown.stdout[-2000:]
    check_replay(outcome.directory, broker)
