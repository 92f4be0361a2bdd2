"""Signals to a ``--workers`` proxy as a terminal or a service manager
sends them: to every process of the proxy at once (Ctrl-C reaches the
terminal's foreground process group; systemd's stop, by default, signals
every process of the unit; dumb-init signals its process group)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import pulsar
import pytest

from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers.support import QUIET, start_proxy, worker_pids

pytestmark = pytest.mark.e2e


def test_ctrl_c_to_every_process_drains_each_worker(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    """Each worker is signalled by the terminal and told to drain by the
    supervisor: it drains, once. (The supervisor's SIGTERM was a second
    signal to it, and it stopped at once, cutting its drain short.)"""
    proxy = start_proxy(broker.url, tmp_path, "--workers", "2", "--drain-timeout", "5",
                        preexec=os.setsid)  # fmt: skip
    pids: dict[int, int] = {}
    clients = []
    try:
        pids = worker_pids(proxy, 2)
        assert len(pids) == 2, proxy.log()
        for _ in range(2):  # connections to drain
            clients.append(pulsar.Client(proxy.url, logger=QUIET))
            clients[-1].create_producer(topic, batching_enabled=False).send(b"m")
        os.killpg(proxy.pid, signal.SIGINT)  # Ctrl-C
        assert proxy.process.wait(timeout=15) == 0, proxy.log()
        log = proxy.log()
        assert "second signal" not in log, log
        # Each worker drained once, on whichever came first: the terminal's
        # signal or the supervisor's word.
        drained = re.findall(
            r" w(\d) sluice\.workers: (?:SIGINT|the supervisor drains): draining", log
        )
        assert sorted(drained) == ["0", "1"], log
    finally:
        for c in clients:
            c.close()
        proxy.kill()
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
