"""Review: WATCH_SCALABLE_TOPICS carries a KeyValue list a client fills
(``property_filters``), like LOOKUP's and GET_TOPICS_OF_NAMESPACE's
``properties``; a credential-like one was recorded and logged in the clear."""

from __future__ import annotations

from google.protobuf import text_format

from sluice.protocols.pulsar import Type, command, decode_frame, encode, pb
from sluice.protocols.pulsar.redact import loggable
from sluice.recording.format import PayloadPolicy
from sluice.recording.pulsar import FrameRecorder

SECRET = "property-filter-secret-0452"


def test_a_watch_property_filter_named_like_a_credential_is_redacted() -> None:
    body = pb.CommandWatchScalableTopics(watch_id=1, namespace="public/default")
    body.property_filters.add(key="auth-token", value=SECRET)
    frame = decode_frame(encode(command(Type.Value("WATCH_SCALABLE_TOPICS"), body)))
    assert frame.error is None
    for policy in PayloadPolicy:
        (packed,) = FrameRecorder(policy).packed(1, 0, 1, 1, [frame])
        assert SECRET.encode() not in packed
    logged = loggable(frame)
    assert logged is not None
    assert SECRET not in text_format.MessageToString(logged, as_one_line=True)
