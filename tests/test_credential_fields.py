"""Every field of a Pulsar command that a client fills with its own
key-value pairs is searched for credentials, in recordings and log lines.

No process is started: frames are built, decoded as the proxy decodes
them, and laid out by the recorder under each payload policy.
"""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from sluice.protocols.pulsar import Type, command, decode_frame, encode, pb
from sluice.protocols.pulsar.redact import MARKER, loggable, redacted, sensitive
from sluice.recording.format import PayloadPolicy
from sluice.recording.pulsar import FrameRecorder

SECRET = "subscription-secret-0051"


def subscribe_with_property(key: str) -> bytes:
    body = pb.CommandSubscribe(
        topic="persistent://public/default/t",
        subscription="sub",
        subType=pb.CommandSubscribe.Shared,
        consumer_id=1,
        request_id=2,
    )
    body.subscription_properties.add(key=key, value=SECRET)
    body.subscription_properties.add(key="team", value="payments")
    return encode(command(Type.Value("SUBSCRIBE"), body))


@pytest.mark.parametrize("payloads", list(PayloadPolicy))
def test_a_subscriptions_own_properties_are_redacted_in_recordings(
    payloads: PayloadPolicy,
) -> None:
    frame = decode_frame(subscribe_with_property("auth-token"))
    assert frame.error is None and SECRET.encode() in frame.raw
    out = b"".join(FrameRecorder(payloads).packed(1, 1, 2, 3, [frame]))
    assert SECRET.encode() not in out
    assert MARKER.encode() in out
    assert b"payments" in out  # a property that is no credential is kept


def test_a_subscriptions_own_properties_are_redacted_in_log_lines() -> None:
    frame = decode_frame(subscribe_with_property("password"))
    assert sensitive(frame)
    body = loggable(frame)
    assert body is not None
    line = text_format.MessageToString(body, as_one_line=True)
    assert SECRET not in line and MARKER in line and "payments" in line
    again = decode_frame(redacted(frame))
    assert again.error is None  # re-encoded whole: replay still reads it
    assert [kv.value for kv in again.body.subscription_properties] == [MARKER, "payments"]


def test_a_subscription_property_that_is_no_credential_is_recorded_as_it_came() -> None:
    frame = decode_frame(subscribe_with_property("region"))
    assert not sensitive(frame)
    assert redacted(frame) == frame.raw
