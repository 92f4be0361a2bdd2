"""Allow-list rules, address parsing, and the request/response correlator."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys

import pytest
import trio
from google.protobuf.message import Message

from sluice.addresses import (
    Address,
    AllowList,
    advertised,
    parse_address,
    parse_host,
    parse_rule,
)
from sluice.brokers.embedded import EmbeddedBroker
from sluice.errors import ConfigError
from sluice.protocols.pulsar import Frame, Type, command, decode_frame, encode, encode_payload, pb
from sluice.protocols.pulsar.auth import UpstreamAuth
from sluice.protocols.pulsar.correlation import Correlator
from sluice.protocols.pulsar.urls import BrokerUrl, parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.pulsar import UpstreamPool

T = Type.Value


@pytest.mark.parametrize(
    ("rule", "address", "allowed"),
    [
        ("broker-*.pulsar.svc", Address("broker-1.pulsar.svc", 6650), True),
        ("broker-*.pulsar.svc", Address("BROKER-2.PULSAR.SVC", 1), True),
        ("broker-*.pulsar.svc", Address("evil.example.com", 6650), False),
        ("broker-*.pulsar.svc:6650", Address("broker-1.pulsar.svc", 6651), False),
        ("10.0.0.0/8", Address("10.1.2.3", 6650), True),
        ("10.0.0.0/8", Address("11.1.2.3", 6650), False),
        ("10.0.0.0/8:6650-6651", Address("10.0.0.1", 6651), True),
        ("10.0.0.0/8:6650-6651", Address("10.0.0.1", 6652), False),
        ("10.0.0.0/8", Address("ten.example", 6650), False),  # names never match CIDRs
        ("127.0.0.1", Address("127.0.0.1", 1234), True),
        ("[fd00::/8]:6650", Address("fd00::1", 6650), True),
        ("[fd00::/8]:6650", Address("fe80::1", 6650), False),
        ("*:6650", Address("anything", 6650), True),
        ("*:6650", Address("anything", 6651), False),
    ],
)
def test_allow_rules(rule: str, address: Address, allowed: bool) -> None:
    assert AllowList([rule]).allows(address) is allowed


@pytest.mark.parametrize("bad", ["", "10.0.0.0/33", "host:abc", "host:9-1", "[fd00::/8]x", ":6650"])
def test_bad_allow_rules_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_rule(bad)


def test_learned_brokers_are_allowed_and_nothing_else_by_default() -> None:
    allow = AllowList()
    assert not allow.allows(Address("10.0.0.5", 6650))
    allow.learn(Address("Broker-0.local", 6650))
    assert allow.allows(Address("broker-0.local", 6650))
    assert not allow.allows(Address("broker-0.local", 6651))


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("pulsar://broker:6650", BrokerUrl("broker", 6650, False)),
        ("pulsar+ssl://broker:6651/", BrokerUrl("broker", 6651, True)),
        ("pulsar://broker", BrokerUrl("broker", 6650, False)),
        ("pulsar+ssl://broker", BrokerUrl("broker", 6651, True)),
        ("broker-1:6650", BrokerUrl("broker-1", 6650, False)),  # proxy_to_broker_url form
        ("pulsar://[::1]:6650", BrokerUrl("::1", 6650, False)),
    ],
)
def test_broker_urls(text: str, url: BrokerUrl) -> None:
    assert parse_broker_url(text) == url


@pytest.mark.parametrize(
    "bad", ["http://broker:80", "pulsar://a:1,b:2", "pulsar://:6650", "pulsar://b:70000"]
)
def test_bad_broker_urls(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_broker_url(bad)


def test_addresses() -> None:
    assert parse_address("0.0.0.0:6650") == Address("0.0.0.0", 6650)
    assert str(parse_address("[::]:6650")) == "[::]:6650"
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        parse_address("localhost")
    with pytest.raises(ConfigError, match=r"expected \[HOST\]:PORT"):
        parse_address("[::1]")
    # Unbracketed, an IPv6 address has no telling port (::1 was host ":", port 1).
    for bare in ("::1", "::1:6650", "fe80::2:8080"):
        with pytest.raises(ConfigError, match="goes in brackets"):
            parse_address(bare, default_port=6650)
    assert parse_address("Broker-1.Pulsar.svc:6650") == Address("broker-1.pulsar.svc", 6650)


def test_advertised_hosts() -> None:
    """What clients are told to dial: the host as written, the override,
    or this host's name for any spelling of a wildcard."""
    assert advertised("localhost", 7000) == Address("localhost", 7000)
    assert advertised("0.0.0.0", 7000, "broker.svc") == Address("broker.svc", 7000)
    for wildcard in ("0.0.0.0", "::", "::0", "0:0:0:0:0:0:0:0"):
        assert advertised(wildcard, 7000) == Address(socket.gethostname(), 7000)
    assert str(advertised("::1", 7000)) == "[::1]:7000"
    assert parse_host(" [::1] ") == "::1"
    for bad, reason in [("", "empty"), ("h:7000", "without a port"), ("a b", "not a host")]:
        with pytest.raises(ConfigError, match=reason):
            parse_host(bad)


def test_config_validation() -> None:
    broker = parse_broker_url("pulsar://b:6650")
    with pytest.raises(ConfigError, match="nothing to listen on"):
        ProxyConfig(broker=broker, listen=None)
    with pytest.raises(ConfigError, match="--listen-tls needs"):
        ProxyConfig(broker=broker, listen_tls=Address("127.0.0.1", 6651))
    with pytest.raises(ConfigError, match="--on-invalid"):
        ProxyConfig(broker=broker, on_invalid="drop")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--drain-timeout must be positive"):
        ProxyConfig(broker=broker, drain_timeout=0)


# --- correlator ------------------------------------------------------------


def frame(type_name: str, body: Message) -> Frame:
    return decode_frame(encode(command(T(type_name), body)))


def test_correlator_tracks_producers_consumers_and_sends() -> None:
    c = Correlator()
    producer = pb.CommandProducer(topic="t1", producer_id=3, request_id=10)
    c.observe(frame("PRODUCER", producer), True, 1.0)
    done = c.observe(
        frame("PRODUCER_SUCCESS", pb.CommandProducerSuccess(request_id=10, producer_name="p")),
        False,
        1.5,
    )
    assert done is not None and done.request_type == T("PRODUCER") and done.topic == "t1"
    assert done.seconds == 0.5 and done.error is None
    assert c.producers == {3: "t1"}

    send = encode_payload(
        command(T("SEND"), pb.CommandSend(producer_id=3, sequence_id=0)),
        pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1),
        b"x",
    )
    c.observe(decode_frame(send), True, 2.0)
    assert c.in_flight_sends == 1
    receipt = pb.CommandSendReceipt(producer_id=3, sequence_id=0)
    done = c.observe(frame("SEND_RECEIPT", receipt), False, 2.25)
    assert done is not None and done.request_type == T("SEND") and done.topic == "t1"
    assert c.in_flight_sends == 0

    sub = pb.CommandSubscribe(
        topic="t2",
        subscription="s",
        subType=pb.CommandSubscribe.Exclusive,
        consumer_id=4,
        request_id=11,
    )
    c.observe(frame("SUBSCRIBE", sub), True, 3.0)
    error = pb.CommandError(request_id=11, error=pb.ConsumerBusy, message="busy")
    done = c.observe(frame("ERROR", error), False, 3.1)
    assert done is not None and done.error == pb.ConsumerBusy
    assert c.consumers == {}  # failed subscribe creates nothing

    close = pb.CommandCloseProducer(producer_id=3, request_id=12)
    c.observe(frame("CLOSE_PRODUCER", close), False, 4.0)
    assert c.producers == {}


def test_correlator_ignores_answers_to_nothing() -> None:
    c = Correlator()
    assert c.observe(frame("SUCCESS", pb.CommandSuccess(request_id=99)), False, 1.0) is None
    receipt = pb.CommandSendReceipt(producer_id=1, sequence_id=1)
    assert c.observe(frame("SEND_RECEIPT", receipt), False, 1.0) is None


def test_correlator_counts_each_chunk_of_a_chunked_send() -> None:
    """Chunks share producer and sequence id; each is in flight until its own receipt."""
    c = Correlator()
    c.observe(
        frame("PRODUCER", pb.CommandProducer(topic="t", producer_id=1, request_id=1)), True, 0
    )
    c.observe(frame("PRODUCER_SUCCESS", pb.CommandProducerSuccess(request_id=1, producer_name="p")),
              False, 0)  # fmt: skip
    for chunk in range(3):
        meta = pb.MessageMetadata(
            producer_name="p", sequence_id=7, publish_time=1, uuid="p-7", chunk_id=chunk,
            num_chunks_from_msg=3, total_chunk_msg_size=30,
        )  # fmt: skip
        send = command(T("SEND"), pb.CommandSend(producer_id=1, sequence_id=7))
        c.observe(decode_frame(encode_payload(send, meta, b"x" * 10)), True, 1.0)
    assert c.in_flight_sends == 3
    receipt = frame("SEND_RECEIPT", pb.CommandSendReceipt(producer_id=1, sequence_id=7))
    done = [c.observe(receipt, False, 2.0) for _ in range(3)]
    assert all(d is not None and d.topic == "t" for d in done)
    assert c.in_flight_sends == 0
    assert c.observe(receipt, False, 3.0) is None  # a fourth receipt answers nothing


async def test_idle_upstream_connections_are_closed_and_reopened(broker: EmbeddedBroker) -> None:
    """Lookups of clients with different credentials each get a pooled
    connection; those unused for the idle time are closed (never one with a
    request in flight), and the next lookup opens a fresh one."""
    address = Address("127.0.0.1", broker.port)
    async with trio.open_nursery() as nursery:
        pool = UpstreamPool(nursery, timeout=10, tls_for=lambda a: None)
        for token in (b"a", b"b", b"c"):  # pulsar-lite takes any credentials
            conn = await pool.get(address, UpstreamAuth("token", token))
            lookup = pb.CommandLookupTopic(topic="persistent://public/default/idle")
            answer = await conn.request(Type.Value("LOOKUP"), lookup, 10)
            assert answer.name == "LOOKUP_RESPONSE"
        assert len(pool) == 3
        assert await pool.close_idle(idle=60) == 0  # all just used
        await trio.sleep(0.05)
        assert await pool.close_idle(idle=0.01) == 3
        assert len(pool) == 0
        conn = await pool.get(address, UpstreamAuth("token", b"a"))
        lookup = pb.CommandLookupTopic(topic="persistent://public/default/idle")
        assert (await conn.request(Type.Value("LOOKUP"), lookup, 10)).name == "LOOKUP_RESPONSE"
        conn._waiting[999] = (trio.Event(), [])  # a request in flight
        await trio.sleep(0.05)
        assert await pool.close_idle(idle=0.01) == 0 and len(pool) == 1
        conn._waiting.clear()
        await pool.aclose()
        nursery.cancel_scope.cancel()


def test_free_ports_come_from_below_the_outgoing_connections_range() -> None:
    # Two test workers: a port handed to a process that binds it later must
    # not be one the kernel may give the other worker's next connection.
    from sluice.brokers.embedded import _ephemeral_low, free_port

    low = _ephemeral_low()
    assert low is not None  # Linux
    ports = {free_port() for _ in range(20)}
    assert all(10000 <= p < low for p in ports), ports
    assert len(ports) > 1  # drawn, not the same one each time
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


@pytest.mark.e2e  # starts processes
def test_a_port_another_process_took_meanwhile_is_not_taken_for_readiness() -> None:
    """free_port's port is drawn before the process binds it: if another
    process listens there first, wait_for_port keeps waiting for the one it
    was given (or its children), rather than returning on the other's
    listener."""
    from sluice.brokers.embedded import BrokerError, free_port, wait_for_port

    port = free_port()
    listen = ("import socket, sys, time; s = socket.socket(); "
              "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(60)")  # fmt: skip
    second = free_port()
    parent = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', *sys.argv[1:]]);"
              " print(p.pid, flush=True); p.wait()")  # fmt: skip
    started: list[subprocess.Popen[bytes]] = []
    child = None
    try:
        other = subprocess.Popen([sys.executable, "-c", listen, str(port)])
        started.append(other)
        ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        started.append(ours)
        below = subprocess.Popen([sys.executable, "-c", parent, listen, str(second)],
                                 stdout=subprocess.PIPE)  # fmt: skip
        started.append(below)
        assert below.stdout is not None
        child = int(below.stdout.readline())
        wait_for_port("127.0.0.1", port, 20, other)  # the other one is ready
        with pytest.raises(BrokerError, match="did not listen"):
            wait_for_port("127.0.0.1", port, 1, ours)
        wait_for_port("127.0.0.1", second, 20, below)  # a child's listener counts
    finally:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        for process in started:
            process.kill()
            process.wait()
