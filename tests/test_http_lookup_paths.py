"""Which paths under ``/lookup/v2/`` are topic lookups, whose answers
Sluice rewrites: in process (no process started), in front of a web
service of the test's own on loopback (raw bytes both ways).
"""

from __future__ import annotations

import logging

import pytest

from sluice.protocols.http import is_topic_lookup
from tests.test_http_relay import Upstream, exchange, ok, relay

BUNDLE = b"0x00000000_0x40000000"


@pytest.mark.parametrize(
    "path",
    [
        b"/lookup/v2/topic/persistent/public/default/t/bundle",
        b"/lookup/v2/destination/persistent/prop/cluster/ns/t/bundle",
    ],
)
async def test_a_topics_bundle_is_answered_as_the_broker_gave_it(
    path: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """``pulsar-admin topics bundle-range`` asks ``…/bundle`` under the
    lookup path: its answer (the bundle's name, no URL) is no lookup answer
    to rewrite, nor a reason for a warning, and the client's encodings go
    on."""
    upstream = Upstream(ok(BUNDLE, b"Content-Type: application/json"))
    asked: list[object] = []
    caplog.set_level(logging.WARNING, "sluice.http")
    async with relay(upstream, asked=asked) as (_, port):
        got = await exchange(
            port, b"GET %s HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n" % path
        )
    assert got.startswith(b"HTTP/1.1 200 OK") and got.endswith(b"\r\n\r\n" + BUNDLE), got
    assert (b"accept-encoding", b"gzip") in upstream.headers()
    assert asked == []
    assert not [r for r in caplog.records if "HTTP lookup" in r.getMessage()], caplog.text


def test_which_lookup_paths_are_topic_lookups() -> None:
    lookups = [
        b"/lookup/v2/topic/persistent/public/default/t",
        b"/lookup/v2/topic/non-persistent/public/default/t?authoritative=false",
        b"/lookup/v2/topic/persistent/public/default/bundle",  # a topic named "bundle"
        b"/lookup/v2/destination/persistent/prop/cluster/ns/t",
        b"/lookup/v2/destination/persistent/prop/cluster/ns/bundle",
    ]
    for target in lookups:
        assert is_topic_lookup(b"GET", target), target
    for target in (
        b"/lookup/v2/topic/persistent/public/default/t/bundle",
        b"/lookup/v2/destination/persistent/prop/cluster/ns/t/bundle",
    ):
        assert not is_topic_lookup(b"GET", target), target
    assert not is_topic_lookup(b"HEAD", lookups[0])
