"""sluice view's detail of a Cursus frame: what it decodes to, fields and all."""

from __future__ import annotations

from sluice.protocols.cursus import Batch, Consume, Message, encode_batch, encode_request, frame
from sluice.protocols.registry import get


def test_a_command_shows_its_fields_without_its_envelope() -> None:
    detail = get("cursus").detail
    assert detail is not None
    raw = encode_request(Consume(topic="orders", partition=2, offset=5, member="m", group="g"))
    shown = detail(raw, {"dir": "C→B"}, get("cursus").decode)
    assert shown["text"] == "CONSUME topic=orders partition=2 offset=5 member=m group=g"
    assert shown["envelope"] == ""
    fields = shown["fields"]
    assert (fields["topic"], fields["partition"], fields["offset"], fields["group"]) == (
        "orders", 2, 5, "g",
    )  # fmt: skip


def test_a_batch_recorded_whole_shows_its_header_and_messages() -> None:
    detail = get("cursus").detail
    assert detail is not None
    batch = Batch("orders", 1, messages=(Message(offset=7, key="k", payload=b"hello"),
                                         Message(offset=8, payload=b"\xff" * 3000)))  # fmt: skip
    shown = detail(frame(encode_batch(batch)), {"dir": "B→C"}, get("cursus").decode)
    head = shown["batch"]
    assert (head["topic"], head["partition"]) == ("orders", 1)
    first, second = head["messages"]
    assert (first["offset"], first["key"], first["payload"]["text"]) == (7, "k", "hello")
    assert second["payload"]["size"] == 3000 and second["payload"]["cut"]


def test_a_reply_shows_its_code_and_words() -> None:
    detail = get("cursus").detail
    assert detail is not None
    shown = detail(
        frame(b"ERROR: NOT_LEADER LEADER_IS 127.0.0.1:19001"), {"dir": "B→C"}, get("cursus").decode
    )
    assert shown["fields"]["code"] == "NOT_LEADER"
    assert shown["fields"]["words"] == ["LEADER_IS", "127.0.0.1:19001"]
