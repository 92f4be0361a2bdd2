"""A snapshot through a `--workers` supervisor that takes longer than an
admin request may take (a large ring, a slow volume) is still answered, as
a lone proxy's is: the supervisor's request was cut at the request's time
while its workers were still writing, and the caller got no answer (and
asked again: a second capture of the same moment). Real processes on
loopback, pulsar-lite as the broker; a sitecustomize shortens a request's
time to 1 s and makes each worker's snapshot write take 2 s."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers.support import wait_ready
from tests.test_flight_recorder import ring_proxy, snapshot_cli

pytestmark = pytest.mark.e2e

SITE = textwrap.dedent(
    """
    import time
    import sluice.proxy.admin as admin
    from sluice.recording import writer

    admin.TIMEOUT = 1.0
    snapshot = writer.Recorder.snapshot

    async def slow_snapshot(self, *args, **kwargs):
        import trio
        await trio.sleep(2.0)
        return await snapshot(self, *args, **kwargs)

    writer.Recorder.snapshot = slow_snapshot
    """
)


def test_a_slow_snapshot_through_the_supervisor_is_answered(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    proxy, admin, _ = ring_proxy(broker.url, tmp_path, "--record-ring", "1M", "--workers", "2",
                                 env={"PYTHONPATH": path})  # fmt: skip
    try:
        wait_ready(admin)
        taken = snapshot_cli(admin, tmp_path, "--reason", "slow", "--json")
    finally:
        proxy.kill()
    assert taken.returncode == 0, taken.stderr + proxy.log()
    answer = json.loads(taken.stdout)
    assert answer["workers"] == 2 and not answer["failed"], answer
