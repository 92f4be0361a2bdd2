"""`sluice replay` of a recording made under fault rules: what a rule kept
from the broker (a request it dropped or answered itself) is not sent to
the live broker, and the answer Sluice wrote in its place is not expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers.support import client, start_proxy
from tests.test_replay import replay

pytestmark = pytest.mark.e2e  # brokers, a proxy and replay run as processes

TOPIC = "persistent://public/default/faulted"


def test_a_send_a_fault_rule_answered_is_not_sent_again(tmp_path: Path) -> None:
    """The second SEND is answered ServiceNotReady by the recording proxy
    (the broker never gets it) and the client sends it again. Replayed, the
    broker gets each message once, as when recorded: equivalent, and the
    transcript says which frame was not sent and which answer was Sluice's."""
    rules = tmp_path / "faults.json"
    rule = {"match": {"command": "SEND"}, "action": "error", "error": "ServiceNotReady",
            "after": 1, "times": 1}  # fmt: skip
    rules.write_text(json.dumps([rule]))
    with EmbeddedBroker() as broker:
        proxy = start_proxy(broker.url, tmp_path, "--record", str(tmp_path / "rec"),
                            "--record-payloads", "full", "--faults", str(rules))  # fmt: skip
        try:
            with client(proxy.url) as c:
                producer = c.create_producer(TOPIC, batching_enabled=False)
                for i in range(3):
                    producer.send(f"m{i}".encode())
            assert proxy.terminate() == 0
        finally:
            proxy.kill()
    transcript = tmp_path / "transcript.txt"
    with EmbeddedBroker() as fresh:
        result = replay(tmp_path / "rec", fresh, "--transcript", str(transcript))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "\nequivalent: " in result.stdout, result.stdout
    assert "note: 1 client frames were not sent" in result.stdout, result.stdout
    lines = transcript.read_text().splitlines()
    held = [line for line in lines if " C→B NOT SENT " in line]
    injected = [line for line in lines if " B→C INJECTED WHEN RECORDED " in line]
    assert len(held) == 1 and "SEND " in held[0] and "sequence_id: 1 " in held[0], held
    assert len(injected) == 1 and "SEND_ERROR" in injected[0], injected
    # Every receipt the live broker sent was for a SEND the recorded broker got.
    receipts = [line for line in lines if " B→C " in line and "SEND_RECEIPT" in line]
    assert len(receipts) == 3, lines
