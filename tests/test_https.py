"""The HTTP listener over TLS (``--http-listen-tls``), against Apache Pulsar
4.0.8: the admin API and HTTP lookups through it, in ``--auth-mode proxy``
the client's role taken from its certificate, and the TLS settings a
reload puts in force there (a rotated client CA; Sluice's renewed client
certificate toward a broker's web service over TLS)."""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import trustme

from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.brokers.embedded import free_port, wait_for_port
from tests.helpers.support import ProxyProcess, start_proxy, tls_files
from tests.test_apache_pulsar import Tokens, auth_broker  # noqa: F401 (a fixture)
from tests.test_http_auth import stats
from tests.test_key_rotation import mount
from tests.test_tls_reload import ClientCertRecorder, client_pair


def https_proxy(
    broker: ApachePulsar, tmp_path: Path, *extra: str
) -> tuple[int, ProxyProcess, trustme.CA]:
    """Sluice with an HTTPS listener only (its certificate from a CA whose
    file is ``ca.pem``); its port, its process, the CA."""
    _, served, ca = tls_files(tmp_path, "127.0.0.1", "localhost")
    port = free_port()
    proxy = start_proxy(
        broker.url, tmp_path, "--http-listen-tls", f"127.0.0.1:{port}",
        "--broker-http", broker.http_url, "--tls-cert", str(served), "--tls-key", str(served),
        *extra,
    )  # fmt: skip
    wait_for_port("127.0.0.1", port, 20, proxy.process)
    return port, proxy, ca


def get(
    url: str, context: ssl.SSLContext, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def test_admin_and_lookups_over_https(apache_pulsar: ApachePulsar, tmp_path: Path) -> None:
    port, proxy, _ = https_proxy(apache_pulsar, tmp_path)
    try:
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        base = f"https://127.0.0.1:{port}"
        assert get(f"{base}/admin/v2/clusters", context) == (200, '["standalone"]')
        topic = f"persistent/public/default/https-{uuid.uuid4().hex[:8]}"
        status, body = get(f"{base}/lookup/v2/topic/{topic}", context)
        assert status == 200, body
        answer = json.loads(body)
        # Sluice's TLS web listener stands for the broker's web service, and
        # no plain URL is left naming the broker.
        assert answer["httpUrlTls"] == base
        assert not answer.get("httpUrl")
        # A client that does not trust Sluice's certificate gets no answer.
        untrusted = ssl.create_default_context()
        try:
            get(f"{base}/admin/v2/clusters", untrusted)
        except urllib.error.URLError as exc:
            assert isinstance(exc.reason, ssl.SSLCertVerificationError), exc
        else:
            raise AssertionError("an untrusted certificate was accepted")
    finally:
        proxy.kill()
    assert "Traceback" not in proxy.log()


def test_proxy_mode_takes_the_role_from_a_client_certificate(
    auth_broker: tuple[ApachePulsar, Tokens],  # noqa: F811
    tmp_path: Path,
) -> None:
    """Mutual TLS at Sluice's web port: the role is the certificate's CN,
    and the broker authorizes that role, named in X-Original-Principal."""
    broker, tokens = auth_broker
    own = tmp_path / "sluice.token"
    own.write_text(tokens.make("sluice") + "\n")
    ca_file = tmp_path / "ca.pem"
    port, proxy, ca = https_proxy(
        broker, tmp_path, "--tls-client-ca", str(ca_file), "--auth-mode", "proxy",
        "--broker-auth-token-file", str(own),
    )  # fmt: skip
    try:
        contexts = {}
        for role in ("app", "stranger"):
            context = ssl.create_default_context(cafile=str(ca_file))
            ca.issue_cert(f"{role}.clients.test", common_name=role).configure_cert(context)
            contexts[role] = context
        allowed, refused = stats(broker, "public/default"), stats(broker, "public/elsewhere")
        base = f"https://127.0.0.1:{port}"
        assert get(base + allowed, contexts["app"])[0] == 200
        direct = get(broker.http_url + refused, ssl.create_default_context(),
                     {"Authorization": f"Bearer {tokens.make('app')}"})[0]  # fmt: skip
        assert direct in (401, 403)
        assert get(base + refused, contexts["app"])[0] == direct
        assert get(base + allowed, contexts["stranger"])[0] == direct
    finally:
        proxy.kill()
    assert "Traceback" not in proxy.log()


def clusters(port: int, server_ca: Path, pair: dict[str, bytes], where: Path) -> int | str:
    """The status of GET /admin/v2/clusters at Sluice's HTTPS listener,
    presenting client certificate ``pair``; "refused": the handshake or the
    connection ended."""
    (where / "client.pem").write_bytes(pair["tls.key"] + pair["tls.crt"])
    context = ssl.create_default_context(cafile=str(server_ca))
    context.load_cert_chain(str(where / "client.pem"))
    try:
        return get(f"https://127.0.0.1:{port}/admin/v2/clusters", context)[0]
    except (OSError, http.client.HTTPException):
        return "refused"


def test_a_rotated_client_ca_decides_for_new_https_clients(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    old_client, new_client = client_pair(old_ca, "old-client"), client_pair(new_ca, "new-client")
    secret = tmp_path / "secret"
    mount(secret, "2026_12_01", {"ca.crt": old_ca.cert_pem.bytes()})
    port, proxy, _ = https_proxy(apache_pulsar, tmp_path, "--tls-client-ca", str(secret / "ca.crt"))
    server_ca = tmp_path / "ca.pem"
    try:
        assert clusters(port, server_ca, old_client, tmp_path) == 200, proxy.log()
        assert clusters(port, server_ca, new_client, tmp_path) == "refused"
        mount(secret, "2026_12_02", {"ca.crt": new_ca.cert_pem.bytes()})
        deadline = time.monotonic() + 30
        while clusters(port, server_ca, new_client, tmp_path) != 200:
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.1)
        assert clusters(port, server_ca, old_client, tmp_path) == "refused"
        assert "generation 2: --tls" in proxy.log()
    finally:
        proxy.kill()
    assert "Traceback" not in proxy.log()


def test_a_renewed_client_certificate_is_used_toward_the_brokers_web_service(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    """The broker's web service behind a TLS front that requires a client
    certificate: the renewed one is presented from the reload on."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    secret = tmp_path / "secret"
    mount(secret, "2026_12_01", client_pair(ca, "sluice-one"))
    web = int(apache_pulsar.http_url.rsplit(":", 1)[1])
    port = free_port()
    with ClientCertRecorder(ca, web) as front:
        proxy = start_proxy(
            apache_pulsar.url, tmp_path, "--http-listen", f"127.0.0.1:{port}",
            "--broker-http", f"https://127.0.0.1:{front.port}",
            "--broker-tls-ca", str(tmp_path / "ca.pem"),
            "--broker-tls-cert", str(secret / "tls.crt"),
            "--broker-tls-key", str(secret / "tls.key"),
        )  # fmt: skip
        try:
            wait_for_port("127.0.0.1", port, 20, proxy.process)
            plain = ssl.create_default_context()  # (get() takes one; unused over http)
            url = f"http://127.0.0.1:{port}/admin/v2/clusters"
            assert get(url, plain) == (200, '["standalone"]'), proxy.log()
            assert front.seen[-1] == "sluice-one"
            mount(secret, "2026_12_02", client_pair(ca, "sluice-two"))
            deadline = time.monotonic() + 30
            while True:
                assert get(url, plain) == (200, '["standalone"]'), proxy.log()
                if front.seen[-1] == "sluice-two":
                    break
                assert time.monotonic() < deadline, (front.seen, proxy.log())
                time.sleep(0.1)
            assert "generation 2: --broker-tls" in proxy.log()
        finally:
            proxy.kill()
    assert "Traceback" not in proxy.log()
