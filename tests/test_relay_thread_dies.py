"""The relay thread's loop dying (a bug: a panic in the compiled step, an
error of the loop's own) stops the proxy with an error instead of leaving
trio running and every carried connection hanging unread. The real loop
is made to fail for real: its epoll descriptor closed under it, so its
next wait fails. (That the compiled loop gives the turn back when a step
panics, which no input makes it do, is rust/src/tests.rs's.)"""

from __future__ import annotations

import socket

import pytest
import trio

from sluice.proxy import relay_thread as relay_thread_module
from sluice.proxy.relay_thread import RelayThread, RelayThreadDied, relay_thread


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
async def test_a_relay_thread_whose_loop_dies_ends_the_proxys_block_with_an_error(
    compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if compiled:
        assert vars(relay_thread_module)["Carrier"] is not None, "sluice._frames is not built"
    else:  # the loop of a tree nobody built
        monkeypatch.setattr(relay_thread_module, "Carrier", None)
    ran: RelayThread | None = None
    carried, writer = socket.socketpair()

    def step() -> None:
        carried.recv(100)

    with carried, writer, trio.fail_after(60):  # a deadline, not a timing: it hung before
        with pytest.raises(RelayThreadDied, match="relay thread died"):
            async with relay_thread() as thread:
                assert thread is not None
                ran = thread
                thread.carry(carried.fileno(), step)
                # Its next wait fails (a wait going on ends with the read).
                thread._epoll.close()
                writer.send(b"x")
                await trio.sleep_forever()
        assert ran is not None and ran.died is not None


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
async def test_a_read_step_raising_a_base_exception_is_dropped_and_the_thread_goes_on(
    compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiled step's panic reaches Python as a BaseException: both loops
    take it as any read step's error (logged, its descriptor dropped)."""
    if not compiled:
        monkeypatch.setattr(relay_thread_module, "Carrier", None)
    broken, broken_writer = socket.socketpair()
    working, working_writer = socket.socketpair()
    read = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def panics() -> None:
        broken.recv(100)
        raise BaseException("a panic, as PyO3 raises it")

    def reads() -> None:
        working.recv(100)
        token.run_sync_soon(read.set)

    with broken, broken_writer, working, working_writer, trio.fail_after(60):
        async with relay_thread() as thread:
            assert thread is not None
            thread.carry(broken.fileno(), panics)
            thread.carry(working.fileno(), reads)
            broken_writer.send(b"x")
            while thread.carried() == 2:  # until the failed step is dropped
                await trio.sleep(0.01)
            working_writer.send(b"y")
            await read.wait()
            assert thread.died is None
