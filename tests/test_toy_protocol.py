"""A third protocol from outside Sluice: the toy in tests/toy_protocol/,
found through an entry point of group ``sluice.protocols``, gets proxying
(with its redirect kept on the proxy by port-per-broker), validation,
metrics, recording, inspect, view, replay and serve without a line of
Sluice naming it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from prometheus_client import generate_latest

from sluice.addresses import Address
from sluice.brokers.embedded import free_port
from sluice.errors import ConfigError
from sluice.protocols import registry
from sluice.proxy.config import ProxyConfig
from sluice.proxy.server import Proxy
from sluice.recording.format import PayloadPolicy
from sluice.recording.writer import RecorderConfig
from sluice.view.index import Index
from tests.toy_protocol.codec import decode, encode, split

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 20.0


@pytest.fixture
def toy_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy as another distribution would ship it: an entry point in an
    installed distribution's metadata (a directory on the path)."""
    site = tmp_path / "site"
    info = site / "toy_sluice-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-sluice\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[sluice.protocols]\ntoy = tests.toy_protocol.spec:PROTOCOL\n"
    )
    monkeypatch.syspath_prepend(str(site))
    registry.refresh()
    yield site
    registry.refresh()


def test_the_toy_comes_only_from_its_entry_point(tmp_path: Path) -> None:
    registry.refresh()
    assert "toy" not in registry.names()
    with pytest.raises(ConfigError, match="--protocol must be one of pulsar, cursus, not 'toy'"):
        ProxyConfig(broker=registry.get("pulsar").url("h:1", what="--broker"), protocol="toy")


class Broker:
    """A toy broker: a key-value store; keys under ``far/`` live on ``other``."""

    def __init__(self, store: dict[str, str], other: Address | None = None) -> None:
        self.store, self.other, self.seen = store, other, list[str]()
        self.address = Address("127.0.0.1", 0)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.address = Address("127.0.0.1", listeners[0].socket.getsockname()[1])
        task_status.started()
        await trio.serve_listeners(self.handle, listeners)

    async def handle(self, stream: trio.SocketStream) -> None:
        buffer = bytearray()
        while data := await stream.receive_some(65536):
            buffer += data
            for raw in split(buffer):
                verb, _, rest = decode(raw, True).text.partition(" ")
                self.seen.append(f"{verb} {rest}")
                key, _, value = rest.partition(" ")
                if key.startswith("far/") and self.other is not None:
                    await stream.send_all(encode(f"MOVED {self.other}"))
                elif verb == "PUT":
                    self.store[key] = value
                    await stream.send_all(encode("OK"))
                else:
                    found = self.store.get(key)
                    await stream.send_all(encode(f"OK {found}" if found else "ERR not_found"))


async def ask(stream: trio.SocketStream, raw: bytes) -> str:
    await stream.send_all(raw)
    buffer = bytearray()
    with trio.fail_after(DEADLINE):
        while not (frames := split(buffer)):
            buffer += await stream.receive_some(65536)
    return decode(frames[0], False).text


async def connect(address: Address) -> trio.SocketStream:
    return await trio.open_tcp_stream(address.host, address.port)


def metric(proxy: Proxy, line_start: str) -> float:
    for line in generate_latest(proxy.metrics.exposed).decode().splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {line_start}")


def sluice(site: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """A ``sluice`` command line, and an environment where the toy is installed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return [sys.executable, "-m", "sluice", *args], env


@pytest.mark.e2e  # it runs sluice proxy, serve, replay and inspect
async def test_a_toy_protocol_gets_everything_through_the_registry(
    toy_installed: Path, tmp_path: Path
) -> None:
    spec = registry.get("toy")
    assert registry.by_url("toy://h:1") is spec  # the scheme picks it, as --broker does
    far = Broker({"far/x": "from-b"})
    near = Broker({})
    rec = tmp_path / "rec"
    async with trio.open_nursery() as nursery:
        await nursery.start(far.run)
        near.other = far.address
        await nursery.start(near.run)
        config = ProxyConfig(
            broker=spec.url(f"toy://{near.address}", what="--broker"),
            protocol="toy",
            listen=Address("127.0.0.1", 0),
            record=RecorderConfig(rec, payloads=PayloadPolicy.FULL, flush_interval=0.05),
        )
        proxy = Proxy(config)
        await nursery.start(proxy.run)
        client = await connect(proxy.addresses["plain"])
        assert await ask(client, encode("PUT a 1")) == "OK"
        assert await ask(client, encode("GET a")) == "OK 1"
        # The redirect names a listener of the proxy's, never the far broker.
        moved = await ask(client, encode("GET far/x"))
        verb, _, where = moved.partition(" ")
        assert verb == "MOVED" and where != str(far.address), moved
        host, _, number = where.rpartition(":")
        redirected = await connect(Address(host, int(number)))
        assert await ask(redirected, encode("GET far/x")) == "OK from-b"
        # Validation: a frame whose checksum is wrong never reaches a broker.
        bad = bytearray(encode("PUT a 2"))
        bad[-1] ^= 1
        assert await ask(client, bytes(bad)) == "ERR checksum"
        assert near.seen == ["PUT a 1", "GET a", "GET far/x"] and far.seen == ["GET far/x"]
        assert metric(proxy, 'sluice_validation_failures_total{direction="client_to_broker",'
                      'kind="checksum",protocol="toy"}') == 1  # fmt: skip
        assert metric(proxy, 'sluice_frames_total{command="GET",direction="client_to_broker",'
                      'protocol="toy"}') == 3  # fmt: skip
        assert metric(proxy, 'sluice_request_duration_seconds_count{command="GET",'
                      'protocol="toy"}') == 3  # fmt: skip
        await client.aclose()
        await redirected.aclose()
        await proxy.drain()

        # inspect: every frame, by the toy's own summaries.
        command, env = sluice(toy_installed, "inspect", str(rec), "--summary")
        done = await trio.run_process(command, env=env, capture_stdout=True, capture_stderr=True)
        summary = done.stdout.decode()
        assert "GET" in summary and "MOVED" in summary and "INVALID" in summary, summary

        # view: every frame, its bytes shown as text.
        index = Index(rec)
        index.build()
        assert index.error == "" and index.protocol == "toy" and index.frames == 9
        texts = [index.detail(i)["command"]["text"] for i in range(index.frames)]
        assert sum(t.endswith("GET far/x") for t in texts) == 2, texts  # one per broker
        assert any(t.endswith("OK from-b") for t in texts), texts

        # replay against the live brokers: every answer as recorded.
        command, env = sluice(toy_installed, "replay", str(rec), "--broker",
                              f"toy://{near.address}", "--quiet")  # fmt: skip
        done = await trio.run_process(command, env=env, capture_stdout=True, check=False)
        assert done.returncode == 0 and "equivalent" in done.stdout.decode(), done.stdout
        nursery.cancel_scope.cancel()

    # serve: the recording answers as the brokers did.
    port = free_port()
    command, env = sluice(toy_installed, "serve", str(rec), "--listen", f"127.0.0.1:{port}")
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with trio.fail_after(DEADLINE):
            while True:
                try:
                    stream = await connect(Address("127.0.0.1", port))
                    break
                except OSError:
                    await trio.sleep(0.05)
        assert await ask(stream, encode("GET a")) == "OK 1"
        assert await ask(stream, encode("GET b")) == "ERR none"
        await stream.aclose()
    finally:
        server.send_signal(signal.SIGINT)
        try:
            out, _ = server.communicate(timeout=DEADLINE)
        except subprocess.TimeoutExpired:  # nothing left running
            server.kill()
            server.communicate()
            raise
    assert "served 2 requests" in out.decode(), out
