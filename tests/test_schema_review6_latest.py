"""A producer that registers a new schema version on the connection (a
GET_OR_CREATE_SCHEMA, or a PRODUCER carrying a schema) makes it the topic's
latest. Sluice kept its cached latest for up to 30 s (LATEST_FOR), so the
messages that name no schema version were checked against the previous
schema: valid ones refused, and ones the new schema refuses passed."""

from __future__ import annotations

import pytest

from sluice.filters.chain import Filters
from sluice.filters.config import FilterSpec, load
from sluice.protocols.core import Ask, Peer
from sluice.protocols.filtering import UNKNOWN, Schema
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.decoder import decode_frame
from sluice.protocols.pulsar.filtering import FilterGate
from tests.test_filters import TOPIC, _avro_record_answer, _core, _receipt, _send
from tests.test_pulsar_core import frame_bytes, names, sent

T = pb.BaseCommand

# Version 1: one string field "t". Version 0 (``_avro_record_answer``): an
# int "id" and a string "s".
NEW = b'{"type": "record", "name": "R", "fields": [{"name": "t", "type": "string"}]}'
V0, V1 = (0).to_bytes(8, "big"), (1).to_bytes(8, "big")
FITS_NEW = b"\x06abc"  # t = "abc": not a version-0 record (it ends early)


def _new_schema() -> pb.Schema:
    return pb.Schema(name="R", schema_data=NEW, type=pb.Schema.Avro)


def _gate() -> tuple[FilterGate, Filters]:
    filters = Filters(load([FilterSpec("schema")]))
    gate = FilterGate(filters, None, None, 5 << 20, None)  # type: ignore[arg-type]
    return gate, filters


def _old(filters: Filters, now: float) -> None:
    old = Schema("AVRO", b"{}", {}, V0)
    filters.learn_schema(TOPIC, None, old, now)


def test_get_or_create_schema_with_a_new_version_makes_it_the_latest() -> None:
    gate, filters = _gate()
    _old(filters, 1.0)
    ask = pb.CommandGetOrCreateSchema(request_id=7, topic=TOPIC, schema=_new_schema())
    gate.named(decode_frame(frame_bytes("GET_OR_CREATE_SCHEMA", ask)), 1.1)
    answer = pb.CommandGetOrCreateSchemaResponse(request_id=7, schema_version=V1)
    gate.registered(decode_frame(frame_bytes("GET_OR_CREATE_SCHEMA_RESPONSE", answer)), 1.2)
    latest = filters.schema(TOPIC + "-partition-0", None, 1.3)
    assert isinstance(latest, Schema)
    assert (latest.data, latest.version) == (NEW, V1)


def test_a_producer_whose_schema_makes_a_new_version_makes_it_the_latest() -> None:
    gate, filters = _gate()
    _old(filters, 1.0)
    producer = pb.CommandProducer(topic=TOPIC, producer_id=3, request_id=8, schema=_new_schema())
    gate.named(decode_frame(frame_bytes("PRODUCER", producer)), 1.1)
    ok = pb.CommandProducerSuccess(request_id=8, producer_name="p", schema_version=V1)
    gate.registered(decode_frame(frame_bytes("PRODUCER_SUCCESS", ok)), 1.2)
    latest = filters.schema(TOPIC, None, 1.3)
    assert isinstance(latest, Schema) and latest.version == V1


@pytest.mark.parametrize("answered", [V0, b""])
def test_an_existing_or_no_version_leaves_the_latest(answered: bytes) -> None:
    """The broker answers a schema it holds already with that version,
    which may be older than the latest: the latest stays."""
    gate, filters = _gate()
    _old(filters, 1.0)
    filters.learn_schema(TOPIC, None, Schema("AVRO", b"{}", {}, V1), 1.0)
    ask = pb.CommandGetOrCreateSchema(request_id=7, topic=TOPIC, schema=_new_schema())
    gate.named(decode_frame(frame_bytes("GET_OR_CREATE_SCHEMA", ask)), 1.1)
    answer = pb.CommandGetOrCreateSchemaResponse(request_id=7, schema_version=answered)
    gate.registered(decode_frame(frame_bytes("GET_OR_CREATE_SCHEMA_RESPONSE", answer)), 1.2)
    latest = filters.schema(TOPIC, None, 1.3)
    assert isinstance(latest, Schema) and (latest.data, latest.version) == (b"{}", V1)


def test_a_refused_registration_leaves_the_latest_unknown_stays_unknown() -> None:
    gate, filters = _gate()
    _old(filters, 1.0)
    ask = pb.CommandGetOrCreateSchema(request_id=7, topic=TOPIC, schema=_new_schema())
    gate.named(decode_frame(frame_bytes("GET_OR_CREATE_SCHEMA", ask)), 1.1)
    refused = pb.CommandGetOrCreateSchemaResponse(
        request_id=7, error_code=pb.IncompatibleSchema, schema_version=V1
    )
    gate.registered(decode_frame(frame_bytes("GET_OR_CREATE_SCHEMA_RESPONSE", refused)), 1.2)
    latest = filters.schema(TOPIC, None, 1.3)
    assert isinstance(latest, Schema) and latest.version == V0
    # A topic whose latest is not cached: the next SEND asks the broker.
    other = "persistent://public/default/other"
    ask = pb.CommandGetOrCreateSchema(request_id=9, topic=other, schema=_new_schema())
    gate.named(decode_frame(frame_bytes("GET_OR_CREATE_SCHEMA", ask)), 1.1)
    answer = pb.CommandGetOrCreateSchemaResponse(request_id=9, schema_version=V1)
    gate.registered(decode_frame(frame_bytes("GET_OR_CREATE_SCHEMA_RESPONSE", answer)), 1.2)
    assert filters.schema(other, None, 1.3) is UNKNOWN


# Through the connection: needs sluice/protocols/pulsar/connection.py to hand
# the client's GET_OR_CREATE_SCHEMA to ``FilterGate.named`` and the broker's
# PRODUCER_SUCCESS / GET_OR_CREATE_SCHEMA_RESPONSE to ``FilterGate.registered``.
def _learn_v0(core: object) -> None:
    (ask,) = core.receive_client(_send(0, [b"\x02\x06abc"]), 1.0)  # type: ignore[attr-defined]
    assert isinstance(ask, Ask)
    answer = decode_frame(frame_bytes("GET_SCHEMA_RESPONSE", _avro_record_answer()))
    out = core.answered(ask.token, answer, 1.1)  # type: ignore[attr-defined]
    assert names(out, Peer.BROKER) == ["SEND"]
    core.receive_broker(_receipt(0), 1.15)  # type: ignore[attr-defined]


def test_a_send_after_get_or_create_schema_is_checked_against_the_new_version() -> None:
    core, _ = _core(FilterSpec("schema"))
    _learn_v0(core)
    ask = pb.CommandGetOrCreateSchema(request_id=7, topic=TOPIC, schema=_new_schema())
    core.receive_client(frame_bytes("GET_OR_CREATE_SCHEMA", ask), 1.2)
    answer = pb.CommandGetOrCreateSchemaResponse(request_id=7, schema_version=V1)
    core.receive_broker(frame_bytes("GET_OR_CREATE_SCHEMA_RESPONSE", answer), 1.3)
    out = core.receive_client(_send(1, [FITS_NEW]), 1.4)
    assert not sent(out, Peer.CLIENT)  # not refused by the version-0 schema
    assert names(out, Peer.BROKER) == ["SEND"]


def test_a_send_after_a_producer_registered_a_version_is_checked_against_it() -> None:
    core, _ = _core(FilterSpec("schema"))
    _learn_v0(core)
    producer = pb.CommandProducer(topic=TOPIC, producer_id=3, request_id=8, schema=_new_schema())
    core.receive_client(frame_bytes("PRODUCER", producer), 1.2)
    ok = pb.CommandProducerSuccess(request_id=8, producer_name="q", schema_version=V1)
    core.receive_broker(frame_bytes("PRODUCER_SUCCESS", ok), 1.3)
    out = core.receive_client(_send(1, [FITS_NEW]), 1.4)
    assert not sent(out, Peer.CLIENT)
    assert names(out, Peer.BROKER) == ["SEND"]
