"""`sluice proxy --workers N` whose workers cannot start at all: the proxy
says so and exits non-zero, as a lone proxy that cannot start does, rather
than holding the port open with nobody to serve it (real processes on
loopback, pulsar-lite as the broker, every process stopped by PID)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import textwrap
import time
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers.support import start_proxy

pytestmark = pytest.mark.e2e

# Every worker process dies as it starts (exit code 3), the supervisor not:
# a worker's command line is the one `python -c` that imports its main.
# (What a broken install or a limit only new processes hit does alike.)
SITE = textwrap.dedent(
    """
    import os, sys
    if "from sluice.proxy.workers import main" in " ".join(getattr(sys, "orig_argv", [])):
        os._exit(3)
    """
)


def test_workers_that_never_start_end_the_proxy_with_an_error(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """The supervisor restarted them for ever (every 30 s in the end) and
    kept the port bound: a TCP probe, or a client, connected to it and
    then waited on a backlog nobody would ever take, and the service
    manager saw a process running. Now, when no worker has ever said it is
    ready and each has failed to start three times, it stops, saying why,
    with exit code 1."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    proxy = start_proxy(broker.url, tmp_path, "--workers", "2", wait=False,
                        env={"PYTHONPATH": path})  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while proxy.process.poll() is None:
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.1)
        log = proxy.log()
        assert proxy.process.returncode == 1, log
        assert "worker 0 exited (exit code 3)" in log, log
        assert "no worker could start" in log, log
        assert "Traceback" not in log, log
        # The port is free for the next try.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", proxy.port))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proxy.pid, signal.SIGKILL)
        proxy.process.wait(10)
