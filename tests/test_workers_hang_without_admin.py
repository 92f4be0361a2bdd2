"""``--workers`` without ``--admin``: a worker that hangs while it serves
(here stopped with SIGSTOP, its trio loop running no more) is killed and
restarted, as with ``--admin``. Before, the supervisor asked its workers
whether they were alive only through their private admin ports, opened
only behind its own: without ``--admin`` a hung worker kept its share of
the listening socket for good, and the clients it accepted hung with it.
(The supervisor as ``sluice proxy --workers 2`` runs it, in this process so
that ``HUNG_AFTER`` can be shortened; real worker processes on loopback,
pulsar-lite as the broker, every one stopped by PID.)

The rule is the one behind ``--admin``: on trio's mock clock, with each
worker's pipes played by a stand-in, one that answers every check late,
or whose check spanned a pause of the whole machine, is not killed; one
that answers none is."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
from collections.abc import Callable

import pytest
import trio
import trio.testing

from sluice.addresses import Address
from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy import workers
from sluice.proxy.config import ProxyConfig
from sluice.proxy.workers import HUNG_AFTER, SCRAPE_TIMEOUT, Supervisor
from tests.helpers.support import RawClient, gone

pytestmark = pytest.mark.e2e


def connects(port: int) -> bool:
    """A CONNECT through the proxy at ``port`` is answered CONNECTED."""
    with RawClient(port) as raw:
        return raw.connect().name == "CONNECTED"


async def test_a_hung_worker_is_replaced_without_admin(
    broker: EmbeddedBroker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(workers, "HUNG_AFTER", 3.0)
    monkeypatch.setattr(workers, "SCRAPE_TIMEOUT", 0.5)
    caplog.set_level(logging.INFO, "sluice.workers")
    config = ProxyConfig(broker=parse_broker_url(broker.url), listen=Address("127.0.0.1", 0),
                         drain_timeout=1)  # fmt: skip
    assert config.admin is None
    supervisor = Supervisor(config, 2, log_level="warning")
    await supervisor.open()
    assert "admin" not in supervisor.addresses
    port = supervisor.addresses["plain"].port
    worker = supervisor.workers[0]
    pids: list[int] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            with trio.fail_after(60):
                while not all(w.said_ready for w in supervisor.workers):
                    await trio.sleep(0.05)
                assert await trio.to_thread.run_sync(connects, port)
                pids += [w.process.pid for w in supervisor.workers if w.process is not None]
                assert worker.process is not None
                hung = worker.process.pid
                os.kill(hung, signal.SIGSTOP)
                assert await trio.to_thread.run_sync(connects, port)  # the other serves
                # Replaced: a new process, said ready, and the hung one gone.
                while not (
                    worker.process is not None and worker.process.pid != hung and worker.said_ready
                ):
                    await trio.sleep(0.05)
                pids.append(worker.process.pid)
                assert await trio.to_thread.run_sync(gone, hung)
                # Every connection is served: none lands on a hung worker.
                for _ in range(4):
                    assert await trio.to_thread.run_sync(connects, port)
            assert worker.restarts == 1
            assert supervisor.workers[1].restarts == 0
            said = [r.getMessage() for r in caplog.records if r.name == "sluice.workers"]
            assert any(
                f"worker 0 (pid {hung}) killed: answered no readiness check for" in line
                and "hung" in line
                for line in said
            ), said
            supervisor.stop()
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        supervisor.stop()


class _Process:
    """A worker's process: each check on its stdin (a real pipe) answered
    as ``answer`` says (the seconds it takes, or None: never), as the
    worker's loop and ``_read_pongs`` would."""

    returncode = None

    def __init__(self, worker: workers.Worker, answer: Callable[[int], float | None]) -> None:
        self.pid = 1000 + worker.index
        self.worker, self.answer = worker, answer
        self.read, write = os.pipe()
        self.stdin = trio.lowlevel.FdStream(write)

    async def answering(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                await trio.lowlevel.wait_readable(self.read)
                for byte in os.read(self.read, 64):
                    assert bytes([byte]) == workers._PING
                    delay = self.answer(self.worker.index)
                    if delay is not None:
                        nursery.start_soon(self.pong, delay)

    async def pong(self, delay: float) -> None:
        await trio.sleep(delay)
        self.worker.pong.set()


def _supervisor(count: int, answer: Callable[[int], float | None]) -> tuple[Supervisor, list[str]]:
    config = ProxyConfig(broker=parse_broker_url("pulsar://127.0.0.1:6650"),
                         listen=Address("127.0.0.1", 0))  # fmt: skip
    supervisor = Supervisor(config, count, log_level="warning")
    shutil.rmtree(supervisor._state, ignore_errors=True)  # (nothing here uses it)
    for worker in supervisor.workers:
        worker.process = _Process(worker, answer)  # type: ignore[assignment]
        worker.piped = True
    killed: list[str] = []

    def kill_one(worker: workers.Worker, why: str) -> None:
        killed.append(f"worker {worker.index}: {why}")

    supervisor._kill_one = kill_one  # type: ignore[method-assign]
    return supervisor, killed


def _watch(supervisor: Supervisor, seconds: float, clock: trio.testing.MockClock) -> None:
    async def watch() -> None:
        async with trio.open_nursery() as nursery:
            for worker in supervisor.workers:
                nursery.start_soon(worker.process.answering)  # type: ignore[union-attr]
            with trio.move_on_after(seconds):
                await supervisor._watch_readiness()
            nursery.cancel_scope.cancel()
        for worker in supervisor.workers:
            os.close(worker.process.read)  # type: ignore[union-attr]
            await worker.process.stdin.aclose()  # type: ignore[union-attr]

    trio.run(watch, clock=clock)


def test_a_worker_that_answers_late_over_its_pipes_is_not_killed() -> None:
    supervisor, killed = _supervisor(1, lambda index: SCRAPE_TIMEOUT + 1)
    _watch(supervisor, 3 * HUNG_AFTER, trio.testing.MockClock(autojump_threshold=0))
    assert killed == []
    assert supervisor.workers[0].problem is not None  # not ready in time, as with --admin


def test_a_check_over_the_pipes_across_a_pause_of_the_machine_kills_no_worker() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    paused = False

    def answer(index: int) -> float | None:
        nonlocal paused
        if not paused and trio.current_time() > 10:
            paused = True
            clock.jump(2 * HUNG_AFTER)  # everything stopped, the clock ran on
            return None  # (its answer lost with the pause)
        return 0.0

    supervisor, killed = _supervisor(2, answer)
    _watch(supervisor, 4 * HUNG_AFTER, clock)
    assert paused
    assert killed == []
    assert [w.problem for w in supervisor.workers] == ["", ""]


def test_a_worker_that_answers_nothing_over_its_pipes_is_killed() -> None:
    supervisor, killed = _supervisor(2, lambda index: None if index == 1 else 0.0)
    _watch(supervisor, HUNG_AFTER + 10, trio.testing.MockClock(autojump_threshold=0))
    assert len(killed) >= 1, killed
    assert all(k.startswith("worker 1: answered no readiness check") for k in killed), killed
