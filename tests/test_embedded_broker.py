"""The embedded pulsar-lite broker (``EmbeddedBroker``) as ``sluice demo``
and the tests start it: a port drawn free and taken before the broker
binds it, and a start interrupted (Ctrl-C) while the broker comes up."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers.support import gone

pytestmark = pytest.mark.e2e  # each starts a broker


@contextlib.contextmanager
def _kill_after(broker: EmbeddedBroker) -> Iterator[None]:
    """Whatever happens, the broker's process is killed by its PID."""
    try:
        yield
    finally:
        process = broker.process
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


def test_a_drawn_port_taken_before_the_broker_binds_it_is_drawn_again() -> None:
    broker = EmbeddedBroker()
    taken = broker.port
    with socket.create_server(("127.0.0.1", taken)), _kill_after(broker), broker:
        assert broker.port != taken
        with socket.create_connection(broker.address, timeout=5):
            pass
    assert not broker.data_dir.exists()


def test_a_port_asked_for_and_taken_is_an_error_naming_it() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        broker = EmbeddedBroker(port=port)
        with _kill_after(broker), pytest.raises(Exception, match="before listening"):
            broker.start()
    assert broker.port == port and broker.process is None


def test_ctrl_c_while_the_broker_starts_stops_it_and_removes_its_data() -> None:
    broker = EmbeddedBroker()
    started: list[int] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if broker.process is not None:  # launched, not yet listening (or just)
            started.append(broker.process.pid)
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
    with _kill_after(broker):  # (after the checks)
        try:
            with pytest.raises(KeyboardInterrupt), broker:
                pytest.fail("started before the interrupt")  # pragma: no cover
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert started and gone(started[0]), "the broker was left running"
        assert not broker.data_dir.exists()


def _listening_ports(pid: int) -> set[tuple[str, int]]:
    """The TCP addresses process ``pid`` listens on (from /proc: its
    sockets' inodes, looked up in /proc/net/tcp and tcp6)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                address, port = fields[1].rsplit(":", 1)
                found.add((address, int(port, 16)))
    return found


def test_the_broker_listens_on_its_loopback_port_only() -> None:
    """pulsar-lite's own metrics endpoint listened on 0.0.0.0:8080 for
    every demo's and test's broker: a port on every interface, which
    nobody here reads, and one the user's own services may want."""
    with EmbeddedBroker() as broker:
        assert broker.pid is not None
        deadline = time.monotonic() + 5
        while not (ports := _listening_ports(broker.pid)):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert {port for _, port in ports} == {broker.port}, ports
        assert all(address == "0100007F" for address, _ in ports), ports  # 127.0.0.1
