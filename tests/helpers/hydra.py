"""Ory Hydra, a real OAuth2 / OpenID Connect server, for the OIDC tests.

``./dev setup`` builds it from ``tests/hydra`` (pinned) into
``~/.cache/sluice`` and exports its path as ``SLUICE_HYDRA``. It runs on
loopback with its store in memory (``DSN=memory``) and ``--dev`` (plain
http issuer), handing out JWT access tokens (``STRATEGIES_ACCESS_TOKEN=jwt``)
by the client-credentials grant: ``iss`` is the issuer URL as configured,
``sub`` the client id, ``aud`` the audiences asked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from sluice.brokers.embedded import free_port, terminate

HYDRA = os.environ.get("SLUICE_HYDRA") or str(Path.home() / ".cache/sluice/hydra-v2.3.0/bin/hydra")
# The key set Hydra signs JWT access tokens with.
ACCESS_TOKEN_KEYS = "hydra.jwt.access-token"


class Hydra:
    """One Hydra process; ``close()`` stops it (by its PID)."""

    def __init__(self, tmp: Path, access_token_ttl: str = "1h") -> None:
        assert Path(HYDRA).is_file(), f"no hydra at {HYDRA}: run ./dev setup (it builds it)"
        self.port = free_port()
        self.admin_port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"hydra-{self.port}.log"
        env = {
            **os.environ,
            "DSN": "memory",
            "URLS_SELF_ISSUER": self.issuer,
            "SECRETS_SYSTEM": os.urandom(16).hex(),
            "SERVE_PUBLIC_HOST": "127.0.0.1",
            "SERVE_PUBLIC_PORT": str(self.port),
            "SERVE_ADMIN_HOST": "127.0.0.1",
            "SERVE_ADMIN_PORT": str(self.admin_port),
            "STRATEGIES_ACCESS_TOKEN": "jwt",
            "TTL_ACCESS_TOKEN": access_token_ttl,
            "LOG_LEVEL": "warn",
        }
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [HYDRA, "serve", "all", "--dev"], stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.issuer}/health/ready", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"hydra did not start:\n{self.log()[-3000:]}")
            time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _admin(self, method: str, path: str, body: object = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.admin_port}{path}", data=data, method=method,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                text = answer.read()
        except urllib.error.HTTPError as error:
            raise AssertionError(f"hydra {method} {path}: {error.code} {error.read()!r}") from None
        return json.loads(text) if text else None

    def add_client(self, client_id: str, audience: str = "pulsar") -> dict[str, str]:
        """A client of the client-credentials grant; its key file's contents
        (``client_id``, ``client_secret``: what Pulsar's clients read)."""
        secret = os.urandom(16).hex()
        self._admin("POST", "/admin/clients", {
            "client_id": client_id,
            "client_secret": secret,
            "grant_types": ["client_credentials"],
            "token_endpoint_auth_method": "client_secret_post",
            "audience": [audience],
        })  # fmt: skip
        return {"client_id": client_id, "client_secret": secret}

    def key_file(self, directory: Path, client_id: str, audience: str = "pulsar") -> Path:
        path = directory / f"{client_id}.json"
        path.write_text(json.dumps(self.add_client(client_id, audience)))
        return path

    def token(self, credentials: dict[str, str], audience: str = "pulsar") -> str:
        """An access token by the client-credentials grant."""
        form = urllib.parse.urlencode({"grant_type": "client_credentials", **credentials,
                                       "audience": audience}).encode()  # fmt: skip
        with urllib.request.urlopen(f"{self.issuer}/oauth2/token", data=form, timeout=10) as a:
            token: str = json.loads(a.read())["access_token"]
        return token

    def signing_keys(self) -> list[str]:
        """The kids of the access-token key set, the signing one first."""
        keys = self._admin("GET", f"/admin/keys/{ACCESS_TOKEN_KEYS}")["keys"]
        return [k["kid"] for k in keys]

    def rotate(self, kid: str) -> None:
        """A new signing key: tokens from now on are signed with it; the old
        one stays published, as an issuer rotating keys does."""
        self._admin("POST", f"/admin/keys/{ACCESS_TOKEN_KEYS}",
                    {"alg": "RS256", "use": "sig", "kid": kid})  # fmt: skip

    def close(self) -> None:
        terminate(self.process, 10)
