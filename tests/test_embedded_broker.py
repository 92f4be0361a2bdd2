"""The embedded pulsar-lite broker (``EmbeddedBroker``) as ``sluice demo``
and the tests start it: a port drawn free and taken before the broker
binds it, and a start interrupted (Ctrl-C) while the broker comes up."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers.poll import wait_until
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


# What pulsar-lite says it listens on: "Metrics endpoint listening on
# http://0.0.0.0:8080/metrics", "Server listening on 127.0.0.1:6650" (the
# last line of its start-up, once every listener is set up).
ANNOUNCED = re.compile(r"listening on (?:\w+://)?\[?([^\s/\]]+?)\]?:(\d+)\b")


def _announced(broker: EmbeddedBroker) -> set[tuple[str, int]] | None:
    """Every address the broker's log says it listens on, once its start-up
    has ended (None until then)."""
    log = broker.log_path.read_text(errors="replace")
    if f"Server listening on {broker.host}:{broker.port}" not in log:
        return None
    return {(host, int(port)) for host, port in ANNOUNCED.findall(log)}


def _hex_address(host: str) -> str:
    """``host`` (IPv4) as /proc/net/tcp writes it: 127.0.0.1 is 0100007F."""
    return socket.inet_aton(host)[::-1].hex().upper()


def test_the_broker_listens_on_its_loopback_port_only() -> None:
    """pulsar-lite's own metrics endpoint listened on 0.0.0.0:8080 for
    every demo's and test's broker: a port on every interface, which
    nobody here reads, and one the user's own services may want.

    The broker is taken as started once its start-up has ended, and every
    listener it announced is seen bound: one that binds after the broker's
    port (the metrics endpoint may) is seen, not raced."""
    with EmbeddedBroker() as broker:
        pid = broker.pid
        assert pid is not None
        announced = wait_until(
            lambda: _announced(broker), 10, "the broker's start-up to end", step=0.02
        )
        assert (broker.host, broker.port) in announced, announced
        wanted = {(_hex_address(host), port) for host, port in announced}
        ports = wait_until(
            lambda: (found := _listening_ports(pid)) >= wanted and found,
            10,
            f"the broker to bind what it announced, {sorted(announced)}",
            step=0.02,
        )
        assert announced == {(broker.host, broker.port)}, announced
        assert ports == {(_hex_address(broker.host), broker.port)}, ports
