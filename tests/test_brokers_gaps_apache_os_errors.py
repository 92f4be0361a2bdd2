"""Apache Pulsar's start failing on the file system, as the embedded
broker's did (tests/test_brokers_gaps_os_errors.py): a file where its data
directory should be, a java that cannot be run, a log that cannot be
opened: one line naming the path and the cause (``sluice demo
--embedded apache-pulsar`` says BrokerError, and only that, in one line),
not an OSError's traceback. Root-proof failures (CI runs as root). No JVM
is started: the release is a stand-in, and its java cannot be run."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.brokers import apache_pulsar
from sluice.brokers.apache_pulsar import ApachePulsar, Runtime
from sluice.brokers.embedded import BrokerError


@pytest.fixture
def java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A release "provisioned" whose java has no execute bit."""
    binary = tmp_path / "jdk" / "bin" / "java"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o644)
    release = Runtime("0", tmp_path / "release", ())
    monkeypatch.setattr(apache_pulsar, "provision", lambda say=None: release)
    monkeypatch.setattr(apache_pulsar, "java_binary", lambda: str(binary))
    return binary


def _quiet(**kwargs: object) -> ApachePulsar:
    return ApachePulsar(say=lambda text: None, **kwargs)  # type: ignore[arg-type]


def test_a_file_where_the_data_directory_should_be_is_named(tmp_path: Path, java: Path) -> None:
    where = tmp_path / "data"
    where.write_text("")
    with pytest.raises(BrokerError, match="not a directory") as caught:
        _quiet(data_dir=where).start()
    assert str(where) in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.e2e  # the real exec of the (unrunnable) java
def test_a_java_that_cannot_be_run_is_named(tmp_path: Path, java: Path) -> None:
    broker = _quiet(data_dir=tmp_path / "data")
    with pytest.raises(BrokerError, match="Permission denied") as caught:
        broker.start()
    assert str(java) in str(caught.value) and "\n" not in str(caught.value)
    assert broker.process is None


def test_a_log_that_cannot_be_opened_is_named(tmp_path: Path, java: Path) -> None:
    log = tmp_path / "broker.log"
    log.mkdir()
    with pytest.raises(BrokerError, match="Is a directory") as caught:
        _quiet(data_dir=tmp_path / "data", log_path=log).start()
    assert str(log) in str(caught.value) and "\n" not in str(caught.value)
