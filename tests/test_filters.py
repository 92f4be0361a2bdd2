"""The filter API without a process: configuration, chains, and the Pulsar
core carrying out verdicts on frames (batches, codecs, checksums, the order
of SEND_ERRORs, skipped deliveries, schemas asked for)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sluice.errors import ConfigError
from sluice.filters.chain import FilterChain, Filters, make_filters
from sluice.filters.config import FilterConfigError, FilterSpec, load, parse_flag, parse_table
from sluice.filters.schema import SchemaValidation
from sluice.protocols import registry
from sluice.protocols.core import Ask, Conn, Filtered, OnInvalid, Peer
from sluice.protocols.filtering import PASS, PRODUCE, UNKNOWN, Message, Reject, Replace, Schema
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.connection import (
    PulsarConnection,
    PulsarSettings,
    Routing,
    UpstreamFailure,
)
from sluice.protocols.pulsar.decoder import decode_frame
from sluice.protocols.pulsar.encoder import command, encode_payload
from sluice.protocols.pulsar.payload import build_batch, compress, messages
from sluice.protocols.pulsar.urls import parse_broker_url
from tests.helpers.support import SLUICE
from tests.test_pulsar_core import (
    MiB,
    Recording,
    connect_body,
    frame_bytes,
    names,
    sent,
)

T = pb.BaseCommand
WORDS = "tests.helpers.filters:Words"
TOPIC = "persistent://public/default/orders"


# --- configuration ------------------------------------------------------------------


def test_a_flag_names_a_filter_and_its_json() -> None:
    spec = parse_flag(
        'tests.helpers.filters:Words:{"topics": ["persistent://public/default/o*"], '
        '"direction": "produce", "on-error": "open", "settings": {"word": "x"}}'
    )
    assert spec == FilterSpec(
        WORDS, ("persistent://public/default/o*",), "produce", (), "open", {"word": "x"}
    )
    assert parse_flag("schema") == FilterSpec("schema")


def test_every_mistake_in_a_table_is_one_line() -> None:
    with pytest.raises(FilterConfigError) as caught:
        parse_table(
            {
                "name": "schema",
                "direction": "sideways",
                "on_error": "maybe",
                "colour": 1,
                "topics": 5,
            },
            "file x.toml",
        )
    assert caught.value.problems == [
        "file x.toml (schema): unknown key 'colour' (known: name, topics, direction, roles, "
        "on-error, settings, label)",
        "file x.toml (schema): topics: expected a list of patterns, not 5",
        "file x.toml (schema): direction must be one of produce, deliver, both, not 'sideways'",
        "file x.toml (schema): on-error must be one of closed, open, not 'maybe'",
    ]
    with pytest.raises(FilterConfigError, match="not a JSON object"):
        parse_flag("schema:{nope")


def test_settings_are_checked_by_type_each_mistake_said() -> None:
    with pytest.raises(FilterConfigError) as caught:
        load([FilterSpec(WORDS, settings={"word": 3, "error": ["x"], "volume": 11})])
    assert caught.value.problems == [
        "filter 'tests.helpers.filters:Words': unknown setting 'volume' (known: word, error)",
        "filter 'tests.helpers.filters:Words': setting 'word' must be a string, not 3",
        "filter 'tests.helpers.filters:Words': setting 'error' must be a string or nothing, "
        "not ['x']",
    ]
    with pytest.raises(FilterConfigError, match="must be pass or reject"):
        load([FilterSpec("schema", settings={"encrypted": "sometimes"})])


def test_filters_are_found_by_entry_point_or_module_and_said_when_not() -> None:
    (loaded,) = load([FilterSpec("schema")])
    assert isinstance(loaded.filter, SchemaValidation)
    with pytest.raises(FilterConfigError, match=r"no such filter \(known: .*schema"):
        load([FilterSpec("nonesuch")])
    with pytest.raises(FilterConfigError, match="cannot import no_such_module"):
        load([FilterSpec("no_such_module:X")])
    with pytest.raises(FilterConfigError, match=r"is not a sluice\.filters\.Filter subclass"):
        load([FilterSpec("tests.helpers.filters:WordSettings")])


def test_a_protocol_without_filters_refuses_them_at_start() -> None:
    with pytest.raises(ConfigError, match="Cursus connections do not run message filters"):
        make_filters([FilterSpec("schema")], registry.get("cursus"))
    assert make_filters([FilterSpec("schema")], registry.get("pulsar"))


# --- chains -------------------------------------------------------------------------


def _filters(*specs: FilterSpec) -> Filters:
    return Filters(load(list(specs)))


def _message(payload: bytes, topic: str = TOPIC) -> Message:
    return Message(direction=PRODUCE, topic=topic, payload=payload)


def test_topics_match_partitions_and_names_without_their_scheme() -> None:
    filters = _filters(FilterSpec(WORDS, topics=("public/default/ord*",), direction="produce"))
    assert filters.chain(TOPIC + "-partition-3", "produce", None) is not None
    assert filters.chain("persistent://public/default/other", "produce", None) is None
    # direction: produce only; roles: any (none named)
    assert filters.chain(TOPIC, "deliver", None) is None


def test_roles_narrow_a_filter_to_verified_clients() -> None:
    filters = _filters(FilterSpec(WORDS, roles=("app-*",)))
    assert filters.chain(TOPIC, "produce", "app-orders") is not None
    assert filters.chain(TOPIC, "produce", "admin") is None
    assert filters.chain(TOPIC, "produce", None) is None  # passthrough: no verified role


def test_each_filter_counts_the_messages_its_hook_ran_on_for_the_metrics() -> None:
    from prometheus_client import generate_latest

    from sluice.proxy.metrics import Metrics

    metrics = Metrics()
    words = FilterSpec(WORDS, direction="produce", settings={"word": "no"})
    elsewhere = FilterSpec("tests.helpers.filters:Suffix", topics=("persistent://x/y/*",))
    filters = Filters(load([words, elsewhere]), metrics.filter_seen)
    chain = filters.chain(TOPIC, "produce", None)
    assert chain is not None
    for payload in (b"fine", b"no thanks", b"shout"):  # passed, refused, changed
        chain.run(_message(payload))
    # A reload's filters count into the same tally.
    again = Filters(load([words]), metrics.filter_seen).chain(TOPIC, "produce", None)
    assert again is not None
    again.run(_message(b"fine"))
    lines = generate_latest(metrics.exposed).decode().splitlines()
    seen = sorted(line for line in lines if line.startswith("sluice_filter_messages_total{"))
    assert seen == [
        'sluice_filter_messages_total{direction="client_to_broker",filter="'
        'tests.helpers.filters:Suffix",protocol="pulsar"} 0.0',  # its topics matched nothing
        'sluice_filter_messages_total{direction="client_to_broker",filter="'
        'tests.helpers.filters:Words",protocol="pulsar"} 4.0',
    ]


def test_a_hook_that_forgets_to_return_pass_is_told_so_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    filters = _filters(FilterSpec("tests.helpers.filters:Forgets", on_error="open"))
    chain = filters.chain(TOPIC, "produce", None)
    assert chain is not None
    outcome = chain.run(_message(b"x"))
    assert outcome.verdict is PASS and outcome.errors == ("tests.helpers.filters:Forgets",)
    assert "a hook must return PASS when it lets a message by" in caplog.text


def test_a_direction_no_filter_has_a_hook_for_is_not_filtered() -> None:
    filters = _filters(FilterSpec("tests.helpers.filters:Suffix"))
    assert filters.chain(TOPIC, "produce", None) is not None
    assert filters.chain(TOPIC, "deliver", None) is None


def test_a_chain_runs_in_order_and_stops_at_a_refusal() -> None:
    filters = _filters(
        FilterSpec("tests.helpers.filters:Suffix", label="first"),
        FilterSpec(WORDS, settings={"word": "++"}),
    )
    chain = filters.chain(TOPIC, "produce", None)
    assert isinstance(chain, FilterChain) and chain.names == ("first", WORDS)
    outcome = chain.run(_message(b"shout"))
    assert outcome.verdict == Replace(b"SHOUT+", {"loud": "1"}, None)
    assert outcome.filter == WORDS
    assert chain.run(_message(b"calm")).verdict == Replace(b"calm+", None, None)
    refused = _filters(FilterSpec(WORDS), FilterSpec("tests.helpers.filters:Suffix"))
    chain = refused.chain(TOPIC, "produce", None)
    assert chain is not None
    outcome = chain.run(_message(b"a bad one"))
    assert isinstance(outcome.verdict, Reject) and outcome.filter == WORDS


@pytest.mark.parametrize("on_error", ["open", "closed"])
def test_a_filter_that_raises_fails_as_configured(on_error: str) -> None:
    filters = _filters(FilterSpec("tests.helpers.filters:Raises", on_error=on_error))
    chain = filters.chain(TOPIC, "produce", None)
    assert chain is not None
    outcome = chain.run(_message(b"x"))
    assert outcome.errors == ("tests.helpers.filters:Raises",)
    if on_error == "open":
        assert outcome.verdict is PASS
    else:
        assert outcome.verdict == Reject(
            "filter_error", "filter tests.helpers.filters:Raises failed"
        )


def test_schemas_are_kept_the_latest_for_a_while() -> None:
    filters = _filters(FilterSpec("schema"))
    avro = Schema("AVRO", b"{}", {}, b"\0" * 8)
    assert filters.schema(TOPIC, None, 0.0) is UNKNOWN
    filters.learn_schema(TOPIC, None, avro, 0.0)
    assert filters.schema(TOPIC + "-partition-0", None, 1.0) == avro
    assert filters.schema(TOPIC, b"\0" * 8, 1000.0) == avro  # a version never changes
    assert filters.schema(TOPIC, None, 1000.0) is UNKNOWN  # the latest is asked again
    filters.learn_schema(TOPIC, None, None, 0.0)
    assert filters.schema(TOPIC, None, 1.0) is None  # the topic has none
    filters.learn_schema(TOPIC, b"\0" * 8, avro, 0.0)
    # A producer opens at once: what was just learned is kept (a client
    # opening producers over and over would make every SEND of the topic
    # wait for the broker's answer).
    filters.forget_schemas(TOPIC + "-partition-1", 0.5)
    assert filters.schema(TOPIC, b"\0" * 8, 0.6) == avro
    filters.forget_schemas(TOPIC + "-partition-1", 1.0)  # a producer opens: the topic made again?
    assert filters.schema(TOPIC, None, 1.0) is UNKNOWN
    assert filters.schema(TOPIC, b"\0" * 8, 1.0) is UNKNOWN  # its numbers may stand for others


# --- the Pulsar core --------------------------------------------------------------


def _core(
    *specs: FilterSpec,
    client_version: str = "Pulsar-CPP-v3.7.0",
    on_invalid: OnInvalid = OnInvalid.REJECT,
) -> tuple[PulsarConnection, Recording]:
    recording = Recording()
    core = PulsarConnection(
        Conn(1, "127.0.0.1:5000", "plain", "pulsar"),
        PulsarSettings(on_invalid, 5 * MiB, 5, filtering=_filters(*specs)),
        Routing(parse_broker_url("pulsar://127.0.0.1:6650")),
        recording,
    )
    hello = connect_body(proxy_to_broker_url="127.0.0.1:6650")
    hello.client_version = client_version
    core.receive_client(frame_bytes("CONNECT", hello), 0.0)
    core.receive_broker(frame_bytes("CONNECTED", pb.CommandConnected(server_version="b")), 0.1)
    producer = pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1)
    core.receive_client(frame_bytes("PRODUCER", producer), 0.2)
    ok = pb.CommandProducerSuccess(request_id=1, producer_name="p")
    core.receive_broker(frame_bytes("PRODUCER_SUCCESS", ok), 0.3)
    subscribe = pb.CommandSubscribe(topic=TOPIC, subscription="s", consumer_id=2, request_id=2,
                                    subType=pb.CommandSubscribe.Shared)  # fmt: skip
    core.receive_client(frame_bytes("SUBSCRIBE", subscribe), 0.4)
    core.receive_broker(frame_bytes("SUCCESS", pb.CommandSuccess(request_id=2)), 0.5)
    recording.events.clear()
    return core, recording


def _batch(
    payloads: list[bytes], codec: pb.CompressionType.ValueType = pb.LZ4
) -> tuple[pb.MessageMetadata, bytes]:
    entries = [(pb.SingleMessageMetadata(payload_size=len(p)), p) for p in payloads]
    data = build_batch(entries)
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                              compression=codec, uncompressed_size=len(data),
                              num_messages_in_batch=len(payloads))  # fmt: skip
    return meta, compress(codec, data)


def _send(
    sequence_id: int, payloads: list[bytes], codec: pb.CompressionType.ValueType = pb.LZ4
) -> bytes:
    meta, data = _batch(payloads, codec)
    body = pb.CommandSend(producer_id=1, sequence_id=sequence_id, num_messages=len(payloads))
    return encode_payload(command(T.SEND, body), meta, data)


def _receipt(sequence_id: int) -> bytes:
    body = pb.CommandSendReceipt(
        producer_id=1, sequence_id=sequence_id,
        message_id=pb.MessageIdData(ledgerId=1, entryId=sequence_id),
    )  # fmt: skip
    return frame_bytes("SEND_RECEIPT", body)


def _message_frame(payloads: list[bytes], entry: int = 7) -> bytes:
    meta, data = _batch(payloads, pb.ZSTD)
    body = pb.CommandMessage(consumer_id=2, message_id=pb.MessageIdData(ledgerId=1, entryId=entry))
    return encode_payload(command(T.MESSAGE, body), meta, data)


def test_a_changed_batch_is_rebuilt_with_its_codec_and_a_good_checksum() -> None:
    core, rec = _core(FilterSpec(WORDS))
    out = core.receive_client(_send(0, [b"one", b"shout two", b"three"]), 1.0)
    (frame,) = sent(out, Peer.BROKER)
    assert frame.error is None  # the checksum verified, the sizes agree
    assert frame.metadata is not None and frame.metadata.compression == pb.LZ4
    got = messages(frame)
    assert [m.payload for m in got] == [b"one", b"SHOUT TWO", b"three"]
    assert got[1].metadata is not None
    assert {kv.key: kv.value for kv in got[1].metadata.properties} == {"loud": "1"}
    (event,) = rec.of(Filtered)
    assert (event.action, event.filter, event.topic) == ("replaced", WORDS, TOPIC)
    assert event.sent == frame.raw


def test_an_unchanged_send_goes_on_byte_for_byte() -> None:
    core, rec = _core(FilterSpec(WORDS))
    raw = _send(0, [b"fine", b"also fine"])
    out = core.receive_client(raw, 1.0)
    assert b"".join(a.data for a in out if a.to is Peer.BROKER) == raw  # type: ignore[union-attr]
    assert not rec.of(Filtered)


@pytest.mark.parametrize(
    ("client", "code", "sequence"),
    [("Pulsar-CPP-v3.7.0", pb.ChecksumError, 5), ("Pulsar-Java-v4.0.0", pb.NotAllowedError, 7)],
)
def test_a_refused_send_waits_for_the_receipts_before_it(
    client: str, code: int, sequence: int
) -> None:
    core, rec = _core(FilterSpec(WORDS), client_version=client)
    assert names(core.receive_client(_send(1, [b"ok"]), 1.0), Peer.BROKER) == ["SEND"]
    body = pb.CommandSend(producer_id=1, sequence_id=5, highest_sequence_id=7, num_messages=3)
    meta, data = _batch([b"a", b"bad", b"c"])
    refused = core.receive_client(encode_payload(command(T.SEND, body), meta, data), 1.1)
    # Sequence 1 has no receipt yet: the client would take an error now for its answer.
    assert not sent(refused, Peer.CLIENT) and not sent(refused, Peer.BROKER)
    later = core.receive_broker(_receipt(1), 1.2)
    assert names(later, Peer.CLIENT) == ["SEND_RECEIPT", "SEND_ERROR"]
    error = sent(later, Peer.CLIENT)[1].body
    assert (error.error, error.sequence_id) == (code, sequence)
    assert error.message == "message 1 of the batch: message 1 holds 'bad'"
    (event,) = rec.of(Filtered)
    assert (event.action, event.reason) == ("rejected", "word")
    # Nothing in flight now: the next refusal is answered at once.
    now = core.receive_client(_send(8, [b"bad again"]), 1.3)
    assert names(now, Peer.CLIENT) == ["SEND_ERROR"]


def test_a_filter_can_name_the_error_code() -> None:
    core, _ = _core(FilterSpec(WORDS, settings={"error": "NotAllowedError"}))
    out = core.receive_client(_send(0, [b"bad"]), 1.0)
    assert [f.body.error for f in sent(out, Peer.CLIENT)] == [pb.NotAllowedError]


def test_an_error_name_that_is_no_server_error_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core, _ = _core(FilterSpec(WORDS, settings={"error": "NotAllowed"}))  # a typo
    for sequence in range(3):
        out = core.receive_client(_send(sequence, [b"bad"]), 1.0 + sequence)
        (error,) = sent(out, Peer.CLIENT)
        assert error.body.error != pb.NotAllowedError  # the default for the client
    said = [r for r in caplog.records if "names no Pulsar ServerError" in r.getMessage()]
    assert len(said) == 1 and "'NotAllowed'" in said[0].getMessage()


def test_refused_deliveries_are_skipped_acked_and_their_permits_given_back() -> None:
    core, rec = _core(FilterSpec(WORDS))
    out = core.receive_broker(_message_frame([b"a", b"skip me", b"c"]), 1.0)
    (delivered,) = sent(out, Peer.CLIENT)
    assert delivered.error is None
    assert delivered.metadata is not None and delivered.metadata.num_messages_in_batch == 2
    got = messages(delivered)
    assert [m.payload for m in got] == [b"a", b"c"]
    assert all({kv.key: kv.value for kv in m.metadata.properties} == {"seen-by": "sluice"}
               for m in got if m.metadata is not None)  # fmt: skip
    (flow,) = sent(out, Peer.BROKER)
    assert (flow.name, flow.body.messagePermits) == ("FLOW", 1)
    whole = core.receive_broker(_message_frame([b"skip", b"skip too"], entry=8), 1.1)
    assert not sent(whole, Peer.CLIENT)
    ack, flow = sent(whole, Peer.BROKER)
    assert ack.name == "ACK" and ack.body.ack_type == pb.CommandAck.Individual
    assert (ack.body.message_id[0].entryId, ack.body.message_id[0].HasField("batch_index")) == (
        8, False,
    )  # fmt: skip
    assert flow.body.messagePermits == 2
    rejected = [e for e in rec.of(Filtered) if e.action == "rejected"]
    assert [(e.reason, e.messages, e.from_client) for e in rejected] == [
        ("skipped", 1, False), ("skipped", 2, False),
    ]  # fmt: skip


def test_a_filtered_connection_leaves_the_compiled_path_and_others_keep_it() -> None:
    core, _ = _core(FilterSpec(WORDS, topics=("*orders",)))
    assert core._filtered(True) and core._filtered(False)
    other, _ = _core(FilterSpec(WORDS, topics=("*elsewhere",)))
    assert not other._filtered(True) and not other._filtered(False)


def _avro_record_answer() -> pb.CommandGetSchemaResponse:
    """The broker's answer to GET_SCHEMA: version 0, an Avro record of an
    int ``id`` and a string ``s``."""
    definition = (b'{"type": "record", "name": "R", "fields": [{"name": "id", "type": "int"}, '
                  b'{"name": "s", "type": "string"}]}')  # fmt: skip
    return pb.CommandGetSchemaResponse(
        request_id=1, schema_version=b"\0" * 8,
        schema=pb.Schema(name="R", schema_data=definition, type=pb.Schema.Avro),
    )  # fmt: skip


def test_a_send_waits_for_its_schema_and_what_follows_waits_behind_it() -> None:
    core, rec = _core(FilterSpec("schema"))
    first = core.receive_client(_send(0, [b"\x02\x06abc"]), 1.0)
    (ask,) = first
    assert isinstance(ask, Ask) and ask.request[0] == T.GET_SCHEMA
    assert ask.request[1].topic == TOPIC and not ask.request[1].HasField("schema_version")
    # The client's next frames wait behind the held SEND, in order.
    assert core.receive_client(_send(1, [b"garbage"]) + frame_bytes("PING"), 1.1) == []
    answer = _avro_record_answer()
    out = core.answered(ask.token, decode_frame(frame_bytes("GET_SCHEMA_RESPONSE", answer)), 1.2)
    assert names(out, Peer.BROKER) == ["SEND", "PING"]
    assert not sent(out, Peer.CLIENT)  # the refusal of 1 waits for 0's receipt
    _, error = sent(core.receive_broker(_receipt(0), 1.25), Peer.CLIENT)
    assert error.name == "SEND_ERROR" and error.body.sequence_id == 1
    assert "field 'id'" in error.body.message or "field 's'" in error.body.message
    # Known now: no second question.
    assert names(core.receive_client(_send(2, [b"\x04\x02z"]), 1.3), Peer.BROKER) == ["SEND"]
    (refused,) = [e for e in rec.of(Filtered) if e.action == "rejected"]
    assert refused.filter == "schema" and refused.reason in ("not_avro", "trailing_bytes")


def test_a_topic_without_a_schema_passes_and_a_failed_question_is_retried() -> None:
    core, _ = _core(FilterSpec("schema"))
    (ask,) = core.receive_client(_send(0, [b"anything"]), 1.0)
    assert isinstance(ask, Ask)
    none = pb.CommandGetSchemaResponse(request_id=1, error_code=pb.TopicNotFound)
    out = core.answered(ask.token, decode_frame(frame_bytes("GET_SCHEMA_RESPONSE", none)), 1.1)
    assert names(out, Peer.BROKER) == ["SEND"]
    core2, _ = _core(FilterSpec("schema"))
    (ask,) = core2.receive_client(_send(0, [b"anything"]), 1.0)
    assert isinstance(ask, Ask)
    out = core2.answered(ask.token, UpstreamFailure("broker went away"), 1.1)
    (error,) = sent(out, Peer.CLIENT)
    # A code on which clients reconnect and send again, not one that fails the send.
    assert error.body.error == pb.ServiceNotReady


def test_a_send_naming_a_version_the_topic_lacks_is_refused_not_passed() -> None:
    """The broker answers GET_SCHEMA for a version the topic lacks as for a
    topic without a schema (TopicNotFound). For a SEND that named a version
    that says only that the version is unknown: the SEND is refused, not
    passed unchecked (garbage went through to readers, and the topic was
    taken for one without a schema from then on)."""
    core, _ = _core(FilterSpec("schema"))
    meta, data = _batch([b"garbage, not avro"])
    meta.schema_version = (99).to_bytes(8, "big")
    body = pb.CommandSend(producer_id=1, sequence_id=0, num_messages=1)
    (ask,) = core.receive_client(encode_payload(command(T.SEND, body), meta, data), 1.0)
    assert isinstance(ask, Ask) and ask.request[1].schema_version == meta.schema_version
    none = pb.CommandGetSchemaResponse(request_id=1, error_code=pb.TopicNotFound)
    out = core.answered(ask.token, decode_frame(frame_bytes("GET_SCHEMA_RESPONSE", none)), 1.1)
    assert names(out, Peer.BROKER) == []
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "SEND_ERROR" and "no schema version 0000000000000063" in error.body.message


def test_an_invalid_send_filters_act_on_is_refused_even_when_invalid_frames_go_on() -> None:
    """--on-invalid forward passes frames Sluice finds invalid on as they
    came; not a SEND that filters act on (encryption fails closed: such a
    SEND went to the broker in plaintext). It is refused; elsewhere the
    invalid SEND still goes on."""
    partial = pb.MessageMetadata(producer_name="p", sequence_id=5).SerializePartialToString()
    body = pb.CommandSend(producer_id=1, sequence_id=5, num_messages=1)
    invalid = encode_payload(command(T.SEND, body), partial, b"SECRET")  # no publish_time
    core, _ = _core(FilterSpec("schema"), on_invalid=OnInvalid.FORWARD)
    out = core.receive_client(invalid, 1.0)
    assert names(out, Peer.BROKER) == []
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "SEND_ERROR" and "publish_time" in error.body.message
    plain, _ = _core(on_invalid=OnInvalid.FORWARD)  # no filter: as it came
    assert names(plain.receive_client(invalid, 1.0), Peer.BROKER) == ["SEND"]


def _chunk(chunk_id: int, chunks: int = 2) -> bytes:
    meta = pb.MessageMetadata(
        producer_name="p", sequence_id=3, publish_time=1, uuid="p-3", chunk_id=chunk_id,
        num_chunks_from_msg=chunks, total_chunk_msg_size=10,
    )  # fmt: skip
    body = pb.CommandSend(producer_id=1, sequence_id=3, is_chunk=True)
    return encode_payload(command(T.SEND, body), meta, b"chunk")


def test_chunked_messages_on_a_filtered_topic_are_refused_not_reassembled() -> None:
    core, rec = _core(FilterSpec(WORDS))
    out = core.receive_client(_chunk(0), 1.0)
    (error,) = sent(out, Peer.CLIENT)
    assert not sent(out, Peer.BROKER)
    assert error.name == "SEND_ERROR" and "chunked messages are not filtered" in error.body.message
    assert [(e.action, e.reason) for e in rec.of(Filtered)] == [("rejected", "chunked")]
    # A chunked delivery is skipped: acknowledged, its permit given back.
    meta = pb.MessageMetadata(
        producer_name="p", sequence_id=3, publish_time=1, uuid="p-3", chunk_id=1,
        num_chunks_from_msg=2, total_chunk_msg_size=10,
    )  # fmt: skip
    body = pb.CommandMessage(consumer_id=2, message_id=pb.MessageIdData(ledgerId=1, entryId=9))
    out = core.receive_broker(encode_payload(command(T.MESSAGE, body), meta, b"chunk"), 1.1)
    assert not sent(out, Peer.CLIENT)
    assert names(out, Peer.BROKER) == ["ACK", "FLOW"]


def test_a_change_past_the_frame_limit_is_refused_not_raised() -> None:
    core, rec = _core(FilterSpec("tests.helpers.filters:Grow"))
    out = core.receive_client(_send(0, [b"x"]), 1.0)
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "SEND_ERROR" and "cannot be sent" in error.body.message
    assert [(e.action, e.reason) for e in rec.of(Filtered)] == [("rejected", "too_large")]


def _proxy_config(tmp_path: Path, toml: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "sluice.toml"
    # Not 6650, the default listener's port: a broker that is Sluice's own
    # listener is refused before the filters are looked at.
    path.write_text('broker = "pulsar://127.0.0.1:6659"\n' + toml)
    return subprocess.run([*SLUICE, "proxy", "--config", str(path), *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.e2e  # runs the command
def test_filters_tables_in_the_toml_file(tmp_path: Path) -> None:
    good = _proxy_config(tmp_path, """
[[filters]]
name = "schema"
topics = ["persistent://acme/*"]
direction = "produce"

[[filters]]
name = "tests.helpers.filters:Words"
settings = { word = "nope" }
""", "--print-config")  # fmt: skip
    assert good.returncode == 0, good.stderr
    (line,) = [x for x in good.stdout.splitlines() if x.startswith("filters = ")]
    # Printed the way a file or flag says it, so the printed file reads back.
    assert line.split("  #")[0] == (
        'filters = ["schema:{\\"topics\\": [\\"persistent://acme/*\\"], \\"direction\\": '
        '\\"produce\\"}", "tests.helpers.filters:Words:{\\"settings\\": {\\"word\\": \\"nope\\"}}"]'
    )
    bad = _proxy_config(tmp_path, """
[[filters]]
name = "schema"
direction = "sideways"

[[filters]]
name = "schema"
on-error = "maybe"
""")  # fmt: skip
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.splitlines() == [
        f"sluice proxy: file {tmp_path / 'sluice.toml'}: filters (schema): direction must be "
        "one of produce, deliver, both, not 'sideways'",
        f"sluice proxy: file {tmp_path / 'sluice.toml'}: filters (schema): on-error must be "
        "one of closed, open, not 'maybe'",
    ]
    unknown = _proxy_config(tmp_path, '[[filters]]\nname = "nonesuch"\n')
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("sluice proxy: filter 'nonesuch': no such filter (known: ")


def test_each_configured_filter_has_its_error_count_at_zero_from_the_start() -> None:
    """SluiceFilterRaising takes increase() of it: without a sample before the
    first error, the first error is missed."""
    from sluice.proxy.config import ProxyConfig
    from sluice.proxy.server import Proxy

    config = ProxyConfig(
        broker=parse_broker_url("pulsar://127.0.0.1:6650"),
        filters=(parse_flag('schema:{"label": "guard"}'),),
    )
    registry = Proxy(config).metrics.registry
    assert registry.get_sample_value("sluice_filter_errors_total", {"filter": "guard"}) == 0


def test_a_filter_with_roles_is_refused_in_passthrough_mode_where_no_client_has_one() -> None:
    from sluice.addresses import Address
    from sluice.proxy.config import ProxyConfig

    def config(auth_mode: str, **more: object) -> ProxyConfig:
        return ProxyConfig(
            broker=parse_broker_url("pulsar://127.0.0.1:6650"),
            listen=Address("127.0.0.1", 0),
            auth_mode=auth_mode,
            filters=(FilterSpec(WORDS, roles=("app-*",), label="apps"),),
            **more,  # type: ignore[arg-type]
        )

    with pytest.raises(ConfigError, match="filter 'apps': roles need --auth-mode proxy"):
        config("passthrough")
    with pytest.raises(ConfigError) as caught:  # proxy mode: refused for another reason
        config("proxy")
    assert "roles" not in str(caught.value)


def test_an_empty_schema_version_is_none_the_latest_schema_checks_it() -> None:
    """Apache Pulsar answers a schemaless producer's PRODUCER with the empty
    schema version, which the Java client puts on every message. Sluice
    asked the broker for that version ("Empty schema version") and refused
    the valid messages of every such producer."""
    core, _ = _core(FilterSpec("schema"), client_version="Pulsar-Java-v4.0.8")
    meta, data = _batch([b"\x02\x06abc"])
    meta.schema_version = b""
    body = pb.CommandSend(producer_id=1, sequence_id=0, num_messages=1)
    (ask,) = core.receive_client(encode_payload(command(T.SEND, body), meta, data), 1.0)
    assert isinstance(ask, Ask) and not ask.request[1].HasField("schema_version")
    answer = _avro_record_answer()
    out = core.answered(ask.token, decode_frame(frame_bytes("GET_SCHEMA_RESPONSE", answer)), 1.1)
    assert names(out, Peer.BROKER) == ["SEND"]
    # Known now, and checked: garbage with the empty version is refused.
    meta, data = _batch([b"garbage, not avro"])
    meta.schema_version = b""
    second = pb.CommandSend(producer_id=1, sequence_id=1, num_messages=1)
    core.receive_broker(_receipt(0), 1.2)
    out = core.receive_client(encode_payload(command(T.SEND, second), meta, data), 1.3)
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "SEND_ERROR"
    assert "field 'id'" in error.body.message or "field 's'" in error.body.message
