"""Idle and slow peers: a thousand idle connections cost little memory,
connections that never finish CONNECT are dropped after
--handshake-timeout. (A consumer that stops reading: see
tests/test_proxy_e2e.py::test_stalled_consumer_does_not_grow_proxy_memory.)"""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.pulsar import NEED_DATA, Frame, FrameDecoder, Type, command, encode
from tests.helpers.reliability import (
    AdminProxy,
    open_fds,
    peak_rss_bytes,
    rss_bytes,
    start_admin_proxy,
    wait_until,
)
from tests.reliability.test_fuzz_port import connect_frame

PONG = encode(command(Type.Value("PONG")))
# Short enough that lookup connections get pinged within the test, long enough
# that a loaded 2-core machine answers in time (the proxy closes a lookup
# connection silent for two intervals; a ping goes out after one to 1.5).
KEEPALIVE = 4.0


def raise_fd_limit(want: int) -> None:
    """At least ``want`` open files for this process (and children started after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft >= want, f"ulimit -n is {soft}: the test needs {want} open files"


class Holder:
    """Many connections that said CONNECT, then only answer PINGs."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.decoders: dict[socket.socket, FrameDecoder] = {}
        self.connected = 0
        self.pings = 0
        self.lost = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def open(self, port: int, count: int, proxy_to: str | None = None) -> None:
        hello = connect_frame(proxy_to)
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(hello)
            sock.setblocking(False)
            self.decoders[sock] = FrameDecoder()
            self.selector.register(sock, selectors.EVENT_READ)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, _ in self.selector.select(0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                decoder = self.decoders[sock]
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                decoder.receive_data(data)
                if not data:
                    self.lost += 1
                    self.selector.unregister(sock)
                    continue
                while isinstance(event := decoder.next_event(), Frame):
                    if event.name == "CONNECTED":
                        self.connected += 1
                    elif event.name == "PING":
                        self.pings += 1
                        sock.setblocking(True)
                        sock.sendall(PONG)
                        sock.setblocking(False)
                assert event is NEED_DATA or not data

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.decoders:
            sock.close()
        self.selector.close()


@dataclass
class IdleOutcome:
    connections: int
    connected: int
    pings: int
    lost: int
    active: float
    rss_before: int
    rss_held: int
    peak_rss: int
    fds_before: int
    fds_after: int
    handshake_dropped: list[float]
    silent_closed: int = 0  # lookup connections the proxy closed as silent


def hold_idle(
    broker: EmbeddedBroker,
    tmp_path: Path,
    *,
    lookup: int,
    proxied: int,
    hold: float,
    never_connect: int = 50,
) -> IdleOutcome:
    raise_fd_limit(lookup + 2 * proxied + never_connect + 256)
    proxy: AdminProxy = start_admin_proxy(
        broker.url,
        tmp_path,
        "--keepalive-interval",
        str(KEEPALIVE),
        "--handshake-timeout",
        "1",
        # The default (1000 per client address) would refuse the extra ones on accept.
        "--max-connections-per-ip",
        "5000",
    )
    holder = Holder()
    try:
        time.sleep(0.3)
        rss_before, fds_before = rss_bytes(proxy.pid), open_fds(proxy.pid)
        holder.start()
        holder.open(proxy.proxy.port, lookup)
        holder.open(proxy.proxy.port, proxied, f"127.0.0.1:{broker.port}")
        total = lookup + proxied
        wait_until(lambda: holder.connected == total, 60, f"{total} CONNECTED answers")
        # Beside them, connections that never finish CONNECT.
        dropped: list[float] = []
        silent = [
            socket.create_connection(("127.0.0.1", proxy.proxy.port)) for _ in range(never_connect)
        ]
        started = time.monotonic()
        for sock in silent:
            sock.settimeout(10)
            sock.sendall(connect_frame()[:5])  # a CONNECT that never ends
        for sock in silent:
            with contextlib.suppress(OSError):
                assert sock.recv(1) == b""
            dropped.append(time.monotonic() - started)
            sock.close()
        time.sleep(hold)  # several keepalive intervals: lookup connections get pinged
        active = proxy.metric("sluice_connections_active")
        rss_held = rss_bytes(proxy.pid)
        outcome = IdleOutcome(
            connections=total,
            connected=holder.connected,
            pings=holder.pings,
            lost=holder.lost,
            active=active,
            rss_before=rss_before,
            rss_held=rss_held,
            peak_rss=peak_rss_bytes(proxy.pid),
            fds_before=fds_before,
            fds_after=0,
            handshake_dropped=dropped,
        )
        outcome.silent_closed = proxy.proxy.log().count("client silent for")
        holder.close()
        wait_until(lambda: proxy.metric("sluice_connections_active") == 0, 30, "all closed")
        outcome.fds_after = open_fds(proxy.pid)
        assert "Traceback" not in proxy.proxy.log()
        return outcome
    finally:
        holder.close()
        proxy.kill()


def test_a_thousand_idle_connections(broker: EmbeddedBroker, tmp_path: Path) -> None:
    outcome = hold_idle(broker, tmp_path, lookup=800, proxied=200, hold=2.5 * KEEPALIVE)
    assert outcome.connected == 1000
    assert outcome.lost == 0, f"{outcome.lost} idle connections answering pings were dropped"
    assert outcome.active == 1000, outcome.active
    assert outcome.pings >= 800, outcome.pings  # every lookup connection was pinged
    assert outcome.rss_held <= 150 * 10**6, f"RSS {outcome.rss_held / 1e6:.0f} MB"
    assert outcome.peak_rss <= 150 * 10**6, f"peak RSS {outcome.peak_rss / 1e6:.0f} MB"
    # Never finishing CONNECT: dropped after the handshake timeout (1 s).
    assert len(outcome.handshake_dropped) == 50
    assert all(0.8 < s < 4 for s in outcome.handshake_dropped), outcome.handshake_dropped
    assert outcome.fds_after <= outcome.fds_before + 2, (outcome.fds_before, outcome.fds_after)
