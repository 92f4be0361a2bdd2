"""What a write through TLS costs on the hot path. Since the stall clock
measures a TLS peer's progress by TCP_INFO (``_acked``), every write to
a TLS peer made a getsockopt call (and a socket object around it) before
it began, about 5 us, even the nearly every one that the socket takes at
once and that never waits: for a sidecar relaying small messages over
TLS, a tenth of what the crossing cost. The baseline of what the peer
took in is now read by the stall clock's first look at a write still
going on; a write that goes at once reads none. The same for plain TCP,
whose write reads it only once the socket would not take it all."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from sluice.protocols.core import Action, Close, Peer, Send
from sluice.proxy import relay as relay_module
from tests.test_relay_backpressure import stalled_pair
from tests.test_relay_slow_peers_keepalive import Core
from tests.test_relay_tls_slow_reader import _relay, _tls_pair

pytestmark = pytest.mark.e2e

ROUNDS = 200


class Echo(Core):
    """Answers each read from the client with as many bytes."""

    def receive_client(self, data: bytes, now: float) -> list[Action]:
        if not data:
            return [Close("closed")]
        return [Send(Peer.CLIENT, data)]


@pytest.mark.parametrize("kind", ["tls", "plain"])
async def test_writes_that_go_at_once_read_no_tcp_info(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    calls = 0
    acked = relay_module._acked

    def counted(fd: int) -> Any:
        nonlocal calls
        calls += 1
        return acked(fd)

    monkeypatch.setattr(relay_module, "_acked", counted)
    client_end, ours = _tls_pair() if kind == "tls" else stalled_pair()
    core = Echo()
    relay = _relay(core, ours)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay.run)
        with trio.fail_after(20):
            for _ in range(ROUNDS):
                await client_end.send_all(b"m" * 100)
                got = b""
                while len(got) < 100:
                    got += await client_end.receive_some(100 - len(got))
        assert core.reason is None, core.reason
        raw = client_end.transport_stream if isinstance(client_end, trio.SSLStream) else client_end
        await raw.aclose()
        nursery.cancel_scope.cancel()
    # (The stall clock may look at a write or two under way: a few calls.)
    assert calls < ROUNDS / 10, calls
