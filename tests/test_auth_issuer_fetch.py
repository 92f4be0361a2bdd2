"""Fetching an OpenID Connect issuer's documents (``sluice/proxy/oidc.py``):
bounded in time as a whole, not per read, and Sluice's own OAuth2 secret
never posted in the clear. Tiny HTTPS servers of the test's own, in threads."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

import jwt
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric import rsa

from sluice.protocols.oidc import ClientCredentials, OidcSettings, OidcVerifier, TokenRefused
from sluice.proxy.oidc import (
    FetchError,
    Issuers,
    client_context,
    fetch,
    keep_own_token,
    own_token_once,
)
from tests.helpers.support import https_answers, https_server


class Drip(http.server.BaseHTTPRequestHandler):
    """Answers 200 with a 100-byte body, one byte every 0.1 s (10 s in
    all): each read is quick, the whole is not."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "100")
        self.end_headers()
        try:
            for _ in range(100):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:
            pass  # the client gave up

    def log_message(self, *args: object) -> None:
        pass


def test_a_document_that_trickles_in_fails_within_the_timeout(tmp_path: Path) -> None:
    """An issuer (or whatever answers in its name) that sends its key set a
    byte at a time, each within the socket timeout, held the fetch for as
    long as it liked: every CONNECT waiting for that issuer's keys waited
    with it, and the scheduled refresh of every issuer stopped behind it.
    As docs/proxy.md says, a fetch slower than --connect-timeout fails."""
    with https_server(tmp_path, Drip) as (server, ca):
        url = f"https://localhost:{server.server_address[1]}/jwks"
        context = client_context(ca)

        async def main() -> float:
            began = time.monotonic()
            with pytest.raises(FetchError, match="within 1s"):
                await fetch(url, context, 1.0)
            return time.monotonic() - began

        took = trio.run(main)
    assert took < 3.0, took


def test_a_quick_document_is_fetched_whole(tmp_path: Path) -> None:
    body = json.dumps({"keys": [{"kid": str(i)} for i in range(5000)]}).encode()

    class Quick(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with https_server(tmp_path, Quick) as (server, ca):
        url = f"https://localhost:{server.server_address[1]}/jwks"
        assert trio.run(fetch, url, client_context(ca), 5.0) == body


def test_own_secret_is_not_posted_in_the_clear_for_an_https_issuer(tmp_path: Path) -> None:
    """Sluice's OAuth2 issuer given as https, whose discovery document names
    a token endpoint over plain http: the client secret is not posted there
    (it was: anyone on the path read it, and could then log in as Sluice,
    a proxy role that may name any role). A redirect there is refused
    already; a named endpoint is no different."""
    posted: list[bytes] = []

    class Plain(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posted.append(self.rfile.read(int(self.headers["Content-Length"])))
            answer = json.dumps({"access_token": "T", "expires_in": 3600}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{plain.server_address[1]}/token"
    try:
        with https_answers(
            tmp_path,
            lambda base, path: json.dumps({"issuer": base, "token_endpoint": endpoint}).encode(),
        ) as (issuer, ca):
            key_file = tmp_path / "credentials.json"
            key_file.write_text(json.dumps({"client_id": "sluice", "client_secret": "s3cret"}))
            own = ClientCredentials.load(issuer, key_file)
            with pytest.raises(FetchError, match="not https"):
                trio.run(own_token_once, own, client_context(ca), 5.0)
    finally:
        plain.shutdown()
        plain.server_close()
    assert posted == []
    assert own.current() == b""


@pytest.mark.parametrize("expires_in", ["", ', "expires_in": NaN', ', "expires_in": "3600"'])
def test_own_token_without_a_usable_expires_in_is_fetched_again_before_its_exp(
    expires_in: str, tmp_path: Path
) -> None:
    """An issuer's token answer without ``expires_in`` (RFC 6749 only
    recommends it), with one that is not a number (some issuers write a
    string) or not finite (NaN, which JSON readers take): Sluice's own
    token was never fetched again, so when it expired the broker closed
    every relayed connection and refused every lookup until a restart.
    The access token's own ``exp`` says when it expires: it is fetched
    again at 80% of that, as with ``expires_in``."""
    posts: list[float] = []
    lifetime = 5.0  # seconds; refetched at 80% of it

    class Issuer(http.server.BaseHTTPRequestHandler):
        def answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            base = f"https://{self.headers['Host']}"
            self.answer(json.dumps({"issuer": base, "token_endpoint": f"{base}/token"}).encode())

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            posts.append(time.time())
            token = jwt.encode({"sub": "sluice", "exp": time.time() + lifetime}, "k" * 32)
            self.answer(f'{{"access_token": "{token}"{expires_in}}}'.encode())

        def log_message(self, *args: object) -> None:
            pass

    with https_server(tmp_path, Issuer) as (server, ca):
        key_file = tmp_path / "credentials.json"
        key_file.write_text(json.dumps({"client_id": "sluice", "client_secret": "s3cret"}))
        own = ClientCredentials.load(f"https://localhost:{server.server_address[1]}", key_file)

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                assert await nursery.start(keep_own_token, own, client_context(ca), 5.0) is None
                with trio.move_on_after(2 * lifetime):
                    while len(posts) < 2:
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()

        trio.run(main)
    assert len(posts) >= 2, "fetched once, never again"
    # Again at 80% of its life: not at once, and before it expired (with a
    # second to spare for the fetch itself on a busy host).
    assert lifetime / 2 < posts[1] - posts[0] < lifetime, posts


def test_a_key_fetch_outlives_the_connection_that_asked_for_it(tmp_path: Path) -> None:
    """A token naming a key the set lacks makes its connection ask for the
    issuer's keys (at most once per --auth-oidc-miss-refresh). The fetch
    ran in that connection's task: a client that sent such a CONNECT and
    hung up at once cancelled it, for the clients waiting on it too, and
    the issuer counted as just tried, so a key the issuer had rotated in
    was not fetched for another miss-refresh period (300 s by default), its
    clients refused meanwhile; again and again, for one CONNECT each time.
    Now the fetch runs on in the background and the key is taken in."""
    old, new = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in "ab")
    published = {"kid-1": old}

    def jwks() -> bytes:
        algorithm = jwt.get_algorithm_by_name("RS256")
        return json.dumps({"keys": [
            json.loads(algorithm.to_jwk(key.public_key())) | {"kid": kid, "use": "sig"}
            for kid, key in published.items()
        ]}).encode()  # fmt: skip

    def answer(base: str, path: str) -> bytes | None:
        if path.endswith("/openid-configuration"):
            return json.dumps({"issuer": base, "jwks_uri": f"{base}/jwks"}).encode()
        time.sleep(0.3)  # a key set that takes a moment
        return jwks()

    with https_answers(tmp_path, answer) as (issuer, ca):
        verifier = OidcVerifier(OidcSettings((issuer,), ("pulsar",), miss_refresh=0))
        issuers = Issuers(verifier, client_context(ca), 5.0)

        def token(kid: str) -> str:
            now = time.time()
            claims = {"iss": issuer, "aud": "pulsar", "sub": "app", "exp": now + 60,
                      "iat": now, "nbf": now}  # fmt: skip
            key = published[kid]
            return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})

        def held(kid: str) -> bool:
            try:
                return verifier.verify(token(kid), time.time(), fetched=True)[0] == "app"
            except TokenRefused:
                return False

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(issuers.run)
                with trio.fail_after(5):  # the keys at start
                    while not held("kid-1"):
                        await trio.sleep(0.05)
                published["kid-2"] = new  # the issuer rotates a key in
                with trio.move_on_after(0.1):  # the asking client hangs up
                    await issuers.fetch(issuer)
                with trio.move_on_after(3):
                    while not held("kid-2"):
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()

        trio.run(main)
        assert verifier.verify(token("kid-2"), time.time(), fetched=True)[0] == "app"
