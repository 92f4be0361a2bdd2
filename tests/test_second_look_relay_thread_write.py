"""A write the relay thread waits to finish (a broker reading slowly): a
bug in what its step does once the write is over (the Relayed event's
taps, re-arming the direction's reads) ended nothing. The step's own
failure callback went with the write (its watch dropped first), so the
thread only logged it: the direction was never read again, and the
connection (both sockets, its tasks, the broker's side) hung for ever.
Now it ends as an internal error, both sides closed, as any other bug
in a relay thread step does."""

from __future__ import annotations

import sys

import pytest
import trio

from sluice.protocols.core import Relayed, Taps
from sluice.protocols.pulsar import Frame
from sluice.proxy import relay_thread as relay_thread_module
from sluice.proxy.metrics import Metrics
from sluice.proxy.relay_thread import relay_thread
from tests.test_relay_clock import open_producer, real_socket_pair, send_frame
from tests.test_relay_thread import SIZES, QuickDial, needs_the_compiled_step, slow_broker

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("loop", ["compiled", "python"])
async def test_a_bug_after_a_thread_write_ends_its_connection(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_the_compiled_step()
    if loop == "python":
        monkeypatch.setattr(relay_thread_module, "Carrier", None)
        monkeypatch.setattr(relay_thread_module, "Turn", None)
    event = Taps.event
    raised: list[bool] = []

    def buggy(self: Taps, conn: object, what: object) -> None:
        # The Relayed event of a write the relay thread finished (its step, ``write``).
        if isinstance(what, Relayed) and sys._getframe(1).f_code.co_name == "write":
            raised.append(True)
            raise RuntimeError("a bug in a tap")
        event(self, conn, what)  # type: ignore[arg-type]

    monkeypatch.setattr(Taps, "event", buggy)
    got: list[Frame] = []
    async with relay_thread() as carrier, trio.open_nursery() as nursery:
        assert carrier is not None
        h = QuickDial(nursery, slow_broker(got), real_socket_pair, real_socket_pair, carrier,
                      Taps([Metrics()]))  # fmt: skip
        h.start()
        with trio.fail_after(10):
            await open_producer(h)

        async def send_all() -> None:
            for sequence, size in enumerate(SIZES):
                try:
                    await h.client.send(send_frame(sequence, bytes([sequence % 251]) * size))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return  # (the connection ended)

        nursery.start_soon(send_all)
        with trio.move_on_after(20):  # a deadline: it hung for ever before
            await h.done.wait()
        died = carrier.died
        nursery.cancel_scope.cancel()
    assert raised, "no write finished on the relay thread"
    assert died is None  # the proxy goes on
    assert h.reason == "RuntimeError"
