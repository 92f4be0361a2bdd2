"""Starting Sluice's Apache Pulsar broker (``ApachePulsar.start``) called
directly, not as a context manager, and interrupted (Ctrl-C) while the JVM
comes up: the JVM is stopped, not left running."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import FrameType

import pytest

from sluice.brokers.apache_pulsar import ApachePulsar
from tests.helpers.support import gone

pytestmark = pytest.mark.e2e  # starts a JVM (and stops it within a second)


def test_ctrl_c_while_the_broker_starts_stops_the_jvm(tmp_path: Path) -> None:
    broker = ApachePulsar(log_path=tmp_path / "broker.log", say=lambda text: None)
    started: list[int] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if broker.process is not None:  # launched, far from ready
            started.append(broker.process.pid)
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.005, 0.005)
    try:
        try:
            with pytest.raises(KeyboardInterrupt):
                broker.start()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert started and gone(started[0]), "the JVM was left running"
        assert broker.process is None
    finally:
        process = broker.process
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
        broker.close()
