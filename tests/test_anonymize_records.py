"""``sluice record anonymize`` on records and captures built here, without
a broker or a proxy: what a capture names outside its frames (directory
and file names, web API paths) and what it cannot parse."""

from __future__ import annotations

from pathlib import Path

from sluice.recording import format as fmt
from sluice.recording.anonymize import Options, anonymize
from sluice.recording.format import PayloadPolicy, read_records, recording_files

KEY = b"k" * 32


def capture_file(path: Path, *records: fmt.Record) -> Path:
    """A recording of ``records`` after a header, at ``path``."""
    head = fmt.header(capture="0123456789ab", segment=1, started_ns=1,
                      payloads=PayloadPolicy.HASH, sluice_version="0")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(fmt.dumps([head, *records]))
    return path


def test_directory_and_file_names_carry_no_reason_or_name(tmp_path: Path) -> None:
    """A snapshot's directory names its reason (``snapshot-<time>-<reason>-<id>``),
    and a capture may sit in directories (or a file) named by its owner: the
    copy's paths keep none of them (the snapshot directory kept its slug, a
    customer's name, and every other name as it was)."""
    source = tmp_path / "in"
    topic = "persistent://initech/payroll/salaries"
    snapshot = {"k": "snapshot", "t": 1, "w": 1, "reason": "initech payroll", "seconds": 3,
                "topic": topic}  # fmt: skip
    stamp = "sluice-20260101T000000-0123456789ab-0001.sluice"
    capture_file(source / "snapshot-20260101T000000-initech-payroll-3fa2c1" / stamp, snapshot)
    capture_file(source / "initech-prod" / "globex-incident.sluice", snapshot)
    anonymize(source, tmp_path / "out", Options(KEY))
    written = sorted(
        str(p.relative_to(tmp_path / "out")) for p in recording_files(tmp_path / "out")
    )
    assert len(written) == 2, written
    for name in ("initech", "payroll", "globex", "incident", "prod"):
        assert not any(name in p for p in written), (name, written)
    # A snapshot's directory is still one, its time and id kept; Sluice's
    # own file names (a time and a capture id) stay as they were.
    assert any(p.startswith("snapshot-20260101T000000-3fa2c1/") and p.endswith(stamp)
               for p in written), written  # fmt: skip
    for path in recording_files(tmp_path / "out"):
        kinds = [r["k"] for r in read_records(path)]
        assert kinds == ["header", "snapshot"], kinds
