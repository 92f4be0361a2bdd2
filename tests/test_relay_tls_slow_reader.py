"""A peer behind TLS that takes a long write in slowly but steadily (a
consumer reading at a slow link's pace) is alive, as it is on plain TCP.
Before, each 64 KiB piece of a TLS write had to be taken in within the
stall bound (two keepalive intervals), since a TLS write cancelled half
way leaves its stream broken: a TLS reader slower than a piece per stall
bound was closed as ``idle`` while it was reading. Now the write goes on as
long as the peer acknowledges bytes on the TCP connection under the TLS
stream (TCP_INFO's ``tcpi_bytes_acked``); a TLS peer that takes nothing in
is still closed as ``idle``.

A ``Relay`` whose client is a real TLS connection over loopback (a
certificate from ``trustme``), with small socket buffers so that the
reader's pace paces the write."""

from __future__ import annotations

import ssl

import pytest
import trio
import trustme

from sluice.proxy.relay import Relay, Timing
from tests.test_pulsar_core import Recording
from tests.test_relay_backpressure import stalled_pair
from tests.test_relay_slow_peers_keepalive import Core, _ask, _dial

pytestmark = pytest.mark.e2e

INTERVAL = 0.4  # --keepalive-interval: stall bound 0.8 s
READING = 10 * INTERVAL  # how long the slow reader reads: five stall bounds
PACE = 0.05  # the reader takes in READ bytes every PACE seconds: about 20 KB/s,
READ = 1024  # a 64 KiB piece in about 3 s, far past the stall bound
BOUND = 15.0  # what a test waits for at most


def _tls_pair() -> tuple[trio.SSLStream[trio.SocketStream], trio.SSLStream[trio.SocketStream]]:
    """(the client's end, Sluice's end) of a TLS connection over loopback
    TCP with small buffers."""
    client_end, ours = stalled_pair()
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(client)
    return (
        trio.SSLStream(client_end, client, server_hostname="localhost"),
        trio.SSLStream(ours, server, server_side=True),
    )


def _relay(core: Core, ours: trio.abc.Stream) -> Relay:
    timing = Timing(handshake_timeout=10.0, connect_timeout=5.0, keepalive_interval=INTERVAL)
    return Relay(core, ours, timing=timing, dial=_dial, ask=_ask, tap=Recording())


async def test_a_slow_but_steady_tls_reader_is_not_cut() -> None:
    client_end, ours = _tls_pair()
    core = Core()
    relay = _relay(core, ours)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay.run)
        with trio.fail_after(BOUND):
            await client_end.send_all(b"go")
            started = trio.current_time()
            taken = 0
            while trio.current_time() - started < READING:
                try:
                    data = await client_end.receive_some(READ)
                except trio.BrokenResourceError:
                    data = b""
                assert data, (
                    f"closed as {core.reason!r} after {trio.current_time() - started:.2f}s, "
                    f"{taken} bytes taken in"
                )
                taken += len(data)
                await trio.sleep(PACE)
            assert core.reason is None, core.reason
            # More than a 64 KiB piece went, each slower than the stall bound.
            assert taken > 64 * 1024, taken
        await client_end.transport_stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_tls_peer_that_takes_nothing_in_is_still_closed_as_idle() -> None:
    client_end, ours = _tls_pair()
    core = Core()
    relay = _relay(core, ours)
    reason: list[str] = []

    async def run() -> None:
        reason.append(await relay.run())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        with trio.fail_after(BOUND):
            await client_end.send_all(b"go")
            started = trio.current_time()
            while not reason:  # the relay's own clock: polled, within BOUND
                await trio.sleep(0.02)
            took = trio.current_time() - started
        await client_end.transport_stream.aclose()
    assert reason == ["idle"]
    assert core.reason == "idle"
    # A stall bound (two intervals) without progress, looked at every
    # quarter of it; the first may see the last of what was in flight
    # taken in, and count as progress.
    assert took < 3 * 2 * INTERVAL, took
