"""`sluice proxy --workers N` restarting a worker: a restart that cannot be
made now (no process, no pipe) is tried again, and the proxy goes on
serving with the workers it has (real processes on loopback, pulsar-lite as
the broker, every process stopped by PID)."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import time
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers.support import client, kill_with_workers, start_proxy, worker_pids

pytestmark = pytest.mark.e2e


def _started(log: str, index: int) -> list[int]:
    return [int(pid) for pid in re.findall(rf"worker {index} \(pid (\d+)\) ready", log)]


def test_a_restart_that_cannot_make_its_process_is_tried_again_and_the_proxy_serves_on(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    """Worker 1 is killed while the supervisor cannot make a new process
    (its open-files limit lowered, with prlimit, to the descriptors it has:
    the pipes to a new worker fail, as fork does under a pids limit or
    without memory). The OSError ended the supervisor (exit 70, `internal
    error`), SIGKILLing the healthy worker 0 and its clients with it. The
    supervisor is to say that worker 1 could not be started, keep serving
    through worker 0, and start worker 1 once it can."""
    proxy = start_proxy(broker.url, tmp_path, "--workers", "2", "--drain-timeout", "2")
    pids: dict[int, int] = {}
    started: list[int] = []
    try:
        pids = worker_pids(proxy, 2)
        assert len(pids) == 2, proxy.log()
        limit = resource.prlimit(proxy.pid, resource.RLIMIT_NOFILE)
        top = max(int(fd) for fd in os.listdir(f"/proc/{proxy.pid}/fd"))
        resource.prlimit(proxy.pid, resource.RLIMIT_NOFILE, (top + 1, limit[1]))
        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while "worker 1 could not be started" not in proxy.log():
            assert proxy.process.poll() is None, proxy.log()
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.05)
        # Still serving, through worker 0 (each connection is its now).
        with client(proxy.url) as c:
            c.create_producer(topic).send(b"while worker 1 cannot be started")
        assert proxy.process.poll() is None, proxy.log()
        os.kill(pids[0], 0)  # alive
        resource.prlimit(proxy.pid, resource.RLIMIT_NOFILE, limit)
        while len(started := _started(proxy.log(), 1)) < 2:
            assert proxy.process.poll() is None, proxy.log()
            assert time.monotonic() < deadline + 30, proxy.log()
            time.sleep(0.05)
        assert _started(proxy.log(), 0) == [pids[0]]
        assert "Traceback" not in proxy.log()
        assert proxy.terminate() == 0
    finally:
        kill_with_workers(proxy, pids)
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
