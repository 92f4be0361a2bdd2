"""Partitioned-topic metadata asked without creating the topic (PIP-344),
through Sluice, of a broker that does not announce it can (pulsar-lite
announces no feature flags): Sluice's CONNECTED tells clients they may ask,
so it must not let the broker take the request for one that creates the
topic. The client is answered NotAllowedError instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.pulsar import Type, command, encode, pb
from tests.helpers.support import RawClient, start_proxy


@pytest.mark.e2e
def test_a_broker_without_the_flag_is_not_asked_to_skip_creating(tmp_path: Path) -> None:
    with EmbeddedBroker(data_dir=tmp_path / "broker") as broker:
        proxy = start_proxy(broker.url, tmp_path)
        client = RawClient(proxy.port)
        try:
            client.send_connect()
            connected = client.receive()
            assert connected is not None and connected.name == "CONNECTED"
            flags = connected.body.feature_flags
            assert flags.supports_get_partitioned_metadata_without_auto_creation

            def ask(request_id: int, create: bool) -> pb.CommandPartitionedTopicMetadataResponse:
                body = pb.CommandPartitionedTopicMetadata(
                    topic="persistent://public/default/never-made",
                    request_id=request_id,
                    metadata_auto_creation_enabled=create,
                )
                client.send(encode(command(Type.Value("PARTITIONED_METADATA"), body)))
                answer = client.receive_type("PARTITIONED_METADATA_RESPONSE", timeout=15)
                response: pb.CommandPartitionedTopicMetadataResponse = answer.body
                assert response.request_id == request_id
                return response

            refused = ask(1, create=False)
            assert refused.response == pb.CommandPartitionedTopicMetadataResponse.Failed
            assert refused.error == pb.NotAllowedError, refused
            assert "PIP-344" in refused.message
            # Asked the way that may create it, the broker answers as before.
            allowed = ask(2, create=True)
            assert allowed.response == pb.CommandPartitionedTopicMetadataResponse.Success
        finally:
            client.close()
            proxy.kill()
