"""Cursus replay of a recording in which Sluice refused a client's frame
(--on-invalid reject, the default): the refused frame never reached the
broker, so it is not sent to the live one, and the refusal Sluice wrote is
not expected from the broker. Recorded through the proxy in-process in front
of the scripted broker."""

from __future__ import annotations

from pathlib import Path

import trio

from sluice.addresses import parse_address
from sluice.protocols.cursus.batch import Batch, Message, encode_batch
from sluice.protocols.cursus.commands import Create, List
from sluice.protocols.cursus.decoder import FrameDecoder
from sluice.protocols.cursus.encoder import encode_request, frame
from sluice.protocols.cursus.replies import Keepalive
from sluice.proxy.server import Proxy
from sluice.recording.reader import load
from sluice.replay.cursus import replay
from tests.helpers.cursus_broker import open_cluster
from tests.test_cursus_recording import recording_proxy


async def _request(stream: trio.SocketStream, decoder: FrameDecoder, data: bytes) -> str:
    """Send ``data``, then read its one reply (keepalives aside)."""
    await stream.send_all(data)
    with trio.fail_after(5):
        while True:
            decoder.receive_data(await stream.receive_some(65536))
            for f in decoder.frames():
                if not isinstance(f.message, Keepalive):
                    return bytes(f.body).decode()


def _corrupt_batch() -> bytes:
    body = encode_batch(Batch("kept", 0, messages=(Message(payload=b"x"),)))
    return frame(body[:-2])


async def test_frames_sluice_refused_are_not_replayed(tmp_path: Path) -> None:
    async with open_cluster(1) as cluster, trio.open_nursery() as nursery:
        proxy: Proxy = await nursery.start(
            Proxy(recording_proxy(cluster.address, tmp_path / "rec")).run
        )
        at = proxy.addresses["plain"]
        stream = await trio.open_tcp_stream(at.host, at.port)
        decoder = FrameDecoder(from_client=False)
        create = encode_request(Create(topic="kept"), envelope_topic="admin")
        assert (await _request(stream, decoder, create)).startswith("OK")
        refused = await _request(stream, decoder, _corrupt_batch())
        assert refused.startswith("ERROR: decode_failed")
        assert (await _request(stream, decoder, encode_request(List()))).startswith("OK")
        await stream.aclose()
        proxy.stop()
    recording = load(tmp_path / "rec")
    async with open_cluster(1) as fresh:
        outcome, transcript = await replay(
            recording, parse_address(fresh.address), timeout=2, say=lambda text: None
        )
        got = dict(fresh.sent)
    text = "\n".join(transcript)
    assert outcome.sent == 2 and outcome.withheld == 1, (outcome, text)
    assert outcome.equivalent, (outcome, text)
    held = [line for line in transcript if " C→B NOT SENT " in line]
    assert len(held) == 1 and "INVALID" in held[0], text
    injected = [line for line in transcript if " B→C INJECTED WHEN RECORDED " in line]
    assert len(injected) == 1 and "decode_failed" in injected[0], text
    assert "decode_failed" not in got, got  # the live broker never saw the corrupt batch
