"""A reload one worker refuses leaves nothing running in the worker that
had made it ready: the keys of the new configuration's OpenID Connect
issuers are not fetched on schedule once the supervisor dropped it."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers.support import https_server, kill_with_workers, start_proxy, worker_pids
from tests.test_oidc import Issuer
from tests.test_reload_workers import write


@pytest.mark.e2e
def test_an_aborted_reload_stops_what_a_worker_started_for_it(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    idp = Issuer()
    asked: dict[str, int] = {}
    lock = threading.Lock()

    class Answer(http.server.BaseHTTPRequestHandler):
        """Issuers by name: ``once`` answers its discovery document to the
        first who asks only (one worker makes the reload ready, the other
        refuses it); the others always."""

        def do_GET(self) -> None:
            base = f"https://{self.headers['Host']}"
            name = self.path.split("/")[1]
            with lock:
                asked[self.path] = asked.get(self.path, 0) + 1
                times = asked[self.path]
            body: bytes | None = None
            if self.path.endswith("/.well-known/openid-configuration"):
                if not (name == "once" and times > 1):
                    document = {"issuer": f"{base}/{name}", "jwks_uri": f"{base}/{name}/jwks.json"}
                    body = json.dumps(document).encode()
            elif self.path.endswith("/jwks.json"):
                body = idp.jwks()
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    def fetched(name: str) -> int:
        with lock:
            return asked.get(f"/{name}/jwks.json", 0)

    with https_server(tmp_path, Answer) as (server, ca):
        base = f"https://localhost:{server.server_address[1]}"
        config = tmp_path / "sluice.toml"
        write(config, [f"{base}/good"])
        own = tmp_path / "own.token"
        own.write_text("sluice-own-token\n")
        proxy = start_proxy(
            broker.url, tmp_path, "--workers", "2", "--config", str(config),
            "--auth-mode", "proxy", "--auth-oidc-ca", str(ca), "--auth-oidc-audiences", "pulsar",
            "--broker-auth-token-file", str(own),
            # Keys fetched again every second: a task left running shows.
            "--auth-oidc-refresh", "1",
        )  # fmt: skip
        pids: dict[int, int] = {}
        try:
            pids = worker_pids(proxy, 2)
            assert len(pids) == 2, proxy.log()
            # The file's change is the reload (one, not one more after an
            # admin request's).
            write(config, [f"{base}/fresh", f"{base}/once"])
            deadline = time.monotonic() + 60
            while "sluice.workers: configuration reload (file): refused" not in proxy.log():
                assert time.monotonic() < deadline, proxy.log()
                time.sleep(0.05)
            assert fetched("once") == 1, asked  # one worker made it ready
            after = fetched("fresh")
            # Both workers fetch the issuer in force every second: six
            # fetches are three rounds, in which a task still running for
            # the dropped reload would have fetched "fresh" again.
            good = fetched("good")
            deadline = time.monotonic() + 30
            while fetched("good") < good + 6:
                assert time.monotonic() < deadline, (asked, proxy.log())
                time.sleep(0.05)
            assert fetched("fresh") == after, (asked, proxy.log())
            assert proxy.terminate() == 0
        finally:
            kill_with_workers(proxy, pids)
    assert "Traceback" not in proxy.log()
