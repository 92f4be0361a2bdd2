"""``sluice replay --broker-tls-ca`` beside a broker URL without TLS (the
``+ssl`` forgotten): one line and status 2, not a plain replay that drops
the CA without a word."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sluice.brokers.embedded import free_port
from tests.test_replay_cli import connect_only

SLUICE = str(Path(sys.executable).with_name("sluice"))


@pytest.mark.e2e
def test_a_broker_ca_beside_a_plain_broker_url_is_a_usage_error(tmp_path: Path) -> None:
    recording = connect_only(tmp_path)
    ca = tmp_path / "ca.pem"
    ca.write_text("not read\n")
    broker = f"pulsar://127.0.0.1:{free_port()}"
    done = subprocess.run([SLUICE, "replay", "--broker", broker, "--broker-tls-ca", str(ca),
                           "--quiet", str(recording)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"sluice replay: --broker-tls-ca is for a broker reached over TLS; "
                           f"--broker {broker} is not one\n")  # fmt: skip
