"""The official pulsar-client through `sluice proxy` to the pulsar-lite broker,
and, where a test takes ``any_broker``, to Apache Pulsar too."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pulsar
import pytest
import trio
import trustme

from sluice.addresses import Address
from sluice.brokers import Broker
from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.commands.proxy import StartupError, serve
from sluice.protocols.pulsar import Type, command, encode, pb
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.dial import TlsServerConfig
from tests.helpers.support import (
    SLUICE,
    ProxyProcess,
    RawClient,
    client,
    redelivers,
    start_proxy,
    stores_corrupt_sends,
    tcp_connections,
    tls_files,
)

pytestmark = pytest.mark.e2e  # every test here starts a process

T = Type.Value


def produce_and_consume(
    url: str, topic: str, count: int, *, duplicates: bool = True, **producer: Any
) -> list[bytes]:
    sent = [f"{topic}:{i}:".encode() * 5 for i in range(count)]
    with client(url) as c:
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        p = c.create_producer(topic, **producer)
        if producer.get("batching_enabled"):
            done = threading.Semaphore(0)
            for body in sent:
                p.send_async(body, lambda res, mid: done.release())
            p.flush()
            for _ in sent:
                assert done.acquire(timeout=15)
        else:
            for body in sent:
                p.send(body)
        received = receive_unique(consumer, len(sent), duplicates=duplicates)
    assert received == sent
    return received


def receive_unique(
    consumer: pulsar.Consumer, count: int, *, duplicates: bool = True
) -> list[bytes]:
    """``count`` distinct messages in arrival order, acknowledging each.

    pulsar-lite sometimes dispatches an entry twice to a consumer that
    subscribed before the producer published (seen in 8 of 15 runs straight
    to the broker, no proxy involved); the copies carry the same message id
    and are dropped here, as an idempotent application would. Apache Pulsar
    does not (``duplicates=False``): there a second copy fails the test.
    """
    seen: set[str] = set()
    out: list[bytes] = []
    while len(out) < count:
        msg = consumer.receive(timeout_millis=10_000)
        consumer.acknowledge(msg)
        key = str(msg.message_id())
        assert duplicates or key not in seen, f"message {key} delivered twice"
        if key not in seen:
            seen.add(key)
            out.append(msg.data())
    return out


@pytest.mark.parametrize(
    "options",
    [
        {"batching_enabled": False},
        {"batching_enabled": True, "batching_max_messages": 10},
        {"batching_enabled": True, "compression_type": pulsar.CompressionType.LZ4},
        {"batching_enabled": False, "compression_type": pulsar.CompressionType.ZSTD},
    ],
    ids=["unbatched", "batched", "batched-lz4", "unbatched-zstd"],
)
def test_messages_pass_intact_and_in_order(
    any_proxy: ProxyProcess, any_broker: Broker, topic: str, options: dict[str, Any]
) -> None:
    produce_and_consume(any_proxy.url, topic, 60, duplicates=redelivers(any_broker), **options)


def test_client_never_dials_the_broker(
    any_proxy: ProxyProcess, any_broker: Broker, topic: str
) -> None:
    proxy, broker = any_proxy, any_broker
    with client(proxy.url) as c:
        producer = c.create_producer(topic)
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer.send(b"hello")
        assert consumer.receive(timeout_millis=10_000).data() == b"hello"
        remotes = {remote for _, remote in tcp_connections(os.getpid())}
        # The client holds its lookup connection and a proxied connection,
        # both to the proxy, and nothing to the broker.
        assert ("127.0.0.1", proxy.port) in remotes
        assert ("127.0.0.1", broker.port) not in remotes
    # The proxy's own sockets do reach the broker (the check can tell).
    assert any(remote == broker.address for _, remote in tcp_connections(proxy.pid))


def test_partitioned_topic(tmp_path: Path) -> None:
    with EmbeddedBroker(default_partitions=3) as partitioned:
        p = start_proxy(partitioned.url, tmp_path)
        try:
            topic = "persistent://public/default/partitioned"
            with client(p.url) as c:
                consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
                producer = c.create_producer(topic, batching_enabled=False)
                assert len(c.get_topic_partitions(topic)) == 3
                sent = {(f"k{i % 5}", i) for i in range(45)}
                for key, i in sorted(sent, key=lambda x: x[1]):
                    producer.send(str(i).encode(), partition_key=key)
                got: list[tuple[str, int]] = []
                seen: set[str] = set()
                while len(got) < len(sent):
                    msg = consumer.receive(timeout_millis=10_000)
                    consumer.acknowledge(msg)
                    if str(msg.message_id()) not in seen:  # see receive_unique
                        seen.add(str(msg.message_id()))
                        got.append((msg.partition_key(), int(msg.data())))
            assert set(got) == sent
            for key in {k for k, _ in sent}:  # per key (one partition) in order
                seq = [i for k, i in got if k == key]
                assert seq == sorted(seq)
        finally:
            p.kill()


Scenario = tuple[list[bytes], list[bytes], list[bytes], list[bytes]]


def scenario_seek_and_reader(url: str, topic: str, repositions: bool) -> Scenario:
    """``repositions``: the broker delivers again after a seek (Apache
    Pulsar), so the first of those may take its consumer's reconnection."""
    with client(url) as c:
        producer = c.create_producer(topic, batching_enabled=False)
        ids = [producer.send(f"m{i}".encode()) for i in range(10)]
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        first = []
        for _ in range(10):
            msg = consumer.receive(timeout_millis=10_000)
            first.append(msg.data())
            consumer.acknowledge(msg)
        consumer.seek(ids[4])
        again: list[bytes] = []
        while True:
            # The seek closes the consumer, which reconnects (a JVM broker on
            # a busy host may take seconds); then what follows comes at once.
            waited = 30_000 if repositions and not again else 1_500
            try:
                msg = consumer.receive(timeout_millis=waited)
            except pulsar.Timeout:
                break
            again.append(msg.data())
        reader = c.create_reader(topic, pulsar.MessageId.earliest)
        read = [reader.read_next(timeout_millis=10_000).data() for _ in range(10)]
        positioned = c.create_reader(topic, ids[4])
        after = [positioned.read_next(timeout_millis=10_000).data() for _ in range(5)]
    return first, again, read, after


def test_acks_seek_and_reader_behave_as_direct(
    any_proxy: ProxyProcess, any_broker: Broker, topic: str
) -> None:
    def run(url: str, name: str) -> Scenario:
        repositions = not isinstance(any_broker, EmbeddedBroker)
        done = scenario_seek_and_reader(url, f"{topic}-{name}", repositions)
        # pulsar-lite 0.2.0 redelivers under load, direct too (CI once saw
        # m3, m4 and m5 twice with no proxy): a run on it that did is run
        # again on a fresh topic, at most twice, either way alike, so that
        # what is compared is its behaviour, not its flake. (A redelivery
        # through Sluice every time would still fail.)
        for attempt in range(2):
            if not isinstance(any_broker, EmbeddedBroker) or done[0] == expected:
                break
            done = scenario_seek_and_reader(url, f"{topic}-{name}-{attempt + 2}", repositions)
        return done

    expected = [f"m{i}".encode() for i in range(10)]
    through = run(any_proxy.url, "proxy")
    direct = run(any_broker.url, "direct")
    assert through == direct
    first, again, read, after = through
    assert first == read == [f"m{i}".encode() for i in range(10)]
    assert after == [f"m{i}".encode() for i in range(5, 10)]
    if isinstance(any_broker, EmbeddedBroker):
        # pulsar-lite answers SEEK with success but does not reposition the
        # subscription, direct or proxied; the seek itself must still succeed.
        assert again == []
    else:
        # Apache Pulsar repositions: what follows the message sought comes again.
        assert again == after


def test_corrupt_send_gets_checksum_error_and_never_reaches_consumers(
    any_proxy: ProxyProcess, any_broker: Broker, topic: str
) -> None:
    proxy, broker = any_proxy, any_broker
    with RawClient(proxy.port) as raw:
        name = raw.producer(broker.port, topic)
        raw.send_message(name, 1, 0, b"corrupt-me", corrupt=True)
        error = raw.receive_type("SEND_ERROR")
        assert error.body.sequence_id == 0
        assert error.body.error == pb.ChecksumError
        raw.send_message(name, 1, 1, b"good")
        assert raw.receive_type("SEND_RECEIPT").body.sequence_id == 1
    with client(broker.url) as c:
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        assert consumer.receive(timeout_millis=10_000).data() == b"good"
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=1_000)
    assert "checksum mismatch" in proxy.log()


def test_forward_mode_lets_a_corrupt_send_through(
    any_broker: Broker, tmp_path: Path, topic: str
) -> None:
    broker = any_broker
    p = start_proxy(broker.url, tmp_path, "--on-invalid", "forward")
    try:
        with RawClient(p.port) as raw:
            name = raw.producer(broker.port, topic)
            raw.send_message(name, 1, 0, b"corrupt-me", corrupt=True)
            if stores_corrupt_sends(broker):
                # pulsar-lite stores it without complaint: the receipt comes back.
                assert raw.receive_type("SEND_RECEIPT").body.sequence_id == 0
            else:
                # Apache Pulsar checks a SEND's checksum itself (measured, 4.0.8).
                error = raw.receive_type("SEND_ERROR")
                assert error.body.error == pb.ChecksumError
                assert "on the broker" in error.body.message
        if stores_corrupt_sends(broker):
            with client(broker.url) as c:
                consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
                # the flipped byte arrives
                assert consumer.receive(timeout_millis=10_000).data() == b"corrupt-md"
        assert "checksum mismatch" in p.log()  # counted and logged all the same
    finally:
        p.kill()


def test_relay_outside_the_allow_list_is_refused(
    any_proxy: ProxyProcess, any_broker: Broker
) -> None:
    proxy, broker = any_proxy, any_broker
    elsewhere = free_port()
    with RawClient(proxy.port) as raw:
        answer = raw.connect(f"127.0.0.1:{elsewhere}")
        assert answer.name == "ERROR"
        assert answer.body.error == pb.ServiceNotReady
        assert "allow-list" in answer.body.message
        assert raw.receive() is None  # and the connection is closed
    # The broker the upstream named is allowed (control for the check above).
    with RawClient(proxy.port) as raw:
        assert raw.connect(f"127.0.0.1:{broker.port}").name == "CONNECTED"


def test_allow_broker_rules(broker: EmbeddedBroker, tmp_path: Path) -> None:
    p = start_proxy(broker.url, tmp_path, "--allow-broker", "127.0.0.0/8:1-2")
    try:
        # Allowed by the rule, so it is dialed (and nothing listens there).
        with RawClient(p.port) as raw:
            answer = raw.connect("127.0.0.1:2")
            assert answer.name == "ERROR" and "cannot reach broker" in answer.body.message
        # Outside the rule's ports: refused without dialing.
        with RawClient(p.port) as raw:
            answer = raw.connect("127.0.0.1:3")
            assert answer.name == "ERROR" and "allow-list" in answer.body.message
        # The configured upstream stays allowed whatever the rules say.
        with RawClient(p.port) as raw:
            assert raw.connect(f"127.0.0.1:{broker.port}").name == "CONNECTED"
    finally:
        p.kill()


def test_tls_listener_with_the_real_client(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    ca, pem, _ = tls_files(tmp_path, "localhost", "127.0.0.1")
    p, tls_port = start_tls_proxy(broker, tmp_path, pem)
    try:
        url = f"pulsar+ssl://localhost:{tls_port}"
        with client(url, tls_trust_certs_file_path=str(ca)) as c:
            producer = c.create_producer(topic)
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            for i in range(20):
                producer.send(f"tls-{i}".encode())
            got = [consumer.receive(timeout_millis=10_000).data() for _ in range(20)]
            assert got == [f"tls-{i}".encode() for i in range(20)]
            remotes = {remote for _, remote in tcp_connections(os.getpid())}
            assert ("127.0.0.1", tls_port) in remotes
            assert broker.address not in remotes
    finally:
        p.kill()


def test_tls_client_with_an_untrusted_ca_is_refused(broker: EmbeddedBroker, tmp_path: Path) -> None:
    _, pem, _ = tls_files(tmp_path, "localhost")
    trustme.CA().cert_pem.write_to_path(str(tmp_path / "other.pem"))
    p, tls_port = start_tls_proxy(broker, tmp_path, pem)
    try:
        url = f"pulsar+ssl://localhost:{tls_port}"
        with (
            client(url, tls_trust_certs_file_path=str(tmp_path / "other.pem")) as c,
            pytest.raises(pulsar.PulsarException),
        ):
            c.create_producer("untrusted", send_timeout_millis=3000)
    finally:
        p.kill()


def test_silent_client_is_dropped_after_the_handshake_timeout(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    p = start_proxy(broker.url, tmp_path, "--handshake-timeout", "0.5")
    try:
        with RawClient(p.port) as raw:
            start = time.monotonic()
            assert raw.receive(timeout=5) is None
            assert 0.4 < time.monotonic() - start < 3
    finally:
        p.kill()


@pytest.mark.parametrize("flag", ["--max-connections-per-ip", "--max-connections"])
def test_connection_limits(broker: EmbeddedBroker, tmp_path: Path, flag: str) -> None:
    p = start_proxy(broker.url, tmp_path, flag, "1")
    try:
        # start_proxy's port probe holds the only slot briefly.
        with served_once_free(p.port), RawClient(p.port) as second:
            assert second.receive(timeout=5) is None
        # Once the first is gone, a new connection is served again.
        with served_once_free(p.port):
            pass
    finally:
        p.kill()


def served_once_free(port: int, timeout: float = 10) -> RawClient:
    """A connection the proxy answers CONNECTED, tried again while the only
    place under the limit is still held by one closing (the proxy closes a
    connection over the limit at once)."""
    deadline = time.monotonic() + timeout
    while True:
        raw = RawClient(port)
        try:
            raw.send_connect()
            frame = raw.receive()
        except OSError:
            frame = None
        if frame is not None and frame.name == "CONNECTED":
            return raw
        raw.close()
        assert frame is None, frame
        assert time.monotonic() < deadline, "the proxy never served a connection"
        time.sleep(0.05)


def test_lookup_connection_answers_ping(proxy: ProxyProcess) -> None:
    with RawClient(proxy.port) as raw:
        assert raw.connect().name == "CONNECTED"
        raw.send(encode(command(T("PING"))))
        assert raw.receive_type("PONG").name == "PONG"


def test_sigterm_drains_and_a_restarted_proxy_takes_over(
    any_broker: Broker, tmp_path: Path, topic: str
) -> None:
    broker = any_broker
    port = free_port()
    first = start_proxy(broker.url, tmp_path, "--drain-timeout", "5", port=port)
    second: ProxyProcess | None = None
    total = 400
    failures: list[BaseException] = []
    sent: list[bytes] = []
    progress = threading.Event()
    try:
        with client(f"pulsar://127.0.0.1:{port}") as c:
            producer = c.create_producer(topic, batching_enabled=False, send_timeout_millis=30_000)

            def produce() -> None:
                for i in range(total):
                    body = f"drain-{i}".encode()
                    try:
                        producer.send(body)
                        sent.append(body)
                    except Exception as exc:  # recorded, asserted below
                        failures.append(exc)
                    if i == 100:
                        progress.set()
                    time.sleep(0.002)

            thread = threading.Thread(target=produce)
            thread.start()
            assert progress.wait(30)
            started = time.monotonic()
            assert first.terminate(timeout=15) == 0
            assert time.monotonic() - started < 5 + 3  # drain timeout plus slack
            second = start_proxy(broker.url, tmp_path, port=port)
            thread.join(60)
            assert not thread.is_alive()
        assert failures == []
        assert len(sent) == total
        assert "draining" in first.log()
        with client(broker.url) as c:
            consumer = c.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
            seen: set[bytes] = set()
            while len(seen) < total:
                msg = consumer.receive(timeout_millis=10_000)
                seen.add(msg.data())
        assert seen == set(sent)
    finally:
        first.kill()
        if second is not None:
            second.kill()


def test_sigterm_does_not_wait_for_a_client_s_lookup_connection(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    """A client holds its lookup connection for as long as it runs: a drain
    closes it at once (nothing on it to hand back) instead of waiting the
    whole --drain-timeout for it to go away."""
    p = start_proxy(broker.url, tmp_path, "--drain-timeout", "30")
    try:
        with client(p.url) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            producer.send(b"before the drain")
            started = time.monotonic()
            assert p.terminate(timeout=40) == 0
            assert time.monotonic() - started < 10
        assert "draining 2 connections" in p.log()
    finally:
        p.kill()


# --- command line ----------------------------------------------------------


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SLUICE, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_bad_flag_is_one_line_and_exit_2() -> None:
    result = run_cli("proxy", "--broker", "pulsar://127.0.0.1:6650", "--listen", "nowhere")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--listen" in lines[0] and "Traceback" not in result.stderr


def test_a_certificate_that_does_not_load_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Checked at start (the broker is not asked first), not at the first TLS client."""
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    tls = ["--listen-tls", f"127.0.0.1:{free_port()}", "--tls-cert", str(junk)]
    result = run_cli("proxy", "--broker", "pulsar://127.0.0.1:1", *tls, "--tls-key", str(junk))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{junk}" in lines[0] and "not a PEM certificate" in lines[0]


def test_a_certificate_gone_bad_after_the_check_stops_start_in_one_line(tmp_path: Path) -> None:
    """Files rotated between config_from's check and the listener opening:
    the reason, not an internal error."""
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    config = ProxyConfig(
        parse_broker_url("pulsar://127.0.0.1:1"),
        listen=None,
        listen_tls=Address("127.0.0.1", 0),
        tls=TlsServerConfig(junk, junk),
    )
    with pytest.raises(StartupError, match="not a PEM certificate"):
        trio.run(serve, config, False)


def test_unreachable_broker_is_one_line_and_exit_1() -> None:
    dead = free_port()
    result = run_cli(
        "proxy",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--broker",
        f"pulsar://127.0.0.1:{dead}",
        "--connect-timeout",
        "2",
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach broker" in lines[0]


def test_port_in_use_is_one_line_and_exit_1(proxy: ProxyProcess, broker: EmbeddedBroker) -> None:
    result = run_cli("proxy", "--listen", f"127.0.0.1:{proxy.port}", "--broker", broker.url)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "address already in use" in lines[0]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_stalled_consumer_does_not_grow_proxy_memory(tmp_path: Path, topic: str) -> None:
    # A broker that tolerates a consumer not answering pings for a while.
    patient = EmbeddedBroker(settings={"keep_alive_interval_secs": 600})
    with patient as broker:
        proxy = start_proxy(broker.url, tmp_path)
        try:
            stall_a_consumer(proxy, broker, topic)
        finally:
            proxy.kill()


def stall_a_consumer(proxy: ProxyProcess, broker: EmbeddedBroker, topic: str) -> None:
    size, count = 64 * 1024, 1000  # ~64 MiB through a consumer that does not read
    with RawClient(proxy.port) as consumer:
        assert consumer.connect(f"127.0.0.1:{broker.port}").name == "CONNECTED"
        subscribe = pb.CommandSubscribe(
            topic=topic,
            subscription="stalled",
            subType=pb.CommandSubscribe.Exclusive,
            consumer_id=1,
            request_id=1,
        )
        consumer.send(encode(command(T("SUBSCRIBE"), subscribe)))
        assert consumer.receive_type("SUCCESS").body.request_id == 1
        consumer.send(
            encode(command(T("FLOW"), pb.CommandFlow(consumer_id=1, messagePermits=100_000)))
        )
        before = rss_bytes(proxy.pid)
        body = os.urandom(size)
        with client(broker.url) as c:
            producer = c.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
            done = threading.Semaphore(0)
            for _ in range(count):
                producer.send_async(body, lambda res, mid: done.release())
            producer.flush()
            for _ in range(count):
                assert done.acquire(timeout=60)
        time.sleep(1.0)  # let the broker push as far as the proxy lets it
        grown = rss_bytes(proxy.pid) - before
        held = size * count / 2**20
        assert grown < 24 * 2**20, f"proxy grew {grown / 2**20:.1f} MiB with {held:.0f} MiB held"
        # Nothing was dropped: the consumer gets every message once it reads,
        # granting permits as it goes like a real client (pulsar-lite pauses
        # dispatch when its write buffer fills and resumes on the next FLOW).
        received = 0
        flow = encode(command(T("FLOW"), pb.CommandFlow(consumer_id=1, messagePermits=50)))
        idle = 0
        while received < count:
            if received % 50 == 0:
                consumer.send(flow)
            try:
                frame = consumer.receive(timeout=2)
            except TimeoutError:
                idle += 1
                assert idle < 15, f"stuck after {received}: {proxy.log()[-1500:]}"
                consumer.send(flow)  # wake a dispatcher that paused between FLOWs
                continue
            assert frame is not None, f"closed after {received}: {proxy.log()[-1500:]}"
            if frame.name == "MESSAGE":
                received += 1
            elif frame.name == "PING":
                consumer.send(encode(command(T("PONG"))))
        assert received == count


# --- TLS towards brokers, proxy chains, client certificates ----------------


def start_tls_proxy(
    broker: EmbeddedBroker, tmp_path: Path, pem: Path, *extra: str
) -> tuple[ProxyProcess, int]:
    """A proxy with a TLS listener using ``pem`` as certificate and key; its TLS port."""
    tls_port = free_port()
    proxy = start_proxy(
        broker.url,
        tmp_path,
        "--tls-cert",
        str(pem),
        "--tls-key",
        str(pem),
        *extra,
        tls_port=tls_port,
    )
    return proxy, tls_port


def test_tls_upstream_through_a_chain_of_proxies(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    # A terminates TLS in front of the broker; B talks to A over TLS, verifying
    # A's certificate against the CA, and keeps itself in the path as A asks.
    ca, pem, _ = tls_files(tmp_path, "localhost")
    a, a_tls = start_tls_proxy(broker, tmp_path, pem)
    b = start_proxy(f"pulsar+ssl://localhost:{a_tls}", tmp_path, "--broker-tls-ca", str(ca))
    try:
        produce_and_consume(b.url, topic, 30, batching_enabled=False)
        b_remotes = {remote for _, remote in tcp_connections(b.pid)}
        assert ("127.0.0.1", a_tls) in b_remotes  # B reaches the broker only through A
        assert broker.address not in b_remotes
        assert any(remote == broker.address for _, remote in tcp_connections(a.pid))
    finally:
        b.kill()
        a.kill()


def test_broker_certificate_hostname_is_verified(broker: EmbeddedBroker, tmp_path: Path) -> None:
    ca, pem, _ = tls_files(tmp_path, "localhost")  # not valid for 127.0.0.1
    a, a_tls = start_tls_proxy(broker, tmp_path, pem)
    try:
        upstream = f"pulsar+ssl://127.0.0.1:{a_tls}"
        result = run_cli(
            "proxy",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--broker",
            upstream,
            "--broker-tls-ca",
            str(ca),
        )
        assert result.returncode == 1
        assert "TLS handshake" in result.stderr and len(result.stderr.strip().splitlines()) == 1
        # Not checking the name is not trusting any certificate: without
        # --broker-tls-ca, one of a CA the system does not trust is refused.
        result = run_cli("proxy", "--listen", f"127.0.0.1:{free_port()}", "--broker", upstream,
                         "--broker-tls-no-verify-hostname")  # fmt: skip
        assert result.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in result.stderr, result
        b = start_proxy(
            upstream, tmp_path, "--broker-tls-ca", str(ca), "--broker-tls-no-verify-hostname"
        )
        try:
            with RawClient(b.port) as raw:
                assert raw.connect().name == "CONNECTED"
        finally:
            b.kill()
    finally:
        a.kill()


def test_client_certificates_are_required_when_configured(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    ca_path, pem, ca = tls_files(tmp_path, "localhost")
    client_cert = ca.issue_cert("client@example")
    client_cert.cert_chain_pems[0].write_to_path(str(tmp_path / "client.crt"))
    client_cert.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    p, tls_port = start_tls_proxy(broker, tmp_path, pem, "--tls-client-ca", str(ca_path))
    try:
        url = f"pulsar+ssl://localhost:{tls_port}"
        auth = pulsar.AuthenticationTLS(str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
        with client(url, tls_trust_certs_file_path=str(ca_path), authentication=auth) as c:
            c.create_producer(topic).send(b"with a certificate")
        with (
            client(url, tls_trust_certs_file_path=str(ca_path)) as c,
            pytest.raises(pulsar.PulsarException),
        ):
            c.create_producer(topic, send_timeout_millis=3000)
        assert "TLS handshake failed" in p.log()
        # A refused or vanished client never takes the proxy down.
        assert p.process.poll() is None
        with client(url, tls_trust_certs_file_path=str(ca_path), authentication=auth) as c:
            c.create_producer(topic).send(b"still serving")
        assert "Traceback" not in p.log()
    finally:
        p.kill()


def test_admin_port_in_use_is_one_line_and_exit_1(
    proxy: ProxyProcess, broker: EmbeddedBroker
) -> None:
    result = run_cli(
        "proxy",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--broker",
        broker.url,
        "--admin",
        f"127.0.0.1:{proxy.port}",
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "address already in use" in lines[0], result.stderr
