"""``sluice record anonymize`` on records of the recorder's format: records a
flipped byte left of the wrong shape (``inspect`` reads such a capture, and
the copy must be written too, without a traceback and without the names the
damaged record holds), and web API paths the copy kept names of."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from sluice.protocols.core import Conn
from sluice.protocols.pseudonyms import Pseudonyms
from sluice.protocols.pulsar import Type, command, decode_frame, encode
from sluice.recording import format as fmt
from sluice.recording.anonymize import Anonymizer, Options, anonymize
from sluice.recording.format import PayloadPolicy, read_records, recording_files
from sluice.recording.writer import Recorder, RecorderConfig

KEY = b"k" * 32
LINK = Conn(1, "127.0.0.1:1", "plain", "pulsar")
PING = decode_frame(encode(command(Type.Value("PING"))))
TOPIC = "persistent://initech/payroll/salaries"
HOST = "broker-3.initech.corp"
CONN: fmt.Record = {
    "k": "conn", "c": 1, "t": 1, "w": 1, "client": "192.0.2.7:4000", "kind": "proxied",
    "broker": f"pulsar://{HOST}:6650", "listener": "plain", "producers": {"1": TOPIC},
}  # fmt: skip
HTTP: fmt.Record = {
    "k": "http", "h": 1, "x": 1, "client": "192.0.2.7:5000", "t": 0, "w": 0, "te": 0,
    "method": "GET", "path": "/admin/v2/persistent/initech/payroll/salaries/stats",
    "kind": "admin", "status": 307,
    "req": {"h": [["Host", f"{HOST}:8080"], ["X-Note", "initech"]], "n": 0},
    "res": {"h": [], "n": 0},
    "hops": [[f"http://{HOST}:8080", "/admin/v2/persistent/initech/payroll/salaries/stats"]],
}  # fmt: skip
FAULT: fmt.Record = {"k": "fault", "c": 1, "d": 0, "t": 1, "w": 1, "rule": "r",
                     "action": "drop", "cmd": "SEND", "topic": TOPIC}  # fmt: skip
# Each damage: the record, and the field of it given a value of another type.
DAMAGE: dict[str, tuple[fmt.Record, dict[str, Any]]] = {
    "conn via": (CONN, {"via": 7}),
    "conn producer": (CONN, {"producers": {"1": 5, "2": TOPIC}}),
    "fault topic": (FAULT, {"topic": 9}),
    "http hop of one part": (HTTP, {"hops": [[f"http://{HOST}:8080"]]}),
    "http hops not a list": (HTTP, {"hops": f"http://{HOST}:8080"}),
    "http header of one part": (HTTP, {"req": {"h": [["Host"], ["Host", HOST]], "n": 0}}),
    "http header name a number": (HTTP, {"req": {"h": [[1, 2], ["Host", HOST]], "n": 0}}),
    "http request not a map": (HTTP, {"req": [["Host", HOST]]}),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_record_is_copied_without_a_traceback_or_its_names(
    damage: str, tmp_path: Path
) -> None:
    """A field of another type than the recorder writes (no reader checks
    these: ``inspect`` prints the record) stopped ``anonymize`` with a
    traceback (AttributeError, ValueError), and no copy was written. The
    copy now holds the record, its names replaced wherever a string is."""
    record, change = DAMAGE[damage]
    head = fmt.header(capture="0123456789ab", segment=1, started_ns=1,
                      payloads=PayloadPolicy.HASH, sluice_version="0")  # fmt: skip
    source = tmp_path / "in.sluice"
    source.write_bytes(fmt.dumps([head, CONN, {**record, **change}]))
    assert HOST.encode() in source.read_bytes()
    anonymize(source, tmp_path / "out", Options(KEY))
    (copy,) = recording_files(tmp_path / "out")
    for original in (HOST, "initech", "payroll", "salaries", "192.0.2.7"):
        assert original.encode() not in copy.read_bytes(), original
    assert [r["k"] for r in read_records(copy)] == ["header", "conn", record["k"]]


def web_path(path: str) -> str:
    """An HTTP exchange's path as the copy has it, in a capture that names
    nothing else (so that nothing but the path's own reading replaces)."""
    anonymizer = Anonymizer(Options(KEY), "pulsar")
    record = {key: value for key, value in HTTP.items() if key != "hops"}
    return str(anonymizer.record({**record, "path": path, "req": {"h": [], "n": 0}})["path"])


def test_transaction_and_rest_api_paths_lose_their_names_and_keep_the_topics_pseudonym() -> None:
    """The transactions admin API names a topic without its domain
    (``/admin/v3/transactions/pendingAckStats/{tenant}/{namespace}/{topic}/{sub}``):
    its tenant, namespace, topic and subscription were kept. The REST
    produce API (``/topics/persistent/{tenant}/{namespace}/{topic}``) has no
    ``v2`` in its path and was read as the v1 API's: its topic took a
    namespace's pseudonym and its namespace a cluster's, so that it matched
    the topic nowhere else in the copy. A namespace anti-affinity group
    (``/admin/v2/namespaces/{cluster}/antiAffinity/{group}``) was kept, and
    the API's word replaced."""
    names = Pseudonyms(KEY)
    topic = names.topic("persistent://initech/payroll/salaries").split("://")[1]
    sub = names.name("subscription", "audit-trail")
    paths = {
        "/admin/v3/transactions/pendingAckStats/initech/payroll/salaries/audit-trail":
            f"/admin/v3/transactions/pendingAckStats/{topic}/{sub}",
        "/admin/v3/transactions/pendingAckInternalStats/initech/payroll/salaries/audit-trail"
        "?metadata=true":
            f"/admin/v3/transactions/pendingAckInternalStats/{topic}/{sub}?metadata=true",
        "/admin/v3/transactions/transactionInPendingAckStats/initech/payroll/salaries/"
        "audit-trail/1/2":
            f"/admin/v3/transactions/transactionInPendingAckStats/{topic}/{sub}/1/2",
        "/admin/v3/transactions/transactionBufferStats/initech/payroll/salaries":
            f"/admin/v3/transactions/transactionBufferStats/{topic}",
        "/admin/v3/transactions/transactionInBufferStats/initech/payroll/salaries/1/2":
            f"/admin/v3/transactions/transactionInBufferStats/{topic}/1/2",
        "/admin/v3/transactions/transactionBufferInternalStats/initech/payroll/salaries":
            f"/admin/v3/transactions/transactionBufferInternalStats/{topic}",
        "/topics/persistent/initech/payroll/salaries": f"/topics/persistent/{topic}",
        "/topics/persistent/initech/payroll/salaries/partitions/2":
            f"/topics/persistent/{topic}/partitions/2",
        "/admin/v2/namespaces/uswest-prod/antiAffinity/payroll-group":
            f"/admin/v2/namespaces/{names.name('cluster', 'uswest-prod')}/antiAffinity/"
            f"{names.name('name', 'payroll-group')}",
    }  # fmt: skip
    for path, expected in paths.items():
        assert web_path(path) == expected, path


async def test_files_named_by_their_owner_keep_their_order_in_the_copy(tmp_path: Path) -> None:
    """Readers take a capture's files in name order (a connection's frames
    across segments, replay's order). Files an owner named (segments copied
    as ``incident-part1.sluice`` … into a directory of their own) took
    pseudonyms in the copy, ordered by hash: its segments came out of order
    (replay would send a later segment's frames before an earlier one's).
    The copy's names keep the originals' order, and none of their words."""
    recorder = Recorder(RecorderConfig(tmp_path / "rec", max_file_bytes=4096))
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    for _ in range(4):
        recorder.frames(LINK, True, [PING] * 100)
        recorder._take_queued()
        await recorder._write_packed()
    await recorder._close_file()
    segments = recording_files(tmp_path / "rec")
    assert len(segments) > 3
    owned = tmp_path / "globex" / "night-shift"
    owned.mkdir(parents=True)
    for n, segment in enumerate(segments, 1):
        shutil.copy(segment, owned / f"incident-part{n:02d}.sluice")
    anonymize(tmp_path / "globex", tmp_path / "out", Options(KEY))
    copies = recording_files(tmp_path / "out")
    order = [next(iter(read_records(p)))["segment"] for p in copies]
    assert order == list(range(1, len(segments) + 1)), [p.name for p in copies]
    for word in ("night", "shift", "incident", "part"):
        assert not any(word in str(p.relative_to(tmp_path / "out")) for p in copies), word


async def test_a_segment_with_nothing_yet_or_removed_is_left_out_not_the_whole_copy(
    tmp_path: Path,
) -> None:
    """The recording directory of a running proxy holds the segment it has
    just opened, empty until its first write, and retention removes the
    oldest segment while a capture is read: ``inspect`` and ``replay`` read
    such a directory (saying what they skipped), but ``anonymize`` refused
    all of it (an empty file, or one removed between its two reads, stopped
    it with one line). Those files are now left out and said to be."""
    recorder = Recorder(RecorderConfig(tmp_path / "rec", max_file_bytes=4096))
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    for _ in range(3):
        recorder.frames(LINK, True, [PING] * 100)
        recorder._take_queued()
        await recorder._write_packed()
    await recorder._close_file()
    segments = recording_files(tmp_path / "rec")
    assert len(segments) >= 3
    opened = tmp_path / "rec" / "sluice-20991231T235959-0123456789ab-0001.sluice"
    opened.write_bytes(b"")  # as a recorder that has not yet written its head
    oldest = segments[0]

    def progress(line: str) -> None:
        if line.startswith("writing 1/"):  # retention, between the two reads
            oldest.unlink()

    report, _ = anonymize(tmp_path / "rec", tmp_path / "out", Options(KEY), progress)
    copies = recording_files(tmp_path / "out")
    assert [p.name for p in copies] == [p.name for p in segments[1:]]
    assert report.files == len(segments) - 1
    said = " ".join(report.skipped)
    assert opened.name in said and oldest.name in said, report.skipped
