"""PROXY protocol in and out, and SNI routing, end to end.

Apache Pulsar 4.0.8 with ``haProxyProtocolEnabled=true`` behind Sluice with
``--proxy-protocol-out`` names the client's own address in its topic stats;
headers written in front of Sluice (the test plays the balancer) carry the
client's address into the logs, the recording, ``sluice view`` and pcapng,
and per-IP limits count it; pulsar-perf in Pulsar's SNI proxy mode reaches
the broker through Sluice's TLS listener. Bad input is refused and counted.
The client's second address is a second loopback address (127.0.0.23).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import struct
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar
import pytest

from sluice.addresses import Address, AllowList
from sluice.brokers.apache_pulsar import ApachePulsar, TlsFiles, hs256_token
from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.errors import ConfigError
from sluice.protocols.core import Conn, OnInvalid, OpenUpstream
from sluice.protocols.haproxy import V2_SIGNATURE, v2_header
from sluice.protocols.pulsar import FrameDecoder, command, decode_stream, encode, pb
from sluice.protocols.pulsar.auth import ProxyAuth
from sluice.protocols.pulsar.connection import PulsarConnection, PulsarSettings, Routing
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.dial import TlsServerConfig
from tests.conftest import start_apache_pulsar
from tests.helpers.poll import wait_until
from tests.helpers.support import ProxyProcess, client, start_proxy, tls_files
from tests.test_apache_pulsar import (
    broker_certificate,
    pulsar_perf,
    recorded_frames,
    recording_proxy,
    records_sent,
    sluice,
    topic_stats,
    unique,
)
from tests.test_dashboards import scrape
from tests.test_http import Redirector, redirector, start_web_proxy  # noqa: F401 (a fixture)
from tests.test_proxy_auth import SECRET
from tests.test_pulsar_core import Recording, connect_body, frame_bytes

T = pb.BaseCommand
SECOND = "127.0.0.23"  # where "the client" connects from
BALANCER = "127.0.0.2"  # where the balancer does: the test itself (scraping) stays unlisted
SNI_NAME = "broker.sluice.test"  # the brokers' DNS name (never resolved)


def rejected(proxy: ProxyProcess, admin: int, reason: str) -> float:
    samples = scrape(proxy, admin)
    return sum(
        v
        for (name, labels), v in samples.items()
        if name == "sluice_connections_rejected_total" and dict(labels).get("reason") == reason
    )


# --- a balancer, as the test plays it ----------------------------------------------


class Balancer:
    """A TCP forwarder in front of Sluice: listens on 127.0.0.1, dials
    ``target`` from ``bind`` and writes ``header(client, listener)`` first,
    as HAProxy or a cloud balancer with PROXY protocol on does."""

    def __init__(self, target: int, *, bind: str = "127.0.0.1", version: int = 0,
                 client_host: str | None = None) -> None:  # fmt: skip
        self.target = target
        self.bind = bind
        self.version = version
        self.client_host = client_host
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self._sockets: list[socket.socket] = [self.server]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, (host, port) = self.server.accept()
            except OSError:
                return
            upstream = socket.socket()
            upstream.bind((self.bind, 0))
            upstream.connect(("127.0.0.1", self.target))
            with self._lock:
                self._sockets += [downstream, upstream]
            source = Address(self.client_host or host, port)
            header = b""
            if self.version == 1:
                header = f"PROXY TCP4 {source.host} 127.0.0.1 {port} {self.port}\r\n".encode()
            elif self.version == 2:
                header = v2_header(source, Address("127.0.0.1", self.port))
            upstream.sendall(header)
            for a, b in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def __enter__(self) -> Balancer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_frame() -> bytes:
    body = pb.CommandConnect(client_version="test", protocol_version=21)
    return encode(command(T.CONNECT, body))


def first_answer(sock: socket.socket, timeout: float = 10.0) -> str:
    """The name of the first frame Sluice answers with; "closed" if it hung up."""
    sock.settimeout(timeout)
    decoder = FrameDecoder()
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return "closed"
        if not data:
            return "closed"
        decoder.receive_data(data)
        frames = list(decoder.frames())
        if frames:
            return frames[0].name


def dial(port: int, first: bytes, *, source: str = BALANCER) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.sendall(first)
    return sock


# --- the broker: haProxyProtocolEnabled, TLS, a DNS name for SNI ------------------


@dataclass
class SniBroker:
    broker: ApachePulsar
    ca: Path
    served: Path  # Sluice's TLS certificate and key, for 127.0.0.1 and SNI_NAME


@pytest.fixture(scope="module")
def pp_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SniBroker]:
    """Apache Pulsar reading PROXY headers (haProxyProtocolEnabled=true),
    with TLS, advertising itself to clients that ask for listener
    ``external`` by a DNS name, as PIP-60's SNI routing needs: Java sends
    no SNI for an IP address. The name never resolves: in SNI mode the
    client dials only the proxy."""
    tmp = tmp_path_factory.mktemp("proxy-protocol")
    ca_file, served, ca = tls_files(tmp, "127.0.0.1", "localhost", SNI_NAME)
    cert, key = broker_certificate(ca, tmp)

    def make(log_path: Path) -> ApachePulsar:
        b = ApachePulsar(
            tls=TlsFiles(cert=cert, key=key, ca=ca_file),
            settings={"haProxyProtocolEnabled": True, "advertisedAddress": "",
                      "internalListenerName": "internal"},
            log_path=log_path,
        )  # fmt: skip
        b.settings["advertisedListeners"] = ",".join(
            f"{name}:{scheme}://{host}:{port}"
            for name, host in (("internal", "127.0.0.1"), ("external", SNI_NAME))
            for scheme, port in (("pulsar", b.port), ("pulsar+ssl", b.tls_port))
        )
        return b

    b = start_apache_pulsar(tmp, make)
    yield SniBroker(b, ca_file, served)
    b.close()


# --- out: the broker sees the client --------------------------------------------


def test_the_broker_names_the_clients_own_address_through_sluice(
    pp_broker: SniBroker, tmp_path: Path
) -> None:
    broker = pp_broker.broker
    proxy, _, record = recording_proxy(broker.url, tmp_path, "--proxy-protocol-out")
    topic = unique("pp-out")
    try:
        # The client's connections reach Sluice from 127.0.0.23 (a plain
        # forwarder bound there: the official client cannot pick its source).
        with Balancer(proxy.port, bind=SECOND) as lb, client(f"pulsar://127.0.0.1:{lb.port}") as c:
            producer = c.create_producer(topic, batching_enabled=False)
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            producer.send(b"from 127.0.0.23")
            assert consumer.receive(timeout_millis=15_000).data() == b"from 127.0.0.23"
            stats = topic_stats(broker, topic)
            shown = {
                "publishers": [p["address"] for p in stats["publishers"]],
                "consumers": [c["address"] for c in stats["subscriptions"]["s"]["consumers"]],
            }
            print("broker topic stats through Sluice:", json.dumps(shown))
            addresses = shown["publishers"] + shown["consumers"]
            assert addresses and all(a.startswith(f"{SECOND}:") for a in addresses), stats
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    clients = {r["client"] for r in conn_records(record)}
    assert clients and all(c.startswith(f"{SECOND}:") for c in clients), clients


def test_a_broker_that_reads_no_headers_refuses_and_the_error_says_why(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    proxy = start_proxy(apache_pulsar.url, tmp_path, "--proxy-protocol-out")
    try:
        with client(proxy.url, operation_timeout_seconds=4) as c, pytest.raises(pulsar.Timeout):
            c.create_producer(unique("pp-refused"))
        wait_until(
            lambda: "haProxyProtocolEnabled=true" in proxy.log(),
            20,
            "the reason in Sluice's log",
            step=0.05,
        )
        assert "broker closed the connection during the handshake" in proxy.log()
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    assert "Traceback" not in proxy.log()


def conn_records(record: Path) -> list[dict[str, Any]]:
    shown = sluice("inspect", str(record), "--json")
    assert shown.returncode == 0, shown.stderr[-3000:]
    return [r for r in map(json.loads, shown.stdout.splitlines()) if "client" in r]


# --- in: headers in front of Sluice -------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_a_balancers_header_names_the_client_everywhere(
    pp_broker: SniBroker, tmp_path: Path, version: int
) -> None:
    broker = pp_broker.broker
    fake = "198.51.100.7"  # the client as the balancer saw it
    proxy, admin, record = recording_proxy(
        broker.url, tmp_path, "--proxy-protocol-in", "--proxy-protocol-from", f"{BALANCER}/32",
        "--proxy-protocol-out", "--log-level", "debug",
    )  # fmt: skip
    topic = unique(f"pp-in-v{version}")
    try:
        balancer = Balancer(proxy.port, bind=BALANCER, version=version, client_host=fake)
        with balancer as lb, client(f"pulsar://127.0.0.1:{lb.port}") as c:
            producer = c.create_producer(topic, batching_enabled=False)
            producer.send(b"through a balancer")
            # ... and on through Sluice to the broker, which names it too.
            publishers = topic_stats(broker, topic)["publishers"]
            assert [p["address"].split(":")[0] for p in publishers] == [fake], publishers
        assert rejected(proxy, admin, "proxy_header_missing") == 0
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    log = proxy.log()
    assert f"from {fake}:" in log and f"via {BALANCER}:" in log and f"(PROXY v{version})" in log
    assert "Traceback" not in log
    conns = conn_records(record)
    assert conns and all(r["client"].startswith(f"{fake}:") for r in conns), conns
    assert all(r["via"].startswith(f"{BALANCER}:") for r in conns), conns
    assert any(f["cmd"] == "SEND" for f in recorded_frames(record))
    timeline = sluice("inspect", str(record))
    assert f"client={fake}:" in timeline.stdout and f"via={BALANCER}:" in timeline.stdout
    page = tmp_path / "view.html"
    exported = sluice("view", str(record), "--export", str(page))
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert f'"client": "{fake}:' in page.read_text() or f'"client":"{fake}:' in page.read_text()
    pcap = tmp_path / "out.pcapng"
    assert sluice("inspect", str(record), "--pcap", str(pcap)).returncode == 0
    assert socket.inet_aton(fake) in pcap.read_bytes()


def test_per_ip_limits_count_the_address_the_header_names(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    admin = free_port()
    proxy = start_proxy(
        broker.url, tmp_path, "--admin", f"127.0.0.1:{admin}", "--proxy-protocol-in",
        "--proxy-protocol-from", f"{BALANCER},::1", "--max-connections-per-ip", "1",
    )  # fmt: skip

    def header(host: str) -> bytes:
        return f"PROXY TCP4 {host} 127.0.0.1 5000 {proxy.port}\r\n".encode()

    try:
        first = dial(proxy.port, header("198.51.100.1") + connect_frame())
        assert first_answer(first) == "CONNECTED"
        # Same client behind the balancer: over its limit, though the socket
        # address is the balancer's, which carries many clients.
        second = dial(proxy.port, header("198.51.100.1") + connect_frame())
        assert first_answer(second) == "closed"
        wait_until(
            lambda: rejected(proxy, admin, "limit") == 1, 20, "the refusal counted", step=0.05
        )
        other = dial(proxy.port, header("198.51.100.2") + connect_frame())
        assert first_answer(other) == "CONNECTED"
        # A source not listed may not send a header, and is served as it is.
        # (Its place is taken as it connects, before its first bytes are
        # looked at: the header first, while SECOND has its place free.)
        forged = dial(proxy.port, header("198.51.100.3") + connect_frame(), source=SECOND)
        assert first_answer(forged) == "closed"
        wait_until(
            lambda: rejected(proxy, admin, "proxy_header_unlisted") == 1,
            20,
            "unlisted counted",
            step=0.05,
        )
        direct = dial(proxy.port, connect_frame(), source=SECOND)
        assert first_answer(direct) == "CONNECTED"
        again = dial(proxy.port, connect_frame(), source=SECOND)  # its one place is taken
        assert first_answer(again) == "closed"
        wait_until(
            lambda: rejected(proxy, admin, "limit") == 2,
            20,
            "the second refusal counted",
            step=0.05,
        )
        again.close()
        for sock in (first, second, other, direct, forged):
            sock.close()
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    log = proxy.log()
    assert "198.51.100.1" in log and "which --proxy-protocol-from does not list" in log
    assert "Traceback" not in log


def v2_with(body: bytes, command_family: bytes = b"\x21\x11") -> bytes:
    return V2_SIGNATURE + command_family + struct.pack("!H", len(body)) + body


INET = bytes([203, 0, 113, 9, 127, 0, 0, 1]) + struct.pack("!HH", 4000, 6650)

BAD_HEADERS = {
    "truncated v1": (b"PROXY TCP4 203.0.113.9 127.0", "proxy_header_truncated"),
    "truncated v2": (v2_with(INET)[:20], "proxy_header_truncated"),
    "oversized v1": (b"PROXY UNKNOWN " + b"x" * 120, "proxy_header_oversized"),
    "oversized v2": (V2_SIGNATURE + b"\x21\x11\xff\xff" + bytes(64), "proxy_header_oversized"),
    "wrong signature": (b"PROXZ TCP4 203.0.113.9 127.0.0.1 1 2\r\n", "proxy_header_missing"),
    "no header": (connect_frame(), "proxy_header_missing"),
    "malformed v1": (b"PROXY TCP4 203.0.113.999 127.0.0.1 1 2\r\n", "proxy_header_malformed"),
    "v2 cut TLV": (v2_with(INET + b"\xea\x00\x10ab"), "proxy_header_malformed"),
}


@contextlib.contextmanager
def header_reading_proxy(
    broker: EmbeddedBroker, tmp_path: Path
) -> Iterator[tuple[ProxyProcess, int]]:
    """``sluice proxy --proxy-protocol-in`` in front of ``broker``, taking
    headers from BALANCER, a handshake's timeout 2s, with an admin
    endpoint: (the proxy, its admin port). Killed on exit."""
    admin = free_port()
    proxy = start_proxy(
        broker.url, tmp_path, "--admin", f"127.0.0.1:{admin}", "--proxy-protocol-in",
        "--proxy-protocol-from", BALANCER, "--handshake-timeout", "2",
    )  # fmt: skip
    try:
        yield proxy, admin
    finally:
        proxy.kill()


def test_bad_headers_are_refused_counted_and_logged_in_a_line(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    with header_reading_proxy(broker, tmp_path) as (proxy, admin):
        for name, (data, reason) in BAD_HEADERS.items():
            before = rejected(proxy, admin, reason)
            sock = dial(proxy.port, data)
            if name.startswith("truncated"):
                sock.shutdown(socket.SHUT_WR)  # the balancer gave up part-way
            assert first_answer(sock) == "closed", name
            sock.close()

            def counted(r: str = reason, b: float = before) -> bool:
                return rejected(proxy, admin, r) > b

            wait_until(counted, 20, f"{name} counted", step=0.05)
        # A header stopped part-way and left open: refused at the timeout.
        sock = dial(proxy.port, b"PROXY TCP4 203.0.113.9")
        assert first_answer(sock) == "closed"
        sock.close()
        wait_until(
            lambda: rejected(proxy, admin, "proxy_header_timeout") == 1,
            20,
            "timeout counted",
            step=0.05,
        )
        # v2 with a TLV Sluice does not know (AWS's VPC endpoint id): skipped, served.
        tlv = b"\xea\x00\x0b\x01vpce-12345"
        sock = dial(proxy.port, v2_with(INET + tlv) + connect_frame())
        assert first_answer(sock) == "CONNECTED"
        sock.close()
        # The admin endpoint reads headers too.
        request = b"GET /healthz HTTP/1.1\r\n\r\n"
        probe = dial(admin, b"PROXY TCP4 203.0.113.9 127.0.0.1 1 2\r\n" + request)
        probe.settimeout(10)
        assert probe.recv(100).startswith(b"HTTP/1.1 200"), "the admin endpoint"
        probe.close()
        # ... and takes none from a listed source too (a kubelet's probe).
        bare = dial(admin, request)
        bare.settimeout(10)
        assert bare.recv(100).startswith(b"HTTP/1.1 200"), "no header, the admin endpoint"
        bare.close()
        assert proxy.terminate() == 0
    assert "Traceback" not in proxy.log()


# --- SNI: Pulsar's proxy mode ---------------------------------------------------------


def routed_core(tmp_path: Path, routing: Routing, to: Address) -> PulsarConnection:
    """A core whose client's TLS server name chose ``to``, Sluice
    authenticating clients (--auth-mode proxy)."""
    (tmp_path / "secret.key").write_bytes(SECRET)
    (tmp_path / "sluice.token").write_text(hs256_token(SECRET, "sluice") + "\n")
    auth = ProxyAuth.load(secret_key=tmp_path / "secret.key", public_key=None,
                          role_claim="sub", own_token=tmp_path / "sluice.token",
                          tls_roles=False, forward_auth_data=False)  # fmt: skip
    settings = PulsarSettings(OnInvalid.REJECT, 5 * 1024 * 1024, 5, auth)
    conn = Conn(1, "198.51.100.7:4000", "tls", "pulsar", via=f"{BALANCER}:5000")
    return PulsarConnection(conn, settings, routing, Recording(), routed=to)


def test_a_routed_connect_goes_to_the_named_broker_as_sluice_naming_the_client(
    tmp_path: Path,
) -> None:
    """SNI mode: the client's CONNECT names no proxy_to_broker_url (the TLS
    server name chose the broker); in proxy mode it goes upstream with
    Sluice's credential, naming the role Sluice verified."""
    routing = Routing(parse_broker_url("pulsar://127.0.0.1:6650"))
    routing.named = {SNI_NAME: parse_broker_url("pulsar+ssl://10.0.0.5:6651")}
    target = routing.route_name(SNI_NAME)
    assert target == Address("10.0.0.5", 6651)
    core = routed_core(tmp_path, routing, target)
    token = hs256_token(SECRET, "app")
    connect = connect_body(auth_method_name="token", auth_data=token.encode())
    (opened,) = core.receive_client(frame_bytes("CONNECT", connect), 0.0)
    assert isinstance(opened, OpenUpstream)
    assert (opened.address, opened.tls) == (target, True)
    (hello,) = decode_stream(opened.hello, 1 << 20)
    assert hello.body.auth_data == hs256_token(SECRET, "sluice").encode()
    assert (hello.body.original_principal, hello.body.original_auth_method) == ("app", "token")
    assert core.conn.kind == "proxied" and core.conn.broker == "10.0.0.5:6651"


def test_server_names_route_to_brokers_the_cluster_named_if_the_allow_list_admits_them() -> None:
    routing = Routing(parse_broker_url("pulsar://127.0.0.1:6650"), ("*.pulsar.svc",))
    assert routing.route_name("broker-1.pulsar.svc") is None  # not named yet
    # A lookup answer named the broker, plain and TLS: the TLS address wins.
    routing.learn(parse_broker_url("pulsar://broker-1.pulsar.svc:6650"))
    routing.learn(parse_broker_url("pulsar+ssl://Broker-1.pulsar.svc:6651"))
    assert routing.route_name("broker-1.pulsar.svc") == Address("broker-1.pulsar.svc", 6651)
    # A host name is one in any case: however a client spells it, its route
    # (TLS here) is found (a client's Broker-1 for a learned broker-1 lost
    # it, and Sluice dialled in the clear).
    assert routing.tls_of(parse_broker_url("pulsar://BROKER-1.Pulsar.svc:6651").address)
    # Named, but the allow-list does not admit it: no route (a TLS alert).
    strict = Routing(parse_broker_url("pulsar://127.0.0.1:6650"), ("10.0.0.0/8",))
    strict.learn(parse_broker_url("pulsar://evil.example:6650"))
    strict.allowlist = AllowList(("10.0.0.0/8",))
    assert strict.route_name("evil.example") is None
    assert routing.route_name("127.0.0.1") == Address("127.0.0.1", 6650)  # the --broker


def test_sni_and_proxy_protocol_settings_say_what_is_wrong() -> None:
    broker = parse_broker_url("pulsar://127.0.0.1:6650")
    tls = TlsServerConfig(Path("c"), Path("k"))
    with pytest.raises(ConfigError, match="needs --proxy-protocol-from"):
        ProxyConfig(broker, proxy_protocol_in=True)
    with pytest.raises(ConfigError, match="goes with --proxy-protocol-in"):
        ProxyConfig(broker, proxy_protocol_from=("10.0.0.0/8",))
    with pytest.raises(ConfigError, match=r"'10\.0\.0\.0/33'"):
        ProxyConfig(broker, proxy_protocol_in=True, proxy_protocol_from=("10.0.0.0/33",))
    with pytest.raises(ConfigError, match="need a TLS listener"):
        ProxyConfig(broker, sni_route=("a.example=pulsar://b:6650",))
    listen = Address("127.0.0.1", 6651)
    for bad in ("a.example", "not_dns=pulsar://b:6650", "a.example=http://b"):
        with pytest.raises(ConfigError, match="--sni-route"):
            ProxyConfig(broker, listen_tls=listen, tls=tls, sni_route=(bad,))
    routes = ("A.Example.=pulsar+ssl://b:6651", "me.example=self")
    config = ProxyConfig(broker, listen_tls=listen, tls=tls, sni_route=routes)
    assert config.sni_routes() == {
        "a.example": parse_broker_url("pulsar+ssl://b:6651"),
        "me.example": None,
    }


def sni_proxy(pp: SniBroker, tmp_path: Path, *extra: str) -> tuple[ProxyProcess, int, int, Path]:
    tls_port = free_port()
    proxy, admin, record = recording_proxy(
        pp.broker.url, tmp_path, "--listen-tls", f"127.0.0.1:{tls_port}", "--tls-cert",
        str(pp.served), "--tls-key", str(pp.served), "--log-level", "debug", *extra,
    )  # fmt: skip
    return proxy, admin, tls_port, record


def test_pulsar_perf_in_sni_proxy_mode_through_sluice(pp_broker: SniBroker, tmp_path: Path) -> None:
    broker = pp_broker.broker
    proxy, _, tls_port, record = sni_proxy(
        pp_broker, tmp_path, "--sni-route", f"{SNI_NAME}=pulsar://127.0.0.1:{broker.port}"
    )
    topic = unique("sni")
    sni = (
        "-u", f"pulsar+ssl://{SNI_NAME}:{broker.tls_port}",
        "--proxy-url", f"pulsar+ssl://127.0.0.1:{tls_port}", "--proxy-protocol", "SNI",
        "--listener-name", "external", "--trust-cert-file", str(pp_broker.ca),
    )  # fmt: skip
    try:
        consume = subprocess.Popen(
            broker.runtime.perf(  # type: ignore[union-attr]
                "consume", *sni, "-ss", "sni", "-sp", "Earliest", "-m", "300", "-i", "1", topic
            ),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            produced = pulsar_perf(broker, "produce", *sni, "-m", "300", "-r", "300", "-s", "512",
                                   "-i", "1", topic)  # fmt: skip
            out, _ = consume.communicate(timeout=120)
        finally:
            if consume.poll() is None:
                consume.kill()
                consume.wait()
        assert consume.returncode == 0, out[-3000:]
        sent = records_sent(produced)
        assert topic_stats(broker, topic)["msgInCounter"] == sent >= 300
        assert "records received" in out, out[-2000:]
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    log = proxy.log()
    assert f"TLS server name {SNI_NAME}: broker 127.0.0.1:{broker.port}" in log
    assert "Traceback" not in log
    frames = recorded_frames(record)
    assert sum(f.get("msgs", 1) for f in frames if f["cmd"] == "SEND") == sent
    assert not [f for f in frames if "invalid" in f]
    kinds = {r["connection_kind"] for r in conn_records(record)}
    assert kinds == {"proxied"}, kinds  # relayed to the broker, lookups and all


def tls_hello(port: int, ca: Path, name: str | None) -> str:
    """A TLS handshake with Sluice naming ``name`` (None: no SNI), then a
    CONNECT; the first answer, or the TLS error."""
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname=name) as sock:
                sock.sendall(connect_frame())
                return first_answer(sock)
        except ssl.SSLError as exc:
            return f"TLS: {exc.reason}"


def test_server_names_that_route_nowhere_get_a_tls_alert(
    pp_broker: SniBroker, tmp_path: Path
) -> None:
    broker = pp_broker.broker
    proxy, admin, tls_port, _ = sni_proxy(
        pp_broker, tmp_path, "--sni-route", f"{SNI_NAME}=pulsar://127.0.0.1:{broker.port}",
        "--sni-route", "sluice.test=self",
    )  # fmt: skip
    try:
        ca = pp_broker.ca
        # No server name (a client dialling an IP address): Sluice serves it
        # as usual, answering CONNECT itself; so does a name routed to "self".
        assert tls_hello(tls_port, ca, None) == "CONNECTED"
        assert tls_hello(tls_port, ca, "sluice.test") == "CONNECTED"
        assert tls_hello(tls_port, ca, SNI_NAME) == "CONNECTED"  # the broker's own
        assert tls_hello(tls_port, ca, "elsewhere.example") == "TLS: TLSV1_UNRECOGNIZED_NAME"
        wait_until(lambda: rejected(proxy, admin, "sni_unknown") == 1, 20, "sni_unknown", step=0.05)
        for odd in ("odd_name!.example", "-leading.example", "odd name.example"):
            assert tls_hello(tls_port, ca, odd) == "TLS: TLSV1_UNRECOGNIZED_NAME", odd
        wait_until(lambda: rejected(proxy, admin, "sni_invalid") == 3, 20, "sni_invalid", step=0.05)
        # A name that is not ASCII (Python's ssl cannot decode it, so it
        # never reaches Sluice's callback): refused alike, no traceback.
        hello = subprocess.run(
            ["openssl", "s_client", "-connect", f"127.0.0.1:{tls_port}", "-servername",
             "été.example", "-CAfile", str(ca)],
            input=b"", capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        assert b"unrecognized name" in hello.stdout + hello.stderr, hello.stderr
        wait_until(lambda: rejected(proxy, admin, "sni_invalid") == 4, 20, "sni_invalid", step=0.05)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    log = proxy.log()
    assert "TLS server name 'elsewhere.example' names no broker" in log
    assert "is not a DNS name" in log and "Traceback" not in log
    assert "Exception ignored" not in log


# --- the HTTP listener -------------------------------------------------------------------


def test_the_http_listener_reads_proxy_headers(
    apache_pulsar: ApachePulsar,
    redirector: Redirector,  # noqa: F811
    tmp_path: Path,
) -> None:
    """--proxy-protocol-in covers the HTTP listener too: the balancer's
    header names the client that X-Forwarded-For carries on; a bad header is
    refused and counted; a client that is not a balancer is served as it is."""
    web = start_web_proxy(apache_pulsar, tmp_path, redirector.url, "--allow-broker", "127.0.0.1",
                          "--proxy-protocol-in", "--proxy-protocol-from", BALANCER)  # fmt: skip
    request = b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    try:
        sock = dial(web.http_port, b"PROXY TCP4 203.0.113.9 127.0.0.1 5000 8080\r\n" + request)
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        assert (answer.status, answer.read()) == (200, b'["standalone"]')
        sock.close()
        sock = dial(web.http_port, b"PROXY TCP4 203.0.113.999 127.0.0.1 1 2\r\n" + request)
        assert first_answer(sock) == "closed"
        sock.close()
        wait_until(lambda: web.metric(
            "sluice_connections_rejected_total", reason="proxy_header_malformed") == 1,
            20, "the bad header counted", step=0.05)  # fmt: skip
        status, _ = apache_pulsar.admin("GET", "/admin/v2/clusters", base=web.url)
        assert status == 200  # from 127.0.0.1, no balancer: no header, served
        assert redirector.forwarded == ["203.0.113.9", "127.0.0.1"]
    finally:
        web.proxy.kill()
    assert "Traceback" not in web.proxy.log()
