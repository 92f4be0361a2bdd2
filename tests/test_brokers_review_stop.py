"""Stopping a broker we started (``terminate``), interrupted by a second
Ctrl-C or SIGTERM while it waits for the process to exit: the process is not
left running. (Apache Pulsar takes seconds to stop; a user presses Ctrl-C
again.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import FrameType

import pytest

from sluice.brokers.embedded import terminate
from tests.helpers.support import gone

pytestmark = pytest.mark.e2e  # starts a process

# A process slow to stop: it ignores SIGTERM (as a JVM busy shutting down
# seems to), says it is ready, then sleeps.
SLOW = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_second_interrupt_while_stopping_kills_the_process() -> None:
    process = subprocess.Popen([sys.executable, "-c", SLOW], stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"

        def interrupt(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        started = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt):
                terminate(process, timeout=20.0)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert time.monotonic() - started < 10
        assert gone(process.pid, timeout=5), "the process was left running"
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
