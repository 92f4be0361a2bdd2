"""``--broker-ports-file`` is one proxy's: two proxies sharing one would
give brokers ports the other does not listen on (the second cannot listen
on a port the first holds, and leaves that broker's URLs unrewritten), and
rewrite each other's lines. A second proxy is refused in one line naming
the file, alone or with ``--workers``; once the first has stopped, the
file is free. The workers of one proxy share it as before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice.addresses import Address
from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.errors import ConfigError
from sluice.proxy.shared import SharedBrokerPorts, hold_ports_file
from tests.helpers.support import kill_with_workers, start_proxy, worker_pids
from tests.test_proxy_e2e import run_cli


def test_a_held_ports_file_refuses_a_second_holder_not_its_workers(tmp_path: Path) -> None:
    path = tmp_path / "ports"
    first = SharedBrokerPorts(path, held=True)
    with pytest.raises(ConfigError) as caught:
        SharedBrokerPorts(path, held=True)
    assert str(caught.value) == (
        f"--broker-ports-file {path}: another sluice proxy is using it "
        "(each proxy needs a file of its own)"
    )
    with pytest.raises(ConfigError):
        hold_ports_file(path)
    first.close()
    # A supervisor holds it; its workers give ports under a lock of their own.
    fd = hold_ports_file(path)
    try:
        lock = tmp_path / "lock"
        one, two = SharedBrokerPorts(path, lock=lock), SharedBrokerPorts(path, lock=lock)
        assert one.assign(Address("b1", 6650), [7000, 7001]) == 7000
        assert two.assign(Address("b1", 6650), [7000, 7001]) == 7000
        assert two.assign(Address("b2", 6650), [7000, 7001]) == 7001
        one.close()
        two.close()
    finally:
        os.close(fd)


def test_a_second_proxy_on_one_ports_file_is_refused(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    path = tmp_path / "broker-ports"
    low = free_port()
    keep = ("--listener-ports", f"{low}-{low + 3}", "--broker-ports-file", str(path))
    first = start_proxy(broker.url, tmp_path, *keep)
    try:
        for workers in ("1", "2"):
            result = run_cli("proxy", "--broker", broker.url, "--listen",
                             f"127.0.0.1:{free_port()}", "--workers", workers, *keep)  # fmt: skip
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 1 and len(lines) == 1, result.stderr
            assert lines[0].endswith(
                f"--broker-ports-file {path}: another sluice proxy is using it "
                "(each proxy needs a file of its own)"
            ), result.stderr
        assert first.terminate() == 0
    finally:
        first.kill()
    # Free once the first has stopped: a proxy with workers takes it.
    second = start_proxy(broker.url, tmp_path, "--workers", "2", *keep)
    pids: dict[int, int] = {}
    try:
        pids = worker_pids(second, 2)
        assert len(pids) == 2, second.log()
    finally:
        kill_with_workers(second, pids)
