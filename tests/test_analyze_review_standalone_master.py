"""`sluice analyze --master spark://HOST:PORT`: a master not there is said at once.

Spark's client tries a standalone master nobody listens at for over a
minute, prints a hundred lines of Java traces, and ends with ``Cannot call
methods on a stopped SparkContext``. As for ``--remote``, it is said in one
line before Spark starts (exit 2)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sluice.analyze.job import Unreachable, check_master_reachable
from tests.helpers.support import SLUICE

GOLDEN = Path(__file__).parent / "golden" / "analyze" / "inputs"
SMALL = GOLDEN / "sluice-20261128T172607-bf2cfe0d70e7-0001.sluice"


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_standalone_master_not_listening_is_unreachable() -> None:
    port = closed_port()
    with pytest.raises(Unreachable, match=f"cannot connect to 127.0.0.1:{port} "):
        check_master_reachable(f"spark://127.0.0.1:{port}")


def test_a_standalone_master_listening_is_reachable() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        check_master_reachable(f"spark://127.0.0.1:{port}")
        # High availability: one of the masters listening is enough.
        check_master_reachable(f"spark://127.0.0.1:{closed_port()},127.0.0.1:{port}")


def test_other_masters_are_not_checked_here() -> None:
    check_master_reachable(None)
    check_master_reachable("local[2]")
    check_master_reachable("yarn")


@pytest.mark.e2e
def test_a_standalone_master_not_there_is_one_line_at_once(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(SMALL, inputs / SMALL.name)
    port = closed_port()
    started = time.monotonic()
    result = subprocess.run(
        [*SLUICE, "analyze", str(inputs), "--out", str(tmp_path / "out"),
         "--master", f"spark://127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.stderr == (
        f"sluice analyze: --master spark://127.0.0.1:{port}: cannot connect to "
        f"127.0.0.1:{port} (Connection refused)\n"
    )
    assert result.returncode == 2
    assert time.monotonic() - started < 30
