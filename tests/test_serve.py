"""`sluice serve` answering the real client from a recording, with no broker."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest
import trio
import trustme

from sluice.addresses import Address
from sluice.brokers.embedded import EmbeddedBroker, free_port, wait_for_port
from sluice.proxy.dial import bind_all
from sluice.replay.common import Listening
from tests.helpers.support import (
    SLUICE,
    client,
    recorded_session,
    start_proxy,
    tcp_connections,
    tls_files,
)

TOPIC = "persistent://public/default/served"


def script(
    url: str, during: list[object] | None = None, produce: bool = True, **options: Any
) -> list[bytes]:
    """The application: produce (unbatched and batched), then consume and ack.

    ``produce=False``: consume only, which a serve that has already answered
    the sends can do again (recorded receipts are each given once).
    """
    with client(url, **options) as c:
        if produce:
            _produce(c)
        consumer = c.subscribe(TOPIC, "s", initial_position=pulsar.InitialPosition.Earliest)
        got = []
        for _ in range(12):
            msg = consumer.receive(timeout_millis=10_000)
            got.append(msg.data())
            consumer.acknowledge(msg)
        if during is not None:
            during.append(None)  # a hook for checks while connected
        return got


def _produce(c: pulsar.Client) -> None:
    producer = c.create_producer(TOPIC, batching_enabled=False)
    for i in range(6):
        producer.send(f"one-{i}".encode())
    batched = c.create_producer(
        TOPIC, batching_enabled=True, batching_max_messages=3, batching_max_publish_delay_ms=500
    )
    done = threading.Semaphore(0)
    for i in range(6):
        batched.send_async(f"batch-{i}".encode(), lambda res, mid: done.release())
    batched.flush()
    for _ in range(6):
        assert done.acquire(timeout=10)


@pytest.fixture(scope="module")
def serve_recording(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    tmp = tmp_path_factory.mktemp("serve")
    with EmbeddedBroker() as broker:
        p = start_proxy(broker.url, tmp, "--record", str(tmp / "rec"), "--record-payloads", "full")
        try:
            messages = script(p.url)
            assert p.terminate() == 0
        finally:
            p.kill()
    return tmp / "rec", messages  # the broker is gone from here on


def start_serve(recording: Path, port: int, *args: str) -> subprocess.Popen[str]:
    """``sluice serve RECORDING ARGS``, once it accepts connections on ``port``."""
    process = subprocess.Popen(
        [*SLUICE, "serve", str(recording), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_port("127.0.0.1", port, 20, process)  # type: ignore[arg-type]
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process


@pytest.fixture
def served(
    serve_recording: tuple[Path, list[bytes]],
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    process = start_serve(serve_recording[0], port, "--listen", f"127.0.0.1:{port}")
    yield process, port
    if process.poll() is None:
        process.kill()
        process.wait()


def stop(process: subprocess.Popen[str]) -> tuple[int, str]:
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=20)
    return process.returncode, out


@pytest.mark.e2e
def test_readers_and_a_shared_subscriptions_consumers_are_served_as_recorded(
    tmp_path: Path,
) -> None:
    """A reader (its subscription named afresh each run) gets what the
    recorded reader got; two consumers of a shared subscription get, between
    them, each recorded message once (each what its recorded consumer got),
    and so again when the client runs again. (Readers got nothing, and every
    consumer of a subscription got all its messages.)"""
    topic = "persistent://public/default/served-readers"

    def session(url: str, produce: bool = True) -> list[bytes]:
        with client(url) as c:
            if produce:  # (recorded receipts are given once: a run again only reads)
                producer = c.create_producer(topic, batching_enabled=False)
                for i in range(4):
                    producer.send(f"m-{i}".encode())
            reader = c.create_reader(topic, pulsar.MessageId.earliest)
            got = [reader.read_next(timeout_millis=10_000).data() for _ in range(4)]
            shared = [c.subscribe(topic, "sh", consumer_type=pulsar.ConsumerType.Shared,
                                  initial_position=pulsar.InitialPosition.Earliest)
                      for _ in range(2)]  # fmt: skip
            both: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(both) < 4 and time.monotonic() < deadline:
                for consumer in shared:
                    try:
                        message = consumer.receive(timeout_millis=500)
                    except pulsar.Timeout:
                        continue
                    both.append(message.data())
                    consumer.acknowledge(message)
            for consumer in shared:  # each message once, to one of them
                with pytest.raises(pulsar.Timeout):
                    consumer.receive(timeout_millis=1_000)
            return sorted(got) + sorted(both)

    recorded: list[list[bytes]] = []
    recording = recorded_session(tmp_path, lambda url: recorded.append(session(url)))
    port = free_port()
    process = start_serve(recording, port, "--listen", f"127.0.0.1:{port}")
    try:
        assert session(f"pulsar://127.0.0.1:{port}") == recorded[0]
        # A client run again is served again.
        assert session(f"pulsar://127.0.0.1:{port}", produce=False) == recorded[0]
        code, report = stop(process)
    finally:
        process.kill()
    assert code == 0, report


def test_the_real_client_runs_against_serve_with_no_broker(
    serve_recording: tuple[Path, list[bytes]], served: tuple[subprocess.Popen[str], int]
) -> None:
    process, port = served
    offline: list[bool] = []

    class Check(list[object]):
        def append(self, item: object) -> None:
            # While the client is connected: serve holds only its listener
            # and accepted connections, nothing it dialed out itself.
            offline.append(all(local[1] == port for local, _ in tcp_connections(process.pid)))

    assert script(f"pulsar://127.0.0.1:{port}", Check()) == serve_recording[1]
    assert offline == [True]
    code, report = stop(process)
    assert code == 0, report
    assert "0 without a recorded answer" in report


def test_serve_over_tls_with_the_real_client(
    serve_recording: tuple[Path, list[bytes]], tmp_path: Path
) -> None:
    """``--listen-tls`` alone: the client's lookups are answered with a
    ``pulsar+ssl://`` broker URL, so it stays on TLS, and nothing listens
    plain. The certificate names only ``localhost`` and the client checks
    host names: lookups must send it to the host as written, not to the IP
    the listener is bound to."""
    ca, pem, _ = tls_files(tmp_path, "localhost")
    port = free_port()
    process = start_serve(serve_recording[0], port, "--listen-tls", f"localhost:{port}",
                          "--tls-cert", str(pem), "--tls-key", str(pem))  # fmt: skip
    try:
        listening = {local[1] for local, remote in tcp_connections(process.pid) if not remote[1]}
        assert listening == {port}
        got = script(
            f"pulsar+ssl://localhost:{port}",
            tls_trust_certs_file_path=str(ca),
            tls_validate_hostname=True,
        )
        assert got == serve_recording[1]
        # A client that does not trust the certificate gets nowhere.
        trustme.CA().cert_pem.write_to_path(str(tmp_path / "other.pem"))
        with (
            client(
                f"pulsar+ssl://localhost:{port}",
                tls_trust_certs_file_path=str(tmp_path / "other.pem"),
            ) as c,  # fmt: skip
            pytest.raises(pulsar.PulsarException),
        ):
            c.create_producer(TOPIC, send_timeout_millis=3000)
        code, report = stop(process)
    finally:
        process.kill()
    assert code == 0, report
    assert "0 without a recorded answer" in report


def test_serve_on_both_listeners_keeps_each_client_on_its_own(
    serve_recording: tuple[Path, list[bytes]], tmp_path: Path
) -> None:
    """``--listen`` and ``--listen-tls`` together: a lookup answers with both
    URLs, and each client follows the one of its own kind."""
    ca, pem, _ = tls_files(tmp_path, "127.0.0.1")
    plain, tls = free_port(), free_port()
    process = start_serve(serve_recording[0], plain, "--listen", f"127.0.0.1:{plain}",
                          "--listen-tls", f"127.0.0.1:{tls}",
                          "--tls-cert", str(pem), "--tls-key", str(pem))  # fmt: skip
    seen: dict[int, set[int]] = {}

    def during(port: int) -> list[object]:
        class Check(list[object]):
            def append(self, item: object) -> None:
                accepted = [local for local, remote in tcp_connections(process.pid) if remote[1]]
                seen[port] = {local[1] for local in accepted}

        return Check()

    try:
        assert script(f"pulsar://127.0.0.1:{plain}", during(plain)) == serve_recording[1]
        # The plain client's connections are closed before the TLS one starts.
        deadline = time.monotonic() + 10
        while any(remote[1] for _, remote in tcp_connections(process.pid)):
            assert time.monotonic() < deadline, tcp_connections(process.pid)
            time.sleep(0.05)
        trusting = {"tls_trust_certs_file_path": str(ca)}
        got = script(f"pulsar+ssl://127.0.0.1:{tls}", during(tls), produce=False, **trusting)
        assert got == serve_recording[1]
        code, report = stop(process)
    finally:
        process.kill()
    assert seen == {plain: {plain}, tls: {tls}}
    assert code == 0, report


@pytest.fixture
def dual_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dual`` resolves to ::1 and 127.0.0.1, as ``localhost`` does on many hosts."""
    resolve = socket.getaddrinfo

    def two_families(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "dual":
            return [
                (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
            ]
        return resolve(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", two_families)


@pytest.mark.usefixtures("dual_name")
async def test_a_name_with_two_addresses_on_port_0_is_served_on_one_port() -> None:
    """The advertised port is the one every address of the name listens on,
    so a client is not refused for trying the other family first."""
    args = argparse.Namespace(listen="dual:0", listen_tls=None, tls_cert=None,
                              tls_key=None, advertise_host=None)  # fmt: skip
    listeners, plain, _ = await Listening.from_args(args).open()
    try:
        assert plain is not None and plain.host == "dual"
        bound = {listener.socket.getsockname()[:2] for listener in listeners}  # type: ignore[attr-defined]
        assert bound == {("::1", plain.port), ("127.0.0.1", plain.port)}
        for host in ("::1", "127.0.0.1"):
            stream = await trio.open_tcp_stream(host, plain.port)
            await stream.aclose()
    finally:
        for listener in listeners:
            await listener.aclose()


@pytest.mark.usefixtures("dual_name")
def test_a_family_the_kernel_lacks_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    create = socket.socket

    def no_ipv6(family: int = socket.AF_INET, *args: Any, **kwargs: Any) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return create(family, *args, **kwargs)

    monkeypatch.setattr(socket, "socket", no_ipv6)
    sockets = bind_all(Address("dual", 0))
    try:
        assert [sock.family for sock in sockets] == [socket.AF_INET]
    finally:
        for sock in sockets:
            sock.close()
    with pytest.raises(OSError, match="not supported"):
        bind_all(Address("::1", 0))  # the only family there is: no listener at all


def test_an_address_that_cannot_be_bound_is_the_error_given() -> None:
    """Port 0 draws again only when the port was taken; an address that is
    not this host's is the error itself, as the OS words it (the one-line
    start errors print it)."""
    here_and_elsewhere = [
        (socket.AF_INET, ("127.0.0.1", 0)),
        (socket.AF_INET6, ("fd00::99", 0, 0, 0)),  # on no interface here
    ]
    with pytest.raises(OSError) as raised:
        bind_all(Address("dual", 0), targets=here_and_elsewhere)
    assert raised.value.errno == errno.EADDRNOTAVAIL
    assert raised.value.strerror == os.strerror(errno.EADDRNOTAVAIL)


def test_serve_tls_settings_that_cannot_work_are_refused(
    serve_recording: tuple[Path, list[bytes]], tmp_path: Path
) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    _, pem, _ = tls_files(tmp_path, "localhost")
    tls = ["--listen-tls", f"127.0.0.1:{free_port()}"]
    cases = [
        (tls, "--listen-tls needs --tls-cert and --tls-key"),
        (["--listen-tls", ""], "expected HOST:PORT"),
        ([*tls, "--advertise-host", " "], "--advertise-host is empty"),
        ([*tls, "--advertise-host", "h:7000"], "a host alone, without a port"),
        (["--tls-cert", str(pem), "--tls-key", str(pem)], "are for --listen-tls"),
        ([*tls, "--tls-cert", str(junk), "--tls-key", str(junk)], "not a PEM certificate and key"),
        (
            [*tls, "--tls-cert", str(pem), "--tls-key", str(tmp_path / "gone.pem")],
            "No such file or directory",
        ),
    ]
    for args, message in cases:
        command = [*SLUICE, "serve", str(serve_recording[0]), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_requests_the_recording_cannot_answer_get_an_error(
    served: tuple[subprocess.Popen[str], int],
) -> None:
    process, port = served
    with client(f"pulsar://127.0.0.1:{port}") as c, pytest.raises(pulsar.PulsarException):
        c.subscribe("persistent://public/default/never-recorded", "s")
    code, report = stop(process)
    assert code == 1
    # The first thing the client asks about the topic has no recorded answer.
    assert (
        "no recorded answer: PARTITIONED_METADATA persistent://public/default/never-recorded"
        in report
    )


@pytest.mark.e2e
def test_serve_needs_payloads(tmp_path: Path) -> None:
    with EmbeddedBroker() as broker:
        p = start_proxy(broker.url, tmp_path, "--record", str(tmp_path / "hashed"))
        try:
            with client(p.url) as c:
                c.create_producer(TOPIC).send(b"x")
            p.terminate()
        finally:
            p.kill()
    result = subprocess.run(
        [*SLUICE, "serve", str(tmp_path / "hashed"), "--listen", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--record-payloads full" in result.stderr and "Traceback" not in result.stderr


def test_a_recording_cut_off_mid_record_is_served_up_to_where_it_ends(
    serve_recording: tuple[Path, list[bytes]], tmp_path: Path
) -> None:
    # A proxy killed mid-write leaves half a record: serve answers from the
    # rest, and says so (as replay and inspect do), not silently.
    cut = tmp_path / "cut"
    cut.mkdir()
    (source,) = sorted(serve_recording[0].glob("*.sluice"))
    (cut / source.name).write_bytes(source.read_bytes() + b"\x87\xa1k\xa5frame")
    port = free_port()
    process = start_serve(cut, port, "--listen", f"127.0.0.1:{port}")
    try:
        process.send_signal(signal.SIGTERM)
        report, err = process.communicate(timeout=20)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, report + err
    assert f"{cut / source.name} ends with an incomplete record" in err, err


@pytest.mark.e2e
def test_a_consumer_let_in_after_a_refusal_gets_the_recorded_messages(
    serve_recording: tuple[Path, list[bytes]], tmp_path: Path
) -> None:
    """The recording holds a SUBSCRIBE the broker refused before the one it
    let in (a client that tried again). Serve answers the live client in
    that order, and the consumer it lets in gets the messages the recorded
    one got (it was given the refused one's: none)."""
    from sluice.protocols.pulsar import Type, command, decode_frame, encode, pb
    from sluice.recording import format as fmt
    from sluice.recording.format import read_records, recording_files

    recording, messages = serve_recording
    out = tmp_path / "refused-first"
    out.mkdir()
    planted = False
    for path in recording_files(recording):
        records: list[dict[str, Any]] = []
        for r in read_records(path):
            if not planted and r["k"] == "frame" and r["s"]["cmd"] == "SUBSCRIBE":
                planted = True
                asked: Any = decode_frame(r["raw"])
                again = pb.BaseCommand()
                again.CopyFrom(asked.command)
                again.subscribe.consumer_id, again.subscribe.request_id = 99, 99
                raw = encode(again)
                refusal = encode(command(Type.Value("ERROR"), pb.CommandError(
                    request_id=99, error=pb.AuthorizationError, message="not yet")))  # fmt: skip
                records += [{**r, "raw": raw, "n": len(raw)},
                            {**r, "d": 1, "raw": refusal, "n": len(refusal),
                             "s": {"cmd": "ERROR"}}]  # fmt: skip
            records.append(r)
        (out / path.name).write_bytes(fmt.dumps(records))
    assert planted
    port = free_port()
    process = start_serve(out, port, "--listen", f"127.0.0.1:{port}")
    try:
        with client(f"pulsar://127.0.0.1:{port}") as c:
            earliest = pulsar.InitialPosition.Earliest
            with pytest.raises(pulsar.PulsarException):
                c.subscribe(TOPIC, "s", initial_position=earliest)
            consumer = c.subscribe(TOPIC, "s", initial_position=earliest)
            got = [consumer.receive(timeout_millis=2_000).data() for _ in messages]
    finally:
        process.kill()
        process.wait()
    assert got == messages
