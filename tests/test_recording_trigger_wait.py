"""A --snapshot-on rule whose snapshot is due while another is written."""

from __future__ import annotations

from pathlib import Path

import trio

from sluice.protocols.core import Answered, Conn
from sluice.recording.triggers import Trigger
from sluice.recording.writer import Recorder, RecorderConfig


async def test_a_due_snapshot_waits_for_one_being_written_without_spinning(
    tmp_path: Path,
) -> None:
    """A rule's snapshot comes due while an on-demand one is being written
    (a large ring takes seconds): the writer must wait for it, not go round
    its loop without pause (a core at 100 % and the proxy's event loop
    starved for as long as that write lasts), and save it once it can."""
    trigger = Trigger(id="errors", on="error", after=0.0, before=1.0)
    recorder = Recorder(RecorderConfig(tmp_path, ring_bytes=1 << 20, triggers=(trigger,)))
    conn = Conn(1, "127.0.0.1:1", "plain", "pulsar")
    recorder.open_connection(1, client="127.0.0.1:1", kind="proxied", listener="plain")
    rounds = 0
    save_due = recorder._save_due

    async def counted() -> None:
        nonlocal rounds
        rounds += 1
        await save_due()

    recorder._save_due = counted  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run)
        recorder._snapshotting = True  # an on-demand snapshot is being written
        recorder.event(conn, Answered("SEND", 0.01, error="PersistenceError"))
        await trio.sleep(0.5)
        busy_rounds = rounds
        recorder._snapshotting = False  # it is done
        with trio.fail_after(5):
            while trigger.saved == 0:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert busy_rounds < 50, f"{busy_rounds} rounds of the writer in 0.5 s"
    assert recorder.snapshots_total == {"errors": 1}
