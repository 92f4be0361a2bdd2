"""Cursus replay of recordings whose answers do not all come live."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from sluice.recording.format import dumps, read_records, recording_files
from sluice.recording.reader import load
from tests.helpers.cursus_broker import open_cluster
from tests.helpers.support import SLUICE
from tests.test_cursus_recording import record_a_session

pytestmark = pytest.mark.e2e  # every test here starts a process


@pytest.fixture
async def recorded(tmp_path: Path) -> Path:
    """A directory holding one Cursus session (``record_a_session``)."""
    return await record_a_session(tmp_path / "rec")


async def test_closes_due_together_wait_side_by_side(recorded: Path, tmp_path: Path) -> None:
    """The producers' connections close one after another when recorded. One
    of them is made to expect an answer no broker sends: its close waits for
    it (up to a --timeout far longer than the test), and the closes recorded
    with it are made meanwhile, each as soon as its own answers are in (they
    waited behind it, a timeout each, one after another)."""
    connections = load(recorded).connections
    due: dict[int, list[int]] = {}
    for conn in connections:
        if conn.closed_at is not None:
            due.setdefault(conn.closed_at, []).append(conn.key[1])
    together = next(ids for ids in due.values() if len(ids) >= 3)
    stuck, others = together[0], together[1:]
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for path in recording_files(recorded):
        records = []
        for record in read_records(path):
            records.append(record)
            if record["k"] == "frame" and record["c"] == stuck and record["d"] == 1:
                records.append(record)  # an answer the live broker will not send
        (tampered / path.name).write_bytes(dumps(records))
    # Which live connection stands for which recorded one: dialled in the
    # order of their first client frames.
    dialled = [c.key[1] for c in sorted(connections, key=lambda c: c.frames[0].index)]
    async with open_cluster(1, keepalive=0.3) as fresh:
        process = await trio.lowlevel.open_process(
            [*SLUICE, "replay", str(tampered), "--broker", f"cursus://{fresh.address}",
             "--timeout", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:

            def closed() -> set[int]:
                peers = [peer for event, peer in fresh.lifetimes if event == "open"]
                ended = {peer for event, peer in fresh.lifetimes if event == "close"}
                return {c for c, peer in zip(dialled, peers, strict=False) if peer in ended}

            with trio.move_on_after(30):
                while not set(others) <= closed():
                    await trio.sleep(0.05)
            assert set(others) <= closed(), fresh.lifetimes
            assert stuck not in closed()  # still waiting for what will not come
        finally:
            process.kill()
            await process.wait()


async def test_a_silent_broker_costs_one_timeout_per_connection(
    recorded: Path, tmp_path: Path
) -> None:
    """The producers' connections alone, each made to send its batch and be
    answered four times. Against a broker that accepts and never answers,
    each one's first wait runs out and it is not waited on again until it
    speaks: one --timeout per connection, not one per client frame (three
    each, and its close's)."""
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    producers: set[int] = set()
    for path in recording_files(recorded):
        records = list(read_records(path))
        for record in records:
            if record["k"] == "frame" and record["d"] == 0 and record["s"]["cmd"] == "BATCH":
                producers.add(record["c"])
        kept: list[dict[str, Any]] = []
        for record in records:
            if "c" in record and record["c"] not in producers:
                continue
            if record["k"] == "close":
                pair = [r for r in records if r["k"] == "frame" and r["c"] == record["c"]]
                kept += pair * 3  # the batch and its ack, three times more
            kept.append(record)
        (tampered / path.name).write_bytes(dumps(kept))
    assert len(producers) == 3

    async def hold(stream: trio.SocketStream) -> None:
        async with stream:
            while await stream.receive_some():
                pass  # read, answer nothing

    timeout = 2
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, hold, listeners)
        started = trio.current_time()
        with trio.fail_after(120):
            done = await trio.run_process(
                [*SLUICE, "replay", str(tampered), "--broker", f"cursus://127.0.0.1:{port}",
                 "--timeout", str(timeout)], capture_stdout=True, capture_stderr=True, check=False,
            )  # fmt: skip
        elapsed = trio.current_time() - started
        nursery.cancel_scope.cancel()
    out = done.stdout.decode()
    assert done.returncode == 1, out + done.stderr.decode()
    assert "note: 3 waits for a broker frame ran out" in out, out
    # One timeout per producer; one per client frame was nine, then three
    # more for the closes.
    assert elapsed < 9 * timeout, f"{elapsed:.1f} s"
