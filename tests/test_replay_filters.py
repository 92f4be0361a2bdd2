"""`sluice replay` of a recording made through a message filter: the broker
is sent what it got when recorded (a changed SEND as changed, a refused one
not at all)."""

from __future__ import annotations

from pathlib import Path

import pulsar
import pytest

from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers.support import client, start_proxy
from tests.test_replay import replay

pytestmark = pytest.mark.e2e  # brokers, a proxy and replay run as processes

WORDS = 'tests.helpers.filters:Words:{"topics": ["*filtered-*"], "direction": "produce"}'
TOPIC = "persistent://public/default/filtered-replay"


def test_a_filtered_session_replays_as_the_broker_saw_it(tmp_path: Path) -> None:
    """A SEND the filter upper-cased and one it refused, then a consumer of
    all: replayed against a plain broker, the consumer gets what it got
    when recorded (before the fix: the original payload, and the refused
    message too)."""
    with EmbeddedBroker() as broker:
        proxy = start_proxy(broker.url, tmp_path, "--record", str(tmp_path / "rec"),
                            "--record-payloads", "full", "--filter", WORDS)  # fmt: skip
        try:
            with client(proxy.url) as c:
                producer = c.create_producer(TOPIC, batching_enabled=False)
                producer.send(b"plain")
                producer.send(b"shout this")
                with pytest.raises(pulsar.PulsarException):
                    producer.send(b"a bad word")
                producer.send(b"after")
                consumer = c.subscribe(TOPIC, "s", initial_position=pulsar.InitialPosition.Earliest)
                got = [consumer.receive(timeout_millis=5000).data() for _ in range(3)]
            assert got == [b"plain", b"SHOUT THIS", b"after"]
            assert proxy.terminate() == 0
        finally:
            proxy.kill()
    transcript = tmp_path / "transcript.txt"
    with EmbeddedBroker() as fresh:
        result = replay(tmp_path / "rec", fresh, "--transcript", str(transcript))
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 diverged, 0 missing, 0 unexpected" in result.stdout, result.stdout
    lines = transcript.read_text().splitlines()
    assert len([line for line in lines if "SENT AS FILTERED WHEN RECORDED" in line]) == 1, lines
    assert len([line for line in lines if " C→B NOT SENT " in line]) == 1, lines
    assert len([line for line in lines if " B→C INJECTED WHEN RECORDED " in line]) == 1, lines
