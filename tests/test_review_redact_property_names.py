"""Review: a message property named like a credential by Sluice's own list
(``protocols/credentials.py``: jwt, pwd, passphrase, bearer, signature)
reached recordings in the clear, because the recorder's narrower pattern
(``redact.py``) did not know those names."""

from __future__ import annotations

import pytest

from sluice.protocols.credentials import names_a_credential
from sluice.protocols.pulsar import Type, command, decode_frame, encode_payload, pb
from sluice.protocols.pulsar.redact import sensitive_key
from sluice.recording.format import PayloadPolicy
from sluice.recording.pulsar import FrameRecorder

SECRET = "eyJhbGciOiJIUzI1NiJ9.property.secret-0451"
NAMES = ("jwt", "db_pwd", "passphrase", "bearer", "signature")


@pytest.mark.parametrize("name", NAMES)
def test_a_property_named_like_a_credential_is_not_recorded(name: str) -> None:
    assert names_a_credential(name)
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    meta.properties.add(key=name, value=SECRET)
    send = command(Type.Value("SEND"), pb.CommandSend(producer_id=0, sequence_id=0))
    frame = decode_frame(encode_payload(send, meta, b"x"))
    assert frame.error is None
    assert sensitive_key(name)
    for policy in PayloadPolicy:
        (packed,) = FrameRecorder(policy).packed(1, 0, 1, 1, [frame])
        assert SECRET.encode() not in packed and b"<redacted>" in packed
