"""The Cursus core pairs broker answers with requests in order: a request
the broker answers must be counted as one, even when Sluice found it invalid
and passed it on (``--on-invalid forward``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.addresses import Address
from sluice.protocols.core import Answered, Conn, Event, OnInvalid, Send
from sluice.protocols.cursus import (
    Batch,
    BatchAck,
    ErrorReply,
    List,
    Message,
    OkReply,
    Stream,
    StreamControl,
    decode_stream,
    encode_batch,
    encode_reply,
    encode_request,
    frame,
)
from sluice.protocols.cursus.connection import CursusConnection, CursusRouting, CursusSettings

UPSTREAM = Address("localhost", 9000)


class Taps:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def frames(self, conn: Conn, from_client: bool, frames: Sequence[Any]) -> None:
        pass

    def event(self, conn: Conn | None, event: Event) -> None:
        self.events.append(event)

    def answered(self) -> list[tuple[str, str | None]]:
        return [(e.request, e.error) for e in self.events if isinstance(e, Answered)]


def forwarding() -> tuple[CursusConnection, Taps]:
    tap = Taps()
    core = CursusConnection(
        Conn(1, "127.0.0.1:5555", "127.0.0.1:19000", "cursus"),
        CursusSettings(on_invalid=OnInvalid.FORWARD),
        CursusRouting(UPSTREAM),
        tap,
    )
    first = encode_request(List())
    core.receive_client(first, 0.0)
    core.upstream_ready(0.1)
    core.receive_broker(encode_reply(OkReply.of(count=0, topics="")), 0.2)
    return core, tap


def _corrupt_batch() -> bytes:
    return frame(encode_batch(Batch("t", 0, messages=(Message(payload=b"x"),)))[:-2])


DECODE_FAILED = encode_reply(ErrorReply.of("decode_failed", reason='"batch ends early"'))


def test_a_forwarded_invalid_frame_takes_its_answer_not_the_next_requests() -> None:
    core, tap = forwarding()
    good = encode_request(Batch("orders", 0, messages=(Message(payload=b"a"),)))
    actions = core.receive_client(_corrupt_batch() + good, 1.0)
    assert all(isinstance(a, Send) for a in actions)
    core.receive_broker(DECODE_FAILED, 1.1)
    assert core.in_flight_sends == 1  # the good batch still waits for its ack
    core.receive_broker(encode_reply(BatchAck("OK", 1, 1, "p", 1, 1)), 1.2)
    assert tap.answered()[1:] == [("INVALID", "decode_failed"), ("BATCH", None)]
    assert core.in_flight_sends == 0


def test_a_stream_after_a_forwarded_invalid_frame_is_still_a_stream() -> None:
    core, _ = forwarding()
    stream = encode_request(Stream(topic="orders", partition=0, offset=0))
    core.receive_client(_corrupt_batch() + stream, 1.0)
    delivery = encode_batch(Batch("orders", 0, messages=(Message(offset=7, payload=b"a"),)))
    core.receive_broker(DECODE_FAILED + frame(delivery), 1.1)
    drained = b"".join(a.data for a in core.drain() if isinstance(a, Send))
    (control,) = decode_stream(drained, from_client=False)
    assert control.message == StreamControl("CLOSE", "stopped", 8)


def test_a_closing_refusal_waits_for_the_answers_before_it() -> None:
    """A malformed frame behind a batch still waiting for its ack: the broker
    would answer the batch, then refuse the frame and hang up. The client
    pairs answers in order, so Sluice's refusal must not come first (the
    client would take it for the batch's answer, and the ack be lost)."""
    from sluice.protocols.core import Close, Peer
    from tests.test_cursus_core import relaying, sent

    core, tap = relaying()
    batch = encode_request(Batch("orders", 0, messages=(Message(payload=b"a"),)))
    malformed = frame(b"\x00\x01t")  # a topic and no payload: refused, then closed
    later = encode_request(List())
    actions = core.receive_client(batch + malformed + later, 1.0)
    assert actions == [Send(Peer.BROKER, batch)]  # nothing after the refused frame
    ack = encode_reply(BatchAck("OK", 1, 1, "p", 1, 1))
    actions = core.receive_broker(ack, 1.1)
    to_client = sent(actions, Peer.CLIENT)
    assert to_client.startswith(ack)
    (refusal,) = decode_stream(to_client[len(ack) :], from_client=False)
    assert refusal.message == ErrorReply("malformed_input", ("reason=missing_topic_or_payload",))
    assert isinstance(actions[-1], Close) and actions[-1].reason == "invalid"
    assert ("BATCH", None) in [(e.request, e.error) for e in tap.of(Answered)]


def test_a_closing_refusal_with_nothing_before_it_goes_at_once() -> None:
    from sluice.protocols.core import Close, Peer
    from tests.test_cursus_core import relaying, sent

    core, _ = relaying()
    actions = core.receive_client(frame(b"\x00\x01t"), 1.0)
    assert sent(actions, Peer.CLIENT)[4:].startswith(b"ERROR: malformed_input")
    assert isinstance(actions[-1], Close) and actions[-1].reason == "invalid"
