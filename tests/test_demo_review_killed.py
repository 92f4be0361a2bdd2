"""``sluice demo --embedded apache-pulsar`` killed outright (SIGKILL: the
OOM killer, ``kill -9``, a container's runtime past its grace period): its
Apache Pulsar JVM goes with it, as the pulsar-lite broker of the default
demo does, rather than staying up with nobody to stop it."""

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

pytestmark = pytest.mark.e2e  # starts the demo and its JVM


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stat = Path(entry.path, "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def test_the_jvm_dies_with_a_killed_demo() -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "sluice", "demo", "--embedded", "apache-pulsar",
         "--messages", "2"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    jvm: int | None = None
    data: Path | None = None
    try:
        deadline = time.monotonic() + 60
        while jvm is None and time.monotonic() < deadline and demo.poll() is None:
            for child in _children(demo.pid):
                with contextlib.suppress(OSError):
                    if b"java" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0]:
                        data = Path(os.readlink(f"/proc/{child}/cwd"))
                        jvm = child
            time.sleep(0.05)
        assert jvm is not None, "the demo started no JVM"
        demo.kill()
        demo.wait()
        assert gone(jvm, timeout=30), "the JVM was left running"
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        if jvm is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(jvm, signal.SIGKILL)
            gone(jvm)
        if data is not None and data.name.startswith("sluice-apache-pulsar-"):
            shutil.rmtree(data, ignore_errors=True)
