"""A reload with ``--workers`` is all or nothing: when one worker refuses
what another could put in force (here an OpenID Connect issuer whose
discovery document is served once, so only the first worker to ask gets
it), no worker puts it in force, the answer names the worker that
refused, and the next reload is put in force by every worker alike."""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sluice.brokers.embedded import EmbeddedBroker, free_port
from tests.helpers.support import (
    RawClient,
    https_server,
    kill_with_workers,
    one_client_per_worker,
    start_proxy,
    worker_pids,
)
from tests.test_oidc import Issuer

TOKEN = "h3-admin-token"


def write(path: Path, issuers: list[str]) -> None:
    part = path.with_suffix(".part")
    part.write_text(f"[proxy]\nauth-oidc-issuers = {json.dumps(','.join(issuers))}\n")
    part.replace(path)


def admin_reload(admin: int) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{admin}/config/reload", method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=90) as answer:
            found: dict[str, Any] = json.loads(answer.read())
    except urllib.error.HTTPError as error:
        found = json.loads(error.read())
    return found


def accepted(port: int, token: str) -> bool:
    """Whether Sluice (in proxy mode) takes a CONNECT with ``token``."""
    with RawClient(port) as raw:
        raw.send_connect(token=token.encode())
        frame = raw.receive()
        return frame is not None and frame.name == "CONNECTED"


def test_a_reload_one_worker_refuses_is_put_in_force_by_none(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    idp = Issuer()
    asked: dict[str, int] = {}
    lock = threading.Lock()

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            base = f"https://{self.headers['Host']}"
            name = self.path.split("/")[1]
            with lock:
                asked[self.path] = asked.get(self.path, 0) + 1
                times = asked[self.path]
            if self.path.endswith("/.well-known/openid-configuration") and not (
                name == "once" and times > 1
            ):
                body: bytes | None = json.dumps(
                    {"issuer": f"{base}/{name}", "jwks_uri": f"{base}/keys/jwks.json"}
                ).encode()
            else:
                body = idp.jwks() if self.path == "/keys/jwks.json" else None
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    with https_server(tmp_path, Answer) as (server, ca):
        base = f"https://localhost:{server.server_address[1]}"

        def token(issuer: str) -> str:
            now = int(time.time())
            return idp.token(iss=f"{base}/{issuer}", iat=now, nbf=now, exp=now + 600)

        config = tmp_path / "sluice.toml"
        write(config, [f"{base}/good"])
        (tmp_path / "admin.token").write_text(TOKEN + "\n")
        own = tmp_path / "own.token"
        own.write_text("sluice-own-token\n")
        admin = free_port()
        proxy = start_proxy(
            broker.url, tmp_path, "--workers", "2", "--config", str(config),
            "--admin", f"127.0.0.1:{admin}", "--admin-token-file", str(tmp_path / "admin.token"),
            "--auth-mode", "proxy", "--auth-oidc-ca", str(ca), "--auth-oidc-audiences", "pulsar",
            "--broker-auth-token-file", str(own),
        )  # fmt: skip
        pids: dict[int, int] = {}
        try:
            pids = worker_pids(proxy, 2)
            assert len(pids) == 2, proxy.log()

            def everywhere(issuer: str) -> list[bool]:
                return one_client_per_worker(pids, lambda: accepted(proxy.port, token(issuer)))

            assert everywhere("good") == [True, True]
            # Only the first worker to ask gets the "once" issuer's discovery
            # document: the other refuses the reload.
            write(config, [f"{base}/good", f"{base}/once"])
            answer = admin_reload(admin)
            assert answer["outcome"] == "refused", answer
            assert answer["generation"] == 1, answer
            (error,) = answer["errors"]
            assert error.startswith("worker ") and f"{base}/once" in error, answer
            assert everywhere("once") == [False, False], proxy.log()
            assert everywhere("good") == [True, True]
            # The next reload is put in force by every worker, as generation 2.
            write(config, [f"{base}/good", f"{base}/also"])
            answer = admin_reload(admin)
            assert answer["outcome"] == "applied" and answer["generation"] == 2, answer
            assert not answer["errors"], answer
            assert everywhere("also") == [True, True], proxy.log()
            assert everywhere("once") == [False, False], proxy.log()
            assert proxy.terminate() == 0
        finally:
            kill_with_workers(proxy, pids)
    assert "Traceback" not in proxy.log()
