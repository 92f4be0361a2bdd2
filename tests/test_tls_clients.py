"""Clients that speak TLS to Sluice as they would to the broker, against
Apache Pulsar 4.0.8 with TLS on both ports and authentication on:

- HTTPS lookups: the answer names a TLS broker URL, Sluice's per-broker
  TLS listener (port-per-broker covers TLS), for the Python client (a
  plain and a partitioned topic) and the Java client (pulsar-perf);
- the client certificate as identity: refused in passthrough mode by
  Sluice itself with the reason and the flag that works, and in
  ``--auth-mode proxy --tls-client-ca`` the certificate's CN is the role
  the broker authorizes (allowed and refused as at the broker directly,
  on the binary port, over HTTPS, and with transactions)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pulsar
import pytest
import trustme

from sluice.brokers.apache_pulsar import ApachePulsar, TlsFiles
from sluice.brokers.embedded import BrokerError, free_port, wait_for_port
from sluice.protocols.pulsar import Type, command, encode, pb
from tests.conftest import start_apache_pulsar
from tests.helpers.support import (
    QUIET,
    ProxyProcess,
    RawClient,
    client,
    start_proxy,
    tcp_connections,
    tls_files,
    wait_ready,
)
from tests.test_apache_pulsar import (
    TOKEN_CLIENT,
    TOKEN_PROVIDER,
    Tokens,
    broker_certificate,
    consume_exactly,
    pulsar_perf,
    records_sent,
    rest_path,
    topic_stats,
    unique,
    write_pkcs8,
)
from tests.test_dashboards import scrape, value

pytestmark = pytest.mark.e2e  # every test here starts a process

TLS_PROVIDER = "org.apache.pulsar.broker.authentication.AuthenticationProviderTls"
TLS_CLIENT = "org.apache.pulsar.client.impl.auth.AuthenticationTls"


@dataclass
class Pki:
    """The test's CA (its file ``ca``), Sluice's server certificate and key
    (``served``), and client certificates by role: (cert, PKCS#8 key)."""

    ca: Path
    served: Path
    authority: trustme.CA
    directory: Path

    def client(self, role: str) -> tuple[Path, Path]:
        cert, key = self.directory / f"{role}.crt", self.directory / f"{role}.key"
        if not cert.exists():
            issued = self.authority.issue_cert(f"{role}.clients.test", common_name=role)
            issued.cert_chain_pems[0].write_to_path(str(cert))
            write_pkcs8(issued, key)  # for the Java client
        return cert, key

    def context(self, role: str | None = None) -> ssl.SSLContext:
        """An HTTPS client context trusting the CA, with ``role``'s certificate."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if role is not None:
            cert, key = self.client(role)
            context.load_cert_chain(str(cert), str(key))
        return context


@dataclass
class TlsBroker:
    broker: ApachePulsar
    tokens: Tokens
    pki: Pki


@pytest.fixture(scope="module")
def tls_auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    """Apache Pulsar with TLS on its binary and web ports, tokens and client
    certificates accepted, authorization on (``app`` may produce and consume
    in public/default, not in public/elsewhere, and look up the transaction
    coordinator's topic), ``sluice`` a proxy role, and the transaction
    coordinator on."""
    tmp = tmp_path_factory.mktemp("tls-clients")
    ca_file, served, ca = tls_files(tmp, "127.0.0.1", "localhost")
    cert, key = broker_certificate(ca, tmp)
    tokens = Tokens(tmp)
    b = start_apache_pulsar(
        tmp,
        tls=TlsFiles(cert=cert, key=key, ca=ca_file),
        admin_token=tokens.admin,
        settings={
            "authenticationEnabled": True,
            "authorizationEnabled": True,
            "authenticationProviders": f"{TOKEN_PROVIDER},{TLS_PROVIDER}",
            "tokenSecretKey": f"file://{tokens.key_file}",
            "superUserRoles": "admin,sluice",
            "proxyRoles": "sluice",
            "brokerClientAuthenticationPlugin": TOKEN_CLIENT,
            "brokerClientAuthenticationParameters": f"token:{tokens.admin}",
            "transactionCoordinatorEnabled": True,
        },
    )
    b.admin_json("POST", "/admin/v2/namespaces/public/default/permissions/app",
                 ["produce", "consume"])  # fmt: skip
    b.admin_json("PUT", "/admin/v2/namespaces/public/elsewhere")  # app may not use it
    # A client with transactions looks the coordinator's topic up: a lookup
    # needs a permission there (refused alike direct and through Sluice).
    b.admin_json("POST", "/admin/v2/namespaces/pulsar/system/permissions/app", ["consume"])
    yield TlsBroker(b, tokens, Pki(ca_file, served, ca, tmp))
    b.close()


@dataclass
class Everywhere:
    """Sluice on every port a client uses: binary plain and TLS, web plain
    and TLS, and its admin endpoint."""

    proxy: ProxyProcess
    tls: int
    http: int
    https: int
    admin: int

    @property
    def https_url(self) -> str:
        return f"https://127.0.0.1:{self.https}"

    @property
    def tls_url(self) -> str:
        return f"pulsar+ssl://127.0.0.1:{self.tls}"


def sluice_everywhere(tb: TlsBroker, tmp_path: Path, *extra: str) -> Everywhere:
    broker = tb.broker
    assert broker.web_tls_port is not None
    tls, http, https, admin = free_port(), free_port(), free_port(), free_port()
    proxy = start_proxy(
        broker.tls_url, tmp_path, "--broker-tls-ca", str(tb.pki.ca),
        "--listen-tls", f"127.0.0.1:{tls}", "--tls-cert", str(tb.pki.served),
        "--tls-key", str(tb.pki.served),
        "--http-listen", f"127.0.0.1:{http}", "--http-listen-tls", f"127.0.0.1:{https}",
        "--broker-http", f"https://127.0.0.1:{broker.web_tls_port}",
        "--admin", f"127.0.0.1:{admin}", *extra,
    )  # fmt: skip
    try:
        for port in (tls, http, https):
            wait_for_port("127.0.0.1", port, 20, proxy.process)
    except BrokerError as exc:  # the proxy's own words on why it did not listen
        raise AssertionError(f"{exc}: {proxy.log()[-2000:]}") from None
    return Everywhere(proxy, tls, http, https, admin)


def get(url: str, context: ssl.SSLContext, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def sluices_upstream_ports(proxy: ProxyProcess, broker: ApachePulsar) -> set[int]:
    """The local ports of Sluice's connections to the broker's TLS port."""
    return {local[1] for local, remote in tcp_connections(proxy.pid)
            if remote == (broker.host, broker.tls_port)}  # fmt: skip


def connected_ports(stats: dict[str, object]) -> list[int]:
    """The client ports of every producer and consumer a topic's stats list."""
    addresses = [p["address"] for p in stats["publishers"]]  # type: ignore[attr-defined]
    for sub in stats["subscriptions"].values():  # type: ignore[attr-defined]
        addresses += [c["address"] for c in sub["consumers"]]
    return [int(a.rpartition(":")[2]) for a in addresses]


# --- HTTPS lookups ------------------------------------------------------------------


def test_https_lookups_name_sluices_tls_listener_for_the_broker(
    tls_auth_broker: TlsBroker, tmp_path: Path
) -> None:
    """The Python client given an https:// service URL and the CA, on a
    plain and a partitioned topic: every connection the broker sees is
    Sluice's, and Sluice's reach the broker's TLS port only."""
    tb = tls_auth_broker
    broker = tb.broker
    web = sluice_everywhere(tb, tmp_path)
    token = tb.tokens.make("app")
    plain, partitioned = unique("https-plain"), unique("https-parts")
    broker.admin_json("PUT", f"/admin/v2/{rest_path(partitioned)}/partitions", 3)
    try:
        # The lookup answer: binary URLs of Sluice's, a TLS one among them,
        # on a per-broker port (neither the broker's nor Sluice's main ones).
        status, body = get(f"{web.https_url}/lookup/v2/topic/{rest_path(plain)}",
                           tb.pki.context(), token)  # fmt: skip
        assert status == 200, body
        answer = json.loads(body)
        assert answer["brokerUrlTls"].startswith("pulsar+ssl://127.0.0.1:"), answer
        assert answer["brokerUrl"].startswith("pulsar://127.0.0.1:"), answer
        own = {int(answer[f].rpartition(":")[2]) for f in ("brokerUrl", "brokerUrlTls")}
        assert len(own) == 2 and not own & {broker.port, broker.tls_port, web.tls, web.proxy.port}
        with client(web.https_url, tls_trust_certs_file_path=str(tb.pki.ca),
                    authentication=pulsar.AuthenticationToken(token)) as c:  # fmt: skip
            for topic, parts in ((plain, [plain]), (partitioned,
                                 [f"{partitioned}-partition-{i}" for i in range(3)])):  # fmt: skip
                consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
                producer = c.create_producer(topic, batching_enabled=False)
                sent = [f"{topic[-8:]}-{i}".encode() for i in range(12)]
                for body_ in sent:
                    producer.send(body_)
                assert sorted(consume_exactly(consumer, len(sent))) == sorted(sent)
                ours = sluices_upstream_ports(web.proxy, broker)
                seen = [p for part in parts for p in connected_ports(topic_stats(broker, part))]
                assert seen and set(seen) <= ours, (seen, ours)
        upstream = {remote for _, remote in tcp_connections(web.proxy.pid)}
        assert broker.address not in upstream  # the broker's plain port: never
        assert web.proxy.terminate() == 0
    finally:
        web.proxy.kill()
    assert "Traceback" not in web.proxy.log()


def test_the_java_client_produces_over_https_lookups(
    tls_auth_broker: TlsBroker, tmp_path: Path
) -> None:
    """pulsar-perf with an https:// service URL: its lookups go to Sluice's
    HTTPS listener, its connections to Sluice's per-broker TLS listener."""
    tb = tls_auth_broker
    web = sluice_everywhere(tb, tmp_path)
    topic = unique("https-perf")
    try:
        produced = pulsar_perf(
            tb.broker, "produce", "-u", web.https_url, "--trust-cert-file", str(tb.pki.ca),
            "--auth-plugin", TOKEN_CLIENT, "--auth-params", f"token:{tb.tokens.make('app')}",
            "-m", "200", "-r", "200", "-s", "256", "-i", "1", topic,
        )  # fmt: skip
        sent = records_sent(produced)
        assert topic_stats(tb.broker, topic)["msgInCounter"] == sent >= 200
        samples = scrape(web.proxy, web.admin)
        # Its binary connection came in on a TLS listener of Sluice's.
        assert value(samples, "sluice_connections_opened_total", listener="tls") >= 1
        assert web.proxy.terminate() == 0
    finally:
        web.proxy.kill()
    assert "Traceback" not in web.proxy.log()


# --- the client certificate as identity ---------------------------------------------


def test_passthrough_refuses_a_certificate_login_and_says_what_works(
    tls_auth_broker: TlsBroker, tmp_path: Path
) -> None:
    tb = tls_auth_broker
    web = sluice_everywhere(tb, tmp_path)
    cert, key = tb.pki.client("app")
    try:
        # Ready: Sluice's probe has found that the broker authenticates.
        wait_ready(web.admin)
        with RawClient(web.proxy.port) as raw:
            body = pb.CommandConnect(client_version="sluice-tests", protocol_version=21,
                                     auth_method_name="tls")  # fmt: skip
            raw.send(encode(command(Type.Value("CONNECT"), body)))
            answer = raw.receive()
        assert answer is not None and answer.name == "ERROR", answer
        assert answer.body.error == pb.AuthenticationError
        assert "--auth-mode proxy --tls-client-ca" in answer.body.message
        # The official client, over TLS with its certificate, gets the same
        # answer, and reacts as to a broker's AuthenticationError on
        # CONNECT: it retries until its operation timeout.
        auth = pulsar.AuthenticationTLS(str(cert), str(key))
        refused = (pulsar.AuthenticationError, pulsar.Timeout)
        with client(web.tls_url, tls_trust_certs_file_path=str(tb.pki.ca), authentication=auth,
                    operation_timeout_seconds=4) as c, pytest.raises(refused):  # fmt: skip
            c.create_producer(unique("passthrough-cert"))
        samples = scrape(web.proxy, web.admin)
        assert value(samples, "sluice_connections_rejected_total", reason="tls_passthrough") >= 2
    finally:
        web.proxy.kill()
    log = web.proxy.log()
    assert "cannot pass through a proxy that ends the TLS session" in log
    assert "Traceback" not in log


def outcome(url: str, pki: Pki, role: str, topic: str) -> str:
    """Produce one message as ``role`` (its certificate) and read it back:
    "ok", or the name of the client's error."""
    cert, key = pki.client(role)
    try:
        with client(url, tls_trust_certs_file_path=str(pki.ca), operation_timeout_seconds=15,
                    authentication=pulsar.AuthenticationTLS(str(cert), str(key))) as c:  # fmt: skip
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            c.create_producer(topic).send(b"by-" + role.encode())
            assert consumer.receive(timeout_millis=15_000).data() == b"by-" + role.encode()
    except pulsar.PulsarException as exc:
        return type(exc).__name__
    return "ok"


def test_proxy_mode_makes_the_certificate_the_role_the_broker_authorizes(
    tls_auth_broker: TlsBroker, tmp_path: Path
) -> None:
    """--auth-mode proxy --tls-client-ca: Sluice checks the certificate and
    names its CN to the broker; allowed and refused exactly as direct, on
    the binary TLS port, through HTTPS lookups, and on the admin REST API."""
    tb = tls_auth_broker
    broker, pki = tb.broker, tb.pki
    own = tmp_path / "sluice.token"
    own.write_text(tb.tokens.make("sluice") + "\n")
    web = sluice_everywhere(tb, tmp_path, "--auth-mode", "proxy", "--tls-client-ca", str(pki.ca),
                            "--broker-auth-token-file", str(own))  # fmt: skip
    cases = [("app", "default"), ("app", "elsewhere"), ("stranger", "default")]
    try:
        assert broker.web_tls_port is not None
        results = {}
        for name, url in (("direct", broker.tls_url), ("binary", web.tls_url),
                          ("direct https", f"https://127.0.0.1:{broker.web_tls_port}"),
                          ("https", web.https_url)):  # fmt: skip
            results[name] = [
                outcome(url, pki, role, f"persistent://public/{ns}/cert-{uuid.uuid4().hex[:8]}")
                for role, ns in cases
            ]
        assert results["direct"] == ["ok", "AuthorizationError", "AuthorizationError"], results
        assert results["binary"] == results["direct"], results
        # Refused over HTTP lookups, the client says ConnectError (HTTP 401).
        assert results["direct https"][0] == "ok", results
        assert results["https"] == results["direct https"], results
        # The admin REST API over HTTPS, the role from the certificate.
        for ns in ("default", "elsewhere"):
            path = f"/admin/v2/persistent/public/{ns}/cert-admin-{uuid.uuid4().hex[:8]}"
            broker.admin_json("PUT", path)
            direct = get(f"https://127.0.0.1:{broker.web_tls_port}{path}/stats", pki.context("app"))
            through = get(f"{web.https_url}{path}/stats", pki.context("app"))
            assert through[0] == direct[0], (direct, through)
            assert direct[0] == 200 if ns == "default" else direct[0] in (401, 403), direct
        samples = scrape(web.proxy, web.admin)
        assert value(samples, "sluice_auth_total", method="tls", outcome="ok") >= 1
        assert web.proxy.terminate() == 0
    finally:
        web.proxy.kill()
    assert "Traceback" not in web.proxy.log()


def test_transactions_through_proxy_mode_with_a_client_certificate(
    tls_auth_broker: TlsBroker, tmp_path: Path
) -> None:
    """The Java client (pulsar-perf) with transactions, its certificate its
    identity, its lookups (the transaction coordinator's system topic
    among them) over HTTPS through Sluice: every message committed."""
    tb = tls_auth_broker
    own = tmp_path / "sluice.token"
    own.write_text(tb.tokens.make("sluice") + "\n")
    web = sluice_everywhere(tb, tmp_path, "--auth-mode", "proxy", "--tls-client-ca",
                            str(tb.pki.ca), "--broker-auth-token-file", str(own))  # fmt: skip
    cert, key = tb.pki.client("app")
    topic = unique("txn")
    try:
        produced = pulsar_perf(
            tb.broker, "produce", "-u", web.https_url, "--trust-cert-file", str(tb.pki.ca),
            "--auth-plugin", TLS_CLIENT, "--auth-params", f"tlsCertFile:{cert},tlsKeyFile:{key}",
            "-txn", "-nmt", "20", "-m", "100", "-r", "100", "-s", "128", "-i", "1", topic,
        )  # fmt: skip
        sent = records_sent(produced)
        assert sent >= 100
        assert topic_stats(tb.broker, topic)["msgInCounter"] == sent
        with client(tb.broker.tls_url, tls_trust_certs_file_path=str(tb.pki.ca), logger=QUIET,
                    authentication=pulsar.AuthenticationToken(tb.tokens.admin)) as c:  # fmt: skip
            reader = c.create_reader(topic, pulsar.MessageId.earliest)
            committed = 0
            while reader.has_message_available():
                reader.read_next(timeout_millis=10_000)
                committed += 1
        # pulsar-perf commits every 20 messages; past -m it may send a few
        # more (102 once, broker-counted), whose transaction may stay open.
        assert sent - sent % 20 <= committed <= sent  # committed, so readable
        assert web.proxy.terminate() == 0
    finally:
        web.proxy.kill()
    assert "Traceback" not in web.proxy.log()
