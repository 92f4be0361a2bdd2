"""``sluice demo`` stopped (SIGTERM) while the official client is stuck on a
broker that does not answer: the demo leaves the client's thread behind
after a few seconds, as it says, and then exits with SIGTERM's status, not
with the C++ client's "terminate called without an active exception" and
SIGABRT (134) as the interpreter tore the abandoned client down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.poll import wait_for_text
from tests.helpers.support import gone

pytestmark = pytest.mark.e2e  # runs the demo and its broker


def test_a_demo_stopped_while_its_client_is_stuck_exits_as_stopped(tmp_path: Path) -> None:
    err = tmp_path / "stderr"
    with open(err, "wb") as stderr:
        demo = subprocess.Popen(
            [sys.executable, "-m", "sluice", "demo", "--messages", "20000",
             "--record", str(tmp_path / "rec")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    broker = 0
    try:
        wait_for_text(demo, err, "one by one", 60, "the one-by-one sends")
        line = next(x for x in err.read_text().splitlines() if "(embedded pulsar-lite, pid" in x)
        broker = int(line.rsplit("pid ", 1)[1].rstrip(")"))
        os.kill(broker, signal.SIGSTOP)  # a broker that answers nothing any more
        time.sleep(0.5)  # the client's sends now wait for it (not a state polled)
        demo.send_signal(signal.SIGTERM)
        status = demo.wait(timeout=60)
        said = err.read_text()
        assert "terminate called" not in said, said[-2000:]
        assert status == 128 + signal.SIGTERM, said[-2000:]
        assert gone(broker), "the broker was left"
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        if broker:
            for signum in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(broker, signum)
                except ProcessLookupError:
                    break
