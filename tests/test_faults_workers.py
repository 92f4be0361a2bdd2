"""Fault rules with ``--workers``: the supervisor's rule set and the workers'.

Runs the real ``sluice proxy`` (a supervisor and its workers) in front of the
pulsar-lite broker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.commands.faults import call
from tests.helpers.support import client, start_proxy, wait_ready, worker_pids

pytestmark = pytest.mark.e2e

TOKEN = "faults-workers-token"


def test_unnamed_rules_of_a_faults_file_have_the_same_id_on_the_supervisor_and_workers(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """A --faults rule without an id is named (file-1, …) where the
    supervisor and every worker see it alike: listed with its name and the
    workers' hits, removable by it, and a rule added next takes a name no
    worker holds already (it was listed as "" with no hits, and the next
    rule, f1, refused by workers that had named the file's rule f1)."""
    rules = tmp_path / "faults.json"
    rules.write_text(json.dumps([{"match": {"command": "LOOKUP"}, "action": "delay",
                                  "delay_ms": 1}]))  # fmt: skip
    token = tmp_path / "admin-token"
    token.write_text(TOKEN)
    admin = free_port()
    proxy = start_proxy(broker.url, tmp_path, "--workers", "2", "--admin", f"127.0.0.1:{admin}",
                        "--admin-token-file", str(token), "--drain-timeout", "1",
                        "--faults", str(rules))  # fmt: skip
    try:
        wait_ready(admin)
        where = f"127.0.0.1:{admin}"
        with client(proxy.url) as c:  # a lookup, on either worker: file-1 fires
            c.create_producer("persistent://public/default/faults-workers-ids").send(b"x")
        listed = call(where, "GET", "/faults")["rules"]
        assert [(r["id"], r["hits"]) for r in listed] == [("file-1", 1)], listed
        added = call(
            where, "POST", "/faults", TOKEN, {"action": "drop", "match": {"command": "PONG"}}
        )
        assert added["id"] == "f1"
        # Every worker holds both, under the supervisor's names.
        assert [r["id"] for r in call(where, "GET", "/faults")["rules"]] == ["file-1", "f1"]
        assert "refused fault rule" not in proxy.log(), proxy.log()
        assert call(where, "DELETE", "/faults/file-1", TOKEN) == {"deleted": 1}
        assert [r["id"] for r in call(where, "GET", "/faults")["rules"]] == ["f1"]
    finally:
        proxy.kill()
        for pid in worker_pids(proxy, 2, timeout=0).values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
