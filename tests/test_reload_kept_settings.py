"""A reload whose changes meet the settings it keeps until a restart: the
configuration put in force is the new one with the kept settings as they
were, and it must check out as a whole, or the reload is refused (one line
a mistake, naming what was kept), never raised out of the proxy."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from sluice.commands.proxy import settings_again
from sluice.proxy.server import Proxy
from sluice.proxy.workers import Supervisor
from tests.helpers.support import tls_files
from tests.test_reload import argv, write


def tls_listener_config(tmp_path: Path) -> tuple[Path, list[str]]:
    """A --config file with a TLS listener and its certificate, and the
    command line that names it."""
    _, pem, _ = tls_files(tmp_path, "localhost")
    cfg = write(tmp_path / "sluice.toml", listen_tls="127.0.0.1:0", tls_cert=str(pem),
                tls_key=str(pem), max_connections=100)  # fmt: skip
    return cfg, argv(cfg)


DROPPED = ("--listen-tls needs --tls-cert and --tls-key "
           "(kept as it was until a restart: --listen-tls)")  # fmt: skip


async def test_a_tls_listener_kept_with_its_certificate_dropped_is_refused(
    tmp_path: Path,
) -> None:
    """The TLS listener and its certificate taken out of the file: the
    listener stays until a restart, so its certificate must stay too.
    (The reload raised ConfigError out of the proxy: SIGHUP and the file
    watch ended it.)"""
    cfg, line = tls_listener_config(tmp_path)
    proxy = Proxy(settings_again(line))
    proxy.load = lambda: settings_again(line)
    write(cfg, max_connections=5)
    refused = await proxy.reload_from_source("SIGHUP")
    assert refused.outcome == "refused" and refused.errors == [DROPPED], refused
    assert proxy.generation.number == 1
    assert proxy.config.tls is not None and proxy.limits.total == 100
    registry = proxy.metrics.registry
    assert registry.get_sample_value("sluice_config_reloads_total", {"outcome": "refused"}) == 1
    # The refusal stands (SluiceConfigReloadRefused fires on it) until a
    # configuration is put in force.
    refused_at = registry.get_sample_value("sluice_config_refused_timestamp_seconds")
    assert refused_at is not None and abs(refused_at - time.time()) < 60
    # Put back, the next change is put in force.
    write(cfg, listen_tls="127.0.0.1:0", tls_cert=str(proxy.config.tls.cert),
          tls_key=str(proxy.config.tls.key), max_connections=5)  # fmt: skip
    applied = await proxy.reload_from_source("SIGHUP")
    assert applied.outcome == "applied" and proxy.limits.total == 5, applied
    assert registry.get_sample_value("sluice_config_refused_timestamp_seconds") == 0


async def test_with_workers_the_supervisor_refuses_it_too(tmp_path: Path) -> None:
    cfg, line = tls_listener_config(tmp_path)
    supervisor = Supervisor(settings_again(line), 2)
    supervisor.load = lambda: settings_again(line)
    write(cfg, max_connections=5)
    refused = await supervisor.reload_from_source("SIGHUP")
    shutil.rmtree(supervisor._state)
    assert refused.outcome == "refused" and refused.errors == [DROPPED], refused
    assert supervisor.generation.number == 1 and supervisor.config.tls is not None
    value = supervisor.registry.get_sample_value(
        "sluice_config_reloads_total", {"outcome": "refused", "protocol": "pulsar"}
    )
    assert value == 1
    refused_at = supervisor.registry.get_sample_value(
        "sluice_config_refused_timestamp_seconds", {"protocol": "pulsar"}
    )
    assert refused_at is not None and abs(refused_at - time.time()) < 60


async def test_snapshot_rules_need_the_flight_recorder_in_force(tmp_path: Path) -> None:
    """--snapshot-on changes live where the flight recorder runs; added with
    the ring it needs (--record-ring, a restart), it is kept with it. (It
    was said to be put in force, and the recorder, ringless, dropped it.)"""
    records = str(tmp_path / "records")
    cfg = write(tmp_path / "sluice.toml", record=records)
    line = argv(cfg)
    proxy = Proxy(settings_again(line))
    proxy.load = lambda: settings_again(line)
    write(cfg, record=records, record_ring="8M", snapshot_on='[{"on": "error"}]')
    outcome = await proxy.reload_from_source("file")
    assert outcome.outcome == "unchanged" and outcome.kept == ["--record"], outcome
    assert proxy.config.record is not None and proxy.config.record.triggers == ()

    # With the ring running, the rules change live.
    ringed = tmp_path / "ringed"
    ringed.mkdir()
    cfg = write(ringed / "sluice.toml", record=records, record_ring="8M")
    line = argv(cfg)
    proxy = Proxy(settings_again(line))
    proxy.load = lambda: settings_again(line)
    write(cfg, record=records, record_ring="8M", snapshot_on='[{"on": "error"}]')
    outcome = await proxy.reload_from_source("file")
    assert outcome.outcome == "applied" and outcome.changed == ["--snapshot-on"], outcome
    assert outcome.kept == [] and proxy.recorder is not None
    assert [t.on for t in proxy.recorder._triggers] == ["error"]


async def test_a_reload_the_supervisor_cannot_hand_on_is_refused(tmp_path: Path) -> None:
    """The workers' state cannot be written (a full disk; here, gone): the
    reload is refused, said in one line, and the supervisor serves on.
    (The OSError was raised out of the reload: SIGHUP ended the proxy.)"""
    cfg = write(tmp_path / "sluice.toml", max_connections=100)
    line = argv(cfg)
    supervisor = Supervisor(settings_again(line), 2)
    supervisor.load = lambda: settings_again(line)
    gone = tmp_path / "gone"
    shutil.rmtree(supervisor._state)
    supervisor._state = gone
    write(cfg, max_connections=5)
    refused = await supervisor.reload_from_source("SIGHUP")
    assert refused.outcome == "refused", refused
    assert refused.errors == [
        f"cannot hand it to the workers ({gone / 'reload.pickle'}): No such file or directory"
    ]
    assert supervisor.generation.number == 1 and supervisor.config.max_connections == 100


async def test_a_changed_log_level_is_said_to_wait_for_a_restart(tmp_path: Path) -> None:
    """--log-level and --log-format are set up once, at start: a reload that
    changes them says so (it answered 'unchanged', as if nothing was)."""
    cfg = write(tmp_path / "sluice.toml", max_connections=100)
    line = argv(cfg)
    proxy = Proxy(settings_again(line))
    proxy.load = lambda: settings_again(line)
    write(cfg, max_connections=100, log_level="debug", log_format="json")
    outcome = await proxy.reload_from_source("SIGHUP")
    assert outcome.outcome == "unchanged", outcome
    assert outcome.kept == ["--log-level", "--log-format"], outcome


async def test_a_bug_in_reading_the_settings_again_refuses_the_reload(tmp_path: Path) -> None:
    """Anything reading them raises is a refused reload, not the end of a
    running proxy (SIGHUP and the file watch call this)."""
    cfg = write(tmp_path / "sluice.toml", max_connections=100)
    line = argv(cfg)
    proxy = Proxy(settings_again(line))

    def broken() -> Any:
        raise RuntimeError("a bug")

    proxy.load = broken
    outcome = await proxy.reload_from_source("SIGHUP")
    assert outcome.outcome == "refused", outcome
    assert outcome.errors == ["the settings could not be read again: RuntimeError: a bug"]
    assert proxy.generation.number == 1


async def test_with_workers_a_bug_in_reading_the_settings_refuses_it_too(tmp_path: Path) -> None:
    cfg = write(tmp_path / "sluice.toml", max_connections=100)
    supervisor = Supervisor(settings_again(argv(cfg)), 2)

    def broken() -> Any:
        raise RuntimeError("a bug")

    supervisor.load = broken
    outcome = await supervisor.reload_from_source("SIGHUP")
    assert outcome.outcome == "refused", outcome
    assert outcome.errors == ["the settings could not be read again: RuntimeError: a bug"]
