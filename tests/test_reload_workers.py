"""A reload with ``--workers`` is all or nothing: when one worker refuses
what another could put in force (here an OpenID Connect issuer whose
discovery document is served once, so only the first worker to ask gets
it), no worker puts it in force, the answer names the worker that
refused, and the next reload is put in force by every worker alike."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sluice.brokers.embedded import EmbeddedBroker, free_port
from tests.helpers.support import (
    ProxyProcess,
    RawClient,
    https_answers,
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


class Issuers:
    """OpenID Connect issuers ``{base}/{name}`` of every name, for
    ``https_answers``: each one's discovery document names ``keys`` (a path,
    ``{name}`` in it standing for the issuer's) as its keys, those of one
    ``Issuer``; the issuer named ``once`` answers its discovery document to
    the first who asks only. ``asked``: how many times each path was asked."""

    def __init__(self, keys: str = "/keys/jwks.json", once: str | None = None) -> None:
        self.idp = Issuer()
        self.keys = keys
        self.once = once
        self.asked: dict[str, int] = {}
        self.lock = threading.Lock()

    def answer(self, base: str, path: str) -> bytes | None:
        name = path.split("/")[1]
        with self.lock:
            self.asked[path] = self.asked.get(path, 0) + 1
            times = self.asked[path]
        if path.endswith("/.well-known/openid-configuration"):
            if name == self.once and times > 1:
                return None
            keys = base + self.keys.format(name=name)
            return json.dumps({"issuer": f"{base}/{name}", "jwks_uri": keys}).encode()
        return self.idp.jwks() if path == self.keys.format(name=name) else None

    def fetched(self, path: str) -> int:
        with self.lock:
            return self.asked.get(path, 0)

    def token(self, issuer: str) -> str:
        """A token of ``issuer`` (its URL) for the audience ``pulsar``."""
        now = int(time.time())
        return self.idp.token(iss=issuer, iat=now, nbf=now, exp=now + 600)


@contextlib.contextmanager
def oidc_workers(
    broker: EmbeddedBroker, tmp_path: Path, ca: Path, issuers: list[str], *extra: str,
    admin: int | None = None,
) -> Iterator[tuple[ProxyProcess, Path, dict[int, int]]]:  # fmt: skip
    """``sluice proxy --workers 2`` in front of ``broker``, in proxy auth
    mode, taking tokens of the OpenID Connect ``issuers`` (served over TLS
    under ``ca``) as its --config file names them; ``admin``: its admin
    endpoint's port, taking TOKEN. (The proxy, its config file, its two
    workers' PIDs); both killed on exit."""
    config = tmp_path / "sluice.toml"
    write(config, issuers)
    own = tmp_path / "own.token"
    own.write_text("sluice-own-token\n")
    if admin is not None:
        (tmp_path / "admin.token").write_text(TOKEN + "\n")
        extra += ("--admin", f"127.0.0.1:{admin}",
                  "--admin-token-file", str(tmp_path / "admin.token"))  # fmt: skip
    proxy = start_proxy(
        broker.url, tmp_path, "--workers", "2", "--config", str(config),
        "--auth-mode", "proxy", "--auth-oidc-ca", str(ca), "--auth-oidc-audiences", "pulsar",
        "--broker-auth-token-file", str(own), *extra,
    )  # fmt: skip
    pids: dict[int, int] = {}
    try:
        pids = worker_pids(proxy, 2)
        assert len(pids) == 2, proxy.log()
        yield proxy, config, pids
    finally:
        kill_with_workers(proxy, pids)


def test_a_reload_one_worker_refuses_is_put_in_force_by_none(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    issuers = Issuers(once="once")
    admin = free_port()
    with (
        https_answers(tmp_path, issuers.answer) as (base, ca),
        oidc_workers(broker, tmp_path, ca, [f"{base}/good"], admin=admin) as (proxy, config, pids),
    ):

        def everywhere(issuer: str) -> list[bool]:
            url = f"{base}/{issuer}"
            return one_client_per_worker(pids, lambda: accepted(proxy.port, issuers.token(url)))

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
    assert "Traceback" not in proxy.log()
