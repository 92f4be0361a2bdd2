"""The ``SLUICE_DEFAULTS`` file is a layer of the settings below ``--config``:
a change to it alone is a reload, as one to the ``--config`` file is (it
was read again on SIGHUP and POST /config/reload, but its change went
unseen, and the edit waited for the next reload of another cause)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.brokers.embedded import free_port
from tests.helpers.support import http_get, start_proxy

pytestmark = pytest.mark.e2e

# The files are looked at every 2 s (server.CONFIG_CHECK_EVERY), then the
# reload itself; with workers, each makes it ready first.
IN_FORCE_WITHIN = 20.0


def config(admin: int) -> dict[str, Any] | None:
    """The admin endpoint's GET /config (None: not answering yet)."""
    try:
        status, body = http_get(f"http://127.0.0.1:{admin}/config")
    except OSError:
        return None
    answer: dict[str, Any] | None = json.loads(body) if status == 200 else None
    return answer


def wait_generation(admin: int, number: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (seen := config(admin)) is None or seen["generation"] != number:
        assert time.monotonic() < deadline, f"generation {number} not in force: {seen}"
        time.sleep(0.1)
    return seen


@pytest.mark.parametrize("workers", [1, 2])
def test_a_changed_defaults_file_is_reloaded(tmp_path: Path, workers: int) -> None:
    defaults = tmp_path / "defaults.toml"
    defaults.write_text("[proxy]\nmax-connections = 100\n")
    admin = free_port()
    # No broker is asked (--no-check-broker): the reload is the subject.
    proxy = start_proxy(f"pulsar://127.0.0.1:{free_port()}", tmp_path, "--no-check-broker",
                        "--admin", f"127.0.0.1:{admin}", "--workers", str(workers),
                        env={"SLUICE_DEFAULTS": str(defaults)})  # fmt: skip
    try:
        wait_generation(admin, 1, 30)
        if workers > 1:  # every worker running: a reload is put in force by all
            deadline = time.monotonic() + 30
            while proxy.log().count(") ready") < workers:
                assert time.monotonic() < deadline, proxy.log()
                time.sleep(0.1)
        part = defaults.with_suffix(".part")
        part.write_text("[proxy]\nmax-connections = 50\n")
        part.replace(defaults)  # as a ConfigMap's file changes: a new inode
        seen = wait_generation(admin, 2, IN_FORCE_WITHIN)
        assert seen["source"] == "file", seen
        assert "configuration reload (file): applied" in proxy.log()
        assert "--max-connections" in proxy.log()
    finally:
        code = proxy.terminate()
    assert code == 0, proxy.log()
