"""``sluice demo --embedded apache-pulsar --port P`` with P taken: the one
line that says so comes before the broker is started, not after a JVM was
brought up for nothing (seconds on a quiet machine, a minute on a busy one)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from sluice.brokers.embedded import free_port

pytestmark = pytest.mark.e2e  # runs the sluice command (and, unfixed, a JVM)


@pytest.mark.parametrize("flag", ["--port", "--admin-port"])
def test_a_busy_port_is_said_before_the_broker_starts(flag: str) -> None:
    other = "--admin-port" if flag == "--port" else "--port"
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "sluice", "demo", "--embedded", "apache-pulsar",
             "--messages", "2", flag, str(port), other, str(free_port())],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=240,
        )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "ready on" not in result.stderr, "the broker was started first"
    lines = [x for x in result.stderr.splitlines() if not x.startswith("[demo] ")]
    assert lines == [
        f"sluice demo: cannot listen on 127.0.0.1:{port} ({flag}): address already in use"
    ], result.stderr
