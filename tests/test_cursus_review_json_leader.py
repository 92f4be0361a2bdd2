"""A JSON answer whose error is ``NOT_LEADER LEADER_IS <addr>`` (the event
store's READ_STREAM answers in JSON; its client takes the address after
the marker in the error and dials it): the address is the proxy's too."""

from __future__ import annotations

import json

from sluice.addresses import Address
from sluice.protocols.core import Ask, Peer, Send
from sluice.protocols.cursus import frame
from sluice.protocols.cursus.connection import ListenerRequest
from sluice.protocols.cursus.encoder import envelope
from sluice.protocols.cursus.rewrite import addresses_in, rewrite_addresses
from tests.test_cursus_core import relaying, sent

ERROR = {"status": "ERROR", "error": "NOT_LEADER LEADER_IS broker-2:9001"}


def _leader_from_error(resp: str) -> str | None:
    """How the client's event store reads it (cursus/eventstore.py)."""
    marker = "NOT_LEADER LEADER_IS"
    if marker not in resp:
        return None
    parts = resp.split(marker, 1)[1].strip().split()
    return parts[0] if parts else None


def test_the_address_in_a_json_error_is_found_and_rewritten() -> None:
    for body in (json.dumps(ERROR).encode(), json.dumps(ERROR, separators=(",", ":")).encode()):
        assert addresses_in(body) == [("broker-2", 9001)]
        new = rewrite_addresses(body, lambda host, port: ("127.0.0.1", 19001))
        assert new is not None
        obj = json.loads(new)
        assert _leader_from_error(f"broker: {obj['error']}") == "127.0.0.1:19001"
        assert {k: v for k, v in obj.items() if k != "error"} == {"status": "ERROR"}


def test_the_core_keeps_an_event_store_client_on_the_proxy() -> None:
    core, _ = relaying()
    read = frame(envelope("", b"READ_STREAM topic=t key=k from_version=0"))
    assert core.receive_client(read, 1.0) == [Send(Peer.BROKER, read)]
    reply = frame(json.dumps(ERROR).encode())
    actions = core.receive_broker(reply, 1.1)
    asks = [a for a in actions if isinstance(a, Ask)]
    assert [a.request for a in asks] == [ListenerRequest(Address("broker-2", 9001))]
    actions = core.answered(asks[0].token, Address("127.0.0.1", 19001), 1.2)
    obj = json.loads(sent(actions, Peer.CLIENT)[4:])
    assert _leader_from_error(f"broker: {obj['error']}") == "127.0.0.1:19001"


def test_replay_compares_a_json_error_with_its_address_masked() -> None:
    from sluice.protocols.cursus import decode_frame
    from sluice.replay.cursus import normalise

    here = decode_frame(frame(json.dumps(ERROR).encode()), from_client=False)
    moved = {"status": "ERROR", "error": "NOT_LEADER LEADER_IS other:9100"}
    there = decode_frame(frame(json.dumps(moved).encode()), from_client=False)
    assert normalise(here) == normalise(there) == "ACK ERROR NOT_LEADER LEADER_IS addr:0"
