"""Review 13b: a second, adversarial look at the review 13 fixes to
OpenID Connect (``sluice/protocols/oidc.py``, ``sluice/proxy/oidc.py``).
Each test holds one defect found, as a strict xfail naming where it is:
the verifier and the issuers' fetcher against a tiny HTTPS issuer of the
test's own on loopback, as tests/test_review13_oidc.py does."""

from __future__ import annotations

import http.server
import json
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from sluice.protocols.oidc import KeysNeeded, OidcSettings, OidcVerifier
from sluice.proxy.oidc import FetchError, Issuers, client_context, fetch
from tests.helpers.support import https_answers, https_server
from tests.test_oidc import Issuer


def _token(idp: Issuer, issuer: str, kid: str = "rsa-1") -> str:
    now = time.time()
    return idp.token(kid, iss=issuer, exp=now + 300, iat=now, nbf=now)


async def test_an_unfetchable_key_set_url_is_clipped_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issuer's discovery document names a 20,000-character key set URL
    with a space in it. The fetch fails (InvalidURL), and the URL is said
    clipped (MAX_URL) at the head of the reason, but http.client's own
    message repeats it whole, and the reason is clipped only when it is not
    printable: one 20 KB log line per fetch, per worker."""
    long = "k" * 20_000

    def answer(base: str, path: str) -> bytes | None:
        if path == "/realm/.well-known/openid-configuration":
            uri = f"{base}/realm/{long} .json"
            return json.dumps({"issuer": f"{base}/realm", "jwks_uri": uri}).encode()
        return None

    with https_answers(tmp_path, answer) as (base, ca):
        issuer = f"{base}/realm"
        verifier = OidcVerifier(OidcSettings(issuers=(issuer,), audiences=("pulsar",)))
        issuers = Issuers(verifier, client_context(ca), 5.0)
        with caplog.at_level(logging.INFO), trio.fail_after(10):
            await issuers.fetch(issuer)
    failure = verifier.failure(issuer)
    assert failure is not None
    said = [r.getMessage() for r in caplog.records if "keys not fetched" in r.getMessage()]
    assert said, caplog.records
    assert all(len(line) < 2000 for line in said), [len(line) for line in said]


async def test_an_answer_that_is_no_key_set_keeps_the_keys_held(tmp_path: Path) -> None:
    """RFC 7517 5: a JWK Set's ``keys`` member is REQUIRED. An issuer (or a
    CDN, a gateway in front of it) answering the key set URL with 200 and
    ``{"error": "temporarily_unavailable"}`` served no key set at all; the
    docstring of ``keys`` says what is no key set keeps the keys held. It is
    taken as a key set that withdrew every key: the held keys are dropped
    and every client of the issuer is refused, for --auth-oidc-miss-refresh
    (300 s) at least, as no failed-fetch retry comes (it is no failure)."""
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
        token = _token(idp, issuer)
        assert verifier.verify(token, time.time())[0] == "app"
        published["jwks"] = json.dumps({"error": "temporarily_unavailable"}).encode()
        with trio.fail_after(10):
            await issuers.fetch(issuer)
        assert verifier.verify(token, time.time())[0] == "app"


class _CountedKeys(http.server.BaseHTTPRequestHandler):
    """An issuer counting its key set's fetches (``fetches``); while
    ``hold`` is set, a key set asked for sets ``asked`` and is answered
    once ``release`` is set."""

    idp: Issuer
    fetches: list[float]
    hold: threading.Event
    asked: threading.Event
    release: threading.Event

    def do_GET(self) -> None:
        cls = type(self)
        base = f"https://{self.headers['Host']}"
        if self.path == "/realm/.well-known/openid-configuration":
            data = json.dumps({"issuer": f"{base}/realm", "jwks_uri": f"{base}/realm/jwks"})
            body = data.encode()
        elif self.path == "/realm/jwks":
            cls.fetches.append(time.monotonic())
            if cls.hold.is_set():
                cls.asked.set()
                cls.release.wait(10)
            body = cls.idp.jwks()
        else:
            body = b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


async def test_a_join_after_the_fetch_ended_fetches_nothing(tmp_path: Path) -> None:
    """A token with a made-up kid arriving while a fetch is under way gets
    KeysNeeded(join=True); by the time its keys request reaches
    ``Issuers.fetch`` (PulsarBackend.ask, a task of its own) that fetch may
    have ended. ``join`` then falls through to a fetch of its own, although
    the keys were fetched a moment ago and --auth-oidc-miss-refresh (300 s)
    allows none: a client sending such tokens as each fetch ends keeps the
    issuer fetched back to back, by every worker."""
    idp = Issuer()

    class handler(_CountedKeys):
        pass

    handler.idp, handler.fetches = idp, []
    handler.hold, handler.asked, handler.release = (
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    with https_server(tmp_path, handler) as (server, ca):
        issuer = f"https://localhost:{server.server_address[1]}/realm"
        verifier = OidcVerifier(OidcSettings(issuers=(issuer,), audiences=("pulsar",)))
        issuers = Issuers(verifier, client_context(ca), 10.0)
        with trio.fail_after(10):
            await issuers.fetch(issuer)
        forger = Issuer()  # keys of the attacker's own, never published
        forger.add("made-up", forger.keys["rsa-1"])
        handler.hold.set()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(issuers.fetch, issuer)  # a scheduled (or kid-miss) fetch
            with trio.fail_after(10):
                await trio.to_thread.run_sync(handler.asked.wait)
            try:
                with pytest.raises(KeysNeeded) as needed:  # a made-up kid, meanwhile
                    verifier.verify(_token(forger, issuer, "made-up"), time.time())
                assert needed.value.join
            finally:
                handler.release.set()
        handler.hold.clear()
        assert len(handler.fetches) == 2
        # The keys request, as PulsarBackend.ask makes it, after that fetch ended.
        with trio.fail_after(10):
            await issuers.fetch(needed.value.issuer, join=needed.value.join)
        assert len(handler.fetches) == 2, "fetched again within --auth-oidc-miss-refresh"


async def test_slow_name_resolution_does_not_starve_other_issuers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_fetch`` promises its thread does not outlive its deadline, each
    blocking step bounded. socket.create_connection resolves the host first
    (getaddrinfo, the system resolver: 5 s a try, per name server, with
    retries) with no deadline. Fetches of an issuer whose name server is
    away are each abandoned at the deadline, their threads left holding the
    fetches' own limiter (FETCH_THREADS, one per process): once 16 are
    held, a healthy issuer's fetch fails too ("no answer within"). The
    resolver here is one that takes its time for ``slow.test`` only."""
    real = socket.getaddrinfo
    answered = threading.Event()

    def resolve(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "slow.test":
            answered.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    idp = Issuer()

    def answer(base: str, path: str) -> bytes | None:
        return {
            "/realm/.well-known/openid-configuration": json.dumps(
                {"issuer": f"{base}/realm", "jwks_uri": f"{base}/realm/jwks.json"}
            ).encode(),
            "/realm/jwks.json": idp.jwks(),
        }.get(path)

    try:
        with https_answers(tmp_path, answer) as (base, ca):
            context = client_context(ca)

            async def slow() -> None:
                with pytest.raises(FetchError, match="no answer within"):
                    await fetch("https://slow.test/realm/jwks", context, 0.3)

            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    for _ in range(16):
                        nursery.start_soon(slow)
            # Each slow fetch ended (for trio) at its 0.3 s deadline; the
            # healthy issuer's is answered within its own 3 s.
            with trio.fail_after(10):
                document = await fetch(f"{base}/realm/jwks.json", context, 3.0)
            assert b"keys" in document
    finally:
        answered.set()


async def test_a_key_set_url_urlsplit_refuses_is_a_failed_fetch(tmp_path: Path) -> None:
    """As review 13's InvalidURL: an issuer whose discovery document names
    its key set at ``https://[::1/keys`` (unbalanced bracket) is an issuer
    whose keys cannot be fetched, its tokens refused saying why. urlsplit
    raises ValueError in ``discovered``, which neither it nor the fetcher
    catches: Issuers.fetch raises, ending the task that runs it (the
    issuers' schedule: the proxy, as test_review13_oidc showed for
    InvalidURL)."""

    def answer(base: str, path: str) -> bytes | None:
        if path == "/realm/.well-known/openid-configuration":
            uri = "https://[::1/keys"
            return json.dumps({"issuer": f"{base}/realm", "jwks_uri": uri}).encode()
        return None

    with https_answers(tmp_path, answer) as (base, ca):
        issuer = f"{base}/realm"
        verifier = OidcVerifier(OidcSettings(issuers=(issuer,), audiences=("pulsar",)))
        issuers = Issuers(verifier, client_context(ca), 5.0)
        with trio.fail_after(10):
            await issuers.fetch(issuer)
    assert verifier.failure(issuer) is not None


async def test_a_token_endpoint_urlsplit_refuses_is_a_failed_fetch(tmp_path: Path) -> None:
    """The same for Sluice's own OAuth2 token: an issuer naming its
    ``token_endpoint`` ``https://[::1/token`` is a token not fetched (said,
    tried again after a back-off); keep_own_token raises ValueError instead,
    ending the task that keeps the token (and the nursery it runs in)."""
    from sluice.protocols.oidc import ClientCredentials
    from sluice.proxy.oidc import keep_own_token

    def answer(base: str, path: str) -> bytes | None:
        if path == "/realm/.well-known/openid-configuration":
            endpoint = "https://[::1/token"
            return json.dumps({"issuer": f"{base}/realm", "token_endpoint": endpoint}).encode()
        return None

    with https_answers(tmp_path, answer) as (base, ca):
        own = ClientCredentials(f"{base}/realm", "sluice", "secret")
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                why = await nursery.start(keep_own_token, own, client_context(ca), 5.0)
                nursery.cancel_scope.cancel()
    assert why is not None and "token_endpoint" in why, why


@pytest.mark.e2e
def test_a_restarted_worker_with_a_pinned_file_takes_an_unrelated_reload(
    broker: Any, tmp_path: Path
) -> None:
    """Worker 1 is restarted after a refused reload (--auth-oidc-ca
    half-written): it is given the CA as in force from a private copy, its
    configuration naming that copy. The CA is put right (as in force), the
    issuer is then away, and a reload changes only --max-concurrent-lookups.
    Worker 0 keeps its issuers (their settings did not change), as
    docs/proxy.md says; worker 1 weighs the new configuration against its
    own, in which --auth-oidc-ca names the copy: a changed issuer setting,
    so it fetches every issuer's keys anew, which fails, and refuses the
    reload, which every worker then leaves (and so on for every later
    reload, for the worker's life; its own token fetched anew each time)."""
    import os
    import re as regex
    import shutil
    import signal

    from tests.helpers.support import worker_pids
    from tests.test_reload_workers import Issuers as Served
    from tests.test_reload_workers import oidc_workers

    served = Served()
    with https_answers(tmp_path, served.answer) as (base, served_ca):
        ca = tmp_path / "oidc-ca.pem"
        shutil.copyfile(served_ca, ca)
        issuer = f"{base}/good"
        with oidc_workers(broker, tmp_path, ca, [issuer]) as (proxy, config, pids):

            def wait_for(seen: Any, what: str) -> None:
                deadline = time.monotonic() + 40
                while not seen(proxy.log()):
                    assert time.monotonic() < deadline, (what, proxy.log()[-4000:])
                    time.sleep(0.1)

            ca.write_text("not a certificate\n")
            wait_for(lambda log: "configuration reload (file): refused" in log, "refused")
            os.kill(pids[1], signal.SIGKILL)

            def restarted(log: str) -> bool:
                ready = regex.findall(r"worker 1 \(pid (\d+)\) ready", log)
                return any(int(pid) != pids[1] for pid in ready)

            wait_for(restarted, "worker 1 restarted")
            assert "changed since the configuration in force was" in proxy.log()
            pids.update(worker_pids(proxy, 2, timeout=0))  # the new worker 1, killed on exit

            def outcomes(log: str) -> list[str]:  # the supervisor's reloads
                return regex.findall(r"sluice\.workers: configuration reload \(file\): (\w+)", log)

            said = len(outcomes(proxy.log()))
            shutil.copyfile(served_ca, ca)  # put right: as in force
            wait_for(lambda log: "unchanged" in outcomes(log)[said:], "the CA put right")
            served.keys = "/gone/{name}.json"  # the issuer's keys away from now on
            said = len(outcomes(proxy.log()))
            part = config.with_suffix(".part")
            part.write_text(
                f"[proxy]\nauth-oidc-issuers = {json.dumps(issuer)}\nmax-concurrent-lookups = 7\n"
            )
            part.replace(config)
            wait_for(lambda log: len(outcomes(log)) > said, "the reload")
            assert outcomes(proxy.log())[-1] == "applied", proxy.log()[-4000:]


class _RefusingTokens(http.server.BaseHTTPRequestHandler):
    """An OAuth2 issuer whose token endpoint refuses, its OAuth2 error
    saying ``error`` (with a line break in it)."""

    error = "invalid_client\n2026-01-01 00:00:00,000 ERROR   sluice.proxy: forged line"

    def do_GET(self) -> None:
        base = f"https://{self.headers['Host']}"
        body = json.dumps({"issuer": f"{base}/realm", "token_endpoint": f"{base}/realm/token"})
        self._send(200 if self.path.endswith("/openid-configuration") else 404, body.encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._send(400, json.dumps({"error": type(self).error}).encode())

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


async def test_an_oauth2_error_with_a_line_break_fails_in_one_line(tmp_path: Path) -> None:
    """review 13 made a fetch's failure one line (a URL's line break is
    escaped). The token endpoint's refusal, an OAuth2 error, is said as its
    ``error`` (100 characters) and ``error_description`` (200) are, line
    breaks included: keep_own_token logs it, an issuer (or anyone answering
    at an http token endpoint) writing a line of its own into Sluice's log."""
    from sluice.protocols.oidc import ClientCredentials
    from sluice.proxy.oidc import own_token_once

    with https_server(tmp_path, _RefusingTokens) as (server, ca):
        own = ClientCredentials(f"https://localhost:{server.server_address[1]}/realm", "s", "x")
        with pytest.raises(FetchError) as failed, trio.fail_after(10):
            await own_token_once(own, client_context(ca), 5.0)
    assert "HTTP 400" in str(failed.value) and "invalid_client" in str(failed.value)
    assert "\n" not in str(failed.value), str(failed.value)


class _TrickledRefusal(http.server.BaseHTTPRequestHandler):
    """A token endpoint refusing (400), its error body a byte every 0.05 s
    until ``stop`` is set (or 30 s)."""

    stop = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            self.wfile.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 100000\r\n\r\n")
            self.wfile.flush()
            deadline = time.monotonic() + 30
            while not type(self).stop.wait(0.05) and time.monotonic() < deadline:
                self.wfile.write(b" ")
                self.wfile.flush()
        except OSError:
            pass

    def log_message(self, *args: object) -> None:
        pass


def test_a_trickled_error_answer_is_a_failed_fetch(tmp_path: Path) -> None:
    """``_fetch`` ends within its deadline with FetchError, "an error
    answer's body" included. A token endpoint's refusal whose body trickles
    in is read (for its OAuth2 error) in the ``except HTTPError`` clause,
    where the deadline's TimeoutError is caught by nothing: it leaves
    ``_fetch`` as TimeoutError (``fetch`` hides it only while trio's own
    deadline, a moment earlier, wins the race; keep_own_token catches
    FetchError and TokenRefused only)."""
    from sluice.proxy.oidc import _fetch

    class handler(_TrickledRefusal):  # this test's own stop
        pass

    handler.stop = threading.Event()
    try:
        with https_server(tmp_path, handler) as (server, ca):
            url = f"https://localhost:{server.server_address[1]}/realm/token"
            with pytest.raises(FetchError):
                _fetch(url, b"grant_type=client_credentials", client_context(ca), 0.5)
    finally:
        handler.stop.set()


def test_an_issuer_urlsplit_refuses_is_a_config_error() -> None:
    """--auth-oidc-issuers (or --broker-auth-oauth2-issuer) with an
    unbalanced ``[`` is refused in one line (ConfigError), not a ValueError
    traceback out of urlsplit."""
    from types import SimpleNamespace

    from sluice.errors import ConfigError
    from sluice.protocols.oidc import client_credentials

    with pytest.raises(ConfigError, match="not an http"):
        OidcSettings(issuers=("https://[::1/realm",), audiences=("pulsar",)).check()
    config = SimpleNamespace(
        broker_auth_oauth2_issuer="https://[::1/realm",
        broker_auth_oauth2_credentials=Path("unused.json"),
        auth_oidc_allow_http=False,
    )
    with pytest.raises(ConfigError, match="not an http"):
        client_credentials(config)
