"""The embedded broker's start failing on the file system (a binary that
cannot be run, a data directory that cannot be made, a log that cannot be
opened): one line that names the path and the cause, not a traceback.

Permissions do not bite root (the CI runs as root), so the failures here
are ones that do: a broker binary without the execute bit (exec needs one
even for root), a file where the data directory should be, a directory
where the log file should be."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.brokers import embedded
from sluice.brokers.embedded import BrokerError, EmbeddedBroker


def test_a_file_where_the_data_directory_should_be_is_named(tmp_path: Path) -> None:
    where = tmp_path / "data"
    where.write_text("not a directory")
    broker = EmbeddedBroker(data_dir=where)
    with pytest.raises(BrokerError) as caught:
        broker.start()
    message = str(caught.value)
    assert "\n" not in message
    assert str(where) in message and "not a directory" in message, message
    assert broker.process is None
    assert where.read_text() == "not a directory"  # the caller's, left alone


def test_a_directory_below_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    where = tmp_path / "file" / "data"
    with pytest.raises(BrokerError, match="Not a directory") as caught:
        EmbeddedBroker(data_dir=where).start()
    assert str(where) in str(caught.value)


def test_a_log_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    log.mkdir()
    broker = EmbeddedBroker(data_dir=tmp_path / "data", log_path=log)
    with pytest.raises(BrokerError, match="Is a directory") as caught:
        broker.start()
    assert str(log) in str(caught.value) and "\n" not in str(caught.value)
    assert broker.process is None


def _unrunnable_pulsar_lite(tmp_path: Path) -> Path:
    """A pulsar_lite package whose broker binary has no execute bit."""
    package = tmp_path / "site" / "pulsar_lite"
    (package / "bin").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    binary = package / "bin" / "pulsar-lite"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o644)
    return binary


@pytest.mark.e2e  # runs the real exec of the binary
def test_a_binary_that_cannot_be_run_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = _unrunnable_pulsar_lite(tmp_path)
    monkeypatch.setattr(embedded, "broker_binary", lambda: binary)
    broker = EmbeddedBroker(data_dir=tmp_path / "data")
    with pytest.raises(BrokerError, match="Permission denied") as caught:
        broker.start()
    assert str(binary) in str(caught.value) and "\n" not in str(caught.value)
    assert broker.process is None


@pytest.mark.e2e  # runs the sluice command
def test_sluice_demo_says_a_binary_that_cannot_be_run_in_one_line(tmp_path: Path) -> None:
    binary = _unrunnable_pulsar_lite(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(binary.parents[2]), os.getcwd()])}
    result = subprocess.run(
        [sys.executable, "-m", "sluice", "demo", "--messages", "2"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, env=env,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [x for x in result.stderr.splitlines() if not x.startswith("[demo] ")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sluice demo: ") and str(binary) in lines[0], lines
    assert "Permission denied" in lines[0], lines
    assert result.stdout == ""
