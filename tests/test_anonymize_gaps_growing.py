"""``sluice record anonymize`` of a capture still being written: the file is
read twice (to learn every name, then to write), and what was appended
between the two reads must not reach the copy with names never learned."""

from __future__ import annotations

from pathlib import Path

from sluice.recording import format as fmt
from sluice.recording.anonymize import Options, anonymize
from sluice.recording.format import read_records, recording_files
from tests.test_anonymize_records import KEY, capture_file


def fault(rule: str, topic: str | None = None) -> fmt.Record:
    record: fmt.Record = {"k": "fault", "c": 1, "d": 0, "t": 1, "w": 1, "rule": rule,
                          "action": "delay", "cmd": "SEND"}  # fmt: skip
    if topic is not None:
        record["topic"] = topic
    return record


def test_records_appended_between_the_two_reads_are_left_out_and_said(tmp_path: Path) -> None:
    """A live capture grew between the reads: the second read wrote what the
    first had not learned from (free text naming a topic only a later record
    names went into the copy as written)."""
    first = fault("delay the known ones", topic="persistent://known/ns/t")
    source = capture_file(tmp_path / "initech-incident.sluice", first)
    appended = (
        fault("hold acme-salaries-eu"),
        fault("x", topic="persistent://acme-salaries-eu/ns/t"),
    )
    grown = False

    def progress(line: str) -> None:
        nonlocal grown
        if line.startswith("writing") and not grown:  # the recorder writes on meanwhile
            with open(source, "ab") as handle:
                for record in appended:
                    handle.write(fmt.pack(record))
            grown = True

    report, _ = anonymize(source, tmp_path / "out", Options(KEY), progress=progress)
    assert grown
    (copy,) = recording_files(tmp_path / "out")
    data = copy.read_bytes()
    assert b"acme" not in data and b"salaries" not in data
    kinds = [r["k"] for r in read_records(copy)]
    assert kinds == ["header", "fault"], kinds  # what the first read saw, all of it
    size = sum(len(fmt.pack(r)) for r in appended)
    (said,) = report.truncated
    assert said.startswith(copy.name) and f"{size} bytes" in said and "initech" not in said, said


def test_an_unfinished_record_finished_between_the_reads_is_left_out(tmp_path: Path) -> None:
    """The first read ended inside a record (the writer mid-way); by the
    second it was whole, and written without its names learned."""
    tail = fmt.pack(fault("hold acme-salaries-eu", topic="persistent://acme-salaries-eu/ns/t"))
    source = capture_file(tmp_path / "live.sluice", fault("known"))
    with open(source, "ab") as handle:
        handle.write(tail[:5])

    def progress(line: str) -> None:
        if line.startswith("writing"):
            with open(source, "ab") as handle:
                handle.write(tail[5:])

    report, _ = anonymize(source, tmp_path / "out", Options(KEY), progress=progress)
    (copy,) = recording_files(tmp_path / "out")
    assert b"acme" not in copy.read_bytes()
    assert [r["k"] for r in read_records(copy)] == ["header", "fault"]
    (said,) = report.truncated
    assert f"{len(tail)} bytes" in said, said


def test_a_file_that_did_not_change_is_copied_whole(tmp_path: Path) -> None:
    source = capture_file(tmp_path / "done.sluice", fault("a"), fault("b"))
    report, _ = anonymize(source, tmp_path / "out", Options(KEY))
    (copy,) = recording_files(tmp_path / "out")
    assert [r["k"] for r in read_records(copy)] == ["header", "fault", "fault"]
    assert report.truncated == []
