"""A port left in TIME_WAIT (a previous run's connection, closed from the
port's side): pulsar-lite binds its port with SO_REUSEADDR, so it can
listen there; the embedded broker's check of whether a failed start lost
its port to another process (``_in_use``, which decides whether the start
is tried again on a port drawn anew) said such a port taken, as a bind
without SO_REUSEADDR does. (``free_port`` draws strictly, on purpose.)"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.brokers import embedded
from sluice.brokers.embedded import EmbeddedBroker, free_port

pytestmark = pytest.mark.e2e  # sockets on loopback, and a broker


def _time_wait(port: int) -> bool:
    """Whether a socket of 127.0.0.1:``port`` is in TIME_WAIT (/proc)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "06" and fields[1] == f"0100007F:{port:04X}":
            return True
    return False


@pytest.fixture
def left_in_time_wait() -> Iterator[int]:
    """A loopback port whose last connection was closed from its side first
    (so its socket waits in TIME_WAIT), and nothing listening on it."""
    for _ in range(5):
        port = free_port()
        try:
            listener = socket.create_server(("127.0.0.1", port))
        except OSError:
            continue  # taken meanwhile
        break
    else:  # pragma: no cover
        pytest.fail("no port to listen on")
    with listener, socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        accepted, _ = listener.accept()
        accepted.close()  # the port's side closes first: it is the one left in TIME_WAIT
        assert client.recv(1) == b""
    deadline = time.monotonic() + 5
    while not _time_wait(port):
        assert time.monotonic() < deadline, "no socket of the port went to TIME_WAIT"
        time.sleep(0.02)
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # what a check without SO_REUSEADDR meets
    yield port


def test_the_broker_listens_on_a_port_in_time_wait(left_in_time_wait: int) -> None:
    broker = EmbeddedBroker(port=left_in_time_wait)
    try:
        broker.start()
        with socket.create_connection(broker.address, timeout=5):
            pass
    finally:
        broker.stop()


def test_a_port_in_time_wait_is_not_said_in_use(left_in_time_wait: int) -> None:
    assert not embedded._in_use("127.0.0.1", left_in_time_wait)


def test_a_listening_port_is_still_said_taken() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:  # (SO_REUSEADDR, as servers bind)
        port = busy.getsockname()[1]
        assert embedded._in_use("127.0.0.1", port)
