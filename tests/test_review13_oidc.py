"""Review 13: OpenID Connect in proxy mode, adversarially. Each test holds
one defect found (each fixed since, its docstring saying what it was): the
verifier and the issuers' fetcher (``sluice/protocols/oidc.py``,
``sluice/proxy/oidc.py``) against a tiny HTTPS issuer of the test's own on
loopback, as tests/test_auth_issuer_fetch.py does."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric import rsa

from sluice.protocols.oidc import KeysNeeded, OidcSettings, OidcVerifier, TokenRefused
from sluice.proxy.oidc import Issuers, client_context
from tests.helpers.support import https_answers, https_server
from tests.test_oidc import Issuer


def _token(idp: Issuer, issuer: str, kid: str = "rsa-1") -> str:
    """A token of ``issuer`` signed with ``kid``, valid now (wall clock: the
    fetcher notes its fetches on it)."""
    now = time.time()
    return idp.token(kid, iss=issuer, exp=now + 300, iat=now, nbf=now)


async def test_a_key_the_issuer_withdrew_is_not_accepted_after_its_keys_are_fetched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issuer answers, with a well-formed key set that no longer holds
    the key a (leaked) token is signed with: that is the issuer saying the
    key is gone, not an issuer that is away. Sluice refuses such a set
    ("holds no RSA or EC signing key") and keeps the keys it held, so a
    token signed with the withdrawn key goes on being accepted."""
    idp = Issuer()
    published = {"jwks": idp.jwks()}

    def answer(base: str, path: str) -> bytes | None:
        return {
            "/realm/.well-known/openid-configuration": json.dumps(
                {"issuer": f"{base}/realm", "jwks_uri": f"{base}/realm/jwks.json"}
            ).encode(),
            "/realm/jwks.json": published["jwks"],
        }.get(path)

    with https_answers(tmp_path, answer) as (base, ca):
        issuer = f"{base}/realm"
        verifier = OidcVerifier(OidcSettings(issuers=(issuer,), audiences=("pulsar",)))
        issuers = Issuers(verifier, client_context(ca), 5.0)
        with trio.fail_after(10):
            await issuers.fetch(issuer)
        leaked = _token(idp, issuer)
        assert verifier.verify(leaked, time.time())[0] == "app"
        # The issuer withdraws its only key (compromised): its key set is empty.
        published["jwks"] = json.dumps({"keys": []}).encode()
        with caplog.at_level("INFO", logger="sluice.oidc"), trio.fail_after(10):
            await issuers.fetch(issuer)
            await issuers.fetch(issuer)  # still none: not warned of again
        with pytest.raises(TokenRefused, match="holds no RSA or EC signing key"):
            verifier.verify(leaked, time.time())
        warned = [r for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 1 and "no usable signing key" in warned[0].getMessage(), warned


class _HeldKeys(http.server.BaseHTTPRequestHandler):
    """An issuer whose key set is answered once ``release`` is set (a
    slow issuer): ``asked`` is set when the key set is asked for."""

    idp: Issuer
    asked = threading.Event()
    release = threading.Event()

    def do_GET(self) -> None:
        base = f"https://{self.headers['Host']}"
        if self.path == "/realm/.well-known/openid-configuration":
            body = json.dumps({"issuer": f"{base}/realm", "jwks_uri": f"{base}/realm/jwks"})
            data = body.encode()
        elif self.path == "/realm/jwks":
            type(self).asked.set()
            type(self).release.wait(10)
            data = type(self).idp.jwks()
        else:
            data = b""
        self.send_response(200 if data else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


async def test_a_token_of_a_rotated_key_waits_for_the_fetch_under_way(tmp_path: Path) -> None:
    """The issuer rotates in rsa-2. The first client with a token of it
    makes Sluice fetch the keys (KeysNeeded); a second client whose token
    names rsa-2 arrives while that fetch is under way. docs/proxy.md ("A
    CONNECT ... waits for the fetch ... and is then checked once more")
    says it waits; it is refused at once ("has no key 'rsa-2'"), although
    the fetch under way brings the key a moment later."""
    idp = Issuer()

    class handler(_HeldKeys):  # this test's own events
        pass

    handler.idp, handler.asked, handler.release = idp, threading.Event(), threading.Event()
    handler.release.set()
    with https_server(tmp_path, handler) as (server, ca):
        issuer = f"https://localhost:{server.server_address[1]}/realm"
        verifier = OidcVerifier(
            OidcSettings(issuers=(issuer,), audiences=("pulsar",), miss_refresh=3.0)
        )
        issuers = Issuers(verifier, client_context(ca), 10.0)
        with trio.fail_after(10):
            await issuers.fetch(issuer)
        assert verifier.verify(_token(idp, issuer), time.time())[0] == "app"
        idp.add("rsa-2", rsa.generate_private_key(public_exponent=65537, key_size=2048))
        first, second = _token(idp, issuer, "rsa-2"), _token(idp, issuer, "rsa-2")
        # Past --auth-oidc-miss-refresh since the last fetch (3 s: the fetch
        # below, a few TLS handshakes on loopback, takes far less).
        await trio.sleep(3.1)
        handler.asked.clear()
        handler.release.clear()
        with pytest.raises(KeysNeeded):  # the first: its keys are fetched
            verifier.verify(first, time.time())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(issuers.fetch, issuer)
            with trio.fail_after(10):
                await trio.to_thread.run_sync(handler.asked.wait)
            try:
                # The second, meanwhile: to wait for the fetch, as the first does.
                with pytest.raises(KeysNeeded):
                    verifier.verify(second, time.time())
            finally:
                handler.release.set()
        assert verifier.verify(first, time.time(), fetched=True)[0] == "app"


async def test_a_key_set_url_urllib_refuses_is_a_failed_fetch(tmp_path: Path) -> None:
    """An issuer whose discovery document names its key set at a URL with a
    space in it (a misconfigured issuer; or a line break, from one that is
    not to be trusted) is an issuer whose keys cannot be fetched: its tokens
    refused, saying why, the fetch tried again later. http.client refuses
    such a URL with InvalidURL, which Sluice's fetch does not catch: the
    exception ends Issuers.fetch, and with it the task that runs it (the
    issuers' schedule at start, a reload's preparation)."""

    def answer(base: str, path: str) -> bytes | None:
        if path == "/realm/.well-known/openid-configuration":
            uri = f"{base}/realm/signing keys.json"
            return json.dumps({"issuer": f"{base}/realm", "jwks_uri": uri}).encode()
        return None

    with https_answers(tmp_path, answer) as (base, ca):
        issuer = f"{base}/realm"
        verifier = OidcVerifier(OidcSettings(issuers=(issuer,), audiences=("pulsar",)))
        issuers = Issuers(verifier, client_context(ca), 5.0)
        with trio.fail_after(10):
            await issuers.fetch(issuer)  # raised http.client.InvalidURL
    failure = verifier.failure(issuer)
    assert failure is not None and "\n" not in failure, failure


async def test_a_proxy_whose_issuer_names_an_unfetchable_key_set_url_serves_on(
    tmp_path: Path,
) -> None:
    """The issuer's keys are fetched at start (and on schedule): one whose
    discovery document names its key set at a URL with a space in it (a
    misconfigured issuer, or one that changes its document later) is an
    issuer whose tokens are refused, saying why. The proxy ends instead,
    with http.client.InvalidURL out of its nursery."""
    from tests.test_review13_reload import _issuer_answers, _proxy

    with https_answers(tmp_path, _issuer_answers(Issuer())) as (base, ca):
        proxy, _ = _proxy(tmp_path, base, ca, issuer="spaced")
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            backend: Any = proxy.backend
            issuer = f"{base}/spaced"
            with trio.fail_after(15):
                while backend.issuers.verifier.failure(issuer) is None:
                    await trio.sleep(0.05)
            assert "signing keys.json" in backend.issuers.verifier.failure(issuer)
            nursery.cancel_scope.cancel()


class _TrickledHead(http.server.BaseHTTPRequestHandler):
    """Answers with a status line and then header bytes, one every 0.05 s,
    each within any read's timeout, until ``stop`` is set (or 60 s)."""

    stop = threading.Event()

    def do_GET(self) -> None:
        try:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            self.wfile.flush()
            deadline = time.monotonic() + 60
            while not type(self).stop.wait(0.05) and time.monotonic() < deadline:
                self.wfile.write(b"a")
                self.wfile.flush()
            self.wfile.write(b"\r\nContent-Length: 0\r\n\r\n")
        except OSError:
            pass

    def log_message(self, *args: object) -> None:
        pass


async def test_a_trickled_answer_head_does_not_hold_the_fetch_threads(tmp_path: Path) -> None:
    """``fetch`` promises that a fetch cut off at --connect-timeout leaves
    its thread to end "at its own deadline, within a read's timeout". An
    issuer (or whatever answers at its address) that sends its answer's
    head a byte at a time holds the thread far longer: urllib reads the
    head line by line, each read quick, and the deadline is only looked at
    once the body is read. Each scheduled or kid-miss fetch then leaves one
    more thread, each holding a token of trio's default thread limiter (40,
    shared by the whole process: a reload's reading of the settings and key
    files, getaddrinfo). Here, 45 fetches of 0.2 s each later, a plain
    to_thread call (what a reload does first) no longer runs."""

    class handler(_TrickledHead):  # this test's own stop
        pass

    handler.stop = threading.Event()
    limiter = trio.to_thread.current_default_thread_limiter()
    try:
        with https_server(tmp_path, handler) as (server, ca):
            issuer = f"https://localhost:{server.server_address[1]}/realm"
            verifier = OidcVerifier(OidcSettings(issuers=(issuer,), audiences=("pulsar",)))
            issuers = Issuers(verifier, client_context(ca), 0.2)
            for _ in range(int(limiter.total_tokens) + 5):
                with trio.fail_after(10):
                    await issuers.fetch(issuer)
                failure = verifier.failure(issuer)
                assert failure is not None and "no answer within 0.2s" in failure, failure
            # Each abandoned thread was to end within a read's timeout (0.2 s).
            with trio.move_on_after(3) as waited:
                assert await trio.to_thread.run_sync(int) == 0
            assert not waited.cancelled_caught, (
                f"{limiter.borrowed_tokens} of {limiter.total_tokens} thread tokens still held"
            )
    finally:
        handler.stop.set()


def test_a_url_with_a_line_break_fails_in_one_line() -> None:
    """A key set URL an issuer names with a line break in it (to forge a
    log line) is a failed fetch whose reason is one line."""
    import ssl

    from sluice.proxy.oidc import FetchError, _fetch

    with pytest.raises(FetchError) as failed:
        url = "https://127.0.0.1:9/keys\nlevel=error forged"
        _fetch(url, None, ssl.create_default_context(), 1)
    assert "\n" not in str(failed.value) and "forged" in str(failed.value)


async def test_a_keys_request_for_an_issuer_not_held_fetches_nothing() -> None:
    """Issuers.fetch of an issuer its verifier does not hold (one a reload
    took out after a token of it asked for its keys) fetches nothing and
    raises nothing (it raised KeyError)."""
    verifier = OidcVerifier(OidcSettings(issuers=("https://127.0.0.1:9/a",), audiences=("p",)))
    issuers = Issuers(verifier, client_context(None), 1.0)
    with trio.fail_after(5):
        await issuers.fetch("https://127.0.0.1:9/gone")
    assert verifier.failure("https://127.0.0.1:9/a") is None


def test_a_trickled_answer_head_is_cut_off_at_the_fetch_deadline(tmp_path: Path) -> None:
    """The fetch itself (its thread) ends at its deadline, whatever the
    issuer trickles: the head a byte every 0.05 s, for up to 60 s."""
    from sluice.proxy.oidc import FetchError, _fetch

    class handler(_TrickledHead):  # this test's own stop
        pass

    handler.stop = threading.Event()
    try:
        with https_server(tmp_path, handler) as (server, ca):
            url = f"https://localhost:{server.server_address[1]}/realm/jwks"
            began = time.monotonic()
            with pytest.raises(FetchError, match=r"no answer within 0\.5s"):
                _fetch(url, None, client_context(ca), 0.5)
            assert time.monotonic() - began < 2.0
    finally:
        handler.stop.set()
