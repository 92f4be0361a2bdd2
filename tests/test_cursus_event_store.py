"""The Cursus event store through the proxy's core: READ_SNAPSHOT answers
carry the application's snapshot, which is data, never broker addresses."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sluice.addresses import Address
from sluice.protocols.core import Ask, Conn, Event, Peer, Send
from sluice.protocols.cursus import Metadata, OkReply, encode_reply, encode_request, frame
from sluice.protocols.cursus.commands import OtherCommand
from sluice.protocols.cursus.connection import CursusConnection, CursusRouting, CursusSettings
from sluice.protocols.cursus.rewrite import addresses_in, rewrite_addresses

UPSTREAM = Address("localhost", 9000)

# A snapshot whose payload reads like a coordinator, a leader list and a
# moved leader: the client takes everything after ``snapshot=`` whole.
SNAPSHOT = json.dumps(
    {
        "version": 3,
        "payload": "moved to host=db.internal port=5432, see leaders=db.internal:22,x "
        "and NOT_LEADER LEADER_IS evil.internal:80 today",
    }
)
ANSWER = f"OK snapshot={SNAPSHOT}".encode()


class Taps:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def frames(self, conn: Conn, from_client: bool, frames: Sequence[Any]) -> None:
        pass

    def event(self, conn: Conn | None, event: Event) -> None:
        self.events.append(event)


def test_a_snapshot_names_no_broker_and_is_not_rewritten() -> None:
    assert addresses_in(ANSWER) == []
    assert rewrite_addresses(ANSWER, lambda host, port: ("127.0.0.1", 19001)) is None
    # What comes before the snapshot is still read (no broker sends it, but
    # the rule is the snapshot's alone).
    before = b"OK leaders=b2:9001 snapshot=" + SNAPSHOT.encode()
    assert addresses_in(before) == [("b2", 9001)]


def test_a_read_snapshot_answer_reaches_the_client_unchanged_and_opens_nothing() -> None:
    routing = CursusRouting(UPSTREAM)
    core = CursusConnection(
        Conn(1, "127.0.0.1:5555", "127.0.0.1:19000", "cursus"), CursusSettings(), routing, Taps()
    )
    read = encode_request(OtherCommand(command="READ_SNAPSHOT", known=True,
                                       extra=(("topic", "t"), ("key", "k"))))  # fmt: skip
    core.receive_client(read, 0.0)
    core.upstream_ready(0.1)
    actions = core.receive_broker(frame(ANSWER), 0.2)
    assert not [a for a in actions if isinstance(a, Ask)]
    sent = b"".join(a.data for a in actions if isinstance(a, Send) and a.to is Peer.CLIENT)
    assert sent == frame(ANSWER)
    # Nothing the application wrote became a broker the proxy relays to.
    assert not routing.allowlist.allows(Address("db.internal", 5432))
    assert not routing.allowlist.allows(Address("evil.internal", 80))
    # A METADATA answer on the same connection is still rewritten.
    core.receive_client(encode_request(Metadata(topic="t")), 0.3)
    actions = core.receive_broker(encode_reply(OkReply.of(leaders="b2:9001")), 0.4)
    assert [a.request.upstream for a in actions if isinstance(a, Ask)] == [Address("b2", 9001)]


def test_every_request_the_client_sends_is_timed_under_its_name() -> None:
    """sluice_request_duration_seconds has a series for each command the
    real client sends, the event store's and the admin ones included: each
    request below, answered, is one sample under its own name."""
    from prometheus_client import generate_latest

    from sluice.protocols.core import Taps as Tapping
    from sluice.protocols.registry import get
    from sluice.proxy.metrics import Metrics

    metrics = Metrics(protocol=get("cursus"))
    core = CursusConnection(
        Conn(1, "127.0.0.1:5555", "127.0.0.1:19000", "cursus"),
        CursusSettings(), CursusRouting(UPSTREAM), Tapping([metrics]),
    )  # fmt: skip
    requests = {
        "LIST": "LIST",
        "DELETE": "DELETE topic=t",
        "PUBLISH": "PUBLISH topic=t message=hello",
        "APPEND_STREAM": "APPEND_STREAM topic=t key=k version=0 event_type=e "
        "schema_version=1 producerId=p message=x",
        "READ_SNAPSHOT": "READ_SNAPSHOT topic=t key=k",
        "SAVE_SNAPSHOT": "SAVE_SNAPSHOT topic=t key=k version=1 message={}",
        "STREAM_VERSION": "STREAM_VERSION topic=t key=k",
    }
    now = 0.0
    for text in requests.values():
        core.receive_client(frame(b"\x00\x00" + text.encode()), now)
        if now == 0.0:
            core.upstream_ready(0.0)
        core.receive_broker(frame(b"OK"), now + 0.001)
        now += 1.0
    exposed = generate_latest(metrics.exposed).decode()
    for name in requests:
        series = f'sluice_request_duration_seconds_count{{command="{name}",protocol="cursus"}} 1.0'
        assert series in exposed, name
