"""Key and certificate files rotated the way Kubernetes updates a mounted
Secret (a new directory, the ``..data`` link swapped to it) are a reload by
themselves, as a changed --config file is: no SIGHUP or POST
/config/reload needed, with one process or with workers."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from sluice.brokers.apache_pulsar import hs256_token
from sluice.brokers.embedded import EmbeddedBroker, free_port
from tests.helpers.support import (
    http_get,
    kill_with_workers,
    one_client_per_worker,
    start_proxy,
    worker_pids,
)
from tests.test_reload_workers import accepted


def mount(secret: Path, version: str, files: dict[str, bytes]) -> None:
    """The kubelet's update of Secret volume ``secret``: the files written
    into a new directory, then the ``..data`` link pointed at it at once
    (the files themselves are links through ``..data``)."""
    data = secret / f"..{version}"
    data.mkdir(parents=True)
    for name, content in files.items():
        (data / name).write_bytes(content)
        if not (secret / name).is_symlink():
            (secret / name).symlink_to(f"..data/{name}")
    (secret / "..data_tmp").symlink_to(data.name)
    os.replace(secret / "..data_tmp", secret / "..data")


def generation(admin: int) -> int:
    status, text = http_get(f"http://127.0.0.1:{admin}/config")
    assert status == 200, text
    return int(json.loads(text)["generation"])


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [1, 2])
def test_a_rotated_secret_key_is_put_in_force_without_being_asked(
    broker: EmbeddedBroker, tmp_path: Path, workers: int
) -> None:
    old_key, new_key = b"o" * 32, b"n" * 32
    secret = tmp_path / "secret"
    mount(secret, "2026_12_01", {"token.key": old_key})
    own = tmp_path / "own.token"
    own.write_text(hs256_token(old_key, "sluice"))
    admin = free_port()
    proxy = start_proxy(
        broker.url, tmp_path, "--workers", str(workers), "--admin", f"127.0.0.1:{admin}",
        "--auth-mode", "proxy", "--auth-token-secret-key", str(secret / "token.key"),
        "--broker-auth-token-file", str(own),
    )  # fmt: skip
    pids: dict[int, int] = {}
    try:
        if workers > 1:
            pids = worker_pids(proxy, workers)
        old, new = hs256_token(old_key, "mallory"), hs256_token(new_key, "alice")
        assert (accepted(proxy.port, old), accepted(proxy.port, new)) == (True, False)
        assert generation(admin) == 1
        mount(secret, "2026_12_02", {"token.key": new_key})
        deadline = time.monotonic() + 30
        while generation(admin) != 2:
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.1)
        assert "generation 2: --auth-token-secret-key" in proxy.log()
        both = [(accepted(proxy.port, old), accepted(proxy.port, new))] * workers
        if workers > 1:  # each worker's answer
            both = one_client_per_worker(
                pids, lambda: (accepted(proxy.port, old), accepted(proxy.port, new))
            )
        assert both == [(False, True)] * workers, proxy.log()
        assert proxy.terminate() == 0
    finally:
        kill_with_workers(proxy, pids)
    assert "Traceback" not in proxy.log()
