"""A reload with ``--workers`` is put in force only when every running
worker said it made it ready: a worker that says nothing in time (here
stopped, as one stuck fetching an issuer's keys would be) may yet refuse
it, so the reload is refused, naming it, and no worker puts it in force;
the silent worker, once it gets to it, leaves it too (it is not restarted
into it). How long the supervisor waits follows from the worst case of
making a reload ready: each of its fetches one after another, each given
--connect-timeout."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.server import RELOAD_FETCHES, prepare_time
from sluice.proxy.workers import decision_timeout, ready_timeout
from tests.helpers.support import https_answers, one_client_per_worker, stopped, worker_pids
from tests.test_reload_workers import Issuers, accepted, admin_reload, oidc_workers


def rewrite_unseen(path: Path, issuers: list[str]) -> None:
    """``path`` written anew in place, its size and time kept, so that the
    proxy's watch of the file starts no reload of its own: the admin's is
    the only one."""
    before = path.stat()
    text = f"[proxy]\nauth-oidc-issuers = {json.dumps(','.join(issuers))}\n".encode()
    assert len(text) == before.st_size
    with open(path, "r+b") as handle:
        handle.write(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns


def test_the_wait_for_workers_covers_the_slowest_reload() -> None:
    for seconds in (1.0, 10.0, 60.0):
        config = ProxyConfig(broker=parse_broker_url("pulsar://127.0.0.1:6650"),
                             connect_timeout=seconds)  # fmt: skip
        # Sluice's own token (discovery, token endpoint), then an issuer's
        # discovery document and keys: one after another.
        assert RELOAD_FETCHES >= 4
        assert prepare_time(config) > RELOAD_FETCHES * seconds
        assert ready_timeout(config) > prepare_time(config)
        assert decision_timeout(config) > ready_timeout(config)


@pytest.mark.e2e
def test_a_worker_silent_past_the_wait_stops_the_reload_for_all(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    issuers = Issuers()
    admin = free_port()
    with (
        https_answers(tmp_path, issuers.answer) as (base, ca),
        oidc_workers(broker, tmp_path, ca, [f"{base}/good", f"{base}/old"],
                     "--connect-timeout", "1", admin=admin) as (proxy, config, pids),
    ):  # fmt: skip

        def everywhere(issuer: str) -> list[bool]:
            url = f"{base}/{issuer}"
            return one_client_per_worker(pids, lambda: accepted(proxy.port, issuers.token(url)))

        assert everywhere("good") == [True, True]
        rewrite_unseen(config, [f"{base}/good", f"{base}/new"])
        with stopped([pids[1]]):  # worker 1 says nothing
            answer = admin_reload(admin)
        assert answer["outcome"] == "refused" and answer["generation"] == 1, answer
        assert answer["errors"] == ["worker 1: did not report it made ready within 24s"], answer
        # Worker 1, continued, comes to the reload: it was aborted, so
        # it keeps what is in force, as worker 0 does; nobody restarts.
        deadline = time.monotonic() + 30
        while "aborted before this worker came to it" not in proxy.log():
            assert time.monotonic() < deadline, proxy.log()
            time.sleep(0.1)
        assert everywhere("new") == [False, False], proxy.log()
        assert everywhere("good") == [True, True]
        assert "restarting" not in proxy.log(), proxy.log()
        assert worker_pids(proxy, 2) == pids, proxy.log()
        # Asked again, with every worker there: put in force by both.
        answer = admin_reload(admin)
        assert answer["outcome"] == "applied" and answer["generation"] == 2, answer
        assert not answer["errors"], answer
        assert everywhere("new") == [True, True], proxy.log()
        assert proxy.terminate() == 0
    assert "Traceback" not in proxy.log()
