"""Fuzz harness: a recording file from someone else, through every reader.

Input: the bytes of one recording segment (``.sluice``), written to a file
and read by what a user runs on a capture they were given:

- the segment reader (``format.read_records``, and ``read_records_from``
  over the same bytes, which must agree with it);
- ``sluice inspect`` (``commands.inspect.run``: the timeline with wall
  times, ``--json --with-bytes``, ``--summary``, ``--pcap``, and a
  ``--command`` name that only the capture could know);
- ``sluice record anonymize`` (``recording.anonymize.anonymize``), whose
  copy must read back without a word of damage;
- the loading step of ``sluice replay`` and ``sluice serve``
  (``recording.reader.load``, then what each builds from it before any
  socket: the outcome, what fault rules and filters withheld, the stub
  broker's answers), for the protocol the header names;
- the analyze decoder (``analyze.decode.decode_segment``, no Spark).

Promise checked: each either succeeds or refuses the file with a
``RecordingError`` of one line (what the commands print as
``sluice <command>: <message>``, exit 2); ``inspect`` returns 0 or 2 with
that line. Anything else raised is a finding.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import shutil
import tempfile
from pathlib import Path

from sluice.analyze.decode import decode_segment
from sluice.commands import inspect
from sluice.protocols import registry
from sluice.recording.anonymize import Options, anonymize
from sluice.recording.format import (
    ReadResult,
    Record,
    RecordingError,
    read_records,
    read_records_from,
)
from sluice.recording.reader import load
from sluice.replay import cursus as replay_cursus
from sluice.replay import pulsar as replay_pulsar
from sluice.replay.outcome import Outcome
from tests.fuzz.common import Violation, check

SCRATCH = Path(tempfile.mkdtemp(prefix="sluice-fuzz-recording-"))
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)
NAME = "sluice-20261128T172607-bf2cfe0d70e7-0001.sluice"
KEY = b"k" * 32


def one_line(exc: RecordingError) -> None:
    message = str(exc)
    check(bool(message.strip()), f"a RecordingError without words: {exc!r}")
    check("\n" not in message and "\r" not in message, f"a refusal of several lines: {message!r}")


def reading(path: Path, data: bytes) -> list[Record] | RecordingError:
    """What the segment reader makes of the file: its records, or its refusal;
    the same from the file and from its bytes."""
    found: list[Record] | RecordingError
    try:
        found = list(read_records(path, ReadResult(path)))
    except RecordingError as exc:
        one_line(exc)
        found = exc
    try:
        again = list(read_records_from(data, str(path)))
    except RecordingError as exc:
        one_line(exc)
        check(
            isinstance(found, RecordingError), f"read from bytes refused what the file gave: {exc}"
        )
        check(str(exc) == str(found), f"{exc} from bytes, {found} from the file")
        return exc
    check(isinstance(found, list), "read from bytes gave records the file refused")
    check(again == found, "the bytes read otherwise than the file")
    return again


def inspecting(path: Path, **options: object) -> None:
    args = argparse.Namespace(recording=path, json=False, summary=False, pcap=None,
                              with_bytes=False, connection=None, commands=None, topic=None,
                              since=None, until=None, wall=False)  # fmt: skip
    for key, value in options.items():
        setattr(args, key, value)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = inspect.run(args)
    said = err.getvalue()
    check(code in (0, 2), f"inspect {options} returned {code}: {said!r}")
    if code == 2:
        lines = said.splitlines()
        check(len(lines) == 1 and lines[0].startswith("sluice inspect: "),
              f"inspect {options} refused in other words than one line: {said!r}")  # fmt: skip


def anonymizing(path: Path, out: Path) -> None:
    try:
        anonymize(path, out, Options(key=KEY))
    except RecordingError as exc:
        one_line(exc)
        return
    for copy in sorted(out.rglob("*.sluice")):
        try:
            list(read_records(copy))
        except RecordingError as exc:
            raise Violation(f"the anonymized copy does not read: {exc}") from exc


def loading(path: Path) -> None:
    try:
        recording = load(path)
    except RecordingError as exc:
        one_line(exc)
        return
    Outcome.of(recording)
    protocol = next(iter(_protocols(path)), registry.DEFAULT_PROTOCOL)
    if protocol == "cursus":
        for conn in recording.connections:
            replay_cursus.withheld_of(conn)
        replay_cursus.CursusStub(recording, None)  # type: ignore[arg-type]
    else:
        for conn in recording.connections:
            replay_pulsar.withheld_of(conn)
        replay_pulsar.Answers.of(recording)


def _protocols(path: Path) -> list[str]:
    for record in read_records(path):
        return [str(record.get("protocol", registry.DEFAULT_PROTOCOL))]
    return []


def analyzing(path: Path, data: bytes) -> None:
    batches = list(decode_segment(str(path), data))
    check(bool(batches) and batches[-1].num_rows >= 1, "no segment row")


def TestOneInput(data: bytes) -> None:
    work = Path(tempfile.mkdtemp(dir=SCRATCH))
    try:
        path = work / NAME
        path.write_bytes(data)
        read = reading(path, data)
        inspecting(path, wall=True)
        inspecting(path, json=True, with_bytes=True)
        inspecting(path, summary=True, commands=["NO_SUCH_COMMAND"])
        inspecting(path, pcap=work / "out.pcapng")
        anonymizing(path, work / "anonymized")
        loading(path)
        analyzing(path, data)
        if isinstance(read, list):
            check(bool(read) and read[0].get("k") == "header", "a file read without its header")
    finally:
        shutil.rmtree(work, ignore_errors=True)
