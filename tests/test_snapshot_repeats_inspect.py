"""``sluice inspect`` of a directory holding flight-recorder snapshots that
cover the same seconds: every recorded frame once, not once per snapshot
that holds it, in the order recorded."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import trio

from sluice.commands import main
from sluice.protocols.core import Conn
from sluice.protocols.pulsar import Type, command, decode_frame, encode
from sluice.recording.format import PayloadPolicy, read_records
from sluice.recording.writer import Recorder, RecorderConfig

MiB = 1024 * 1024
PING = decode_frame(encode(command(Type.Value("PING"))))
PONG = decode_frame(encode(command(Type.Value("PONG"))))


def _recorder(directory: Path) -> tuple[Recorder, Conn]:
    config = RecorderConfig(directory, PayloadPolicy.FULL, ring_bytes=MiB, flush_interval=0.02)
    recorder = Recorder(config)
    recorder.open_connection(1, client="127.0.0.1:5555", kind="proxied", listener="plain",
                             broker="127.0.0.1:6650")  # fmt: skip
    return recorder, Conn(1, "127.0.0.1:5555", "plain", "pulsar")


async def overlapping_snapshots(directory: Path) -> list[Path]:
    """A real recorder's ring, snapshot four times: A (8 PINGs), B (A's 8
    and 4 PONGs), C (the last 4 only) and D (all of it again): 36 frames
    in the files, 12 recorded. Returns the files, in the order taken."""
    recorder, conn = _recorder(directory)
    files = []
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        for _ in range(4):
            recorder.frames(conn, True, [PING, PING])  # two frames of one read: same t and w
            await trio.sleep(0.01)
        files.append((await recorder.snapshot(name="a")).file)
        await trio.sleep(0.3)
        for _ in range(4):
            recorder.frames(conn, False, [PONG])
            await trio.sleep(0.01)
        files.append((await recorder.snapshot(name="b")).file)
        files.append((await recorder.snapshot(name="c", last=0.25)).file)
        files.append((await recorder.snapshot(name="d")).file)
        nursery.cancel_scope.cancel()
    held = [sum(r["k"] == "frame" for r in read_records(f)) for f in files]
    assert held == [8, 12, 4, 12]  # each file reads whole on its own
    return files


async def snapshots_listed_later_one_first(directory: Path) -> None:
    """Two snapshots of one second, named (by reason) so that the later one
    (the last 0.2 s: the PONG alone) is listed before the earlier one (the
    whole ring: PING, PING, PONG)."""
    recorder, conn = _recorder(directory)
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        recorder.frames(conn, True, [PING, PING])
        await trio.sleep(0.3)
        recorder.frames(conn, False, [PONG])
        await recorder.snapshot(name="snapshot-20260101T000000-zz-rule-1a2b3c")
        await recorder.snapshot(name="snapshot-20260101T000000-aa-demand-4d5e6f", last=0.2)
        nursery.cancel_scope.cancel()


def _inspect(path: Path, *extra: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["inspect", str(path), *extra]) == 0, err.getvalue()
    return out.getvalue(), err.getvalue()


def _timeline_commands(text: str) -> list[str]:
    return re.findall(r"\b(PING|PONG)\b", text)


async def test_overlapping_snapshots_are_inspected_as_each_frame_once(tmp_path: Path) -> None:
    await overlapping_snapshots(tmp_path)
    summary, _ = _inspect(tmp_path, "--summary")
    assert "12 frames on 1 connections in 4 file(s)" in summary
    assert re.search(r"PING +client_to_broker +8\n", summary)
    assert re.search(r"PONG +broker_to_client +4\n", summary)
    timeline, _ = _inspect(tmp_path)
    assert _timeline_commands(timeline.split("\n\n")[0]) == ["PING"] * 8 + ["PONG"] * 4
    shown, _ = _inspect(tmp_path, "--json")
    records = [json.loads(line) for line in shown.splitlines()]
    frames = [r["cmd"] for r in records if r["kind"] == "frame"]
    assert frames == ["PING"] * 8 + ["PONG"] * 4
    assert sum(r["kind"] == "snapshot" for r in records) == 4  # each snapshot taken, said
    assert sum(r["kind"] == "conn" for r in records) == 1


async def test_overlapping_snapshots_make_a_pcap_of_each_frame_once(tmp_path: Path) -> None:
    await overlapping_snapshots(tmp_path / "rec")
    pcap = tmp_path / "out.pcapng"
    _, said = _inspect(tmp_path / "rec", "--pcap", str(pcap))
    _, once = _inspect(tmp_path / "rec" / "d", "--pcap", str(pcap))
    (whole,) = re.findall(r"wrote (\d+) packets", once)  # snapshot D alone: every frame
    assert re.findall(r"wrote (\d+) packets", said) == [whole]


async def test_snapshots_of_one_second_are_inspected_in_the_order_taken(tmp_path: Path) -> None:
    await snapshots_listed_later_one_first(tmp_path)
    timeline, _ = _inspect(tmp_path)
    assert _timeline_commands(timeline.split("\n\n")[0]) == ["PING", "PING", "PONG"]
    shown, _ = _inspect(tmp_path, "--json")
    frames = [json.loads(line) for line in shown.splitlines()]
    assert [r["cmd"] for r in frames if r["kind"] == "frame"] == ["PING", "PING", "PONG"]
