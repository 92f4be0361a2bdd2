"""Cursus replay of a recording made under fault rules: a request a rule
dropped or answered in the broker's place never reached the broker, so it
is not sent to the live one, and the answer Sluice wrote is not expected.
Recorded through the proxy in-process in front of the scripted broker."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import trio

from sluice.addresses import parse_address
from sluice.protocols import registry
from sluice.protocols.cursus.commands import Create, List
from sluice.protocols.cursus.decoder import FrameDecoder
from sluice.protocols.cursus.encoder import encode_request
from sluice.protocols.cursus.replies import Keepalive
from sluice.protocols.faults import parse_rule
from sluice.proxy.server import Proxy
from sluice.recording.reader import load
from sluice.replay.cursus import replay
from tests.helpers.cursus_broker import open_cluster
from tests.test_cursus_recording import recording_proxy


async def _request(stream: trio.SocketStream, decoder: FrameDecoder, data: bytes,
                   answers: int) -> None:  # fmt: skip
    """Send ``data``, then read until ``answers`` replies (keepalives aside) came."""
    await stream.send_all(data)
    got = 0
    with trio.fail_after(5):
        while got < answers:
            decoder.receive_data(await stream.receive_some(65536))
            got += sum(not isinstance(f.message, Keepalive) for f in decoder.frames())


async def record_under_faults(directory: Path) -> None:
    """One client: CREATE kept (answered by the broker), CREATE refused
    (answered NOT_LEADER by a rule), CREATE dropped (dropped by a rule: no
    answer), then LIST (the broker names the one topic it got)."""
    protocols = registry.all_faults()
    rules = (
        parse_rule({"match": {"protocol": "cursus", "command": "CREATE", "topic": "refused"},
                    "action": "error"}, protocols),
        parse_rule({"match": {"protocol": "cursus", "command": "CREATE", "topic": "dropped"},
                    "action": "drop"}, protocols),
    )  # fmt: skip
    async with open_cluster(1) as cluster, trio.open_nursery() as nursery:
        config = dataclasses.replace(recording_proxy(cluster.address, directory), faults=rules)
        proxy: Proxy = await nursery.start(Proxy(config).run)
        at = proxy.addresses["plain"]
        stream = await trio.open_tcp_stream(at.host, at.port)
        decoder = FrameDecoder(from_client=False)
        await _request(
            stream, decoder, encode_request(Create(topic="kept"), envelope_topic="admin"), 1
        )
        await _request(
            stream, decoder, encode_request(Create(topic="refused"), envelope_topic="admin"), 1
        )
        await _request(
            stream, decoder, encode_request(Create(topic="dropped"), envelope_topic="admin"), 0
        )
        await _request(stream, decoder, encode_request(List()), 1)
        await stream.aclose()
        assert set(cluster.topics) == {"kept"}
        proxy.stop()


async def test_frames_a_fault_rule_kept_from_the_broker_are_not_replayed(tmp_path: Path) -> None:
    await record_under_faults(tmp_path / "rec")
    recording = load(tmp_path / "rec")
    assert sum(len(conn.faults) for conn in recording.connections) == 2
    async with open_cluster(1) as fresh:
        outcome, transcript = await replay(
            recording, parse_address(fresh.address), timeout=2, say=lambda text: None
        )
        topics = set(fresh.topics)
    text = "\n".join(transcript)
    # The broker got what the recorded one got: the refused and the dropped
    # CREATE were not sent (sent, the topics were made, and the LIST answer
    # named them).
    assert topics == {"kept"}, text
    assert outcome.equivalent, (outcome, text)
    assert outcome.withheld == 2 and outcome.sent == 2, outcome
    held = [line for line in transcript if " C→B NOT SENT " in line]
    assert len(held) == 2 and all("CREATE" in line for line in held), text
    injected = [line for line in transcript if " B→C INJECTED WHEN RECORDED " in line]
    assert len(injected) == 1 and "NOT_LEADER" in injected[0], text
    assert sum("~~~ FAULT " in line for line in transcript) == 2, text
