"""The written Cursus spec's positional command forms (``CREATE t 4`` for
``CREATE topic=t partitions=4``): decoded into the same commands as the
``key=value`` forms, so that ``--on-invalid reject`` no longer refuses a
client that writes them."""

from __future__ import annotations

import struct

import pytest
import trio

from sluice.protocols.core import OnInvalid
from sluice.protocols.cursus import (
    BatchCommit,
    Consume,
    Create,
    Delete,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    Stream,
    SyncGroup,
    decode_frame,
    encode_request,
    format_command,
    frame,
    parse_command,
)
from sluice.protocols.cursus.commands import Command
from sluice.protocols.cursus.errors import Problem, RemoteProtocolError
from tests.helpers.cursus_broker import open_cluster
from tests.test_cursus_broker import Wire
from tests.test_cursus_proxy import start_proxy

# Each positional form of the spec, and the command the key=value form is.
FORMS: list[tuple[str, Command]] = [
    ("CREATE t 4", Create(topic="t", partitions=4)),
    ("DELETE t", Delete(topic="t")),
    ("CONSUME t 1 5", Consume(topic="t", partition=1, offset=5)),
    ("STREAM t 1 5", Stream(topic="t", partition=1, offset=5)),
    ("JOIN_GROUP t g c1", JoinGroup(topic="t", group="g", member="c1")),
    ("LEAVE_GROUP t g c1-0001", LeaveGroup(topic="t", group="g", member="c1-0001")),
    ("SYNC_GROUP t g c1-0001 3", SyncGroup(topic="t", group="g", member="c1-0001", generation=3)),
    (
        "HEARTBEAT t g c1 c1-0001 3",
        Heartbeat(topic="t", group="g", member="c1-0001", generation=3, args=("c1",)),
    ),
    (
        "BATCH_COMMIT t g c1-0001 3 P0:5,P1:7",
        BatchCommit(topic="t", group="g", member="c1-0001", generation=3, offsets=((0, 5), (1, 7))),
    ),
]


def envelope(topic: str, text: str) -> bytes:
    """A client frame: ``[u16 len][topic][command]``, as every client wraps one."""
    data = topic.encode()
    return frame(struct.pack(">H", len(data)) + data + text.encode())


@pytest.mark.parametrize(("text", "expected"), FORMS, ids=[t for t, _ in FORMS])
def test_a_positional_form_is_the_same_command(text: str, expected: Command) -> None:
    assert parse_command(text) == expected
    for raw in (frame(text.encode()), envelope("", text)):  # bare and in an envelope
        decoded = decode_frame(raw, from_client=True)
        assert decoded.error is None, decoded.error
        assert decoded.message == expected
        assert decoded.raw == raw  # what a proxy relays: the bytes as sent
    # Re-encoded, it is the key=value form the broker and the client speak,
    # which reads back as the same command.
    again = format_command(parse_command(text))
    assert "=" in again
    assert parse_command(again) == expected


def test_a_positional_form_with_words_missing_or_wrong_is_still_invalid() -> None:
    for text, problem in (
        ("CREATE t", Problem.MISSING_FIELD),
        ("CONSUME t 1", Problem.MISSING_FIELD),
        ("CREATE t four", Problem.PARSE),
        ("SYNC_GROUP t g m x", Problem.PARSE),
        ("BATCH_COMMIT t g m 3", Problem.MISSING_FIELD),
    ):
        with pytest.raises(RemoteProtocolError) as caught:
            parse_command(text)
        assert caught.value.problem is problem, (text, caught.value)


def test_key_value_forms_are_unchanged() -> None:
    assert parse_command("CREATE topic=t partitions=4") == Create(topic="t", partitions=4)
    # Bare words beside key=value words stay bare words, as before.
    assert parse_command("DELETE topic=t extra") == Delete(topic="t", args=("extra",))
    with pytest.raises(RemoteProtocolError):
        parse_command("CREATE partitions=4 t")  # no topic= and not the positional form


@pytest.mark.e2e
async def test_a_positional_create_passes_a_rejecting_proxy() -> None:
    """The proxy refused ``CREATE t 4`` as invalid (``--on-invalid reject``):
    the client got ``ERROR: invalid_command`` and the topic was never made."""
    async with open_cluster(1) as cluster, trio.open_nursery() as nursery:
        proxy = await start_proxy(nursery, cluster, on_invalid=OnInvalid.REJECT)
        w = await Wire.open(proxy.address)
        await w.send(envelope("admin", "CREATE positional 4"))
        reply = await w.receive()
        assert reply.body.startswith(b"OK topic=positional partitions=4"), reply.body
        await w.send(frame(b"DELETE positional"))  # bare, as the spec's clients write it
        reply = await w.receive()
        assert reply.body == b"OK topic=positional deleted=true", reply.body
        # The key=value form still works on the same connection.
        assert (await w.ask(Create(topic="kv", partitions=2))).body.startswith(b"OK topic=kv")
        await w.aclose()
        assert "kv" in cluster.topics and "positional" not in cluster.topics
        nursery.cancel_scope.cancel()


def test_encode_request_still_writes_key_value() -> None:
    raw = encode_request(Create(topic="t", partitions=4), envelope_topic="admin")
    assert raw.endswith(b"CREATE topic=t partitions=4")
