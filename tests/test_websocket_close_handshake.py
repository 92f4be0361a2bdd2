"""A WebSocket session whose closing handshake is done (a CLOSE frame went
each way) but whose peers keep their TCP connections open: Sluice ends
both connections soon after (RFC 6455 7.1.1: the server closes the TCP
connection once the handshake is done; the peers get ``CLOSE_GRACE`` to do
it themselves), and the session counts as ``closed``, not as timed out."""

from __future__ import annotations

import struct

import pytest
import trio

import sluice.proxy.websocket as session_module
from sluice.logs import LogLimit
from tests.helpers.poll import wait_until_in_trio
from tests.test_websocket import TIMEOUT, Between, broker_frame, masked, read_to_eof

CLIENT_CLOSE = masked(b"\x88\x02\x03\xe8")  # 1000
BROKER_CLOSE = broker_frame(8, struct.pack("!H", 1000))


async def read_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    got = b""
    with trio.fail_after(10):
        while len(got) < n:
            data = await stream.receive_some(n - len(got))
            assert data, f"the end after {got!r}"
            got += data
    return got


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_both_closes_end_the_connections_although_no_peer_hangs_up(
    monkeypatch: pytest.MonkeyPatch, tls: bool
) -> None:
    monkeypatch.setattr(session_module, "CLOSE_GRACE", 0.2)

    async def main() -> float:
        # Before: the session lasted until this idle timeout (then 1001
        # frames could not go, and it counted as idle_timeout).
        between = Between(idle_timeout=60.0, tls=tls)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(between.run)
            await between.client.send_all(CLIENT_CLOSE)
            assert await read_exactly(between.broker, len(CLIENT_CLOSE)) == CLIENT_CLOSE
            await between.broker.send_all(BROKER_CLOSE)
            assert await read_exactly(between.client, len(BROKER_CLOSE)) == BROKER_CLOSE
            done = trio.current_time()  # the closing handshake, as both peers see it
            # Neither hangs up; each sees its connection end.
            assert await read_to_eof(between.client) == b""
            assert await read_to_eof(between.broker) == b""
            ended = trio.current_time() - done
            await between.done.wait()
        assert between.session.ending == "closed"
        assert between.metric("sessions_ended_total", reason="closed") == 1
        assert between.metric("sessions_ended_total", reason="idle_timeout") == 0
        assert between.metric("sessions_active") == 0
        return ended

    ended = trio.run(main)
    assert ended < 5.0, f"the connections ended {ended:.2f}s after the closing handshake"


def test_a_peer_that_hangs_up_within_the_grace_ends_the_session_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker closes its connection after the handshake, as a server
    does: the client sees the end then, not when the grace is over (made
    long here, so that the two cannot be mistaken)."""
    monkeypatch.setattr(session_module, "CLOSE_GRACE", 30.0)

    async def main() -> float:
        between = Between(idle_timeout=60.0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(between.run)
            await between.client.send_all(CLIENT_CLOSE)
            assert await read_exactly(between.broker, len(CLIENT_CLOSE)) == CLIENT_CLOSE
            await between.broker.send_all(BROKER_CLOSE)
            assert await read_exactly(between.client, len(BROKER_CLOSE)) == BROKER_CLOSE
            done = trio.current_time()
            await between.broker.aclose()
            assert await read_to_eof(between.client) == b""
            ended = trio.current_time() - done
        assert between.session.ending == "closed"
        return ended

    ended = trio.run(main)
    assert ended < 10.0, f"the client saw the end {ended:.2f}s after the broker hung up"


def test_a_shutdown_after_the_closing_handshake_is_no_ending_of_sluices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sluice stopping while the peers have their grace: the session had
    ended by itself (``closed``), and no 1001 frame goes to either side."""
    monkeypatch.setattr(session_module, "CLOSE_GRACE", 30.0)

    async def main() -> tuple[bytes, bytes]:
        between = Between(idle_timeout=60.0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(between.run)
            await between.client.send_all(CLIENT_CLOSE)
            assert await read_exactly(between.broker, len(CLIENT_CLOSE)) == CLIENT_CLOSE
            await between.broker.send_all(BROKER_CLOSE)
            assert await read_exactly(between.client, len(BROKER_CLOSE)) == BROKER_CLOSE
            await wait_until_in_trio(
                lambda: between.session.handshake_done, TIMEOUT, "the broker's CLOSE relayed"
            )
            between.session.shut_down()
            after = await read_to_eof(between.client), await read_to_eof(between.broker)
        assert between.session.ending == "closed"
        assert between.metric("sessions_ended_total", reason="shutdown") == 0
        return after

    assert trio.run(main) == (b"", b"")


def test_sessions_ended_for_broken_frames_are_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Anyone may open session after session with a broken frame each.
    caplog.set_level("DEBUG", logger="sluice.http")
    monkey = pytest.MonkeyPatch()
    monkey.setattr(session_module, "_broken", LogLimit())

    async def five() -> None:
        for _ in range(5):
            between = Between()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(between.run)
                await between.client.send_all(b"\x81\x05hello")  # unmasked: a client must mask
                await between.done.wait()
            assert between.session.ending == "protocol_error"

    try:
        trio.run(five)
    finally:
        monkey.undo()
    said = [r for r in caplog.records if "session closed" in r.getMessage()]
    assert len(said) == 5
    assert [r.levelname for r in said] == ["INFO"] + ["DEBUG"] * 4
