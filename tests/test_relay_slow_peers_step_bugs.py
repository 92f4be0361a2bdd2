"""A bug (an exception, or a compiled panic: a BaseException) in a relay
thread step other than the guarded part of a read step ends that
connection as an internal error, both sides closed, and the proxy goes
on. Before, the thread's loop only dropped the step's descriptor: trio
never heard of it, and the connection (both sockets, its tasks, the
broker's side) hung for ever. Each step the relay gives the thread says
what ends its connection (``failed``), whichever loop runs it."""

from __future__ import annotations

import functools
import socket
import threading
import time

import pytest
import trio

from sluice.protocols.core import Taps
from sluice.proxy import relay_thread as relay_thread_module
from sluice.proxy.relay import Relay
from sluice.proxy.relay_thread import relay_thread
from tests.test_relay_clock import send_frame
from tests.test_relay_thread import OverSockets, ThreadWire, wire_producer

pytestmark = pytest.mark.e2e

LOOPS = ["compiled", "python"]


def _loop(loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if loop == "python":
        monkeypatch.setattr(relay_thread_module, "Carrier", None)
        monkeypatch.setattr(relay_thread_module, "Turn", None)
    else:
        assert vars(relay_thread_module)["Carrier"] is not None, "sluice._frames is not built"


@pytest.mark.parametrize("loop", LOOPS)
async def test_a_failing_write_step_is_given_to_its_failed_and_the_thread_goes_on(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _loop(loop, monkeypatch)
    writable, writable_peer = socket.socketpair()
    working, working_writer = socket.socketpair()
    told: list[BaseException] = []
    read = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def panics() -> None:
        raise BaseException("a panic, as PyO3 raises it")

    def reads() -> None:
        working.recv(100)
        token.run_sync_soon(read.set)

    with writable, writable_peer, working, working_writer, trio.fail_after(30):
        async with relay_thread() as thread:
            assert thread is not None
            thread.carry(working.fileno(), reads)
            thread.watch_writable(writable.fileno(), panics, told.append)
            while not told:  # polled, within fail_after's bound
                await trio.sleep(0.01)
            assert thread.carried() == 1  # the failed step dropped, the read kept
            working_writer.send(b"y")
            await read.wait()
            assert thread.died is None
    assert [str(exc) for exc in told] == ["a panic, as PyO3 raises it"]


@pytest.mark.parametrize("loop", LOOPS)
async def test_a_bug_in_a_read_step_outside_the_core_ends_its_connection(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _loop(loop, monkeypatch)
    c = OverSockets(Taps([]))
    c.core.quick = lambda from_client: None  # type: ignore[method-assign]
    trio_thread = threading.current_thread()
    carry_read = Relay._carry_read

    def buggy(self: Relay, *args: object) -> None:
        if threading.current_thread() is not trio_thread:
            raise RuntimeError("a bug in the relay thread's step")
        carry_read(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Relay, "_carry_read", buggy)
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
        with trio.move_on_after(20):  # a deadline: it hung for ever before
            reason = await relay.run()
        died = carrier.died
        nursery.cancel_scope.cancel()
    assert died is None  # the proxy goes on
    assert reason == "RuntimeError"
    assert closed == [True]
