"""Review 13: configuration reloads, adversarially, where they meet the
OpenID Connect settings. Each test holds one defect found (each fixed
since, its docstring saying what it was). A real ``Proxy`` reloaded from its
settings (as tests/test_reload.py does), its issuer a tiny HTTPS server of
the test's own on loopback."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from sluice.brokers.apache_pulsar import hs256_token
from sluice.commands.proxy import settings_again
from sluice.proxy.server import Proxy
from tests.helpers.support import https_answers, https_server, tls_files
from tests.test_oidc import Issuer
from tests.test_reload import argv, write


def _issuer_answers(idp: Issuer) -> Callable[[str, str], bytes | None]:
    """An issuer at BASE/good (its keys at a plain URL) and one at BASE/spaced
    whose discovery document names its key set at a URL with a space."""

    def answer(base: str, path: str) -> bytes | None:
        return {
            "/good/.well-known/openid-configuration": json.dumps(
                {"issuer": f"{base}/good", "jwks_uri": f"{base}/good/jwks.json"}
            ).encode(),
            "/spaced/.well-known/openid-configuration": json.dumps(
                {"issuer": f"{base}/spaced", "jwks_uri": f"{base}/spaced/signing keys.json"}
            ).encode(),
            "/good/jwks.json": idp.jwks(),
        }.get(path)

    return answer


def _proxy(
    tmp_path: Path, base: str, ca: Path, issuer: str = "good", **settings: Any
) -> tuple[Proxy, Path]:
    """A proxy in proxy mode trusting the issuer BASE/``issuer`` (CA file
    ``ca``), reloaded from its config file (``settings`` in it): it, that file."""
    own = tmp_path / "own.token"
    own.write_text(hs256_token(b"k" * 32, "sluice"))
    cfg = write(tmp_path / "sluice.toml", auth_oidc_issuers=f"{base}/{issuer}", **settings)
    line = argv(cfg, "--auth-mode", "proxy", "--auth-oidc-ca", str(ca),
                "--auth-oidc-audiences", "pulsar", "--broker-auth-token-file", str(own),
                "--no-check-broker")  # fmt: skip
    proxy = Proxy(settings_again(line))
    proxy.load = lambda: settings_again(line)
    return proxy, cfg


async def test_a_reload_to_an_issuer_whose_key_set_url_cannot_be_fetched_is_refused(
    tmp_path: Path,
) -> None:
    """docs/proxy.md: "an issuer whose keys cannot be fetched ... refuses the
    reload: what is in force is kept", each mistake one line. An issuer
    whose discovery document names its key set at a URL with a space in it
    cannot be fetched; the reload raises http.client.InvalidURL out of
    reload_from_source instead (the file watcher's or SIGHUP's task, and so
    the running proxy, ended by it; the admin endpoint's answer lost)."""
    with https_answers(tmp_path, _issuer_answers(Issuer())) as (base, ca):
        proxy, cfg = _proxy(tmp_path, base, ca)
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            write(cfg, auth_oidc_issuers=f"{base}/spaced")
            with trio.fail_after(20):
                refused = await proxy.reload_from_source("file")  # raised InvalidURL
            assert refused.outcome == "refused", refused.to_json()
            assert len(refused.errors) == 1, refused.errors
            assert proxy.config.auth_oidc_issuers == (f"{base}/good",)
            assert proxy.generation.number == 1
            nursery.cancel_scope.cancel()


async def test_an_oidc_ca_rewritten_while_a_reload_is_made_ready_is_put_in_force_later(
    tmp_path: Path,
) -> None:
    """A reload changes an OpenID Connect setting (the leeway): its issuers
    are made anew, their TLS trust from --auth-oidc-ca as the file is then.
    While it is made ready (its issuer's keys fetched: seconds; with
    --workers, until every worker has reported), the CA file is rewritten
    under its name (a Kubernetes Secret updated with the ConfigMap: here a
    bundle of the old CA and a new one). The file watcher's reload that
    follows says "applied: --auth-oidc-ca", but the issuers in force still
    trust only the CA read before: the new CA is never put in force, and
    when the issuer moves to a certificate of it, every token is refused."""
    with https_answers(tmp_path, _issuer_answers(Issuer())) as (base, served_ca):
        ca = tmp_path / "oidc-ca.pem"
        shutil.copyfile(served_ca, ca)
        other = tmp_path / "other"
        other.mkdir()
        other_ca, _, _ = tls_files(other, "localhost")
        proxy, cfg = _proxy(tmp_path, base, ca)
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            backend: Any = proxy.backend
            assert len(backend.issuers.context.get_ca_certs()) == 1
            write(cfg, auth_oidc_issuers=f"{base}/good", auth_oidc_leeway=5)
            new = settings_again_of(proxy)
            with trio.fail_after(20):
                async with proxy.preparing(new, "file") as prepared:
                    assert callable(prepared), prepared
                    # Rewritten while the reload is made ready: a bundle.
                    ca.write_bytes(ca.read_bytes() + other_ca.read_bytes())
                    applied = prepared()
            assert applied.outcome == "applied" and applied.changed == ["--auth-oidc-leeway"]
            # The file watcher sees the rewritten CA: a reload of it.
            with trio.fail_after(20):
                again = await proxy.reload_from_source("file")
            assert again.outcome == "applied" and again.changed == ["--auth-oidc-ca"], (
                again.to_json()
            )
            # What the file holds is what the issuers trust now.
            assert len(backend.issuers.context.get_ca_certs()) == 2
            nursery.cancel_scope.cancel()


def settings_again_of(proxy: Proxy) -> Any:
    """The proxy's settings read again, as a reload reads them."""
    load = proxy.load
    assert load is not None
    return load()


async def test_a_keys_request_for_an_issuer_a_reload_took_out_does_not_end_the_proxy(
    tmp_path: Path,
) -> None:
    """A CONNECT (or a client's refreshed token) whose issuer's keys must
    be fetched hands the proxy an Ask (``KeysNeeded``), run in a task of
    its own (relay.py start_soon) on whatever issuers are in force when it
    runs. A reload that replaces the issuers (here BASE/good by BASE/also)
    can be put in force before it does. That keys request then reaches
    Issuers.fetch for an issuer the new verifier does not hold: KeyError,
    raised in the issuers' background nursery, ends the whole proxy.
    Expected: nothing fetched, the client's token refused as of an
    issuer no longer allowed, the proxy serving on."""
    from sluice.protocols.oidc import KeysNeeded

    idp = Issuer()

    def answer(base: str, path: str) -> bytes | None:
        documents = {
            f"/{name}/.well-known/openid-configuration": json.dumps(
                {"issuer": f"{base}/{name}", "jwks_uri": f"{base}/good/jwks.json"}
            ).encode()
            for name in ("good", "also")
        }
        return (documents | {"/good/jwks.json": idp.jwks()}).get(path)

    with https_answers(tmp_path, answer) as (base, ca):
        proxy, cfg = _proxy(tmp_path, base, ca)
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            write(cfg, auth_oidc_issuers=f"{base}/also")
            with trio.fail_after(20):
                applied = await proxy.reload_from_source("file")
            assert applied.outcome == "applied", applied.to_json()
            # The Ask a connection made before the reload, run after it.
            with trio.fail_after(20):
                await proxy.backend.ask(proxy.config.broker.address, KeysNeeded(f"{base}/good"))
                # Still serving: the issuers in force answer a reload (and
                # their schedule) as before.
                again = await proxy.reload_from_source("SIGHUP")
            assert again.outcome == "unchanged", again.to_json()
            nursery.cancel_scope.cancel()


@pytest.mark.e2e
def test_a_worker_restarted_after_a_refused_reload_serves_the_configuration_in_force(
    broker: Any, tmp_path: Path
) -> None:
    """docs/proxy.md: a refused reload "changes nothing ... the
    configuration in force stays", and "a worker (re)started ... starts
    with" the configuration in force. --auth-oidc-ca is rewritten with
    something that is no certificate (a half-written Secret): the file
    watch's reload is refused, both workers serve on. Then worker 1 ends
    (a crash, the OOM killer): the supervisor starts it again, and the new
    process loads the CA file as it is now, which fails; it never becomes
    ready, and the proxy serves on one worker fewer until the file is put
    right."""
    import os
    import signal
    import time

    from tests.helpers.support import worker_pids
    from tests.test_reload_workers import Issuers, oidc_workers

    issuers = Issuers()
    with https_answers(tmp_path, issuers.answer) as (base, served_ca):
        ca = tmp_path / "oidc-ca.pem"
        shutil.copyfile(served_ca, ca)
        with oidc_workers(broker, tmp_path, ca, [f"{base}/good"]) as (proxy, _, pids):
            ca.write_text("not a certificate\n")
            deadline = time.monotonic() + 30
            while "configuration reload (file): refused" not in proxy.log():
                assert time.monotonic() < deadline, proxy.log()
                time.sleep(0.1)
            os.kill(pids[1], signal.SIGKILL)
            deadline = time.monotonic() + 30
            while True:
                ready = [int(p) for i, p in re.findall(r"worker (\d+) \(pid (\d+)\) ready",
                                                       proxy.log()) if i == "1"]  # fmt: skip
                if any(pid != pids[1] for pid in ready):
                    break
                assert time.monotonic() < deadline, proxy.log()[-3000:]
                time.sleep(0.2)
            pids.update(worker_pids(proxy, 2, timeout=0))  # the new worker 1, killed on exit
            assert proxy.terminate() == 0


class _IssuerWithTokens(http.server.BaseHTTPRequestHandler):
    """An issuer at /idp: its discovery document, keys (``idp``) and token
    endpoint (a client-credentials answer, or 503 while ``down`` is set)."""

    idp: Issuer
    down = threading.Event()
    posts = 0

    def do_GET(self) -> None:
        base = f"https://{self.headers['Host']}/idp"
        if self.path == "/idp/.well-known/openid-configuration":
            self._send(200, json.dumps({"issuer": base, "jwks_uri": f"{base}/jwks",
                                        "token_endpoint": f"{base}/token"}).encode())  # fmt: skip
        elif self.path == "/idp/jwks":
            self._send(200, type(self).idp.jwks())
        else:
            self._send(404, b"")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).posts += 1
        if type(self).down.is_set():
            self._send(503, b"")
        else:
            answer = {"access_token": "sluice-own", "token_type": "Bearer", "expires_in": 3600}
            self._send(200, json.dumps(answer).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


async def test_a_reload_of_an_issuer_setting_keeps_the_own_token_it_fetched(
    tmp_path: Path,
) -> None:
    """docs/proxy.md: "A changed OpenID Connect or OAuth2 setting fetches
    its keys or Sluice's own token before it is put in force ...; an
    unchanged one keeps what it fetched." Only --auth-oidc-leeway changes
    (the issuers' checking); Sluice's own OAuth2 settings do not. Its token
    endpoint is away for a moment (503): the reload is refused ("Sluice's
    own token ... could not be fetched") although that token, fetched at
    start and good for an hour, was not to be fetched again."""

    class handler(_IssuerWithTokens):  # this test's own state
        pass

    handler.idp, handler.down = Issuer(), threading.Event()
    with https_server(tmp_path, handler) as (server, ca):
        base = f"https://localhost:{server.server_address[1]}"
        credentials = tmp_path / "credentials.json"
        credentials.write_text(json.dumps({"client_id": "sluice", "client_secret": "s3cret"}))
        cfg = write(tmp_path / "sluice.toml", auth_oidc_issuers=f"{base}/idp")
        line = argv(cfg, "--auth-mode", "proxy", "--auth-oidc-ca", str(ca),
                    "--auth-oidc-audiences", "pulsar", "--broker-auth-oauth2-issuer",
                    f"{base}/idp", "--broker-auth-oauth2-credentials", str(credentials),
                    "--no-check-broker")  # fmt: skip
        proxy = Proxy(settings_again(line))
        proxy.load = lambda: settings_again(line)
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            assert handler.posts == 1
            handler.down.set()
            write(cfg, auth_oidc_issuers=f"{base}/idp", auth_oidc_leeway=5)
            with trio.fail_after(30):
                outcome = await proxy.reload_from_source("file")
            assert outcome.outcome == "applied", outcome.to_json()
            assert outcome.changed == ["--auth-oidc-leeway"]
            nursery.cancel_scope.cancel()
