"""``sluice record anonymize`` on Pulsar frames built here, without a
broker: what a frame's fields hold after ``anonymized_frame``."""

from __future__ import annotations

import json

from sluice.protocols.pseudonyms import Pseudonyms
from sluice.protocols.pulsar import encode, pb
from sluice.protocols.pulsar.anonymize import anonymized_frame, schema_name
from sluice.protocols.pulsar.decoder import decode_frame

KEY = b"k" * 32
TOPIC = "persistent://initech/payroll/salaries"


def key_value(key: bytes, value: bytes) -> bytes:
    """A KEY_VALUE schema's data: each part's behind its 4-byte length."""
    return b"".join(len(p).to_bytes(4, "big") + p for p in (key, value))


def parts(data: bytes) -> list[bytes]:
    """A KEY_VALUE schema's data split again (its lengths must fit)."""
    key_size = int.from_bytes(data[:4], "big")
    key, rest = data[4 : 4 + key_size], data[4 + key_size :]
    value_size = int.from_bytes(rest[:4], "big")
    assert len(rest) == 4 + value_size, (key_size, value_size, len(data))
    return [key, rest[4:]]


def test_a_key_value_schemas_parts_are_scrubbed_each_and_keep_their_lengths() -> None:
    """A KEY_VALUE schema's data is two schemas behind 4-byte lengths: it
    was scrubbed as one text, so a length with a byte over 0x7f (not UTF-8)
    left all of it as it was, and one without came out with lengths that no
    longer fit the scrubbed parts."""
    for padding in (0, 130):  # a key schema shorter than 128 bytes, then longer
        names = Pseudonyms(KEY)
        names.topic(TOPIC)
        key = json.dumps({"type": "record", "name": "salaries", "doc": "x" * padding,
                          "namespace": "payroll"}).encode()  # fmt: skip
        value = json.dumps({"type": "record", "name": "initech", "fields": []}).encode()
        cmd = pb.BaseCommand(type=pb.BaseCommand.PRODUCER)
        cmd.producer.topic, cmd.producer.producer_id, cmd.producer.request_id = TOPIC, 1, 1
        cmd.producer.schema.name, cmd.producer.schema.type = "kv", pb.Schema.KeyValue
        cmd.producer.schema.schema_data = key_value(key, value)
        done = anonymized_frame(encode(cmd), names)
        assert done is not None
        command = decode_frame(done[0]).command
        assert command is not None
        data = command.producer.schema.schema_data
        for original in (b"initech", b"payroll", b"salaries"):
            assert original not in data, (padding, original, data)
        key_part, value_part = parts(data)
        # In a schema a pseudonym is written as an Avro name (schema_name).
        assert json.loads(key_part)["namespace"] == schema_name(names.name("namespace", "payroll"))
        assert json.loads(value_part)["name"] == schema_name(names.name("tenant", "initech"))
