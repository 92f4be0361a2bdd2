"""What replay compares of a broker frame: values that differ from run to
run whatever the broker does are left out, the rest is kept."""

from __future__ import annotations

from typing import Any

from sluice.protocols.pulsar import Frame, Type, command, decode_frame, encode, pb
from sluice.replay.pulsar import normalise

T = Type.Value


def frame(name: str, body: Any) -> Frame:
    return decode_frame(encode(command(T(name), body)))


def stats(**fields: Any) -> pb.CommandConsumerStatsResponse:
    base: dict[str, Any] = {"request_id": 7, "consumerName": "c", "availablePermits": 990,
                            "unackedMessages": 3, "msgBacklog": 10}  # fmt: skip
    return pb.CommandConsumerStatsResponse(**{**base, **fields})


def test_consumer_stats_compare_state_not_rates_addresses_or_times() -> None:
    recorded = stats(msgRateOut=12.5, msgThroughputOut=800.0, msgRateRedeliver=0.5,
                     msgRateExpired=0.1, messageAckRate=3.0, address="/127.0.0.1:40112",
                     connectedSince="2026-12-07T03:00:00Z")  # fmt: skip
    live = stats(msgRateOut=3.2, msgThroughputOut=210.0, msgRateRedeliver=0.0,
                 msgRateExpired=0.0, messageAckRate=1.0, address="/127.0.0.1:51876",
                 connectedSince="2026-12-07T04:10:31Z")  # fmt: skip
    name = "CONSUMER_STATS_RESPONSE"
    assert normalise(frame(name, recorded)) == normalise(frame(name, live))
    # What the broker's state decides is still compared.
    for changed in ({"msgBacklog": 11}, {"unackedMessages": 0}, {"availablePermits": 1000}):
        assert normalise(frame(name, stats(**changed))) != normalise(frame(name, stats()))


def test_schema_answers_compare_the_schema_not_the_version_the_registry_gave() -> None:
    from sluice.replay.pulsar import Remap

    schema = pb.Schema(name="s", schema_data=b'{"type":"string"}', type=pb.Schema.Json)
    versions = (b"\x00" * 8, b"\x00" * 7 + b"\x03")
    created = [frame("GET_OR_CREATE_SCHEMA_RESPONSE", pb.CommandGetOrCreateSchemaResponse(
        request_id=4, schema_version=version)) for version in versions]  # fmt: skip
    assert normalise(created[0]) == normalise(created[1])
    got = [frame("GET_SCHEMA_RESPONSE", pb.CommandGetSchemaResponse(
        request_id=5, schema=schema, schema_version=version))
        for version in versions]  # fmt: skip
    assert normalise(got[0]) == normalise(got[1])
    other = pb.Schema(name="s", schema_data=b'{"type":"int"}', type=pb.Schema.Json)
    changed = frame("GET_SCHEMA_RESPONSE", pb.CommandGetSchemaResponse(
        request_id=5, schema=other, schema_version=b"\x00" * 8))  # fmt: skip
    assert normalise(changed) != normalise(got[0])
    # The version the live registry gave is the one asked for afterwards.
    remap = Remap()
    remap.learn(created[0], created[1])
    asked = frame("GET_SCHEMA", pb.CommandGetSchema(request_id=5, topic="t",
                                                     schema_version=b"\x00" * 8))  # fmt: skip
    sent: Any = decode_frame(remap.client_frame(asked)).body
    assert sent.schema_version == b"\x00" * 7 + b"\x03"


def test_a_migrated_topic_compares_who_moved_not_the_brokers_url() -> None:
    def migrated(url: str, resource: int = 1) -> str:
        return normalise(frame("TOPIC_MIGRATED", pb.CommandTopicMigrated(
            resource_id=resource, resource_type=pb.CommandTopicMigrated.Producer,
            brokerServiceUrl=url, brokerServiceUrlTls=url.replace("pulsar:", "pulsar+ssl:"),
        )))  # fmt: skip

    assert migrated("pulsar://green-1:6650") == migrated("pulsar://127.0.0.1:40001")
    assert migrated("pulsar://green-1:6650") != migrated("pulsar://green-1:6650", resource=2)


def test_a_live_messages_credential_property_is_compared_and_shown_as_recorded() -> None:
    """A recording keeps no property that names a credential (its value is
    the redaction marker); a live broker's MESSAGE carries the value. Both
    read the same, and a transcript shows none."""
    from sluice.protocols.pulsar import encode_payload
    from sluice.protocols.pulsar.redact import MARKER

    def message(secret: str) -> Frame:
        body = pb.CommandMessage(consumer_id=1, message_id=pb.MessageIdData(ledgerId=1, entryId=2))
        meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                                  properties=[pb.KeyValue(key="jwt", value=secret),
                                              pb.KeyValue(key="colour", value="red")])  # fmt: skip
        return decode_frame(encode_payload(command(T("MESSAGE"), body), meta, b"x"))

    live = normalise(message("eyJhbGciOi.secret.sig"))
    assert "eyJhbGciOi" not in live and "red" in live
    assert live == normalise(message(MARKER))
