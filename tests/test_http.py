"""Pulsar's web port through Sluice (``--http-listen``), against Apache Pulsar 4.0.8.

Everything goes over loopback as plain HTTP (urllib, or a raw socket for
what urllib will not send), through a ``sluice proxy`` process in front of
the session's Apache Pulsar standalone.

A standalone broker owns every bundle and never redirects, so the redirect
tests put a small HTTP server (the stdlib's ``http.server``) in front as
``--broker-http``: it answers every request with a 307 to the real broker
(or to itself, for the loop), and Apache Pulsar is the one that must
receive the replayed request whole. It is the redirecting end, not a
stand-in for Pulsar.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import signal
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar
import pytest

from sluice.addresses import Address
from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.brokers.embedded import BrokerError, free_port, wait_for_port
from sluice.errors import ConfigError
from sluice.protocols.http import (
    Hop,
    HttpUrl,
    RedirectError,
    Redirects,
    answer_headers,
    forward_headers,
    forwarded_for,
    is_topic_lookup,
    lookup_broker_urls,
    origin_form,
    parse_http_url,
    request_kind,
    rewrite_lookup,
    with_credentials,
)
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.dial import TlsServerConfig
from tests.helpers.support import (
    ProxyProcess,
    client,
    start_proxy,
    tcp_connections,
    tls_files,
    worker_pids,
)
from tests.test_apache_pulsar import sluice, tls_broker  # noqa: F401 (a fixture)
from tests.test_dashboards import scrape

MAX_BODY = 64 * 1024
MAX_HEADER = 8 * 1024


@dataclass
class WebProxy:
    """A Sluice process with an HTTP listener, and its admin port."""

    proxy: ProxyProcess
    http_port: int
    admin_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def metric(self, name: str, **labels: str) -> float:
        """A metric summed over the samples whose labels include ``labels``."""
        want = set(labels.items())
        return sum(
            value
            for (sample, have), value in scrape(self.proxy, self.admin_port).items()
            if sample == name and want <= set(have)
        )


def start_web_proxy(
    broker: ApachePulsar, tmp_path: Path, broker_http: str, *extra: str
) -> WebProxy:
    http_port, admin_port = free_port(), free_port()
    proxy = start_proxy(
        broker.url, tmp_path, "--http-listen", f"127.0.0.1:{http_port}",
        "--broker-http", broker_http, "--admin", f"127.0.0.1:{admin_port}",
        "--http-max-body", str(MAX_BODY), "--http-max-header", str(MAX_HEADER), *extra,
    )  # fmt: skip
    try:
        wait_for_port("127.0.0.1", http_port, 20, proxy.process)
    except Exception:
        proxy.kill()
        raise AssertionError(f"no HTTP listener:\n{proxy.log()}") from None
    return WebProxy(proxy, http_port, admin_port)


@pytest.fixture
def web(apache_pulsar: ApachePulsar, tmp_path: Path) -> Iterator[WebProxy]:
    """Sluice relaying to the broker's own web port."""
    w = start_web_proxy(apache_pulsar, tmp_path, apache_pulsar.http_url)
    yield w
    w.proxy.kill()
    assert "Traceback" not in w.proxy.log(), w.proxy.log()


def raw_exchange(port: int, data: bytes, timeout: float = 15) -> tuple[int, str]:
    """Bytes urllib would not send, written as they are; the answer's status
    and body (read by the stdlib's HTTP client)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        return answer.status, answer.read().decode(errors="replace")


def names(prefix: str) -> tuple[str, str]:
    tenant = f"{prefix}-{uuid.uuid4().hex[:8]}"
    return tenant, f"{tenant}/ns"


# --- the admin REST API and lookups ------------------------------------------------


def test_admin_api_through_sluice(apache_pulsar: ApachePulsar, web: WebProxy) -> None:
    tenant, namespace = names("http")
    topic = f"persistent/{namespace}/parts"

    def call(method: str, path: str, body: object = None) -> tuple[int, str]:
        return apache_pulsar.admin(method, path, body, base=web.url)

    status, _ = call("PUT", f"/admin/v2/tenants/{tenant}",
                     {"adminRoles": [], "allowedClusters": ["standalone"]})  # fmt: skip
    assert status == 204
    assert call("PUT", f"/admin/v2/namespaces/{namespace}")[0] == 204
    assert call("PUT", f"/admin/v2/{topic}/partitions", 3)[0] == 204
    status, text = call("GET", f"/admin/v2/{topic}/partitioned-stats")
    assert status == 200, text
    assert json.loads(text)["metadata"]["partitions"] == 3
    assert call("POST", f"/admin/v2/namespaces/{namespace}/messageTTL", 120)[0] == 204
    status, text = call("GET", f"/admin/v2/namespaces/{namespace}/messageTTL")
    assert (status, json.loads(text)) == (200, 120)
    # An error answer comes back as the broker gave it.
    status, text = call("GET", f"/admin/v2/namespaces/{tenant}/missing/messageTTL")
    assert status == 404, text
    # The broker itself holds what went through Sluice.
    stored = apache_pulsar.admin_json("GET", f"/admin/v2/{topic}/partitions")
    assert isinstance(stored, dict) and stored["partitions"] == 3, stored
    assert web.metric("sluice_http_requests_total", kind="admin", status="2xx") == 6
    assert web.metric("sluice_http_requests_total", kind="admin", status="4xx") == 1
    assert web.metric("sluice_http_request_duration_seconds_count", kind="admin") == 7
    assert web.metric("sluice_http_bytes_total", direction="client_to_broker") > 0
    assert web.metric("sluice_http_bytes_total", direction="broker_to_client") > 0


def test_keep_alive_on_both_sides(apache_pulsar: ApachePulsar, web: WebProxy) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", web.http_port, timeout=15)
    try:
        for _ in range(5):
            connection.request("GET", "/admin/v2/clusters")
            answer = connection.getresponse()
            assert (answer.status, json.loads(answer.read())) == (200, ["standalone"])
        assert web.metric("sluice_http_connections_active") == 1
    finally:
        connection.close()


def test_http_lookup_names_sluice(apache_pulsar: ApachePulsar, web: WebProxy) -> None:
    """Both URL kinds of a lookup answer name Sluice: the web ones its HTTP
    listener, the binary one the listener Sluice opened for that broker
    (not its main port, which serves binary lookups); the TLS one, which
    Sluice does not serve here, is emptied rather than left naming the broker."""
    path = f"/lookup/v2/topic/persistent/public/default/looked-up-{uuid.uuid4().hex[:8]}"
    status, direct = apache_pulsar.admin("GET", path)
    assert status == 200, direct
    assert json.loads(direct)["brokerUrl"] == apache_pulsar.url
    urls = set()
    for _ in range(2):
        status, text = apache_pulsar.admin("GET", path, base=web.url)
        assert status == 200, text
        answer = json.loads(text)
        assert answer["httpUrl"] == web.url
        assert not answer.get("httpUrlTls")
        assert not answer.get("brokerUrlTls")
        assert answer["brokerUrl"].startswith("pulsar://127.0.0.1:")
        assert answer["brokerUrl"] not in (web.proxy.url, apache_pulsar.url)
        assert answer.get("nativeUrl") in (None, answer["brokerUrl"])
        urls.add(answer["brokerUrl"])
    assert len(urls) == 1  # the broker keeps its listener
    # Asked in the absolute form, or a letter percent-encoded, it is the same
    # lookup, rewritten the same (it went to the client as the broker wrote it).
    host, port = web.url.split("//", 1)[1].rsplit(":", 1)
    for target in (web.url + path, path.replace("/persistent/", "/%70ersistent/")):
        asked = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            asked.request("GET", target)
            answered = asked.getresponse()
            assert answered.status == 200
            assert json.loads(answered.read())["brokerUrl"] in urls, target
        finally:
            asked.close()
    assert "left as the broker gave it" not in web.proxy.log()
    assert web.metric("sluice_http_requests_total", kind="lookup", status="2xx") == 4


def _addresses(stats: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The addresses a topic's stats (one partition's) give its producers
    and its consumers, as ``host:port``."""
    producers = [p["address"].lstrip("/") for p in stats["publishers"]]
    consumers = [
        c["address"].lstrip("/")
        for sub in stats["subscriptions"].values()
        for c in sub["consumers"]
    ]
    return producers, consumers


@pytest.mark.parametrize("partitions", [0, 3])
def test_pulsar_client_with_an_http_service_url_stays_on_sluice(
    apache_pulsar: ApachePulsar, web: WebProxy, partitions: int
) -> None:
    """The Python client given Sluice's http:// URL: partition metadata and
    topic lookups over HTTP through Sluice, then producers and consumers on
    the listener Sluice opened for the broker the lookup named (their
    CONNECT names no proxy_to_broker_url). 1,000 messages each way, and the
    broker's own topic stats show only Sluice's connections to it."""
    produce_and_consume_over_http(apache_pulsar, web, partitions, [web.proxy.pid])


def test_http_lookups_with_workers_share_the_per_broker_listener(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    """--workers 2: the HTTP listener and --listener-ports are the
    supervisor's, served by both workers; whichever worker answers a
    lookup names the same port for the broker, and a connection on it is
    relayed by whichever worker takes it."""
    low = free_port()
    ca, served, _ = tls_files(tmp_path, "127.0.0.1", "localhost")
    https = free_port()
    web = start_web_proxy(apache_pulsar, tmp_path, apache_pulsar.http_url,
                          "--workers", "2", "--listener-ports", f"{low}-{low + 9}",
                          "--listen-tls", f"127.0.0.1:{free_port()}", "--tls-cert", str(served),
                          "--tls-key", str(served),
                          "--http-listen-tls", f"127.0.0.1:{https}")  # fmt: skip
    try:
        pids = worker_pids(web.proxy, 2)
        assert len(pids) == 2, web.proxy.log()
        path = f"/lookup/v2/topic/persistent/public/default/w-{uuid.uuid4().hex[:8]}"
        urls = set()
        for _ in range(8):  # each a new connection, taken by either worker
            status, text = apache_pulsar.admin("GET", path, base=web.url)
            assert status == 200, text
            answer = json.loads(text)
            urls.add((answer["brokerUrl"], answer["brokerUrlTls"]))
        assert len(urls) == 1, urls
        plain, tls = urls.pop()
        assert plain.startswith("pulsar://") and tls.startswith("pulsar+ssl://")
        ports = {int(url.rpartition(":")[2]) for url in (plain, tls)}
        assert len(ports) == 2 and all(low <= p <= low + 9 for p in ports), ports
        produce_and_consume_over_http(apache_pulsar, web, 3, [*pids.values()])
        # A client with an https:// service URL is served on the broker's
        # TLS port, whichever worker takes its connection.
        topic = f"persistent://public/default/w-tls-{uuid.uuid4().hex[:8]}"
        wait_for_port("127.0.0.1", https, 20, web.proxy.process)
        with client(f"https://127.0.0.1:{https}", tls_trust_certs_file_path=str(ca)) as c:
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            c.create_producer(topic).send(b"over tls")
            assert consumer.receive(timeout_millis=15_000).data() == b"over tls"
            tls_port = int(tls.rpartition(":")[2])
            served_tls = [pid for pid in pids.values()
                          if any(local[1] == tls_port for local, remote in tcp_connections(pid)
                                 if remote[1])]  # fmt: skip
            assert served_tls, "no worker holds a connection on the TLS port"
    finally:
        web.proxy.kill()
    assert "Traceback" not in web.proxy.log(), web.proxy.log()


def test_broker_ports_file_keeps_a_brokers_port_across_restarts(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    """--broker-ports-file with --listener-ports: a restarted Sluice listens
    at once on the port an earlier run gave the broker an HTTP lookup
    named, and names it again. (The port is free for anyone while no Sluice
    runs: one another test's process took meanwhile, which the restarted
    Sluice says it cannot listen on, gets the scenario run again, once, on
    another range.)"""
    for attempt in range(2):
        low = free_port()
        keep = ("--listener-ports", f"{low}-{low + 9}", "--broker-ports-file",
                str(tmp_path / f"broker-ports-{attempt}"))  # fmt: skip
        path = f"/lookup/v2/topic/persistent/public/default/kept-{uuid.uuid4().hex[:8]}"
        ports: list[int] = []
        taken = False
        for run in range(2):
            web = start_web_proxy(apache_pulsar, tmp_path, apache_pulsar.http_url, *keep)
            try:
                if run:  # before any lookup: the journal's port is listened on
                    try:
                        wait_for_port("127.0.0.1", ports[0], 20, web.proxy.process)
                    except BrokerError:
                        log = web.proxy.log()
                        taken = "no listener on its earlier port" in log and attempt == 0
                        if not taken:
                            raise AssertionError(
                                f"port {ports[0]} not listened on:\n{log}"
                            ) from None
                        break
                status, text = apache_pulsar.admin("GET", path, base=web.url)
                assert status == 200, text
                ports.append(int(json.loads(text)["brokerUrl"].rpartition(":")[2]))
            finally:
                web.proxy.kill()
            assert "Traceback" not in web.proxy.log(), web.proxy.log()
        if not taken:
            assert ports[0] == ports[1] and low <= ports[0] <= low + 9, ports
            return


def produce_and_consume_over_http(
    broker: ApachePulsar, web: WebProxy, partitions: int, pids: list[int]
) -> None:
    """1,000 messages produced and consumed by a client with Sluice's
    http:// URL on a new topic (``partitions``: 0, not partitioned); the
    broker's stats must name, for every producer and consumer, one of the
    connections processes ``pids`` (Sluice's) hold to its binary port."""
    topic = f"persistent://public/default/over-http-{uuid.uuid4().hex[:8]}"
    rest = topic.replace("://", "/")
    if partitions:
        status, text = broker.admin("PUT", f"/admin/v2/{rest}/partitions", partitions,
                                    base=web.url)  # fmt: skip
        assert status == 204, text
    sent = [f"m-{i}".encode() for i in range(1_000)]
    with client(web.url) as c:
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = c.create_producer(topic, batching_enabled=False)
        for body in sent:
            producer.send(body)
        got = []
        for _ in sent:
            message = consumer.receive(timeout_millis=15_000)
            got.append(message.data())
            consumer.acknowledge(message)
        # While they are connected: who the broker sees, and Sluice's own
        # connections to the broker's binary port.
        if partitions:
            status, text = broker.admin(
                "GET", f"/admin/v2/{rest}/partitioned-stats?perPartition=true"
            )
            assert status == 200, text
            per_partition = list(json.loads(text)["partitions"].values())
        else:
            status, text = broker.admin("GET", f"/admin/v2/{rest}/stats")
            assert status == 200, text
            per_partition = [json.loads(text)]
        binary = ("127.0.0.1", broker.port)
        own = {
            f"{host}:{port}"
            for pid in pids
            for (host, port), remote in tcp_connections(pid)
            if remote == binary
        }
    assert sorted(got) == sorted(sent)
    assert len(per_partition) == max(partitions, 1)
    for stats in per_partition:
        producers, consumers = _addresses(stats)
        assert len(producers) == 1 and len(consumers) == 1, stats
        assert set(producers + consumers) <= own, (producers, consumers, own)
    assert web.metric("sluice_http_requests_total", kind="lookup", status="2xx") >= 1
    # The client's binary connections came to the per-broker listener, relayed.
    assert web.metric("sluice_sessions_total", kind="proxied") >= 1


@pytest.mark.e2e  # its broker comes by getfixturevalue, which the marking cannot see
def test_https_to_the_broker(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """--broker-http https://: the broker's certificate checked with --broker-tls-ca
    (test_apache_pulsar's broker with its TLS ports open)."""
    broker, ca, _ = request.getfixturevalue("tls_broker")
    assert isinstance(broker, ApachePulsar)
    assert broker.web_tls_port is not None
    web = start_web_proxy(broker, tmp_path, f"https://127.0.0.1:{broker.web_tls_port}",
                          "--broker-tls-ca", str(ca))  # fmt: skip
    try:
        status, text = broker.admin("GET", "/admin/v2/clusters", base=web.url)
        assert (status, json.loads(text)) == (200, ["standalone"])
    finally:
        web.proxy.kill()
    # Without the CA, the broker's certificate is not trusted: 502, saying so.
    web = start_web_proxy(broker, tmp_path, f"https://127.0.0.1:{broker.web_tls_port}")
    try:
        status, text = broker.admin("GET", "/admin/v2/clusters", base=web.url)
        assert status == 502 and "certificate verify failed" in text, text
    finally:
        web.proxy.kill()
    assert "Traceback" not in web.proxy.log()


# --- redirects ------------------------------------------------------------------


class Redirector(http.server.ThreadingHTTPServer):
    """Answers every request with a 307: ``/loop…`` to itself, ``/hop/N`` to
    ``/hop/N+1``, ``/away…`` to an address no allow-list admits, the rest to
    ``target`` with the same path. Records what it was sent."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.bodies: list[bytes] = []
        self.authorizations: list[str | None] = []
        self.forwarded: list[str | None] = []
        super().__init__(("127.0.0.1", 0), _RedirectHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _RedirectHandler(http.server.BaseHTTPRequestHandler):
    server: Redirector

    def _redirect(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.server.bodies.append(self.rfile.read(length))
        self.server.authorizations.append(self.headers.get("Authorization"))
        self.server.forwarded.append(self.headers.get("X-Forwarded-For"))
        if self.path.startswith("/loop"):
            location = f"{self.server.url}{self.path}"
        elif self.path.startswith("/hop/"):
            location = f"{self.server.url}/hop/{int(self.path[5:]) + 1}"
        elif self.path.startswith("/away"):
            location = f"http://192.0.2.1:8080{self.path}"
        else:
            location = f"{self.server.target}{self.path}"
        note = b"moved"
        self.send_response(307)
        self.send_header("Location", location)
        self.send_header("Content-Length", str(len(note)))
        self.end_headers()
        self.wfile.write(note)

    do_GET = do_PUT = do_POST = do_DELETE = _redirect

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def redirector(apache_pulsar: ApachePulsar) -> Iterator[Redirector]:
    server = Redirector(apache_pulsar.http_url)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_redirect_with_a_body_arrives_whole(
    apache_pulsar: ApachePulsar, redirector: Redirector, tmp_path: Path
) -> None:
    web = start_web_proxy(apache_pulsar, tmp_path, redirector.url, "--allow-broker", "127.0.0.1")
    try:
        tenant, namespace = names("redirected")
        body = {"adminRoles": ["someone"], "allowedClusters": ["standalone"]}
        status, text = apache_pulsar.admin("PUT", f"/admin/v2/tenants/{tenant}", body,
                                           base=web.url)  # fmt: skip
        assert status == 204, text
        assert redirector.bodies == [json.dumps(body).encode()]
        stored = apache_pulsar.admin_json("GET", f"/admin/v2/tenants/{tenant}")
        assert isinstance(stored, dict) and stored["adminRoles"] == ["someone"], stored
        # A namespace policy set through the redirect: the body, not just the path.
        apache_pulsar.admin_json("PUT", f"/admin/v2/namespaces/{namespace}")
        status, text = apache_pulsar.admin(
            "POST", f"/admin/v2/namespaces/{namespace}/messageTTL", 777, base=web.url
        )
        assert status == 204, text
        assert (
            apache_pulsar.admin_json("GET", f"/admin/v2/namespaces/{namespace}/messageTTL") == 777
        )
        assert web.metric("sluice_http_redirects_followed_total") == 2

        # A loop, and a chain longer than --max-redirects (5): 502 with why.
        status, text = apache_pulsar.admin("GET", "/loop", base=web.url)
        assert status == 502 and "redirect loop" in text, text
        status, text = apache_pulsar.admin("GET", "/hop/0", base=web.url)
        assert status == 502 and "more than 5 redirects" in text, text
        assert "redirect loop" in web.proxy.log()
        assert web.metric("sluice_http_refused_total", reason="redirects") == 2

        # A broker no allow-list admits: the 307 goes to the client as it came.
        connection = http.client.HTTPConnection("127.0.0.1", web.http_port, timeout=15)
        connection.request("GET", "/away/x")
        answer = connection.getresponse()
        assert answer.status == 307
        assert answer.getheader("Location") == "http://192.0.2.1:8080/away/x"
        assert answer.read() == b"moved"
        connection.close()
    finally:
        web.proxy.kill()
    assert "Traceback" not in web.proxy.log(), web.proxy.log()


# --- limits and bad input -------------------------------------------------------


def test_malformed_request_is_400(web: WebProxy) -> None:
    status, text = raw_exchange(web.http_port, b"NOT HTTP AT ALL\r\n\r\n")
    assert status == 400 and "malformed" in text, text
    for head in (
        b"GET /admin/v2/clusters HTTP/1.1\r\nHost x\r\n\r\n",
        b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET /admin/v2/clusters HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
    ):
        status, text = raw_exchange(web.http_port, head)
        assert status == 400, (head, text)
    # A good head, then a body that breaks its chunked framing.
    status, text = raw_exchange(web.http_port, b"PUT /admin/v2/tenants/x HTTP/1.1\r\nHost: x\r\n"
                                b"Transfer-Encoding: chunked\r\n\r\nzz\r\n")  # fmt: skip
    assert status == 400 and "malformed HTTP request body" in text, text
    # A request line or header h11 refuses is not quoted back: a query's
    # token or a header's credential would reach the log, the answer and
    # the capture.
    for head in (
        b"GET /ws/v2/consumer/persistent/a/b/c/my sub?token=SECRET-1 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer SECRET-2\x00\r\n\r\n",
    ):
        status, text = raw_exchange(web.http_port, head)
        said = text.replace("Illegal", "illegal")
        assert status == 400 and "malformed HTTP request: illegal" in said, text
        assert "SECRET" not in text, text
    assert "SECRET" not in web.proxy.log()
    assert web.metric("sluice_http_refused_total", reason="malformed") == 8
    assert web.metric("sluice_http_requests_total", kind="other", status="4xx") == 7
    assert web.metric("sluice_http_requests_total", kind="admin", status="4xx") == 1
    assert "internal error" not in web.proxy.log()
    # The listener still serves.
    status, _ = raw_exchange(web.http_port, b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\n"
                             b"Connection: close\r\n\r\n")  # fmt: skip
    assert status == 200


def test_a_request_framed_both_ways_is_answered_then_the_connection_closed(
    web: WebProxy,
) -> None:
    """Transfer-Encoding and Content-Length together: h11 reads the chunked
    body, but a hop in front may have read the length, so nothing after the
    answer is taken as a request (RFC 9112 6.3)."""
    head = (b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")  # fmt: skip
    with socket.create_connection(("127.0.0.1", web.http_port), timeout=15) as sock:
        sock.sendall(head)
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        assert (answer.status, json.loads(answer.read())) == (200, ["standalone"])
        sock.settimeout(10)  # a connection kept open would block here until then
        assert sock.recv(1024) == b""
    # A request framed one way keeps its connection.
    connection = http.client.HTTPConnection("127.0.0.1", web.http_port, timeout=15)
    try:
        for _ in range(2):
            connection.request("GET", "/admin/v2/clusters", headers={"Content-Length": "0"})
            assert connection.getresponse().read() == b'["standalone"]'
        assert web.metric("sluice_http_connections_active") == 1
    finally:
        connection.close()


def test_an_upgrade_to_other_than_websocket_is_declined_and_served(web: WebProxy) -> None:
    """WebSocket is relayed (tests/test_websocket.py); an upgrade to another
    protocol (h2c) is declined by answering over HTTP/1.1, as the broker
    does (tests/test_http_upgrade.py)."""
    status, text = raw_exchange(
        web.http_port, b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\n"
        b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__"
        b"\r\n\r\n",
    )  # fmt: skip
    assert status == 200 and text == '["standalone"]', text
    assert web.metric("sluice_http_requests_total", kind="admin", status="2xx") == 1
    assert web.metric("sluice_http_refused_total", reason="upgrade") == 0


def test_oversized_header_is_431(web: WebProxy) -> None:
    big = b"x" * (MAX_HEADER + 100)
    status, text = raw_exchange(
        web.http_port, b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\nX-Big: " + big + b"\r\n\r\n"
    )
    assert status == 431 and "--http-max-header" in text, text
    assert web.metric("sluice_http_refused_total", reason="header_too_large") == 1


def test_oversized_body_is_413(apache_pulsar: ApachePulsar, web: WebProxy) -> None:
    tenant, _ = names("too-big")
    status, text = apache_pulsar.admin("PUT", f"/admin/v2/tenants/{tenant}",
                                       {"adminRoles": ["r" * MAX_BODY]}, base=web.url)  # fmt: skip
    assert status == 413 and "--http-max-body" in text, text
    # Chunked, without a length: counted as it comes.
    chunk = b"y" * 40_000
    framed = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(2)) + b"0\r\n\r\n"
    status, text = raw_exchange(
        web.http_port, b"PUT /admin/v2/tenants/x HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + framed,
    )  # fmt: skip
    assert status == 413, text
    assert web.metric("sluice_http_refused_total", reason="body_too_large") == 2
    assert apache_pulsar.admin("GET", f"/admin/v2/tenants/{tenant}")[0] == 404


def test_slow_client_does_not_hold_the_listener(web: WebProxy, tmp_path: Path) -> None:
    with socket.create_connection(("127.0.0.1", web.http_port), timeout=15) as slow:
        slow.sendall(b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\n")  # head never ends
        status, text = raw_exchange(web.http_port, b"GET /admin/v2/clusters HTTP/1.1\r\n"
                                    b"Host: x\r\nConnection: close\r\n\r\n")  # fmt: skip
        assert (status, json.loads(text)) == (200, ["standalone"])


def test_idle_timeout_answers_408_for_a_head_begun(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    web = start_web_proxy(apache_pulsar, tmp_path, apache_pulsar.http_url,
                          "--http-idle-timeout", "1")  # fmt: skip
    try:
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", web.http_port), timeout=15) as sock:
            sock.sendall(b"GET /admin/v2/clusters HTTP/1.1\r\n")
            answer = http.client.HTTPResponse(sock)
            answer.begin()
            assert answer.status == 408
        assert time.monotonic() - started < 10
    finally:
        web.proxy.kill()


@contextlib.contextmanager
def one_connection_held(web: WebProxy) -> Iterator[None]:
    """Once the start-up check's connection (wait_for_port) is gone, one
    kept-alive connection that has had an answer, held open meanwhile."""
    deadline = time.monotonic() + 10
    while web.metric("sluice_http_connections_active") != 0:
        assert time.monotonic() < deadline, "the probe connection stayed open"
        time.sleep(0.05)
    with socket.create_connection(("127.0.0.1", web.http_port), timeout=15) as held:
        held.sendall(b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\n\r\n")
        first = http.client.HTTPResponse(held)
        first.begin()
        assert first.status == 200
        first.read()
        yield


def test_connection_cap_answers_503(apache_pulsar: ApachePulsar, tmp_path: Path) -> None:
    web = start_web_proxy(apache_pulsar, tmp_path, apache_pulsar.http_url,
                          "--http-max-connections", "1")  # fmt: skip
    try:
        with one_connection_held(web):
            status, text = raw_exchange(web.http_port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 503 and "--http-max-connections" in text, text
        assert web.metric("sluice_http_refused_total", reason="connection_limit") == 1
    finally:
        web.proxy.kill()


def test_connection_cap_is_shared_by_the_workers(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    """--workers 2 --http-max-connections 1: one connection held on either
    worker, every other one is refused, whichever worker takes it."""
    low = free_port()
    web = start_web_proxy(apache_pulsar, tmp_path, apache_pulsar.http_url, "--workers", "2",
                          "--listener-ports", f"{low}-{low + 9}",
                          "--http-max-connections", "1")  # fmt: skip
    try:
        assert len(worker_pids(web.proxy, 2)) == 2, web.proxy.log()
        with one_connection_held(web):
            # Each a new connection, taken by either worker: 8 of them land
            # on the idle worker too, unless that is very unlucky (1 in 256).
            statuses = [raw_exchange(web.http_port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")[0]
                        for _ in range(8)]  # fmt: skip
        assert statuses == [503] * 8, statuses
        assert web.metric("sluice_http_refused_total", reason="connection_limit") == 8
    finally:
        web.proxy.kill()
    assert "Traceback" not in web.proxy.log(), web.proxy.log()


def test_broker_down_is_502(apache_pulsar: ApachePulsar, tmp_path: Path) -> None:
    # A port bound and never listened on: refused, and nobody else's meanwhile.
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    nowhere = f"http://127.0.0.1:{held.getsockname()[1]}"
    web = start_web_proxy(apache_pulsar, tmp_path, nowhere)
    try:
        status, text = apache_pulsar.admin("GET", "/admin/v2/clusters", base=web.url)
        assert status == 502 and f"cannot reach the broker's web service at {nowhere}" in text
        assert web.metric("sluice_http_refused_total", reason="upstream_unreachable") == 1
        assert web.metric("sluice_http_requests_total", kind="admin", status="5xx") == 1
        assert "cannot reach the broker's web service" in web.proxy.log()
    finally:
        web.proxy.kill()
        held.close()
    assert "Traceback" not in web.proxy.log()


def test_authorization_passes_through(apache_pulsar: ApachePulsar, redirector: Redirector,
                                      tmp_path: Path) -> None:  # fmt: skip
    """The client's Authorization reaches the broker unchanged (the
    redirecting server sees what Sluice sends on)."""
    web = start_web_proxy(apache_pulsar, tmp_path, redirector.url, "--allow-broker", "127.0.0.1")
    try:
        request = urllib.request.Request(web.url + "/admin/v2/clusters")
        request.add_header("Authorization", "Bearer abc.def.ghi")
        with urllib.request.urlopen(request, timeout=15) as answer:
            assert answer.status == 200
        assert redirector.authorizations == ["Bearer abc.def.ghi"]
        assert redirector.forwarded == ["127.0.0.1"]
    finally:
        web.proxy.kill()


class KeepAlive(http.server.ThreadingHTTPServer):
    """A web service that keeps connections alive, then closes one idle
    for 0.3 s (as a broker's Jetty does after its idle timeout); ``/slow``
    answers once ``release`` is set."""

    def __init__(self) -> None:
        self.requests = 0
        self.closed = threading.Semaphore(0)
        self.release = threading.Event()
        super().__init__(("127.0.0.1", 0), _KeepAliveHandler)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, daemon=True)
        thread.start()
        return thread

    def stop(self, thread: threading.Thread) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()
        thread.join(timeout=10)


class _KeepAliveHandler(http.server.BaseHTTPRequestHandler):
    server: KeepAlive
    protocol_version = "HTTP/1.1"
    timeout = 0.3

    def do_GET(self) -> None:
        self.server.requests += 1
        if self.path == "/slow":
            self.server.release.wait(30)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def finish(self) -> None:
        super().finish()
        self.server.closed.release()

    def log_message(self, *args: object) -> None:
        pass


def test_a_kept_broker_connection_closed_meanwhile_is_replaced(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    server = KeepAlive()
    thread = server.start()
    web = start_web_proxy(apache_pulsar, tmp_path, f"http://127.0.0.1:{server.server_address[1]}")
    connection = http.client.HTTPConnection("127.0.0.1", web.http_port, timeout=15)
    try:
        connection.request("GET", "/admin/v2/clusters")
        assert connection.getresponse().read() == b"ok"
        assert server.closed.acquire(timeout=10), "the server kept Sluice's connection open"
        connection.request("GET", "/admin/v2/clusters")
        answer = connection.getresponse()
        assert (answer.status, answer.read()) == (200, b"ok")
        assert server.requests == 2
    finally:
        connection.close()
        web.proxy.kill()
        server.stop(thread)
    assert "Traceback" not in web.proxy.log()


def test_request_timeout_is_504_and_the_connection_serves_on(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    server = KeepAlive()
    thread = server.start()
    web = start_web_proxy(apache_pulsar, tmp_path, f"http://127.0.0.1:{server.server_address[1]}",
                          "--http-request-timeout", "1")  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", web.http_port, timeout=15)
    try:
        connection.request("GET", "/slow")
        answer = connection.getresponse()
        assert answer.status == 504 and b"--http-request-timeout" in answer.read()
        server.release.set()
        # The same client connection, and a broker connection that is not
        # the one left waiting for /slow.
        connection.request("GET", "/admin/v2/clusters")
        answer = connection.getresponse()
        assert (answer.status, answer.read()) == (200, b"ok")
        assert web.metric("sluice_http_refused_total", reason="timeout") == 1
        assert web.metric("sluice_http_requests_total", kind="other", status="5xx") == 1
    finally:
        connection.close()
        web.proxy.kill()
        server.stop(thread)
    assert "internal error" not in web.proxy.log(), web.proxy.log()


def test_drain_answers_the_request_in_progress_and_closes_idle_connections(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    server = KeepAlive()
    thread = server.start()
    web = start_web_proxy(apache_pulsar, tmp_path, f"http://127.0.0.1:{server.server_address[1]}")
    idle = http.client.HTTPConnection("127.0.0.1", web.http_port, timeout=15)
    busy = http.client.HTTPConnection("127.0.0.1", web.http_port, timeout=15)
    answers: list[tuple[int, str | None, bytes]] = []

    def slow_request() -> None:
        busy.request("GET", "/slow")
        answer = busy.getresponse()
        answers.append((answer.status, answer.getheader("Connection"), answer.read()))

    try:
        idle.request("GET", "/admin/v2/clusters")
        assert idle.getresponse().read() == b"ok"
        asker = threading.Thread(target=slow_request)
        asker.start()
        deadline = time.monotonic() + 10
        while server.requests < 2:
            assert time.monotonic() < deadline, "the slow request never reached the server"
            time.sleep(0.02)
        started = time.monotonic()
        web.proxy.process.send_signal(signal.SIGTERM)
        # The idle keep-alive connection is closed at once...
        assert idle.sock is not None
        assert idle.sock.recv(1) == b""
        # ...the request in progress is answered, as the connection's last.
        server.release.set()
        asker.join(timeout=15)
        assert answers == [(200, "close", b"ok")]
        assert web.proxy.process.wait(timeout=15) == 0
        assert time.monotonic() - started < 10  # well within --drain-timeout (20 s)
    finally:
        idle.close()
        busy.close()
        web.proxy.kill()
        server.stop(thread)
    assert "Traceback" not in web.proxy.log()


# --- the decisions, sans-I/O ------------------------------------------------------


def test_request_kinds() -> None:
    assert request_kind(b"/admin/v2/tenants") == "admin"
    assert request_kind(b"/admin/v3/functions/a/b/c") == "admin"
    assert request_kind(b"/admin?x") == "admin"
    assert request_kind(b"/administrator") == "other"
    assert request_kind(b"/lookup/v2/topic/persistent/a/b/c") == "lookup"
    assert request_kind(b"/ws/v2/producer/persistent/a/b/c") == "websocket"
    assert request_kind(b"/metrics") == "other"
    assert is_topic_lookup(b"GET", b"/lookup/v2/topic/non-persistent/a/b/c?authoritative=false")
    assert not is_topic_lookup(b"PUT", b"/lookup/v2/topic/persistent/a/b/c")
    assert not is_topic_lookup(b"GET", b"/lookup/v2/namespace/a/b")


def test_a_target_is_read_as_the_broker_serves_it() -> None:
    """The absolute form (which an HTTP/1.1 server must take) and
    percent-encoded unreserved characters name the same resource as the
    plain path: Sluice reads (and forwards) them as that path, so a lookup
    asked that way is still rewritten to name Sluice. (Both went to the
    broker as sent and its answer reached the client unchanged: the client
    left the proxy.)"""
    lookup = b"/lookup/v2/topic/persistent/t/n/x"
    encoded = (b"/lookup/v2/topic/%70ersistent/t/n/x", b"/lookup/v2/topic/%70%65rsistent/t/n/x")
    for asked in (lookup, b"http://sluice:8080" + lookup, b"HTTPS://sluice" + lookup, *encoded):
        assert origin_form(asked) == lookup, asked
        assert is_topic_lookup(b"GET", origin_form(asked))
    assert origin_form(b"http://sluice:8080" + lookup + b"?a=%2F") == lookup + b"?a=%2F"
    assert origin_form(b"http://sluice:8080") == b"/"
    assert origin_form(b"http://sluice:8080?x=1") == b"/?x=1"
    # Reserved characters stay encoded (%2F is not a path separator), as does a stray %.
    assert origin_form(b"/admin/v2/a%2Fb/%zz/%4") == b"/admin/v2/a%2Fb/%zz/%4"
    assert origin_form(b"*") == b"*"
    # A fragment: the broker's web server routes by what comes before it.
    assert origin_form(lookup + b"#x") == lookup
    assert origin_form(lookup + b"?a=1#x?b=2") == lookup + b"?a=1"
    assert is_topic_lookup(b"GET", origin_form(lookup + b"#x/../../admin"))


def test_a_websocket_upgrade_keeps_the_clients_credentials_but_no_principal() -> None:
    """Proxy mode: a request goes on with Sluice's credentials naming the
    client's role; a WebSocket upgrade with the client's own, checked, but
    never an X-Original-Principal the client wrote itself (it went on:
    "superuser", taken by a broker from a proxy role)."""
    own = [(b"authorization", b"Bearer OWN"), (b"x-original-principal", b"app")]
    sent = [(b"Authorization", b"Bearer theirs"), (b"X-Original-Principal", b"superuser"),
            (b"upgrade", b"websocket")]  # fmt: skip
    assert with_credentials(sent, own) == [(b"upgrade", b"websocket"), *own]
    assert with_credentials(sent, own, upgrade=True) == [
        (b"Authorization", b"Bearer theirs"), (b"upgrade", b"websocket"),
        (b"x-pulsar-auth-method-name", b"token"),
    ]  # fmt: skip
    assert with_credentials(sent, None, upgrade=True) == sent  # passthrough: as sent


def test_hop_by_hop_headers_stay_behind() -> None:
    sent = forward_headers(
        [(b"Host", b"sluice:8080"), (b"Connection", b"keep-alive, X-Secret-Hop"),
         (b"X-Secret-Hop", b"1"), (b"Authorization", b"Bearer t"), (b"Expect", b"100-continue"),
         (b"Transfer-Encoding", b"chunked"), (b"Accept", b"*/*")],
        b"broker:8080",
    )  # fmt: skip
    assert sent == [(b"host", b"broker:8080"), (b"Authorization", b"Bearer t"),
                    (b"Accept", b"*/*")]  # fmt: skip
    assert forward_headers([(b"Accept-Encoding", b"gzip"), (b"Accept", b"*/*")], b"b:1",
                           identity=True) == [(b"host", b"b:1"), (b"Accept", b"*/*")]  # fmt: skip
    sent = [(b"X-Forwarded-For", b"10.0.0.1"), (b"Accept", b"*/*")]
    assert forwarded_for(sent, "10.1.1.1", trusted=True) == [
        (b"Accept", b"*/*"), (b"x-forwarded-for", b"10.0.0.1, 10.1.1.1")
    ]  # fmt: skip
    assert forwarded_for(sent, "10.1.1.1") == [
        (b"Accept", b"*/*"),
        (b"x-forwarded-for", b"10.1.1.1"),
    ]
    assert forwarded_for([], "::1") == [(b"x-forwarded-for", b"::1")]
    answered = answer_headers([(b"Content-Length", b"10"), (b"Keep-Alive", b"timeout=5"),
                               (b"Content-Type", b"application/json")], length=4)  # fmt: skip
    assert answered == [(b"Content-Type", b"application/json"), (b"content-length", b"4")]


def test_per_broker_listeners_for_http_lookups_in_the_config(tmp_path: Path) -> None:
    """Pulsar's per-broker listeners exist for HTTP lookups: with workers
    they need --listener-ports (the supervisor binds them) only when there
    is an HTTP listener, and Pulsar may still listen plain and TLS at once
    (its main listener stands for no broker)."""
    broker = parse_broker_url("pulsar://127.0.0.1:6650")
    web = ProxyConfig(broker=broker, http_listen=Address("127.0.0.1", 0),
                      broker_http=parse_http_url("http://127.0.0.1:8080"))  # fmt: skip
    with pytest.raises(ConfigError, match="--workers with Pulsar needs --listener-ports"):
        web.replace(workers=2)
    web.replace(workers=2, listener_ports=(19000, 19009))
    ProxyConfig(broker=broker, workers=2)
    (tmp_path / "c.pem").touch()
    ProxyConfig(broker=broker, listen_tls=Address("127.0.0.1", 0),
                tls=TlsServerConfig(tmp_path / "c.pem", tmp_path / "c.pem"))  # fmt: skip


def test_broker_http_urls() -> None:
    assert parse_http_url("http://broker:8080") == HttpUrl(Address("broker", 8080), False)
    assert parse_http_url("https://broker") == HttpUrl(Address("broker", 443), True)
    assert str(parse_http_url("http://[::1]:8080/")) == "http://[::1]:8080"
    for bad in ("pulsar://broker:6650", "broker:8080", "http://", "http://u:p@broker:8080",
                "http://broker:x"):  # fmt: skip
        with pytest.raises(ConfigError):
            parse_http_url(bad, what="--broker-http")


def test_redirects_followed_and_refused() -> None:
    first = Hop(parse_http_url("http://a:8080"), b"/admin/v2/x")
    allowed = {"a", "b"}
    chain = Redirects(first, 2, lambda url: url.address.host in allowed)
    assert chain.follow(200, []) is None
    assert chain.follow(302, [(b"location", b"http://b:8080/y")]) is None  # method may change
    assert chain.follow(307, []) is None
    assert chain.follow(307, [(b"location", b"http://elsewhere:8080/y")]) is None
    # A Location that is no URL goes to the client as it is (it was an internal error).
    assert chain.follow(307, [(b"location", b"http://[x/y")]) is None
    hop = chain.follow(307, [(b"Location", b"http://b:8080/admin/v2/x?authoritative=true")])
    assert hop == Hop(parse_http_url("http://b:8080"), b"/admin/v2/x?authoritative=true")
    relative = chain.follow(308, [(b"location", b"/admin/v2/z")])
    assert relative == Hop(parse_http_url("http://b:8080"), b"/admin/v2/z")
    assert chain.followed == 2
    with pytest.raises(RedirectError, match="more than 2 redirects"):
        chain.follow(307, [(b"location", b"http://a:8080/admin/v2/w")])
    loop = Redirects(first, 5, lambda url: True)
    loop.follow(307, [(b"location", b"http://b:8080/q")])
    with pytest.raises(RedirectError, match="redirect loop"):
        loop.follow(307, [(b"location", b"http://a:8080/admin/v2/x")])
    # From TLS to plain HTTP is not followed: the request's credentials
    # (Sluice's own, in proxy mode) would go in the clear.
    secure = Redirects(Hop(parse_http_url("https://a:8443"), b"/x"), 5, lambda url: True)
    assert secure.follow(307, [(b"location", b"http://b:8080/x")]) is None
    assert secure.follow(307, [(b"location", b"https://b:8443/x")]) is not None


def test_lookup_rewrite() -> None:
    answer = json.dumps({
        "brokerUrl": "pulsar://b1:6650", "brokerUrlTls": "pulsar+ssl://b1:6651",
        "httpUrl": "http://b1:8080", "httpUrlTls": "https://b1:8443", "nativeUrl": "x",
    }).encode()  # fmt: skip
    assert lookup_broker_urls(answer) == ("pulsar://b1:6650", "pulsar+ssl://b1:6651", "x")
    done = rewrite_lookup(answer, http="http://sluice:8080", https=None,
                          broker="pulsar://sluice:7001", broker_tls=None)  # fmt: skip
    assert done.body is not None
    assert json.loads(done.body) == {
        "brokerUrl": "pulsar://sluice:7001", "brokerUrlTls": None,
        "httpUrl": "http://sluice:8080", "httpUrlTls": None, "nativeUrl": "pulsar://sluice:7001",
    }  # fmt: skip
    assert [str(u) for u in done.named] == ["http://b1:8080", "https://b1:8443"]
    assert done.kept == ()
    # A broker without a TLS port still gets Sluice's TLS listener named,
    # and no nativeUrl where it wrote none.
    plain_only = json.dumps({"brokerUrl": "pulsar://b1:6650", "httpUrl": "http://b1:8080"})
    done = rewrite_lookup(plain_only.encode(), http=None, https="https://sluice:8443",
                          broker=None, broker_tls="pulsar+ssl://sluice:7002")  # fmt: skip
    assert done.body is not None
    assert json.loads(done.body) == {
        "brokerUrl": None, "brokerUrlTls": "pulsar+ssl://sluice:7002",
        "httpUrl": None, "httpUrlTls": "https://sluice:8443",
    }  # fmt: skip
    # No listener of Sluice's for the broker: its URLs stay, and kept says why.
    done = rewrite_lookup(answer, http="h", https=None, broker=None, broker_tls=None)
    assert done.body is not None and json.loads(done.body)["brokerUrl"] == "pulsar://b1:6650"
    assert len(done.kept) == 3 and "nativeUrl x" in done.kept[2]
    assert lookup_broker_urls(b"<html>") == ()
    assert rewrite_lookup(b"<html>", http="h", https=None, broker="p", broker_tls=None).body is None
    assert rewrite_lookup(b"[1]", http="h", https=None, broker="p", broker_tls=None).body is None
