"""Replay of a recording that is incomplete: frames the recorder dropped
(``gap`` records) and connections recorded from mid-stream (a segment whose
predecessors are gone) are said, and the differences they explain are not
counted as divergence."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from sluice.recording import format as fmt
from sluice.recording.format import read_records, recording_files
from sluice.recording.reader import load
from tests.helpers.support import SLUICE, recorded_session, start_proxy
from tests.test_replay import session

pytestmark = pytest.mark.e2e  # every test here starts a broker


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recorded_session(tmp_path_factory.mktemp("incomplete"), session)


def replay(recording: Path, transcript: Path) -> subprocess.CompletedProcess[str]:
    with EmbeddedBroker() as fresh:
        return subprocess.run(
            [*SLUICE, "replay", str(recording), "--broker", fresh.url, "--timeout", "3",
             "--transcript", str(transcript)],
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip


def test_frames_the_recorder_dropped_are_said_not_counted_as_divergence(
    recording: Path, tmp_path: Path
) -> None:
    """Three SENDs of the recording are replaced by the gap record the
    recorder writes when it drops frames: their receipts, and the messages
    the consumer got from them, do not come live."""
    out = tmp_path / "gapped"
    out.mkdir()
    sends = 0
    for path in recording_files(recording):
        records: list[dict[str, Any]] = []
        for r in read_records(path):
            if r["k"] == "frame" and r["d"] == 0 and r["s"]["cmd"] == "SEND":
                sends += 1
                if sends == 3:
                    records.append({"k": "gap", "t": r["t"], "w": r["w"], "dropped": 3})
                if 3 <= sends <= 5:
                    continue
            records.append(r)
        (out / path.name).write_bytes(fmt.dumps(records))
    assert sends > 5
    transcript = tmp_path / "transcript.txt"
    result = replay(out, transcript)
    report = result.stdout
    assert result.returncode == 0, report + result.stderr
    assert "note: the recording is incomplete: 3 frames were not recorded" in report, report
    assert "EXPECTED" in report and "MISSING" in report  # the receipts that did not come
    assert "equivalent where the recording is complete" in report, report
    assert " 0 diverged, 0 missing, 0 unexpected" in report, report
    assert "~~~ GAP 3 frames not recorded here" in transcript.read_text()


def test_connections_recorded_from_mid_stream_are_said(broker: EmbeddedBroker,
                                                       tmp_path: Path) -> None:  # fmt: skip
    """Small segments, the first gone (as --record-retain-bytes removes the
    oldest): the connections it opened are restated by the next one and
    replayed from there, without their CONNECT."""
    directory = tmp_path / "rec"
    proxy = start_proxy(broker.url, tmp_path, "--record", str(directory),
                        "--record-payloads", "full", "--record-max-bytes", "4096")  # fmt: skip
    try:
        session(proxy.url)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    first, *rest = recording_files(directory)
    assert len(rest) >= 2
    first.unlink()
    transcript = tmp_path / "transcript.txt"
    result = replay(directory, transcript)
    report = result.stdout
    assert result.returncode == 0, report + result.stderr
    late = [conn.name for conn in load(directory).connections if conn.late]
    assert late and f"{', '.join(late)} recorded from mid-stream" in report, report
    assert "EXPECTED" in report, report
    assert "RECORDED FROM MID-STREAM" in transcript.read_text()
