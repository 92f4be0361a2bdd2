"""A capture directory of several files none of which holds a whole record
(every writer stopped before, or during, its first flush) holds no
recording: refused by every reader in one line, exit 2, as a lone such file
is, not read as a capture of 0 frames."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sluice.recording.format import RecordingError
from sluice.recording.reader import load
from sluice.view.index import Index
from tests.helpers.cli import run_main
from tests.helpers.support import SLUICE

INPUTS = Path(__file__).parent / "golden" / "analyze" / "inputs"
CAPTURE = INPUTS / "sluice-20261128T172608-f2b453b65503-0001.sluice"

COMMANDS = {
    "inspect": ["inspect", "{target}"],
    "inspect --summary": ["inspect", "{target}", "--summary"],
    "inspect --json": ["inspect", "{target}", "--json"],
    "inspect --pcap": ["inspect", "{target}", "--pcap", "{out}/x.pcapng"],
    "view --export": ["view", "{target}", "--export", "{out}/x.html"],
    "replay": ["replay", "{target}", "--broker", "pulsar://127.0.0.1:1"],
    "serve": ["serve", "{target}", "--listen", "127.0.0.1:0"],
}


@pytest.fixture
def empties(tmp_path: Path) -> Path:
    """A directory of three empty segments (one in a snapshot directory)."""
    capture = tmp_path / "rec"
    (capture / "snapshot-20260101T000000-1234").mkdir(parents=True)
    segment = "sluice-20260101T000000-0123456789ab-000{}.sluice"
    for name in (
        segment.format(1),
        segment.format(2),
        f"snapshot-20260101T000000-1234/{segment.format(1)}",
    ):
        (capture / name).write_bytes(b"")
    return capture


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_directory_of_empty_files_only_is_refused_in_one_line(
    empties: Path, tmp_path: Path, name: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    code, stdout, stderr = run_main([a.format(target=empties, out=out) for a in COMMANDS[name]])
    command = COMMANDS[name][0]
    assert code == 2, (stdout, stderr)
    assert stderr.splitlines()[-1] == (
        f"sluice {command}: {empties}: all 3 files are empty, not a Sluice recording"
    )
    assert "0 frames" not in stdout + stderr
    assert list(out.iterdir()) == []


def test_the_readers_say_it_too(empties: Path) -> None:
    with pytest.raises(RecordingError) as raised:
        load(empties, need_payloads=False)
    assert str(raised.value) == f"{empties}: all 3 files are empty, not a Sluice recording"
    index = Index(empties)
    index.build()
    assert index.error == f"{empties}: all 3 files are empty, not a Sluice recording"


def test_empty_and_cut_files_only_are_refused_naming_each_kind(empties: Path) -> None:
    (empties / "sluice-20260101T000000-0123456789ab-0003.sluice").write_bytes(
        CAPTURE.read_bytes()[:30]
    )
    expected = (
        f"{empties}: none of its 4 files holds a whole record (3 empty, 1 cut inside its "
        "header), not a Sluice recording"
    )
    code, _, stderr = run_main(["inspect", str(empties)])
    assert code == 2 and stderr.splitlines() == [f"sluice inspect: {expected}"]
    with pytest.raises(RecordingError) as raised:
        load(empties, need_payloads=False)
    assert str(raised.value) == expected
    index = Index(empties)
    index.build()
    assert index.error == expected


def test_one_readable_segment_among_empty_ones_is_read(empties: Path) -> None:
    (empties / CAPTURE.name).write_bytes(CAPTURE.read_bytes())
    code, stdout, stderr = run_main(["inspect", str(empties), "--summary"])
    assert code == 0, stderr
    assert "in 4 file(s)" in stdout and stdout.count("empty, an incomplete record") == 3
    assert load(empties, need_payloads=False).frames > 0


@pytest.mark.e2e
def test_view_refuses_a_directory_of_empty_files_before_serving(empties: Path) -> None:
    # A view that served would never end; a busy host may take seconds to
    # start Python and import Sluice.
    result = subprocess.run([*SLUICE, "view", str(empties), "--listen", "127.0.0.1:0"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"sluice view: {empties}: all 3 files are empty, not a Sluice recording"
    )
    assert "http://" not in result.stdout
