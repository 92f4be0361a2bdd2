"""`sluice analyze --remote`: a Spark Connect server that is not there is said at once.

Spark Connect's client retries a call nobody answers for ten minutes and
more; `sluice analyze` says in one line that nothing is listening, and exits."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from sluice.analyze.job import Unreachable, check_reachable
from tests.helpers.support import SLUICE


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_server_not_listening_is_unreachable() -> None:
    port = closed_port()
    with pytest.raises(Unreachable, match=f"cannot connect to 127.0.0.1:{port} "):
        check_reachable(f"sc://127.0.0.1:{port}")


def test_a_listening_server_is_reachable() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"sc://127.0.0.1:{server.getsockname()[1]}/;use_ssl=false")


def test_a_url_without_a_host_is_said_so() -> None:
    with pytest.raises(Unreachable, match="no host in it"):
        check_reachable("sc://:15002")


@pytest.mark.e2e
def test_analyze_through_a_server_that_is_not_there_fails_at_once(tmp_path: Path) -> None:
    port = closed_port()
    started = time.monotonic()
    result = subprocess.run(
        [*SLUICE, "analyze", str(tmp_path), "--out", str(tmp_path / "out"),
         "--remote", f"sc://127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert time.monotonic() - started < 30
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"sluice analyze: --remote sc://127.0.0.1:{port}: cannot connect to 127.0.0.1:{port} "
        "(Connection refused)\n"
    )
