"""The sans-I/O Cursus connection core: bytes in, actions out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from sluice.addresses import Address
from sluice.protocols.core import (
    Answered,
    Ask,
    Close,
    Conn,
    Event,
    Invalid,
    OnInvalid,
    OpenUpstream,
    Peer,
    Send,
    TopicTraffic,
)
from sluice.protocols.cursus import (
    BROKER_MAX_FRAME_SIZE,
    KEEPALIVE,
    Batch,
    BatchAck,
    CommitOffset,
    Consume,
    ErrorReply,
    Keepalive,
    List,
    Message,
    Metadata,
    OkReply,
    Stream,
    StreamControl,
    decode_stream,
    encode_batch,
    encode_reply,
    encode_request,
    frame,
)
from sluice.protocols.cursus.connection import (
    CursusConnection,
    CursusRouting,
    CursusSettings,
    ListenerRequest,
)

UPSTREAM = Address("localhost", 9000)


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[bool, Any]] = []
        self.events: list[Event] = []

    def frames(self, conn: Conn, from_client: bool, frames: Sequence[Any]) -> None:
        self.seen += [(from_client, frame) for frame in frames]

    def event(self, conn: Conn | None, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def make(
    on_invalid: OnInvalid = OnInvalid.REJECT, routing: CursusRouting | None = None
) -> tuple[CursusConnection, Recorder]:
    tap = Recorder()
    core = CursusConnection(
        Conn(1, "127.0.0.1:5555", "127.0.0.1:19000", "cursus"),
        CursusSettings(on_invalid=on_invalid),
        routing or CursusRouting(UPSTREAM),
        tap,
    )
    return core, tap


def relaying(
    on_invalid: OnInvalid = OnInvalid.REJECT, routing: CursusRouting | None = None
) -> tuple[CursusConnection, Recorder]:
    core, tap = make(on_invalid, routing)
    first = encode_request(List())
    assert core.receive_client(first, 0.0) == [OpenUpstream(UPSTREAM, False, b"")]
    assert core.upstream_pending
    assert core.upstream_ready(0.1) == [Send(Peer.BROKER, first)]
    assert core.established
    core.receive_broker(encode_reply(OkReply.of(count=0, topics="")), 0.2)
    return core, tap


def sent(actions: list[Any], to: Peer) -> bytes:
    return b"".join(a.data for a in actions if isinstance(a, Send) and a.to is to)


def test_client_bytes_wait_for_the_upstream_in_order() -> None:
    core, _ = make()
    a, b = encode_request(List()), encode_request(Metadata(topic="t"))
    actions = core.receive_client(a[:5], 0.0)
    assert actions == [OpenUpstream(UPSTREAM, False, b"")]
    assert core.receive_client(a[5:] + b, 0.0) == []
    assert core.upstream_ready(0.5) == [Send(Peer.BROKER, a + b)]


def test_replies_naming_brokers_wait_for_a_listener_then_are_rewritten() -> None:
    routing = CursusRouting(UPSTREAM)
    core, tap = relaying(routing=routing)
    core.receive_client(encode_request(Metadata(topic="t")), 1.0)
    meta = encode_reply(OkReply.of(topic="t", partitions=2, leaders="localhost:9000,b2:9001"))
    after = encode_reply(OkReply())
    actions = core.receive_broker(meta + after, 1.5)
    asks = [a for a in actions if isinstance(a, Ask)]
    assert [a.request for a in asks] == [
        ListenerRequest(UPSTREAM),
        ListenerRequest(Address("b2", 9001)),
    ]
    assert sent(actions, Peer.CLIENT) == b""  # held, and what follows it too
    assert core.answered(asks[0].token, Address("127.0.0.1", 19000), 1.6) == []
    actions = core.answered(asks[1].token, Address("127.0.0.1", 19001), 1.7)
    replies = decode_stream(sent(actions, Peer.CLIENT), from_client=False)
    assert replies[0].body == b"OK topic=t partitions=2 leaders=127.0.0.1:19000,127.0.0.1:19001"
    assert replies[1].message == OkReply()
    assert routing.listener_for(Address("B2", 9001)) == Address("127.0.0.1", 19001)
    assert routing.allowlist.allows(Address("b2", 9001))
    assert [e.request for e in tap.of(Answered)] == ["LIST", "METADATA"]
    # Known listeners: rewritten at once, on a STREAM as anywhere.
    core.receive_client(encode_request(Stream(topic="t", partition=1)), 2.0)
    moved = encode_reply(ErrorReply.of("NOT_LEADER", "LEADER_IS", "b2:9001"))
    assert sent(core.receive_broker(moved, 2.1), Peer.CLIENT)[4:] == (
        b"ERROR: NOT_LEADER LEADER_IS 127.0.0.1:19001"
    )


def test_no_listener_means_an_error_reply_not_the_brokers_and_a_close() -> None:
    """The broker's reply would send the client around the proxy: it is
    not passed on; the client is told why in an ERROR: line, then closed."""
    core, _ = relaying()
    core.receive_client(encode_request(Metadata(topic="t")), 1.0)
    reply = encode_reply(ErrorReply.of("NOT_COORDINATOR", host="b3", port=9003))
    (ask,) = [a for a in core.receive_broker(reply, 1.1) if isinstance(a, Ask)]
    actions = core.answered(ask.token, OSError("port range exhausted"), 1.2)
    (told,) = decode_stream(sent(actions, Peer.CLIENT), from_client=False)
    assert isinstance(told.message, ErrorReply) and told.message.code == "unavailable"
    assert "port range exhausted" in told.message.fields["reason"]
    assert b"host=" not in sent(actions, Peer.CLIENT)  # nothing the client would follow
    assert isinstance(actions[-1], Close) and actions[-1].reason == "no_listener"


def _corrupt_batch() -> bytes:
    body = encode_batch(Batch("t", 0, messages=(Message(payload=b"x"),)))
    return frame(body[:-2])


def test_reject_answers_a_corrupt_batch_as_the_broker_and_keeps_going() -> None:
    core, tap = relaying()
    actions = core.receive_client(_corrupt_batch() + encode_request(List()), 1.0)
    assert sent(actions, Peer.CLIENT)[4:].startswith(b'ERROR: decode_failed reason="')
    assert sent(actions, Peer.BROKER) == encode_request(List())
    assert not any(isinstance(a, Close) for a in actions)
    assert [e.problem for e in tap.of(Invalid)] == ["parse"]


def test_reject_closes_on_malformed_input_like_the_broker() -> None:
    core, _ = relaying()
    actions = core.receive_client(frame(b"\x00\x00hello"), 1.0)
    assert (
        sent(actions, Peer.CLIENT)[4:] == b"ERROR: malformed_input reason=missing_topic_or_payload"
    )
    assert isinstance(actions[-1], Close) and actions[-1].reason == "invalid"


def test_forward_passes_invalid_frames_on_and_counts_them() -> None:
    core, tap = relaying(OnInvalid.FORWARD)
    bad = _corrupt_batch() + frame(b"\x00\x00hello")
    actions = core.receive_client(bad, 1.0)
    assert actions == [Send(Peer.BROKER, bad)]
    assert len(tap.of(Invalid)) == 2


def test_unknown_commands_pass_even_under_reject() -> None:
    core, _ = relaying()
    unknown = frame(b"\x00\x00BEGIN_TXN id=1")
    assert core.receive_client(unknown, 1.0) == [Send(Peer.BROKER, unknown)]


@pytest.mark.parametrize("on_invalid", list(OnInvalid))
def test_an_oversize_frame_closes_without_a_word(on_invalid: OnInvalid) -> None:
    core, tap = relaying(on_invalid)
    actions = core.receive_client((BROKER_MAX_FRAME_SIZE + 1).to_bytes(4, "big"), 1.0)
    assert actions == [actions[-1]] and isinstance(actions[-1], Close)
    assert actions[-1].reason == "unframeable"
    assert tap.of(Invalid)[-1].fatal


def test_batches_are_counted_timed_and_in_flight() -> None:
    core, tap = relaying()
    batch = Batch("orders", 0, messages=(Message(payload=b"a"), Message(payload=b"b")))
    core.receive_client(encode_request(batch), 1.0)
    assert core.in_flight_sends == 1
    assert tap.of(TopicTraffic) == [TopicTraffic("orders", True, 2, len(encode_request(batch)))]
    core.receive_broker(encode_reply(BatchAck("OK", 1, 1, "p", 1, 2)), 1.25)
    assert core.in_flight_sends == 0
    assert tap.of(Answered)[-1] == Answered("BATCH", 0.25, None, "orders")
    core.receive_client(encode_request(Consume(topic="orders", partition=0, offset=9)), 2.0)
    core.receive_broker(encode_reply(ErrorReply.of("OFFSET_OUT_OF_RANGE")), 2.5)
    assert tap.of(Answered)[-1].error == "OFFSET_OUT_OF_RANGE"


def test_drain_ends_a_stream_where_the_client_was() -> None:
    core, _ = relaying()
    assert core.drain() == []
    core.receive_client(encode_request(Stream(topic="t", partition=0, group="g", member="m")), 1.0)
    delivered = Batch("t", 0, messages=(Message(offset=4), Message(offset=5)))
    core.receive_broker(encode_reply(delivered) + KEEPALIVE, 1.1)
    assert core.conn.kind == "stream"
    (action,) = core.drain()
    assert isinstance(action, Send) and action.to is Peer.CLIENT
    assert decode_stream(action.data, from_client=False)[0].message == StreamControl(
        "CLOSE", "stopped", 6
    )


def test_a_refused_stream_is_no_stream_to_end_on_drain() -> None:
    """A STREAM the broker answers with an error opened nothing: the
    connection is not a stream's, and a drain sends the client no CLOSE
    of a stream it never had."""
    core, _ = relaying()
    core.receive_client(encode_request(Stream(topic="t", partition=0, group="g", member="m")), 1.0)
    core.receive_broker(encode_reply(ErrorReply.of("NOT_LEADER")), 1.1)
    assert core.conn.kind == "relay"
    assert core.drain() == []


def test_requests_on_a_connection_that_streams_are_not_kept() -> None:
    """A client that commits on its stream's connection (today's client
    uses connections of their own): nothing is paired with the stream's
    deliveries, so nothing is kept waiting, however long it streams."""
    core, tap = relaying()
    core.receive_client(encode_request(Stream(topic="t", partition=0, group="g", member="m")), 1.0)
    core.receive_broker(encode_reply(Batch("t", 0, messages=(Message(offset=4),))), 1.1)
    commit = encode_request(CommitOffset(topic="t", partition=0, group="g", offset=5))
    batch = encode_request(Batch("t", 0, messages=(Message(payload=b"x"),)))
    for _ in range(1000):
        core.receive_client(commit + batch, 1.2)
    assert len(core._requests) == 0 and core.in_flight_sends == 0
    assert sum(e.messages for e in tap.of(TopicTraffic) if e.from_client) == 1000


def test_an_upstream_not_allowed_is_refused() -> None:
    routing = CursusRouting(UPSTREAM)
    tap = Recorder()
    core = CursusConnection(
        Conn(1, "c", "l", "cursus"),
        CursusSettings(),
        routing,
        tap,
        upstream=Address("elsewhere", 1),
    )
    (action,) = core.receive_client(encode_request(List()), 0.0)
    assert isinstance(action, Close) and action.reason == "relay_refused"


def test_what_the_broker_sent_before_closing_still_arrives() -> None:
    core, _ = relaying()
    core.receive_client(encode_request(Metadata(topic="t")), 1.0)
    meta = encode_reply(OkReply.of(leaders="b9:9009"))
    actions = core.receive_broker(meta, 1.1) + core.receive_broker(b"", 1.2)
    assert not any(isinstance(a, Close) for a in actions)
    (ask,) = [a for a in actions if isinstance(a, Ask)]
    actions = core.answered(ask.token, Address("127.0.0.1", 19009), 1.3)
    assert sent(actions, Peer.CLIENT)[4:] == b"OK leaders=127.0.0.1:19009"
    assert isinstance(actions[-1], Close) and actions[-1].reason == "broker_closed"
    assert isinstance(core.receive_broker(b"", 1.4), list)


def test_keepalives_pass_through() -> None:
    core, _ = relaying()
    core.receive_client(encode_request(Stream(topic="t", partition=0)), 1.0)
    assert core.receive_broker(KEEPALIVE, 1.1) == [Send(Peer.CLIENT, KEEPALIVE)]
    assert decode_stream(KEEPALIVE, from_client=False)[0].message == Keepalive()


def test_even_a_reply_we_cannot_parse_is_rewritten() -> None:
    routing = CursusRouting(UPSTREAM)
    routing.add_listener(Address("b2", 9001), Address("127.0.0.1", 19001))
    core, tap = relaying(routing=routing)
    core.receive_client(encode_request(Stream(topic="t", partition=0, offset=3)), 1.0)
    odd = frame(b"WARN NOT_LEADER LEADER_IS b2:9001")
    actions = core.receive_broker(odd, 1.1)
    assert sent(actions, Peer.CLIENT) == frame(b"WARN NOT_LEADER LEADER_IS 127.0.0.1:19001")
    assert tap.of(Invalid)[-1].problem == "unknown-type" and not tap.of(Invalid)[-1].from_client
    # A drain before any batch was delivered resumes at the offset asked for.
    (action,) = core.drain()
    assert isinstance(action, Send)
    assert decode_stream(action.data, from_client=False)[0].message == StreamControl(
        "CLOSE", "stopped", 3
    )


def test_a_client_that_hangs_up_at_once_opens_nothing() -> None:
    core, _ = make()
    (action,) = core.receive_client(b"", 0.0)
    assert isinstance(action, Close) and action.reason == "closed"


def test_a_topic_or_error_that_is_not_utf8_is_served_in_the_metrics() -> None:
    """Cursus text is decoded with surrogateescape: such a topic (or a
    broker's error code) must not make every later scrape fail."""
    from prometheus_client import generate_latest

    from sluice.protocols.core import Taps
    from sluice.protocols.registry import get
    from sluice.proxy.metrics import Metrics

    metrics = Metrics(protocol=get("cursus"))
    core = CursusConnection(
        Conn(1, "127.0.0.1:5555", "127.0.0.1:19000", "cursus"),
        CursusSettings(), CursusRouting(UPSTREAM), Taps([metrics]),
    )  # fmt: skip
    batch = encode_request(Batch("t", 0, messages=(Message(payload=b"x"),)))
    batch = batch.replace(b"\x00\x01t", b"\x00\x01\xff", 1)
    core.receive_client(batch, 0.0)
    core.upstream_ready(0.1)
    core.receive_broker(b"\x00\x00\x00\x0bERROR: \xfe\xfd\xfc\xfb", 0.2)
    text = generate_latest(metrics.exposed).decode()
    assert 'topic="\ufffd"' in text
    assert 'error="\ufffd\ufffd\ufffd\ufffd"' in text


def test_a_fault_errors_reason_is_quoted_as_the_broker_quotes_it() -> None:
    """An error rule's message with a quote or a backslash reaches the
    client as one quoted word that reads back as written."""
    from sluice.protocols import registry
    from sluice.protocols.faults import Faults, parse_rule

    core, _ = relaying()
    faults = Faults()
    faults.add(parse_rule({"match": {"protocol": "cursus", "command": "BATCH"}, "action": "error",
                           "error": "NOT_LEADER", "message": 'say "hi" \\ there'},
                          registry.all_faults()))  # fmt: skip
    core.faults = faults
    batch = encode_request(Batch("t", 0, messages=(Message(payload=b"x"),)))
    answer = sent(core.receive_client(batch, 1.0), Peer.CLIENT)
    (reply,) = decode_stream(answer, from_client=False)
    assert isinstance(reply.message, ErrorReply)
    assert reply.message.fields["reason"] == 'say "hi" \\ there'


def test_a_faults_error_answer_waits_for_the_answers_before_it() -> None:
    """Cursus answers carry no request id: a client pairs them in order. An
    error rule on the second of two BATCHes in one read answered at once,
    while the first waited for the broker: the producer took the ERROR for
    the first batch's answer, and the first batch's ack for the second's."""
    from sluice.protocols import registry
    from sluice.protocols.faults import Faults, parse_rule

    core, tap = relaying()
    faults = Faults()
    faults.add(parse_rule({"match": {"protocol": "cursus", "command": "BATCH", "topic": "b"},
                           "action": "error", "error": "NOT_LEADER"},
                          registry.all_faults()))  # fmt: skip
    core.faults = faults
    first = encode_request(Batch("a", 0, messages=(Message(payload=b"x"),)))
    second = encode_request(Batch("b", 0, messages=(Message(payload=b"y"),)))
    out = core.receive_client(first + second, 1.0)
    assert sent(out, Peer.BROKER) == first and sent(out, Peer.CLIENT) == b""
    ack = encode_reply(BatchAck("OK", 1, 1, "p", 1, 1))
    answers = decode_stream(sent(core.receive_broker(ack, 1.1), Peer.CLIENT), from_client=False)
    assert [type(a.message) for a in answers] == [BatchAck, ErrorReply]
    # Recorded in the order the client got them.
    assert [type(f.message) for _, f in tap.seen[-2:]] == [BatchAck, ErrorReply]
    # Nothing before it: at once.
    third = encode_request(Batch("b", 0, messages=(Message(payload=b"z"),)))
    (now,) = decode_stream(sent(core.receive_client(third, 1.2), Peer.CLIENT), from_client=False)
    assert isinstance(now.message, ErrorReply)


def test_taps_see_a_rewritten_reply_as_the_client_got_it() -> None:
    """Recordings and live views hold the frame as the client saw it: the
    proxy's listener, not the upstream address the client never got."""
    routing = CursusRouting(UPSTREAM)
    routing.add_listener(UPSTREAM, Address("127.0.0.1", 19000))
    core, tap = relaying(routing=routing)
    core.receive_client(encode_request(Metadata(topic="t")), 1.0)
    meta = encode_reply(OkReply.of(topic="t", partitions=1, leaders="localhost:9000"))
    actions = core.receive_broker(meta, 1.1)
    to_client = sent(actions, Peer.CLIENT)
    assert b"127.0.0.1:19000" in to_client
    (_, seen) = tap.seen[-1]
    assert seen.raw == to_client
    assert isinstance(seen.message, OkReply) and seen.message.get("leaders") == "127.0.0.1:19000"


def test_unknown_commands_answered_with_errors_share_one_metrics_label() -> None:
    """A request's name labels sluice_broker_errors_total: words a client
    makes up (passed on for the broker to judge) must not each add a label,
    as they do not in sluice_frames_total (UNKNOWN)."""
    core, tap = relaying()
    for i in range(3):
        core.receive_client(frame(f"\x00\x00MADE_UP_{i} id=1".encode()), 1.0)
        core.receive_broker(encode_reply(ErrorReply.of("unknown_command")), 1.1)
    assert [(e.request, e.error) for e in tap.of(Answered)][1:] == [
        ("UNKNOWN", "unknown_command")
    ] * 3
