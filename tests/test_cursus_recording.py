"""A Cursus session recorded through the proxy, then inspected, replayed
against a fresh broker and served back to the real cursus-client."""

from __future__ import annotations

import json
import ssl
import struct
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trustme
from cursus import ConsumerMode

from sluice.addresses import Address
from sluice.brokers.embedded import free_port
from sluice.protocols.pulsar.urls import BrokerUrl
from sluice.proxy.config import ProxyConfig
from sluice.proxy.server import Proxy
from sluice.recording.format import PayloadPolicy, dumps, read_records, recording_files
from sluice.recording.reader import load
from sluice.recording.writer import RecorderConfig
from tests.helpers.cursus_broker import open_cluster
from tests.helpers.support import SLUICE, tls_files
from tests.test_analyze import analyze, rows_of
from tests.test_cursus_broker import client_speaks_tls, collect_all, in_thread, produce

pytestmark = pytest.mark.e2e  # every test here starts a process

PAYLOADS = [f"r{i}" for i in range(9)]


async def produce_and_stream(address: str, waiting_for: str) -> None:
    """Produce PAYLOADS on 3 partitions at ``address``, then stream them all
    back with a consumer group."""
    assert await in_thread(produce, address, "rec", PAYLOADS, 3) == 9
    await collect_all(address, "rec", "g", ConsumerMode.STREAMING, PAYLOADS, waiting_for)


def recording_proxy(cluster: str, directory: Path) -> ProxyConfig:
    """A Cursus proxy on a loopback port in front of the cluster at
    ``cluster`` (host:port), recording into ``directory``, payloads in full."""
    host, port = cluster.rsplit(":", 1)
    return ProxyConfig(
        broker=BrokerUrl(host, int(port), False, "cursus"),
        protocol="cursus",
        listen=Address("127.0.0.1", 0),
        record=RecorderConfig(directory, payloads=PayloadPolicy.FULL, flush_interval=0.1),
    )


async def record_a_session(directory: Path) -> Path:
    """``directory``, holding one Cursus session recorded through the proxy:
    9 messages produced on 3 partitions (a connection each, closed before
    the consumer's open), then streamed back by a consumer group."""
    async with open_cluster(1, keepalive=0.3) as cluster, trio.open_nursery() as nursery:
        proxy: Proxy = await nursery.start(Proxy(recording_proxy(cluster.address, directory)).run)
        await produce_and_stream(str(proxy.addresses["plain"]), "9 messages streamed")
        proxy.stop()
    return directory


@pytest.fixture
async def recorded(tmp_path: Path) -> Path:
    """A directory holding one Cursus session (``record_a_session``)."""
    return await record_a_session(tmp_path / "rec")


def sluice(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SLUICE, *args], capture_output=True, text=True, timeout=timeout)


async def test_a_cursus_session_is_recorded_and_inspected(recorded: Path, tmp_path: Path) -> None:
    (path, *_) = recording_files(recorded)
    records = list(read_records(path))
    assert records[0]["protocol"] == "cursus"
    frames = [r for r in records if r["k"] == "frame"]
    commands = {r["s"]["cmd"] for r in frames}
    assert {"CREATE", "METADATA", "BATCH", "ACK", "STREAM", "OK"} <= commands, commands
    batches = [r for r in frames if r["s"]["cmd"] == "BATCH" and r["d"] == 0]
    assert sum(r["s"]["msgs"] for r in batches) == 9
    assert {r["s"]["topic"] for r in batches} == {"rec"}

    shown = await in_thread(sluice, "inspect", str(recorded))
    assert shown.returncode == 0, shown.stderr
    assert "BATCH" in shown.stdout and "METADATA" in shown.stdout
    assert "Traceback" not in shown.stderr
    lines = (await in_thread(sluice, "inspect", str(recorded), "--json")).stdout.splitlines()
    assert all(json.loads(line)["capture"] for line in lines)
    pcap = tmp_path / "cursus.pcapng"
    done = await in_thread(sluice, "inspect", str(recorded), "--pcap", str(pcap))
    assert done.returncode == 0, done.stderr
    info = await in_thread(lambda: subprocess.run(["capinfos", str(pcap)], capture_output=True,
                                                  text=True, timeout=60))  # fmt: skip
    assert "Cursus" in info.stdout, info.stdout  # the capture comment says how to read it
    assert "Number of packets" in info.stdout


async def test_replay_against_a_fresh_broker_is_equivalent(recorded: Path, tmp_path: Path) -> None:
    async with open_cluster(1, keepalive=0.3) as fresh:
        transcript = tmp_path / "transcript.txt"
        done = await in_thread(sluice, "replay", str(recorded), "--broker",
                               f"cursus://{fresh.address}", "--timeout", "5", "--transcript",
                               str(transcript))  # fmt: skip
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode == 0, done.stdout + done.stderr
        assert "equivalent" in done.stdout
        assert "BATCH rec[" in transcript.read_text()
        stored = sum(len(p.log) for p in fresh.topics["rec"].partitions)
        assert stored == 9


async def test_replay_paces_closes_and_waits_as_recorded(recorded: Path, tmp_path: Path) -> None:
    """--speed paces client frames by the recorded time between them; a
    connection the recording shows closed (the producer's, before the
    consumer's opened) is closed there, not at the end; a truncated file is
    said."""
    # The session as if each record had come 10 ms after the one before.
    slowed = tmp_path / "slowed"
    slowed.mkdir()
    at = 0
    for path in recording_files(recorded):
        records = []
        for record in read_records(path):
            if "w" in record:
                at += 10_000_000
                record = {**record, "w": record["w"] + at}
            records.append(record)
        (slowed / path.name).write_bytes(dumps(records))
    client_walls = [f.wall_ns for c in load(slowed).connections for f in c.frames
                    if f.from_client]  # fmt: skip
    span = (max(client_walls) - min(client_walls)) / 1e9
    assert span > 0.1
    last = recording_files(slowed)[-1]
    last.write_bytes(last.read_bytes() + b"\x92")  # a record the writer did not finish
    async with open_cluster(1, keepalive=0.3) as fresh:
        started = trio.current_time()
        done = await in_thread(sluice, "replay", str(slowed), "--broker",
                               f"cursus://{fresh.address}", "--timeout", "5",
                               "--speed", "0.5")  # fmt: skip
        elapsed = trio.current_time() - started
        assert done.returncode == 0, done.stdout + done.stderr
        assert "equivalent" in done.stdout
        assert elapsed >= span / 0.5 * 0.9, (elapsed, span)
        assert last.name in done.stdout + done.stderr  # the truncation is said
        events = fresh.lifetimes
        last_open = max(i for i, (event, _) in enumerate(events) if event == "open")
        assert any(event == "close" for event, _ in events[:last_open]), events


async def test_replay_against_a_tls_broker(recorded: Path, tmp_path: Path) -> None:
    """``--broker cursus+ssl://`` with ``--broker-tls-ca``: the same session,
    replayed over TLS against a node that speaks nothing else."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    node = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(node)
    async with open_cluster(1, keepalive=0.3, tls=node) as fresh:
        done = await in_thread(sluice, "replay", str(recorded), "--broker",
                               f"cursus+ssl://{fresh.address}", "--broker-tls-ca",
                               str(tmp_path / "ca.pem"), "--timeout", "5")  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "equivalent" in done.stdout
        assert sum(len(p.log) for p in fresh.topics["rec"].partitions) == 9
        # Without the CA the node's certificate is not trusted: one line, exit 2.
        refused = await in_thread(sluice, "replay", str(recorded), "--broker",
                                  f"cursus+ssl://{fresh.address}", "--timeout", "5")  # fmt: skip
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "certificate" in refused.stderr and "Traceback" not in refused.stderr


async def test_replay_tells_a_different_broker_apart(recorded: Path, tmp_path: Path) -> None:
    """A broker that already holds the topic answers CREATE differently."""
    async with open_cluster(1, keepalive=0.3) as fresh:
        assert await in_thread(produce, fresh.address, "rec", ["already"], 3) == 1
        done = await in_thread(sluice, "replay", str(recorded), "--broker",
                               f"cursus://{fresh.address}", "--timeout", "3")  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert "DIVERGED" in done.stdout


async def test_replay_spends_no_wait_on_a_connection_the_broker_closed(
    recorded: Path, tmp_path: Path
) -> None:
    """Every connection first sends a frame whose length is over the
    broker's limit: the broker hangs up, and replay does not wait for the
    answers each connection had when recorded (that was one --timeout per
    connection, and the replay's own waits spun until theirs ran out)."""
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    too_long = struct.pack(">I", 0xFFFF_FFF0) + b"x"
    for path in recording_files(recorded):
        records, seen = [], set()
        for record in read_records(path):
            if record["k"] == "frame" and record["d"] == 0 and record["c"] not in seen:
                seen.add(record["c"])
                records.append({**record, "raw": too_long, "n": len(too_long)})
            records.append(record)
        (tampered / path.name).write_bytes(dumps(records))
    async with open_cluster(1, keepalive=0.3) as fresh:
        started = trio.current_time()
        done = await in_thread(sluice, "replay", str(tampered), "--broker",
                               f"cursus://{fresh.address}", "--timeout", "3")  # fmt: skip
        elapsed = trio.current_time() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert "MISSING" in done.stdout and "Traceback" not in done.stderr, done.stdout
    assert "ran out" not in done.stdout, done.stdout
    assert elapsed < 10, f"{elapsed:.1f} s"


@asynccontextmanager
async def serving(recorded: Path, port: int, *args: str) -> AsyncIterator[trio.Process]:
    """``sluice serve`` of ``recorded``, once it accepts connections on
    ``port``; stopped with SIGTERM after, and its output checked."""
    process = await trio.lowlevel.open_process(
        [*SLUICE, "serve", str(recorded), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        with trio.fail_after(30):
            while True:
                try:
                    probe = await trio.open_tcp_stream("127.0.0.1", port)
                    await probe.aclose()
                    break
                except OSError:
                    await trio.sleep(0.1)
        yield process
    finally:
        process.terminate()
        with trio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
    assert process.stderr is not None
    errors = await process.stderr.receive_some(65536)
    assert b"Traceback" not in errors, errors


async def test_serve_answers_the_real_client_from_the_recording(recorded: Path) -> None:
    port = free_port()
    async with serving(recorded, port, "--listen", f"127.0.0.1:{port}"):
        await produce_and_stream(f"127.0.0.1:{port}", "9 recorded messages served")


async def test_serve_over_tls(
    recorded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--listen-tls``: the real client, speaking TLS, is answered from the
    recording; one that does not speak TLS gets nowhere. The certificate
    names only ``localhost``: the metadata answers must send the client to
    the host as written, not to the IP it resolved to."""
    ca_file, pem, ca = tls_files(tmp_path, "localhost")
    client_pem = tmp_path / "client.pem"
    ca.issue_cert("client.example").private_key_and_cert_chain_pem.write_to_path(str(client_pem))
    port = free_port()
    address = f"localhost:{port}"
    tls = ["--listen-tls", address, "--tls-cert", str(pem), "--tls-key", str(pem)]
    async with serving(recorded, port, *tls):
        try:
            plain = await in_thread(produce, address, "rec", ["x"], 3)
        except Exception:  # the client's own error types vary
            plain = 0
        assert plain == 0
        client_speaks_tls(monkeypatch, ca_file, client_pem)
        await produce_and_stream(address, "9 recorded messages served over TLS")
    # One listener for a Cursus recording: both ways at once is refused.
    both = await in_thread(sluice, "serve", str(recorded), "--listen", "127.0.0.1:0", *tls)
    assert both.returncode == 2 and "one listener" in both.stderr, both.stderr


async def test_analyze_tables_include_the_cursus_session(recorded: Path, tmp_path: Path) -> None:
    out = tmp_path / "analysis"
    # Spark: bounded by the subprocess timeout in analyze(), not in_thread's.
    await trio.to_thread.run_sync(analyze, recorded.as_uri(), out, "local[1]")
    connections = rows_of(out / "connections")
    assert connections and {c["protocol"] for c in connections} == {"cursus"}
    produced = sum(row["messages"] for row in rows_of(out / "topic_minute")
                   if row["topic"] == "rec" and row["direction"] == "client_to_broker")  # fmt: skip
    assert produced == 9
    assert {f["protocol"] for f in rows_of(out / "files")} == {"cursus"}
    assert (out / "report.html").is_file()
