"""What the relay thread counts as its reads (``RelayThread.steps_run``,
``compiled_runs``; exported as ``sluice_relay_thread_reads_total``): each
read of a carried direction, by the compiled loop alone or through the
relay's Python read step (``Relay._carry``), and nothing else it runs: a
wait for room to write (``watch_writable``, a slow reader) is not a read,
nor is an accept on a listening socket (``listen``)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import trio

from sluice.protocols.core import Taps
from sluice.proxy import relay_thread as relay_thread_module
from sluice.proxy.metrics import Metrics
from sluice.proxy.relay import Relay
from sluice.proxy.relay_thread import relay_thread
from tests.test_relay_thread import SIZES, needs_the_compiled_step, relay_sends


@pytest.mark.parametrize("loop", ["compiled", "python"])
async def test_waits_for_room_to_write_are_not_counted_as_reads(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_the_compiled_step()
    if loop == "python":
        monkeypatch.setattr(relay_thread_module, "Carrier", None)
        monkeypatch.setattr(relay_thread_module, "Turn", None)
    python_reads = 0
    carry = Relay._carry

    def counted(self: Relay, *args: Any) -> None:
        nonlocal python_reads
        python_reads += 1
        carry(self, *args)

    monkeypatch.setattr(Relay, "_carry", counted)
    metrics = Metrics()
    got, receipts, h, steps, _ = await relay_sends(True, Taps([metrics]))
    assert len(got) == len(receipts) == len(SIZES)
    assert h.write_waits > 1  # a slow reader: the relay thread waited for room
    compiled = h.compiled_runs
    assert steps - compiled == python_reads, (steps, compiled, python_reads, h.write_waits)


async def test_accepts_are_not_counted_as_reads() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    accepted: list[socket.socket] = []
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def accept() -> None:
        accepted.append(listener.accept()[0])
        token.run_sync_soon(done.set)

    with listener, trio.fail_after(10):
        async with relay_thread() as thread:
            assert thread is not None
            thread.listen(listener.fileno(), accept)
            with socket.create_connection(listener.getsockname()):
                await done.wait()
            thread.drop(listener.fileno())
            assert thread.steps_run == 0
    for sock in accepted:
        sock.close()
