"""TLS as Sluice speaks it, both ways, with real handshakes on loopback
(sluice/proxy/dial.py): what a listener accepts (versions, client
certificates, the role a certificate gives), what a broker must show to be
dialled (the CA, its name or address), the certificate and key re-read when
they change, and keys that ask for a password."""

from __future__ import annotations

import contextlib
import logging
import os
import pty
import select
import socket
import ssl
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import trio
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from sluice.addresses import Address
from sluice.errors import ConfigError
from sluice.proxy import dial as dial_module
from sluice.proxy.dial import (
    CertificateReloader,
    TlsClientConfig,
    TlsServerConfig,
    certificate_cn,
    client_ssl_context,
    dial,
    server_ssl_context,
)
from sluice.proxy.oidc import FetchError, client_context
from sluice.proxy.oidc import fetch as oidc_fetch
from tests.helpers.support import https_answers


def pair(ca: trustme.CA, tmp_path: Path, stem: str, *names: str, **kw: object) -> tuple[Path, Path]:
    """A certificate of ``ca`` for ``names`` and its key, in two files."""
    issued = ca.issue_cert(*names, **kw)  # type: ignore[arg-type]
    cert, key = tmp_path / f"{stem}.pem", tmp_path / f"{stem}.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    key.write_bytes(issued.private_key_pem.bytes())
    return cert, key


def encrypted(key: Path, to: Path) -> Path:
    """``key`` again, encrypted with a password."""
    loaded = serialization.load_pem_private_key(key.read_bytes(), None)
    to.write_bytes(
        loaded.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"hunter2"),
        )
    )
    return to


class Listener:
    """A TLS server on loopback with ``context``, in a thread: each
    connection's handshake, and what became of it (the peer certificate's
    subject, or the error)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.outcomes: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            raw.settimeout(5)
            try:
                with self.context.wrap_socket(raw, server_side=True) as conn:
                    self.outcomes.append(f"ok {conn.version()}")
                    conn.recv(1)
            except (OSError, ssl.SSLError) as exc:
                self.outcomes.append(f"refused {exc}")

    def close(self) -> None:
        self.sock.close()


def handshake(port: int, context: ssl.SSLContext, name: str | None = "localhost") -> str:
    """A client's TLS handshake to ``port``: the version, or the error."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            with context.wrap_socket(raw, server_hostname=name) as conn:
                version = conn.version()
                conn.getpeercert()
                # A refused client certificate shows on the first read (TLS 1.3).
                conn.settimeout(0.5)
                with contextlib.suppress(TimeoutError):
                    conn.recv(1)
                return f"ok {version}"
        except (OSError, ssl.SSLError) as exc:
            return f"refused {exc}"


def old_tls_client() -> ssl.SSLContext:
    """A client that offers TLS 1.0 and 1.1 only (and would trust anything)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    return context


def old_tls_server(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    context.load_cert_chain(cert, key)
    return context


def test_tls_below_1_2_is_refused_by_listeners_and_toward_brokers(tmp_path: Path) -> None:
    """The same old peer is served by an old counterpart (so it is a real
    TLS 1.1 peer), and refused by Sluice either way."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert, key = pair(ca, tmp_path, "srv", "localhost")
    old = Listener(old_tls_server(cert, key))
    try:
        assert handshake(old.port, old_tls_client()) == "ok TLSv1.1"
        toward_broker = client_ssl_context(TlsClientConfig(ca=tmp_path / "ca.pem"))
        assert "protocol version" in handshake(old.port, toward_broker)
    finally:
        old.close()
    ours = Listener(server_ssl_context(TlsServerConfig(cert, key)))
    try:
        assert "protocol version" in handshake(ours.port, old_tls_client())
        assert handshake(ours.port, client_ssl_context(TlsClientConfig(ca=tmp_path / "ca.pem")))
    finally:
        ours.close()


def test_only_the_client_ca_signs_client_certificates(tmp_path: Path) -> None:
    """With --tls-client-ca, a client needs a certificate that CA signed:
    none, or one of another CA (the server's own, or one of the CAs the
    system trusts) is refused in the handshake."""
    ca, clients, other = trustme.CA(), trustme.CA(), trustme.CA()
    cert, key = pair(ca, tmp_path, "srv", "localhost")
    clients.cert_pem.write_to_path(str(tmp_path / "clients.pem"))
    context = server_ssl_context(TlsServerConfig(cert, key, tmp_path / "clients.pem"))
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.cert_store_stats()["x509_ca"] == 1  # the client CA, not the system's
    server = Listener(context)
    try:

        def client(issuer: trustme.CA | None) -> str:
            side = ssl.create_default_context()
            ca.configure_trust(side)
            if issuer is not None:
                issuer.issue_cert("alice@example.com", common_name="alice").configure_cert(side)
            return handshake(server.port, side)

        assert client(clients).startswith("ok")
        for refused in (None, other, ca):
            assert client(refused).startswith("refused")
    finally:
        server.close()


async def serve_tls() -> tuple[trio.SocketListener, int]:
    """A TCP listener on loopback (whose connections a test wraps in TLS)."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    return listener, listener.socket.getsockname()[1]


async def roles_of(ca: trustme.CA, tmp_path: Path, *subjects: x509.Name) -> list[str | None]:
    """The role (``certificate_cn``) a TLS listener with --tls-client-ca
    gives clients with certificates of these subjects, each over a real
    handshake."""
    cert, key = pair(ca, tmp_path, "srv", "localhost")
    ca.cert_pem.write_to_path(str(tmp_path / "clients.pem"))
    context = server_ssl_context(TlsServerConfig(cert, key, tmp_path / "clients.pem"))
    listener, port = await serve_tls()
    roles: list[str | None] = []
    async with trio.open_nursery() as nursery:

        async def one(tcp: trio.SocketStream) -> None:
            stream = trio.SSLStream(tcp, context, server_side=True)
            await stream.do_handshake()
            roles.append(certificate_cn(stream))
            await stream.send_all(b"x")

        nursery.start_soon(trio.serve_listeners, one, [listener])
        for subject in subjects:
            side = ssl.create_default_context()
            ca.configure_trust(side)
            issued = ca.issue_cert("client.example", common_name="ignored")
            certificate = x509.load_pem_x509_certificate(issued.cert_chain_pems[0].bytes())
            # The same certificate, its subject as given (signed by the CA).
            signed = (
                x509.CertificateBuilder()
                .subject_name(subject)
                .issuer_name(certificate.issuer)
                .public_key(certificate.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(certificate.not_valid_before_utc)
                .not_valid_after(certificate.not_valid_after_utc)
            )
            for extension in certificate.extensions:
                signed = signed.add_extension(extension.value, extension.critical)
            ca_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), None)
            made = signed.sign(ca_key, certificate.signature_hash_algorithm)  # type: ignore[arg-type]
            (tmp_path / "c.pem").write_bytes(made.public_bytes(serialization.Encoding.PEM))
            (tmp_path / "c.key").write_bytes(issued.private_key_pem.bytes())
            side.load_cert_chain(tmp_path / "c.pem", tmp_path / "c.key")
            tcp = await trio.open_tcp_stream("127.0.0.1", port)
            stream = trio.SSLStream(tcp, side, server_hostname="localhost", https_compatible=True)
            await stream.receive_some(1)
            await stream.aclose()
        nursery.cancel_scope.cancel()
    return roles


async def test_a_certificate_with_several_or_crafted_names_gets_one_role(tmp_path: Path) -> None:
    """The CN is read as a structure, never as text: a comma, an "=" or a
    "CN=" inside another attribute's value names no role; of several CNs,
    the last in the certificate (the first as RFC 2253 writes the subject,
    the broker's); an empty CN gives way to the next."""
    attr = x509.NameAttribute
    cn, org, unit = NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME, NameOID.ORGANIZATIONAL_UNIT_NAME
    roles = await roles_of(
        trustme.CA(),
        tmp_path,
        x509.Name([attr(cn, "bob"), attr(org, "x,CN=admin")]),
        x509.Name([attr(org, "CN=admin"), attr(cn, "bob")]),
        x509.Name([attr(cn, "admin"), attr(cn, "bob")]),
        x509.Name([attr(unit, "ops"), attr(cn, "bob,CN=admin")]),
        x509.Name([attr(org, "no common name")]),
    )
    assert roles == ["bob", "bob", "bob", "bob,CN=admin", None]


async def test_a_broker_must_show_a_certificate_for_the_host_dialled(tmp_path: Path) -> None:
    """A broker's certificate must name what Sluice dials: its name, or
    its IP address (a broker URL with an address needs that address in the
    certificate's names, not a name that resolves to it). Of another CA, or
    for another name, it is refused; so is one for "localhost" when
    127.0.0.1 was dialled."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    trusted = client_ssl_context(TlsClientConfig(ca=tmp_path / "ca.pem"))

    async def dialled(host: str, cert: Path, key: Path, context: ssl.SSLContext) -> str:
        listener, port = await serve_tls()
        async with trio.open_nursery() as nursery:

            async def one(tcp: trio.SocketStream) -> None:
                server = trio.SSLStream(tcp, server_ssl_context(TlsServerConfig(cert, key)),
                                        server_side=True)  # fmt: skip
                with contextlib.suppress(trio.BrokenResourceError):
                    await server.do_handshake()

            nursery.start_soon(trio.serve_listeners, one, [listener])
            try:
                stream = await dial(Address(host, port), timeout=5, tls=context)
            except OSError as exc:
                outcome = f"refused {exc}"
            else:
                outcome = "ok"
                await stream.aclose()
            nursery.cancel_scope.cancel()
        return outcome

    by_name = pair(ca, tmp_path, "name", "localhost")
    by_address = pair(ca, tmp_path, "address", "127.0.0.1")
    assert await dialled("localhost", *by_name, trusted) == "ok"
    assert await dialled("127.0.0.1", *by_address, trusted) == "ok"
    refused = await dialled("127.0.0.1", *by_name, trusted)
    assert "IP address mismatch" in refused
    assert "Hostname mismatch" in await dialled("localhost", *by_address, trusted)
    assert "Hostname mismatch" in await dialled(
        "localhost", *pair(ca, tmp_path, "other", "other.example"), trusted
    )
    stranger = trustme.CA()
    for host, stem in (("localhost", "s1"), ("127.0.0.1", "s2")):
        outcome = await dialled(host, *pair(stranger, tmp_path, stem, host), trusted)
        assert "certificate verify failed" in outcome
    # The system's trust store (no --broker-tls-ca) does not know a private CA.
    system = client_ssl_context(TlsClientConfig())
    assert "certificate verify failed" in await dialled("localhost", *by_name, system)


async def test_without_hostname_checks_the_ca_still_decides_and_it_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """--broker-tls-no-verify-hostname takes a certificate of the CA for
    any broker: said in the log, as a warning, when such a context is made
    (it was said nowhere). A certificate of another CA is still refused."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    if hasattr(dial_module, "_said_no_hostname_check"):  # (said once a process)
        dial_module._said_no_hostname_check.cache_clear()
    with caplog.at_level(logging.WARNING, logger="sluice.tls"):
        checking = client_ssl_context(TlsClientConfig(ca=tmp_path / "ca.pem"))
        assert not caplog.records
        lax = client_ssl_context(TlsClientConfig(ca=tmp_path / "ca.pem", verify_hostname=False))
    assert checking.check_hostname and not lax.check_hostname
    assert lax.verify_mode == ssl.CERT_REQUIRED
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "--broker-tls-no-verify-hostname" in caplog.records[0].message
    for issuer, expected in ((ca, "ok"), (trustme.CA(), "refused")):
        cert, key = pair(issuer, tmp_path, "srv", "other.example")
        server = Listener(server_ssl_context(TlsServerConfig(cert, key)))
        try:
            assert (await trio.to_thread.run_sync(handshake, server.port, lax)).startswith(expected)
        finally:
            server.close()


def test_an_encrypted_key_is_refused_naming_it(tmp_path: Path) -> None:
    """A key file with a password (Sluice has no option for one) is
    refused with a message that says so, for a listener and toward
    brokers. (It said "Invalid argument".)"""
    ca = trustme.CA()
    cert, key = pair(ca, tmp_path, "srv", "localhost")
    locked = encrypted(key, tmp_path / "locked.key")
    with pytest.raises(ConfigError, match="password-protected") as listening:
        server_ssl_context(TlsServerConfig(cert, locked))
    assert str(locked) in str(listening.value)
    with pytest.raises(ConfigError, match="password-protected"):
        client_ssl_context(TlsClientConfig(cert=cert, key=locked))


@pytest.mark.e2e
def test_an_encrypted_key_never_asks_for_its_password_on_a_terminal(tmp_path: Path) -> None:
    """Run where a terminal is (a proxy started by hand), OpenSSL asked
    for the password there and waited: the proxy hung at start, and a
    renewed certificate with an encrypted key stopped the event loop of a
    running one (the reload runs there). It fails at once, saying why."""
    ca = trustme.CA()
    cert, key = pair(ca, tmp_path, "srv", "localhost")
    locked = encrypted(key, tmp_path / "locked.key")
    master, slave = pty.openpty()
    script = (
        "import os, sys\n"
        "os.setsid()\n"
        "os.close(os.open(sys.argv[1], os.O_RDWR))  # the controlling terminal now\n"
        "from pathlib import Path\n"
        "from sluice.errors import ConfigError\n"
        "from sluice.proxy.dial import TlsServerConfig, server_ssl_context\n"
        "try:\n"
        "    server_ssl_context(TlsServerConfig(Path(sys.argv[2]), Path(sys.argv[3])))\n"
        "except ConfigError as exc:\n"
        "    print('refused:', exc, flush=True)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, os.ttyname(slave), str(cert), str(locked)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    os.close(slave)
    on_terminal = b""
    # Python's start and imports alone may take seconds on a busy host; a
    # child that asks for the pass phrase waits for good.
    deadline = time.monotonic() + 30
    try:
        while child.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.05)[0]:
                try:
                    on_terminal += os.read(master, 1024)
                except OSError:  # nobody has the terminal open (yet, or any more)
                    time.sleep(0.05)
        assert child.poll() is not None, f"still waiting; on its terminal: {on_terminal!r}"
        assert child.stdout is not None
        said = child.stdout.read().decode()
    finally:
        child.kill()
        child.wait()
        os.close(master)
    assert b"pass phrase" not in on_terminal
    assert "refused:" in said and "password-protected" in said


def test_a_changed_pair_that_does_not_load_keeps_the_old_one_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A listener's certificate re-read when its files change: a new
    certificate whose key has not come yet, a half-written key, an
    encrypted one: the old pair keeps being served, and each change is
    said once, naming both files (then nothing until the next change).
    The whole new pair is then taken."""
    ca = trustme.CA()
    cert, key = pair(ca, tmp_path, "srv", "old.example")
    context = server_ssl_context(TlsServerConfig(cert, key))
    reloader = CertificateReloader(TlsServerConfig(cert, key), context)
    server = Listener(context)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    client.check_hostname = False

    def served() -> str:
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
            client.wrap_socket(raw) as conn,
        ):
            names = (conn.getpeercert() or {}).get("subjectAltName", ())
            return str(names[0][1])

    new_cert, new_key = pair(ca, tmp_path, "new", "new.example")
    try:
        assert served() == "old.example"
        with caplog.at_level(logging.INFO, logger="sluice.tls"):
            steps = [
                (new_cert.read_bytes(), key.read_bytes()),  # the key not yet there
                (new_cert.read_bytes(), new_key.read_bytes()[:200]),  # half of it
                (new_cert.read_bytes(), encrypted(new_key, tmp_path / "locked.key").read_bytes()),
            ]
            for step, (cert_pem, key_pem) in enumerate(steps):
                cert.write_bytes(cert_pem)
                key.write_bytes(key_pem)
                assert not reloader.check() and not reloader.check()
                assert served() == "old.example"
                said = [r for r in caplog.records if r.levelno == logging.ERROR]
                assert len(said) == step + 1
                assert str(cert) in said[-1].message and str(key) in said[-1].message
            assert "password-protected" in said[-1].message
            key.write_bytes(new_key.read_bytes())
            assert reloader.check()
        assert served() == "new.example"
        assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 3
    finally:
        server.close()


async def test_identity_providers_are_checked_as_brokers_are(tmp_path: Path) -> None:
    """OpenID Connect issuers and the OAuth2 token endpoint are fetched over
    https with --auth-oidc-ca (else the system's CAs), the host name checked
    and TLS 1.2 at least: a certificate of a CA not trusted, or for another
    host (the same server reached by its IP address), is refused."""
    with https_answers(tmp_path, lambda base, path: b'{"ok": true}') as (base, ca):
        port = base.rsplit(":", 1)[1]
        trusted = client_context(ca)
        assert trusted.minimum_version >= ssl.TLSVersion.TLSv1_2
        assert await oidc_fetch(f"{base}/x", trusted, 5) == b'{"ok": true}'
        for url, context, why in (
            (f"{base}/x", client_context(None), "certificate verify failed"),
            (f"https://127.0.0.1:{port}/x", trusted, "IP address mismatch"),
        ):
            with pytest.raises(FetchError, match=why):
                await oidc_fetch(url, context, 5)
