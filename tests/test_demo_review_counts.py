"""``sluice demo`` stopped (SIGTERM) while its batched sends are being
confirmed: the line it ends with counts the messages the broker confirmed,
batched ones included, not only the ones sent one by one (the batched
ones were added up only once all were confirmed)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.poll import wait_for_text

pytestmark = pytest.mark.e2e  # runs the demo and its broker

SINGLE = 20000  # the demo sends half of --messages one by one


def _summary(record: Path) -> str:
    return subprocess.run(
        [sys.executable, "-m", "sluice", "inspect", str(record), "--summary"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip


def test_the_stopped_line_counts_confirmed_batched_sends(tmp_path: Path) -> None:
    err = tmp_path / "stderr"
    record = tmp_path / "rec"
    with open(err, "wb") as stderr:
        demo = subprocess.Popen(
            [sys.executable, "-m", "sluice", "demo", "--messages", str(2 * SINGLE),
             "--record", str(record)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        wait_for_text(demo, err, "in batches", 120, "the batched sends")
        time.sleep(0.5)  # a moment into the batched sends (the check below is exact)
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=60) == 128 + signal.SIGTERM
        line = err.read_text().splitlines()[-1]
        sent = re.search(r"stopped after sending (\d+)", line)
        assert sent, line
        # Each batch the broker confirmed (one SEND_RECEIPT, past the
        # one-by-one sends' own) holds at least one message; two may be
        # confirmed but not yet answered to the client when it stopped.
        receipts = re.search(r"SEND_RECEIPT\s+broker_to_client\s+(\d+)", _summary(record))
        batches = int(receipts.group(1)) - SINGLE if receipts else 0
        assert batches > 2, "no batch confirmed before the stop: stopped too early"
        assert int(sent.group(1)) >= SINGLE + batches - 2, line
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
