"""Review: proxy mode, a proxied (relayed) connection. Sluice logs in to
the broker as its own proxy role naming the verified client in
``original_principal``; on lookup connections it rewrites a LOOKUP's and a
PARTITIONED_METADATA's ``original_*`` fields to the verified client
(``_name_client``; sluice/protocols/pulsar/connection.py:21-24 says
"Lookups carry the client's verified role, never its own ``original_*``
fields"). A client may send the same requests on its proxied connection
(Java and C++ clients look topics up on any connection they hold; SNI
routing sends every lookup there): they are relayed as written, so
``original_principal="admin"``, ``original_auth_data`` and
``original_auth_method`` of the client's choosing reach the broker on a
connection authenticated as Sluice's proxy role. Apache Pulsar brokers
since #1002 (2018) took a lookup's own ``original_principal`` over the
connection's for the lookup's authorization; newer ones read the
connection's, but what a broker reads is not Sluice's to assume.

Now rewritten as on lookup connections (``_naming_client``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.brokers.apache_pulsar import hs256_token
from sluice.protocols.core import OpenUpstream, Peer, Send
from sluice.protocols.pulsar import decode_stream, pb
from sluice.protocols.pulsar.connection import Routing
from sluice.protocols.pulsar.urls import parse_broker_url
from tests.test_proxy_credentials import BROKER, SECRET, core_for, proxy_auth, token_connect
from tests.test_pulsar_core import frame_bytes


@pytest.mark.parametrize("forward", [False, True], ids=["own-data", "forward-auth-data"])
@pytest.mark.parametrize("request_type", ["LOOKUP", "PARTITIONED_METADATA"])
def test_a_relayed_lookup_never_names_a_principal_the_client_wrote(
    tmp_path: Path, request_type: str, forward: bool
) -> None:
    routing = Routing(parse_broker_url(BROKER), ("127.0.0.0/8",))
    core, _ = core_for(routing, proxy_auth(tmp_path, forward=forward))
    app = hs256_token(SECRET, "app")
    (opened,) = core.receive_client(token_connect(app, proxy_to_broker_url="127.0.0.1:6650"), 0.0)
    assert isinstance(opened, OpenUpstream)  # the configured broker: Sluice logs in as itself
    (hello,) = decode_stream(opened.hello, 1 << 20)
    assert hello.body.original_principal == "app"
    core.upstream_ready(0.1)
    connected = pb.CommandConnected(server_version="broker", protocol_version=21)
    core.receive_broker(frame_bytes("CONNECTED", connected), 0.2)

    message = (
        pb.CommandLookupTopic if request_type == "LOOKUP" else pb.CommandPartitionedTopicMetadata
    )
    body = message(topic="persistent://t/n/a", request_id=9, original_principal="admin",
                   original_auth_method="token", original_auth_data="forged")  # fmt: skip
    out = core.receive_client(frame_bytes(request_type, body), 1.0)
    upstream = [
        frame
        for action in out
        if isinstance(action, Send) and action.to == Peer.BROKER
        for frame in decode_stream(action.data, 1 << 20)
    ]
    assert [frame.name for frame in upstream] == [request_type]  # it does go on
    sent = upstream[0].body
    assert sent.original_principal in ("", "app")
    assert sent.original_auth_data in ("", app)
    assert sent.original_auth_method in ("", "token")
