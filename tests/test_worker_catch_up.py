"""A worker (re)started after a reload: what it makes of the last one."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest

from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.config import ProxyConfig
from sluice.proxy.server import Proxy, WorkerRole
from sluice.proxy.shared import create_state
from sluice.proxy.workers import RELOAD_DECISIONS, RELOAD_FILE, _Reloads


async def test_a_worker_started_after_an_aborted_reload_says_nothing_of_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The last reload was aborted before this worker started: it runs the
    configuration in force and has nothing to leave. (Each worker restarted
    since logged that it left that reload, 'aborted before this worker came
    to it', as if one had just been tried.)"""
    config = ProxyConfig(broker=parse_broker_url("pulsar://127.0.0.1:6650"))
    create_state(tmp_path, 1)
    newer = config.replace(max_connections=77)
    (tmp_path / RELOAD_FILE).write_bytes(pickle.dumps((1, 2, "SIGHUP", newer)))
    (tmp_path / RELOAD_DECISIONS).write_text("1 abort\n")
    proxy = Proxy(config, WorkerRole(0, 1, tmp_path, []))
    with caplog.at_level(logging.INFO):
        await _Reloads(proxy, tmp_path, 0).catch_up()
    assert proxy.generation.number == 1
    assert proxy.config.max_connections == config.max_connections
    assert not [r for r in caplog.records if "reload" in r.getMessage()], caplog.text
