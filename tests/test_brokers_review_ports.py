"""Apache Pulsar started on ports drawn free, one of them taken by another
process before the JVM binds it (the JVM takes seconds to get there): the
broker is started again on ports drawn anew, as pulsar-lite's is, rather
than the start failing ("broker exited with status 1 before listening")."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sluice.brokers.apache_pulsar import ApachePulsar

pytestmark = pytest.mark.e2e  # starts a JVM


def test_a_drawn_port_taken_before_the_broker_binds_it_is_drawn_again(tmp_path: Path) -> None:
    broker = ApachePulsar(log_path=tmp_path / "broker.log", say=lambda text: None)
    taken = broker.port
    try:
        with socket.create_server(("127.0.0.1", taken)), broker:
            assert broker.port != taken
            with socket.create_connection(broker.address, timeout=5):
                pass
        assert broker.process is None
    finally:
        broker.close()  # (by PID; nothing left if it started and stopped)
