"""``sluice proxy --workers`` with a count no machine runs (a typo, a
stray digit): one line and status 2 at once, not a supervisor that
builds a table of that many workers until memory runs out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sluice.brokers.embedded import free_port
from sluice.commands.proxy import MAX_WORKERS

SLUICE = str(Path(sys.executable).with_name("sluice"))


@pytest.mark.e2e
@pytest.mark.parametrize("count", ["99999999999999999999999", str(MAX_WORKERS + 1)])
def test_a_worker_count_past_the_bound_is_refused_at_once(count: str) -> None:
    argv = [SLUICE, "proxy", "--listen", f"127.0.0.1:{free_port()}", "--no-check-broker",
            "--broker", "pulsar://127.0.0.1:1", "--workers", count]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"--workers {count}: still starting after 30 s")
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"sluice proxy: --workers must be at most {MAX_WORKERS}, not {count}\n"
