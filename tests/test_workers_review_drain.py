"""`sluice proxy --workers N` stopping: a worker that does not finish its
drain is killed, and the log says which one and why (real processes on
loopback, pulsar-lite as the broker, every process stopped by PID)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers.support import kill_with_workers, start_proxy, wait_stopped, worker_pids

pytestmark = pytest.mark.e2e


def test_a_worker_killed_for_not_draining_in_time_is_named_in_the_log(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """Worker 0 hangs (SIGSTOP) as the supervisor drains: once the drain
    timeout and the five seconds after it have passed, the supervisor
    kills it. It said nothing of it: the log ended `stopped` as after a
    clean drain, and whoever reads it after a stop that took six seconds
    instead of none could not tell that a worker was killed, nor which."""
    proxy = start_proxy(broker.url, tmp_path, "--workers", "2", "--drain-timeout", "1")
    pids: dict[int, int] = {}
    try:
        pids = worker_pids(proxy, 2)
        assert len(pids) == 2, proxy.log()
        os.kill(pids[0], signal.SIGSTOP)
        wait_stopped(pids[0], 10)
        started = time.monotonic()
        proxy.process.send_signal(signal.SIGTERM)
        proxy.process.wait(30)
        took = time.monotonic() - started
        assert 1 + 5 - 0.5 < took < 1 + 5 + 5, took  # the drain timeout, then five seconds
        log = proxy.log()
        assert f"worker 0 (pid {pids[0]}) killed: did not finish draining within 6s" in log, log
        assert "worker 1 (pid" not in log.split("draining 2 workers")[1], log  # it drained
        with pytest.raises(ProcessLookupError):  # killed, and reaped
            os.kill(pids[0], 0)
    finally:
        kill_with_workers(proxy, pids)
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):  # (killed, if stopped)
                os.kill(pid, signal.SIGKILL)
