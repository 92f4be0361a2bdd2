"""A compiled step's panic (PyO3 raises it as ``PanicException``, a
BaseException, not an Exception) on the relay thread ends that connection
as an internal error, both sides closed, and the proxy goes on. Before,
the relay's read step let it through to the thread's loop, which dropped
the descriptor: trio never heard of it, and the connection hung open, its
client and broker held, for ever. No input makes the step panic, so the
step here raises as PyO3 would; the relay, its core, the relay thread and
the sockets are real."""

from __future__ import annotations

import functools
import time

import pytest
import trio

from sluice.protocols.core import Taps
from sluice.proxy.relay_thread import relay_thread
from tests.test_relay_clock import send_frame
from tests.test_relay_thread import (
    OverSockets,
    ThreadWire,
    needs_the_compiled_step,
    wire_producer,
)


class PanicException(BaseException):
    """What PyO3 raises for a Rust panic (pyo3_runtime.PanicException)."""


class Panics:
    """A compiled step whose every read panics."""

    def carry(self, source: int, sink: int, from_client: bool, now: float) -> object:
        raise PanicException("a bug in the compiled step")


@pytest.mark.parametrize("loop", ["compiled", "python"])
async def test_a_step_that_panics_on_the_relay_thread_ends_its_connection(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_the_compiled_step()
    if loop == "python":
        from sluice.proxy import relay_thread as relay_thread_module

        monkeypatch.setattr(relay_thread_module, "Carrier", None)
        monkeypatch.setattr(relay_thread_module, "Turn", None)
    c = OverSockets(Taps([]))
    reason = "still open after 20 s"
    c.core.quick = lambda from_client: Panics()  # type: ignore[method-assign,assignment,return-value]
    closed: list[bool] = []

    def client() -> None:
        wire = ThreadWire(c.client_sock)
        with c.client_sock:
            wire_producer(wire)
            # Enough reads for the direction to go to the relay thread,
            # whose first read panics.
            for sequence in range(20):
                try:
                    wire.send(send_frame(sequence, b"x" * 20_000))
                except OSError:
                    break
                wire.receive(0.1)
            # Then the connection's end (bounded: it never came before).
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    if not c.client_sock.recv(65536):
                        closed.append(True)
                        return
                except TimeoutError:
                    continue
                except OSError:
                    closed.append(True)
                    return

    async with relay_thread() as carrier, trio.open_nursery() as nursery:
        assert carrier is not None
        relay = c.relay(carrier)
        nursery.start_soon(functools.partial(trio.to_thread.run_sync, client,
                                             abandon_on_cancel=True))  # fmt: skip
        with trio.move_on_after(20):  # a deadline: it hung for ever before
            reason = await relay.run()
        died = carrier.died
        nursery.cancel_scope.cancel()
    assert died is None  # the proxy goes on
    assert reason == "RuntimeError"
    assert closed == [True]


async def test_a_panic_in_the_core_on_the_relay_thread_ends_its_connection() -> None:
    """The relay thread's Python read step (no compiled step: a tap that
    is not the metrics, a filter) runs the core, whose frame scanning is
    compiled: a panic there is no Exception either, and must end the
    connection as an error, not hang it."""
    import threading

    c = OverSockets(Taps([]))
    c.core.quick = lambda from_client: None  # type: ignore[method-assign]
    receive = c.core.receive_client
    trio_thread = threading.current_thread()

    def panics_on_the_relay_thread(data: bytes, now: float) -> object:
        if threading.current_thread() is not trio_thread:
            raise PanicException("a bug in the compiled frame scanner")
        return receive(data, now)

    c.core.receive_client = panics_on_the_relay_thread  # type: ignore[method-assign,assignment]
    reason = "still open after 20 s"
    closed: list[bool] = []

    def client() -> None:
        wire = ThreadWire(c.client_sock)
        with c.client_sock:
            wire_producer(wire)
            for sequence in range(20):
                try:
                    wire.send(send_frame(sequence, b"x" * 20_000))
                except OSError:
                    break
                wire.receive(0.1)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    if not c.client_sock.recv(65536):
                        closed.append(True)
                        return
                except TimeoutError:
                    continue
                except OSError:
                    closed.append(True)
                    return

    async with relay_thread() as carrier, trio.open_nursery() as nursery:
        assert carrier is not None
        relay = c.relay(carrier)
        nursery.start_soon(functools.partial(trio.to_thread.run_sync, client,
                                             abandon_on_cancel=True))  # fmt: skip
        with trio.move_on_after(20):
            reason = await relay.run()
        died = carrier.died
        nursery.cancel_scope.cancel()
    assert died is None
    assert reason == "RuntimeError"
    assert closed == [True]
