"""A damaged recording is a one-line error and exit 2 from every command
that reads one, never a traceback: the bytes of a real capture, its header
included, are changed in turn (a stride of them, seeded), and every reader
runs on the result in-process. A changed byte inside a frame's bytes still reads
(exit 0: the frame shows as invalid); one that breaks the structure must be
said as damage."""

from __future__ import annotations

import contextlib
import io
import random
import shutil
from pathlib import Path

import msgpack
import pytest

from sluice.commands import main
from sluice.commands.inspect import Summary, records
from sluice.protocols.pulsar import Type, command, encode
from sluice.recording.format import (
    Gone,
    PayloadPolicy,
    RecordingError,
    dumps,
    header,
    read_records,
)
from sluice.recording.reader import load

INPUTS = Path(__file__).parent / "golden" / "analyze" / "inputs"
CAPTURE = INPUTS / "sluice-20261128T172608-f2b453b65503-0001.sluice"
STRIDE = 23

COMMANDS = {
    "inspect": ["inspect", "{file}"],
    "inspect --json": ["inspect", "{file}", "--json"],
    "inspect --summary": ["inspect", "{file}", "--summary"],
    "inspect --pcap": ["inspect", "{file}", "--pcap", "{out}/x.pcapng"],
    "view --export": ["view", "{file}", "--export", "{out}/x.html"],
    "record anonymize": ["record", "anonymize", "{file}", "{out}/anon", "--payloads", "hash"],
}


def _run_out(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, err.getvalue()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_reader_says_damage_in_one_line(name: str, tmp_path: Path) -> None:
    data = CAPTURE.read_bytes()
    rng = random.Random(name)
    file = tmp_path / "capture.sluice"
    out = tmp_path / "out"
    damaged = 0
    for at in range(0, len(data), STRIDE):
        changed = bytearray(data)
        changed[at] = rng.choice([changed[at] ^ 0xFF, rng.randrange(256)])
        file.write_bytes(changed)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        argv = [a.format(file=file, out=out) for a in COMMANDS[name]]
        code, err = _run(argv)  # a traceback fails the test here
        assert code in (0, 2), (at, code, err)
        if code == 2:
            damaged += 1
            last = err.strip().splitlines()[-1]
            assert last.startswith("sluice ") and "Traceback" not in err, (at, err)
    # Not every change reads: the test did reach the damage paths.
    assert damaged >= 5


def _frame(**fields: object) -> dict[str, object]:
    return {"k": "frame", "c": 1, "d": 0, "t": 1, "w": 1, "n": 3, "raw": b"abc",
            "s": {"cmd": "PING"}, **fields}  # fmt: skip


@pytest.mark.parametrize(
    ("record", "said"),
    [
        ({"c": 1}, "a record of no kind"),
        ({"k": {"a": 1}}, "a record of no kind"),
        (_frame(c="1"), "a frame record with 'c' of the wrong type"),
        (_frame(d=2), "a frame record of no direction"),
        (_frame(t=2**64 - 1), "a frame record with 't' of the wrong type"),
        (
            {"k": "conn", "c": 1, "t": 1, "w": 1, "client": "a", "broker": "b", "kind": "proxied"},
            "a conn record without 'listener'",
        ),
        ({"k": "close", "t": 1, "w": 1}, "a close record without 'c'"),
        ([1, 2], "damaged after 1 records"),
        (
            {"k": "fault", "c": 1, "d": 0, "t": 1, "w": 1, "rule": "f1", "action": "drop"},
            "a fault record without 'cmd'",
        ),
        (
            {
                "k": "filter",
                "c": 1,
                "d": 3,
                "t": 1,
                "w": 1,
                "filter": "x",
                "action": "drop",
                "n": 1,
            },
            "a filter record of no direction",
        ),
    ],
)
def test_a_record_readers_cannot_rely_on_is_damage(
    record: object, said: str, tmp_path: Path
) -> None:
    path = tmp_path / "x.sluice"
    head = header(capture="c", segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
                  sluice_version="test", protocol="cursus")  # fmt: skip
    path.write_bytes(dumps([head]) + msgpack.packb(record))
    with pytest.raises(RecordingError, match="damaged after 1 records") as caught:
        list(read_records(path))
    assert said in str(caught.value)


def test_a_map_key_that_is_a_map_is_damage(tmp_path: Path) -> None:
    # msgpack raises TypeError for it (a dict cannot be a key).
    path = tmp_path / "x.sluice"
    head = header(capture="c", segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
                  sluice_version="test", protocol="cursus")  # fmt: skip
    # A map of one entry whose key is a map of one entry: 0x81 0x81 0xa1 'a' 0x01 0x01.
    path.write_bytes(dumps([head]) + b"\x81\x81\xa1a\x01\x01")
    with pytest.raises(RecordingError, match="damaged after 1 records"):
        list(read_records(path))


def test_a_header_readers_cannot_rely_on_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "x.sluice"
    head = header(capture="c", segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
                  sluice_version="test", protocol="cursus")  # fmt: skip
    for key, value in (("capture", None), ("started", "0"), ("payloads", 3)):
        broken = {k: v for k, v in head.items() if k != key}
        if value is not None:
            broken[key] = value
        path.write_bytes(dumps([broken]))
        with pytest.raises(RecordingError, match=f"damaged header \\('{key}'\\)"):
            list(read_records(path))


@pytest.mark.parametrize("command", ["replay", "serve"])
def test_a_directory_of_two_protocols_is_one_line(command: str, tmp_path: Path) -> None:
    """Replay and serve speak one protocol per run: a directory holding a
    Pulsar capture and a Cursus one is refused, naming a file of each."""
    shutil.copy(CAPTURE, tmp_path / CAPTURE.name)
    head = header(capture="c", segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
                  sluice_version="test", protocol="cursus")  # fmt: skip
    conn = {"k": "conn", "c": 1, "t": 1, "w": 1, "client": "127.0.0.1:1",
            "broker": "127.0.0.1:2", "kind": "proxied", "listener": "127.0.0.1:3"}  # fmt: skip
    cursus = tmp_path / "a-cursus.sluice"  # read first: files go in name order
    cursus.write_bytes(dumps([head, conn, _frame(raw=b"\x00\x00\x00\x01x")]))
    argv = [command, str(tmp_path)]
    argv += (
        ["--broker", "pulsar://127.0.0.1:1"] if command == "replay" else ["--listen", "127.0.0.1:0"]
    )
    code, err = _run(argv)
    assert code == 2 and "Traceback" not in err, err
    assert (
        "more than one protocol: cursus (" in err and f"pulsar ({tmp_path / CAPTURE.name})" in err
    )
    assert len(err.strip().splitlines()) == 1, err


def _cursus_file(path: Path, *records: dict[str, object], protocol: str = "cursus") -> Path:
    head = header(capture="c", segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
                  sluice_version="test", protocol=protocol)  # fmt: skip
    conn = {"k": "conn", "c": 1, "t": 1, "w": 1, "client": "127.0.0.1:1",
            "broker": "127.0.0.1:2", "kind": "proxied", "listener": "plain"}  # fmt: skip
    path.write_bytes(dumps([head, conn, *records]))
    return path


@pytest.mark.parametrize(
    ("record", "said"),
    [
        (_frame(s={}), "whose summary names no command"),
        (_frame(s={"cmd": "PING", "topic": 7}), "summary has 'topic' of the wrong type"),
        (_frame(s={"cmd": "PING", "invalid": {"a": 1}}), "summary has 'invalid' of the wrong"),
        (_frame(s={"cmd": "SEND", "chunk": 7}), "summary has 'chunk' of the wrong type"),
        (_frame(s={"cmd": "SEND", "chunk": ["u", "1", 2, 0]}), "'chunk' of the wrong shape"),
        (_frame(w=-5), "a frame record from before 1970"),
        (_frame(invalid=40), "a frame record with 'invalid' of the wrong type"),
        ({"k": "gap", "t": 1, "dropped": 2, "w": "x"}, "a gap record with 'w' of the wrong"),
        ({"k": "http", "h": 1, "t": 1, "w": 1}, "a http record without 'x'"),
        ({"k": "ws", "h": "1", "d": 0, "t": 1, "w": 1, "n": 1, "op": "text"}, "'h' of the wrong"),
    ],
)  # fmt: skip
def test_a_stored_summary_or_web_record_readers_cannot_rely_on_is_damage(
    record: dict[str, object], said: str, tmp_path: Path
) -> None:
    """Cursus captures (and frames whose bytes were withheld) keep their
    summaries on disk: damage there is said as such by every reader."""
    path = _cursus_file(tmp_path / "x.sluice", record)
    with pytest.raises(RecordingError, match="damaged after 2 records") as caught:
        list(read_records(path))
    assert said in str(caught.value)
    for argv in (["inspect", str(path)], ["inspect", str(path), "--summary"],
                 ["inspect", str(path), "--pcap", str(tmp_path / "x.pcapng")]):  # fmt: skip
        code, err = _run(argv)
        assert code == 2 and said in err and "Traceback" not in err, (argv, err)


def test_a_recording_of_a_protocol_this_sluice_lacks_is_one_line(tmp_path: Path) -> None:
    path = _cursus_file(tmp_path / "x.sluice", protocol="kafka")
    for argv in (["inspect", str(path)], ["replay", str(path), "--broker", "pulsar://127.0.0.1:1"],
                 ["view", str(path), "--export", str(tmp_path / "x.html")]):  # fmt: skip
        code, err = _run(argv)
        assert code == 2 and "Traceback" not in err, (argv, err)
        assert "a recording of protocol 'kafka', which this Sluice does not have" in err, err


def test_a_segment_cut_in_its_header_or_removed_is_skipped_among_others(tmp_path: Path) -> None:
    """A writer stopped inside its first flush leaves a segment cut in its
    header; among a capture's other segments it holds nothing yet, as an
    empty one, and the rest is read. Alone, it is an error."""
    shutil.copy(CAPTURE, tmp_path / CAPTURE.name)
    cut = tmp_path / "sluice-29991231T000000-ffffffffffff-0009.sluice"
    cut.write_bytes(CAPTURE.read_bytes()[:30])
    code, err = _run(["inspect", str(tmp_path), "--summary"])
    assert code == 0, err
    assert f"{cut}: ends with 30 bytes of an incomplete record" in _run_out(
        ["inspect", str(tmp_path), "--summary"]
    )
    recording = load(tmp_path, need_payloads=False)  # replay's and serve's reader
    assert recording.truncated[-1] == cut and recording.frames > 0
    code, err = _run(["inspect", str(cut)])
    assert code == 2 and "ends inside its header (30 bytes)" in err, err
    # Removed between the listing and its reading (retention): said, skipped.
    gone = tmp_path / "sluice-29991231T000000-ffffffffffff-0010.sluice"
    summary = Summary()
    kinds = [r["k"] for _, r in records([tmp_path / CAPTURE.name, gone], summary)]
    assert "frame" in kinds and summary.gone == [gone]
    with pytest.raises(Gone, match="removed while being read"):
        list(read_records(gone))


def test_several_writers_captures_are_replayed_in_the_order_of_time(tmp_path: Path) -> None:
    """--workers records a capture per worker; read one file after another,
    each worker's traffic would be replayed after the one before it. The
    frames, closes and faults are put in wall-clock order instead."""
    ping = encode(command(Type.PING))

    def capture(name: str, *records: dict[str, object]) -> None:
        head = header(capture=name, segment=1, started_ns=0, payloads=PayloadPolicy.FULL,
                      sluice_version="test")  # fmt: skip
        conn = {"k": "conn", "c": 1, "t": 1, "w": 1, "client": f"127.0.0.1:{len(name)}",
                "broker": "127.0.0.1:2", "kind": "proxied", "listener": "plain"}  # fmt: skip
        (tmp_path / f"sluice-{name}.sluice").write_bytes(dumps([head, conn, *records]))

    def frame(wall: int) -> dict[str, object]:
        return {"k": "frame", "c": 1, "d": 0, "t": wall, "w": wall, "n": len(ping), "raw": ping}

    capture("a", frame(10), frame(30), {"k": "close", "c": 1, "t": 35, "w": 35})
    fault = {"k": "fault", "c": 1, "d": 0, "t": 25, "w": 25, "rule": "r", "action": "drop",
             "cmd": "PING"}  # fmt: skip
    capture("bb", frame(20), fault, frame(40))
    # A wall clock stepped back inside a capture: its own order is kept.
    capture("ccc", frame(100), frame(50))
    recording = load(tmp_path)
    first, second, third = recording.connections
    assert [(f.wall_ns, f.index) for f in first.frames] == [(10, 0), (30, 2)]
    assert [(f.wall_ns, f.index) for f in second.frames] == [(20, 1), (40, 3)]
    assert [(f.wall_ns, f.index) for f in third.frames] == [(100, 4), (50, 5)]
    assert first.closed_at == 3  # after the three frames recorded before the close
    assert [f.index for f in second.faults] == [2]


# Every command that reads a file whole, in-process.
_READERS = (
    ["inspect", "{file}"],
    ["inspect", "{file}", "--json"],
    ["inspect", "{file}", "--summary"],
    ["inspect", "{file}", "--pcap", "{out}/x.pcapng"],
    ["view", "{file}", "--export", "{out}/x.html"],
    ["replay", "{file}", "--broker", "pulsar://127.0.0.1:1"],
    ["record", "anonymize", "{file}", "{out}/anon"],
)


def _every_reader_says(path: Path, tmp_path: Path, said: str) -> None:
    for n, argv in enumerate(_READERS):
        out = tmp_path / f"out{n}"
        out.mkdir()
        code, err = _run([a.format(file=path, out=out) for a in argv])
        assert code == 2 and said in err and "Traceback" not in err, (argv, err)


@pytest.mark.parametrize(
    ("record", "said"),
    [
        ({"k": "snapshot", "t": "1", "w": 1, "reason": "r", "seconds": 1.0},
         "a snapshot record with 't' of the wrong type"),
        ({"k": "trigger", "c": 1, "t": 1, "w": [1], "rule": "r", "on": "error"},
         "a trigger record with 'w' of the wrong type"),
        ({"k": "kind-of-tomorrow", "t": 1, "w": 2**64 - 1},
         "a kind-of-tomorrow record with 'w' of the wrong type"),
        ({"k": "snapshot", "t": 1, "w": -1, "reason": "r"}, "a snapshot record from before 1970"),
        ({"k": "header", "capture": "c"}, "a header of no recording"),
    ],
)  # fmt: skip
def test_a_record_of_any_kind_placed_at_no_time_is_damage(
    record: dict[str, object], said: str, tmp_path: Path
) -> None:
    """Readers skip kinds they do not know, and show annotations
    (``trigger``, ``snapshot``) as they come, but every one of them places a
    record by its ``t`` and ``w``: of the wrong type, in a record of any
    kind, that is damage said in one line, not a TypeError."""
    path = _cursus_file(tmp_path / "x.sluice", record, protocol="pulsar")
    with pytest.raises(RecordingError, match="damaged after 2 records") as caught:
        list(read_records(path))
    assert said in str(caught.value)
    _every_reader_says(path, tmp_path, said)


def test_a_record_of_an_unknown_kind_is_skipped(tmp_path: Path) -> None:
    path = _cursus_file(tmp_path / "x.sluice", {"k": "kind-of-tomorrow", "t": 1, "w": 1, "x": [1]})
    assert [r["k"] for r in read_records(path)] == ["header", "conn", "kind-of-tomorrow"]
    assert _run(["inspect", str(path)])[0] == 0


@pytest.mark.parametrize(
    ("key", "value"),
    [("segment", None), ("segment", "2"), ("host", 5), ("listen", 5), ("listen", [5]),
     ("broker", [1]), ("started", 2**63), ("protocol", 1)],
)  # fmt: skip
def test_a_header_field_of_the_wrong_type_is_damage(
    key: str, value: object, tmp_path: Path
) -> None:
    """The header's optional fields are read as they are (replay compares
    segment numbers, anonymize rewrites the host, listen addresses and
    broker): of the wrong type they are damage said in one line."""
    path = _cursus_file(tmp_path / "x.sluice", protocol="pulsar")
    records = list(read_records(path))
    records[0][key] = value
    path.write_bytes(dumps(records))
    _every_reader_says(path, tmp_path, "damaged header")


def test_files_joined_are_read_each_by_its_own_header(tmp_path: Path) -> None:
    """``cat a.sluice b.sluice``: the second header is checked as the first
    (a protocol this Sluice lacks is said in one line), and each part is
    read by the protocol its header names."""
    pulsar = (INPUTS / "sluice-20261128T172607-bf2cfe0d70e7-0001.sluice").read_bytes()  # whole
    cursus = _cursus_file(tmp_path / "c.sluice", _frame(raw=b"\x00\x00\x00\x01x"))
    joined = tmp_path / "joined.sluice"
    joined.write_bytes(pulsar + cursus.read_bytes())
    kinds = [r["k"] for r in read_records(joined)]
    assert kinds.count("header") == 2 and kinds[-1] == "frame"
    kafka = _cursus_file(tmp_path / "k.sluice", protocol="kafka")
    joined.write_bytes(pulsar + kafka.read_bytes())
    _every_reader_says(joined, tmp_path, "a recording of protocol 'kafka'")
