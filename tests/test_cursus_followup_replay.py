"""`sluice replay` of Cursus recordings, as Pulsar's: a broker that stops
reading costs a --timeout, not a hang. Recorded through the proxy in-process in
front of the scripted broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from sluice.addresses import parse_address
from sluice.protocols.cursus.batch import Batch, Message
from sluice.protocols.cursus.commands import Create
from sluice.protocols.cursus.decoder import FrameDecoder
from sluice.protocols.cursus.encoder import encode_request
from sluice.proxy.server import Proxy
from sluice.recording.reader import load
from sluice.replay.cursus import replay
from tests.helpers.cursus_broker import open_cluster
from tests.test_cursus_recording import recording_proxy
from tests.test_cursus_replay_faults import _request

SIZE = 100_000
COUNT = 300  # 30 MB of batches: more than loopback's socket buffers hold


async def record_big_batches(directory: Path) -> None:
    async with open_cluster(1) as cluster, trio.open_nursery() as nursery:
        proxy: Proxy = await nursery.start(Proxy(recording_proxy(cluster.address, directory)).run)
        at = proxy.addresses["plain"]
        stream = await trio.open_tcp_stream(at.host, at.port)
        decoder = FrameDecoder(from_client=False)
        create = encode_request(Create(topic="big"), envelope_topic="admin")
        await _request(stream, decoder, create, 1)
        for i in range(COUNT):
            batch = Batch("big", 0, messages=(Message(offset=i, payload=bytes([i % 256]) * SIZE),))
            await _request(stream, decoder, encode_request(batch), 1)
        await stream.aclose()
        proxy.stop()


@pytest.mark.e2e
async def test_a_cursus_broker_that_stops_reading_costs_a_timeout_not_a_hang(
    tmp_path: Path,
) -> None:
    await record_big_batches(tmp_path / "rec")
    recording = load(tmp_path / "rec")
    broker = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.cursus_broker", "--port", "0"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert broker.stdout is not None
        line = broker.stdout.readline()  # "node 0: host:port", once it listens
        address = parse_address(line.split(": ", 1)[1].strip())
        os.kill(broker.pid, signal.SIGSTOP)  # accepts (the kernel's backlog), reads nothing
        said: list[str] = []
        try:
            with trio.fail_after(40):
                outcome, _ = await replay(recording, address, timeout=2, say=said.append)
        except trio.TooSlowError:
            pytest.fail("replay still running after 40 s against a broker that reads nothing")
    finally:
        os.kill(broker.pid, signal.SIGCONT)
        broker.kill()
        broker.wait(10)
    assert not outcome.equivalent
    assert outcome.missing, outcome
    given_up = [s for s in said if "given up" in s]
    assert len(given_up) == 1 and "took nothing for 2s" in given_up[0], said
    assert outcome.sent < COUNT + 1  # frames that did not go out are not counted
