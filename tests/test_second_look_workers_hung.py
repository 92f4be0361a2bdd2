"""``--workers``: the supervisor kills a worker that has answered none of
its readiness checks for ``HUNG_AFTER`` (hung: stuck, stopped,
deadlocked). A worker that is alive must not be killed by that rule, its
connections cut with it:

- one that answers every check, but later than the check's own limit
  (``SCRAPE_TIMEOUT``, 2 s: its loop busy under a heavy load) counted as
  silent for good and was killed after a minute;
- one check that spanned a pause of the whole machine or process group
  (``docker pause``, SIGSTOP, a VM paused: trio's clock runs on through
  it) made the supervisor kill at once every worker it was asking, each
  of which answered the very next check.

The supervisor's readiness loop alone, on trio's mock clock, with each
worker's admin endpoint played by a stand-in for ``http``."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import trio
import trio.testing

from sluice.addresses import Address
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy import workers
from sluice.proxy.config import ProxyConfig
from sluice.proxy.workers import HUNG_AFTER, SCRAPE_TIMEOUT, Supervisor


class _Process:
    returncode = None

    def __init__(self, pid: int) -> None:
        self.pid = pid


def _supervisor(count: int) -> tuple[Supervisor, list[str]]:
    config = ProxyConfig(broker=parse_broker_url("pulsar://127.0.0.1:6650"),
                         listen=Address("127.0.0.1", 0), admin=Address("127.0.0.1", 0))  # fmt: skip
    supervisor = Supervisor(config, count, log_level="warning")
    shutil.rmtree(supervisor._state, ignore_errors=True)  # (nothing here uses it)
    for worker in supervisor.workers:
        worker.process = _Process(1000 + worker.index)  # type: ignore[assignment]
        worker.admin = Address("127.0.0.1", 9000 + worker.index)
    killed: list[str] = []

    def kill_one(worker: workers.Worker, why: str) -> None:
        killed.append(f"worker {worker.index}: {why}")

    supervisor._kill_one = kill_one  # type: ignore[method-assign]
    return supervisor, killed


async def _watch(supervisor: Supervisor, seconds: float) -> None:
    with trio.move_on_after(seconds):
        await supervisor._watch_readiness()


def test_a_worker_that_answers_late_is_not_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every answer comes a second after the check's own limit."""
    supervisor, killed = _supervisor(1)

    async def http(address: Address, method: str, path: str, *args: Any, **kwargs: Any
                   ) -> tuple[int, bytes]:  # fmt: skip
        await trio.sleep(SCRAPE_TIMEOUT + 1)
        return 200, b"ready\n"

    monkeypatch.setattr(workers, "http", http)
    trio.run(_watch, supervisor, 3 * HUNG_AFTER,
             clock=trio.testing.MockClock(autojump_threshold=0))  # fmt: skip
    assert killed == []
    # Not ready meanwhile, as before: it did not answer within the limit.
    assert supervisor.workers[0].problem is not None


def test_a_check_across_a_pause_of_the_machine_kills_no_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The clock jumps past HUNG_AFTER while one check is on its way; the
    workers answer every other check at once."""
    supervisor, killed = _supervisor(2)
    clock = trio.testing.MockClock(autojump_threshold=0)
    paused = False

    async def http(address: Address, method: str, path: str, *args: Any, **kwargs: Any
                   ) -> tuple[int, bytes]:  # fmt: skip
        nonlocal paused
        if not paused and trio.current_time() > 10:
            paused = True
            clock.jump(2 * HUNG_AFTER)  # everything stopped, the clock ran on
            await trio.sleep(SCRAPE_TIMEOUT + 1)  # (its answer lost with the pause)
        return 200, b"ready\n"

    monkeypatch.setattr(workers, "http", http)
    trio.run(_watch, supervisor, 4 * HUNG_AFTER, clock=clock)
    assert paused
    assert killed == []
    assert [w.problem for w in supervisor.workers] == ["", ""]


def test_a_worker_that_answers_nothing_is_still_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    supervisor, killed = _supervisor(2)

    async def http(address: Address, method: str, path: str, *args: Any, **kwargs: Any
                   ) -> tuple[int, bytes]:  # fmt: skip
        if address.port == 9001:
            await trio.sleep_forever()
        return 200, b"ready\n"

    monkeypatch.setattr(workers, "http", http)
    trio.run(_watch, supervisor, HUNG_AFTER + 10,
             clock=trio.testing.MockClock(autojump_threshold=0))  # fmt: skip
    assert len(killed) >= 1, killed
    assert all(k.startswith("worker 1: answered no readiness check") for k in killed), killed
