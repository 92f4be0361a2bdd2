"""``python -m sluice.brokers.apache_pulsar run`` (docs/brokers.md) stopped
with SIGTERM while its JVM still comes up: the JVM is stopped and its data
directory removed, as on Ctrl-C, rather than Python dying at once and
leaving both behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.support import gone

pytestmark = pytest.mark.e2e  # starts a JVM


def _java_child(pid: int) -> int | None:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stat = Path(entry.path, "stat").read_text()
                if (
                    int(stat.rsplit(")", 1)[1].split()[1]) == pid
                    and b"java" in Path(entry.path, "cmdline").read_bytes().split(b"\0")[0]
                ):
                    return int(entry.name)
    return None


def test_sigterm_while_the_broker_starts_stops_it_and_removes_its_data() -> None:
    run = subprocess.Popen(
        [sys.executable, "-m", "sluice.brokers.apache_pulsar", "run"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    jvm: int | None = None
    data: Path | None = None
    try:
        deadline = time.monotonic() + 60
        while jvm is None and time.monotonic() < deadline and run.poll() is None:
            jvm = _java_child(run.pid)
            time.sleep(0.02)
        assert jvm is not None, "no JVM started"
        data = Path(os.readlink(f"/proc/{jvm}/cwd"))
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
        assert gone(jvm, timeout=30), "the JVM was left running"
        assert not data.exists(), "its data directory was left"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if jvm is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(jvm, signal.SIGKILL)
            gone(jvm)
        if data is not None and data.name.startswith("sluice-apache-pulsar-"):
            shutil.rmtree(data, ignore_errors=True)
