"""`sluice replay` of a recording whose CONNECT names the broker in bytes that
are not UTF-8 (a damaged byte in a real client's ``proxy_to_broker_url``):
replayed, never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from sluice.recording import format as fmt
from sluice.recording.format import read_records, recording_files
from tests.helpers.support import SLUICE, client, recorded_session

TOPIC = "persistent://public/default/review-damaged-url"


def produce(url: str) -> None:
    with client(url) as c:
        c.create_producer(TOPIC, batching_enabled=False).send(b"one")


@pytest.mark.e2e
def test_a_broker_url_that_is_not_utf8_is_replayed_without_a_traceback(tmp_path: Path) -> None:
    recording = recorded_session(tmp_path, produce)
    out = tmp_path / "damaged"
    out.mkdir()
    damaged = 0
    for path in recording_files(recording):
        records = list(read_records(path))
        for record in records:
            if record["k"] == "frame" and record["s"]["cmd"] == "CONNECT":
                raw = bytes(record["raw"])
                at = raw.find(b"127.0.0.1:")  # the proxy_to_broker_url a proxied CONNECT names
                if at >= 0:
                    record["raw"] = raw[:at] + b"\xff" + raw[at + 1 :]
                    damaged += 1
        (out / path.name).write_bytes(fmt.dumps(records))
    assert damaged == 1
    with EmbeddedBroker() as fresh:
        result = subprocess.run(
            [*SLUICE, "replay", str(out), "--broker", fresh.url, "--timeout", "3"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    assert "equivalent" in result.stdout, result.stdout
