"""What fuzzing recording files (``tests/fuzz/fuzz_recording.py``) found:
each finding on the smallest file that shows it, a capture someone else
gave the user, read by the command they ran on it."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sluice.commands import main
from sluice.recording import format as fmt

T0 = 10**18


def capture(tmp_path: Path, *records: dict[Any, Any]) -> Path:
    head = fmt.header(capture="abc", segment=1, started_ns=T0, payloads=fmt.PayloadPolicy.FULL,
                      sluice_version="t")  # fmt: skip
    path = tmp_path / "r.sluice"
    path.write_bytes(fmt.dumps([head, *records]))
    return path


def sluice(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_inspect_json_shows_a_record_keyed_by_bytes(tmp_path: Path) -> None:
    # A record of a kind this Sluice does not know (read on, as a newer
    # one's) with a key that is bytes, not text: json.dumps raised
    # TypeError ("keys must be str, ...") out of inspect --json.
    path = capture(tmp_path, {"k": "later", "w": T0, b"\x01": 1, "m": {b"k": {2: b"v"}}})
    code, out, err = sluice("inspect", str(path), "--json", "--with-bytes")
    assert (code, err) == (0, "")
    (line,) = out.splitlines()
    shown = json.loads(line)
    assert shown["kind"] == "later" and shown["b'\\x01'"] == 1
    assert shown["m"] == {"b'k'": {"2": "b'v'"}}


def test_inspect_json_shows_a_record_keyed_by_a_msgpack_extension(tmp_path: Path) -> None:
    # msgpack's extension types (ExtType, Timestamp) unpack as hashable
    # values: keys json.dumps refused as it did bytes.
    key = msgpack.ExtType(5, b"x")
    path = capture(tmp_path, {"k": "later", "w": T0, "m": {key: 1, msgpack.Timestamp(1): 2}})
    code, out, err = sluice("inspect", str(path), "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["m"] == {str(key): 1, str(msgpack.Timestamp(1)): 2}


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("mode", [[], ["--json"]])
def test_inspect_says_a_record_nested_too_deep_is_damage(tmp_path: Path, mode: list[str]) -> None:
    # msgpack nests up to 1,024 levels, past Python's recursion limit: a
    # close record's reason nested 1,000 deep raised RecursionError out of
    # the timeline's f-string and out of json.dumps.
    path = capture(tmp_path, {"k": "close", "c": 1, "t": 0, "w": T0, "reason": nested(1000)})
    code, _, err = sluice("inspect", str(path), *mode)
    assert code == 2
    assert (
        err
        == f"sluice inspect: {path}: damaged after 1 records (a value nested more than 100 deep)\n"
    )


def test_a_record_nested_as_deep_as_anonymize_takes_still_reads(tmp_path: Path) -> None:
    path = capture(tmp_path, {"k": "later", "w": T0, "x": nested(100)})
    assert [r["k"] for r in fmt.read_records(path)] == ["header", "later"]


FRAME = {"k": "frame", "c": 1, "d": 1, "t": 0, "w": T0, "n": 3, "raw": b"abc"}


def test_inspect_says_a_message_id_that_is_no_list_is_damage(tmp_path: Path) -> None:
    # A frame summary's message id (``mid``: ledger, entry, partition,
    # batch) that is a number: the timeline's ids raised TypeError ("'int'
    # object is not subscriptable").
    path = capture(tmp_path, {**FRAME, "s": {"cmd": "MESSAGE", "cid": 0, "mid": 116}})
    code, _, err = sluice("inspect", str(path))
    assert code == 2
    assert err == (
        f"sluice inspect: {path}: damaged after 1 records "
        "(a frame record whose summary has 'mid' of the wrong type)\n"
    )


def test_a_header_of_no_kind_is_damage(tmp_path: Path) -> None:
    # A first record that says it is a recording (``format``) but not that
    # it is a header (``k``): it was read as the header, and every reader
    # then met a KeyError on record["k"] (inspect's first).
    head = fmt.header(capture="abc", segment=1, started_ns=T0, payloads=fmt.PayloadPolicy.FULL,
                      sluice_version="t")  # fmt: skip
    del head["k"]
    path = tmp_path / "r.sluice"
    path.write_bytes(fmt.dumps([head]))
    for command in (["inspect"], ["inspect", "--json"]):
        code, _, err = sluice(*command, str(path))
        assert (code, err) == (2, f"sluice inspect: {path}: damaged header ('k')\n")


def test_anonymize_withholds_a_frame_of_fewer_bytes_than_its_length(tmp_path: Path) -> None:
    # A frame record whose bytes are fewer than a Pulsar frame's length
    # prefix: anonymized_frame() took it for one the recorder cut and
    # raised OverflowError writing its length (len(raw) - 4 < 0).
    path = capture(tmp_path, {**FRAME, "n": 1, "raw": b"\x00", "s": {"cmd": "UNKNOWN(0)"}})
    code, _, err = sluice("record", "anonymize", str(path), str(tmp_path / "out"))
    assert code == 0, err
    (copy,) = (tmp_path / "out").iterdir()
    frames = [r for r in fmt.read_records(copy) if r["k"] == "frame"]
    assert frames[0]["raw"] == b"" and "withheld" in frames[0]["s"]


CONN = {"k": "conn", "c": 1, "t": 0, "w": T0, "broker": "pulsar://127.0.0.1:6650",
        "kind": "proxied", "listener": "plain"}  # fmt: skip


def test_inspect_pcap_of_a_client_port_past_65535(tmp_path: Path) -> None:
    # A conn record whose client's port is out of range (127.0.0.1:86228):
    # --pcap packed it into the TCP header and raised struct.error.
    path = capture(tmp_path, {**CONN, "client": "127.0.0.1:86228"})
    code, _, err = sluice("inspect", str(path), "--pcap", str(tmp_path / "out.pcapng"))
    assert code == 0, err


@pytest.mark.parametrize(
    "record",
    [
        # A kind this Sluice does not know, whose ``s`` is no map: --json
        # merged it into the line as a frame's summary (TypeError: 'int'
        # object is not iterable).
        {**FRAME, "k": "frAme", "s": -1},
        # A ``p`` (payload size and digest) that is empty: IndexError.
        {**FRAME, "raw": b"", "p": [], "s": {"cmd": "SEND"}},
        {"k": "ws", "h": 1, "d": 1, "t": 0, "w": T0, "n": 2, "op": "text", "p": []},
        # A filter's changed frame without its bytes, or with an empty
        # ``p``: KeyError, IndexError.
        {"k": "filter", "c": 1, "d": 0, "t": 0, "w": T0, "filter": "f", "action": "replaced",
         "n": 1, "sent": {"n": 3, "p": []}},
    ],
)  # fmt: skip
def test_inspect_json_shows_a_record_whose_parts_are_of_another_shape(
    tmp_path: Path, record: dict[str, Any]
) -> None:
    path = capture(tmp_path, record)
    code, out, err = sluice("inspect", str(path), "--json", "--with-bytes")
    assert (code, err) == (0, "")
    assert json.loads(out)["kind"] == record["k"]


@pytest.mark.parametrize(
    ("key", "said"),
    [
        # A frame record's own keys are not walked (the reader's hot path):
        # a container there is the wrong type, said as such.
        ("c", "a frame record with 'c' of the wrong type"),
        ("raw", "a frame record with 'raw' of the wrong type"),
        ("why", "a frame record with 'why' of the wrong type"),
        # ``p`` holding a container, or a key a frame record has not, is walked.
        ("p", "a value nested more than 100 deep"),
        ("later", "a value nested more than 100 deep"),
    ],
)
def test_a_frame_record_nested_too_deep_is_one_line(tmp_path: Path, key: str, said: str) -> None:
    path = capture(tmp_path, {**FRAME, key: nested(1000)})
    for mode in ([], ["--json"]):
        code, _, err = sluice("inspect", str(path), *mode)
        assert (code, err) == (2, f"sluice inspect: {path}: damaged after 1 records ({said})\n")
