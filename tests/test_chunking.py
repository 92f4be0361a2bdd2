"""Chunked (large) messages through the proxy, with the real client and broker.

The client splits a message larger than the broker's limit into chunks sized
by the ``max_message_size`` it was told. Sluice once told it 5 MiB on lookup
connections, more than the broker accepts: every chunk was refused and the
client reconnected forever. Each size is sent direct and through the proxy in
the same run. ``pulsar-lite`` 0.2.0 sometimes loses a chunked message on its
own (it redelivers a chunk, and the client drops the message), direct too:
there each side gets a few tries on fresh topics, and the proxy must deliver
whenever the broker delivers direct. Tests that take ``any_broker`` run
against Apache Pulsar too, where every size must arrive both ways at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from sluice.analyze.decode import parse_file
from sluice.brokers import Broker
from sluice.brokers.embedded import EmbeddedBroker, free_port, wait_for_port
from sluice.recording.format import read_records, recording_files
from tests.helpers.support import SLUICE, ProxyProcess, client, in_child, start_proxy

pytestmark = pytest.mark.e2e  # every test here starts a process

MiB = 1024 * 1024


def send_and_receive(
    url: str, topic: str, size: int, data: bytes | None = None, wait_ms: int = 30_000
) -> bytes | None:
    """Send one chunked message, then read it back from the start; None if lost.
    The client runs in a child process (see ``in_child``): the same test runs
    on pulsar-lite and Apache Pulsar, whose CONNECTEDs differ."""
    result: bytes | None = in_child(_send_and_receive, url, topic, size, data, wait_ms)
    return result


def _send_and_receive(
    url: str, topic: str, size: int, data: bytes | None, wait_ms: int
) -> bytes | None:
    data = os.urandom(size) if data is None else data
    with client(url) as c:
        producer = c.create_producer(
            topic, chunking_enabled=True, batching_enabled=False, send_timeout_millis=30_000
        )
        producer.send(data)
        # Subscribing after the send: pulsar-lite 0.2.0 mixes up chunks it
        # dispatches to a consumer that was already waiting (direct too).
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        try:
            got: bytes = consumer.receive(timeout_millis=wait_ms).data()
        except pulsar.Timeout:
            return None
    assert got == data, f"{size} bytes came back different"
    return got


def delivered(url: str, name: str, size: int, tries: int, wait_ms: int = 30_000) -> int:
    """The try (1 on) on which one chunked message of ``size`` bytes, sent
    to a fresh topic, came back; 0 if none of ``tries`` did."""
    for attempt in range(1, tries + 1):
        topic = f"persistent://public/default/chunked-{name}-{uuid.uuid4().hex[:8]}"
        if send_and_receive(url, topic, size, wait_ms=wait_ms) is not None:
            return attempt
    return 0


def tries_on(broker: Broker) -> int:
    """pulsar-lite loses chunked messages now and then, direct too (the
    module's docstring): a few tries there; one on Apache Pulsar."""
    return 3 if isinstance(broker, EmbeddedBroker) else 1


@pytest.fixture(scope="module")
def recording_proxy(
    any_broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ProxyProcess, Path]]:
    tmp = tmp_path_factory.mktemp("chunks")
    record = tmp / "rec"
    p = start_proxy(
        any_broker.url, tmp, "--record", str(record), "--record-payloads", "hash",
        "--record-flush-interval", "0.2",
    )  # fmt: skip
    yield p, record
    p.kill()
    assert "Traceback" not in p.log(), p.log()


@pytest.mark.parametrize("mib", [6, 12, 50])
def test_chunked_message_passes_as_direct(
    any_broker: Broker, recording_proxy: tuple[ProxyProcess, Path], mib: int
) -> None:
    proxy, _ = recording_proxy
    tries = tries_on(any_broker)
    if not delivered(any_broker.url, f"{mib}-direct", mib * MiB, tries):
        pytest.fail(f"{mib} MiB chunked message lost direct {tries} times, no proxy in the path")
    assert delivered(proxy.url, f"{mib}-proxied", mib * MiB, tries), (
        f"{mib} MiB chunked message lost through the proxy {tries} times"
    )
    log = proxy.log()
    assert "unframeable" not in log and "NotAllowed" not in log, log[-3000:]


def test_lookup_connection_does_not_advertise_a_message_size(
    recording_proxy: tuple[ProxyProcess, Path],
) -> None:
    """Only the broker knows its limit; the proxy's own CONNECTED must not guess."""
    from tests.helpers.support import RawClient

    proxy, _ = recording_proxy
    with RawClient(proxy.port) as raw:
        connected = raw.connect()
    assert connected.name == "CONNECTED"
    assert not connected.body.HasField("max_message_size")


def test_recorded_chunks_hash_like_the_delivered_chunks(
    recording_proxy: tuple[ProxyProcess, Path],
) -> None:
    proxy, record = recording_proxy
    topic = f"persistent://public/default/chunk-hashes-{uuid.uuid4().hex[:8]}"
    assert send_and_receive(proxy.url, topic, 7 * MiB) is not None
    proxy_sends: dict[str, list[str]] = {"SEND": [], "MESSAGE": []}
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        proxy_sends = {"SEND": [], "MESSAGE": []}
        for path in recording_files(record):
            for r in read_records(path):
                s = r.get("s", {})
                if r["k"] == "frame" and s.get("topic") == topic and s["cmd"] in proxy_sends:
                    proxy_sends[s["cmd"]].append(s["payload"]["sha256"])
        if len(proxy_sends["MESSAGE"]) >= 2:
            break
        time.sleep(0.2)
    sent, delivered = proxy_sends["SEND"], proxy_sends["MESSAGE"]
    assert len(sent) >= 2, "a 7 MiB message travels as at least two chunks"
    assert sorted(set(sent)) == sorted(set(delivered))
    assert hashlib.sha256(b"").hexdigest() not in sent


def test_partitioned_topic_carries_chunked_messages(tmp_path: Path) -> None:
    """pulsar-lite loses chunked messages on partitioned topics more often,
    direct too: each side gets five tries, and the proxy must deliver
    whenever the broker delivers direct."""
    with EmbeddedBroker(default_partitions=3) as partitioned:
        p = start_proxy(partitioned.url, tmp_path, "--record", str(tmp_path / "rec"))
        try:
            if not delivered(partitioned.url, "direct", 6 * MiB, 5, wait_ms=8_000):
                pytest.fail("pulsar-lite lost 5 chunked messages in a row direct")
            assert delivered(p.url, "proxied", 6 * MiB, 5, wait_ms=8_000), (
                "5 chunked messages lost through the proxy"
            )
        finally:
            p.kill()
        assert "Traceback" not in p.log()


def test_a_message_over_the_limit_fails_as_it_does_direct(
    any_broker: Broker, recording_proxy: tuple[ProxyProcess, Path]
) -> None:
    """Unchunked and too big: the client refuses it itself, through Sluice as direct."""
    proxy, _ = recording_proxy
    outcomes = []
    for url in (any_broker.url, proxy.url):
        with client(url) as c:
            topic = f"persistent://public/default/too-big-{uuid.uuid4().hex[:8]}"
            producer = c.create_producer(topic, batching_enabled=False)
            try:
                producer.send(os.urandom(5 * MiB + 100 * 1024))
                outcomes.append("sent")
            except Exception as exc:
                outcomes.append(type(exc).__name__)
    assert outcomes[0] == outcomes[1] != "sent", outcomes


def sluice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SLUICE, *args], capture_output=True, text=True, timeout=180, check=False
    )


def test_chunked_session_records_inspects_replays_and_serves(tmp_path: Path) -> None:
    data = random.Random(20).randbytes(7 * MiB)
    topic = "persistent://public/default/chunked-session"
    record = tmp_path / "rec"
    with EmbeddedBroker() as recorded_broker:
        p = start_proxy(
            recorded_broker.url, tmp_path, "--record", str(record), "--record-payloads", "full"
        )
        try:
            assert send_and_receive(p.url, topic, len(data), data) == data
            assert p.terminate() == 0
        finally:
            p.kill()

    summary = sluice("inspect", str(record), "--summary")
    assert summary.returncode == 0, summary.stderr
    assert "chunked messages: 1 in 2 SEND frames (client_to_broker)" in summary.stdout
    assert "chunked messages: 1 in 2 MESSAGE frames (broker_to_client)" in summary.stdout
    timeline = sluice("inspect", str(record))
    assert "chunk 1/2 of message" in timeline.stdout and "chunk 2/2 of message" in timeline.stdout
    lines = sluice("inspect", str(record), "--json").stdout.splitlines()
    sends = [r for r in map(json.loads, lines) if r.get("cmd") == "SEND"]
    assert len(sends) == 2 and sum(s["msgs"] for s in sends) == 1  # one logical message
    # sluice analyze's executors read the same count: one message, two frames.
    rows = [
        row
        for path in recording_files(record)
        for tag, row in parse_file(str(path), path.read_bytes())
        if tag == "F" and row[6] == "SEND"
    ]
    assert len(rows) == 2 and sum(row[13] for row in rows) == 1

    with EmbeddedBroker() as fresh:
        replayed = sluice("replay", str(record), "--broker", fresh.url, "--timeout", "5")
    assert replayed.returncode == 0, replayed.stdout[-3000:] + replayed.stderr[-2000:]
    assert "equivalent" in replayed.stdout

    port = free_port()
    serve = subprocess.Popen(
        [*SLUICE, "serve", str(record), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_port("127.0.0.1", port, 20, serve)  # type: ignore[arg-type]
        assert send_and_receive(f"pulsar://127.0.0.1:{port}", topic, len(data), data) == data
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            out, err = serve.communicate(timeout=20)
        except subprocess.TimeoutExpired:  # nothing left running
            serve.kill()
            serve.communicate()
            raise
    assert "0 without a recorded answer" in out, out + err
