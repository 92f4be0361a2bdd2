"""A command whose standard output cannot be written (``> file`` on a full
disk, here /dev/full): one line saying the output is lost and status 1,
not a traceback of the write."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_replay_cli import connect_only

SLUICE = str(Path(sys.executable).with_name("sluice"))


@pytest.mark.e2e
@pytest.mark.parametrize("view", [[], ["--json"], ["--summary"]])
def test_a_full_standard_output_is_one_line_and_status_1(tmp_path: Path, view: list[str]) -> None:
    recording = connect_only(tmp_path)
    with open("/dev/full", "w") as full:
        done = subprocess.run([SLUICE, "inspect", *view, str(recording)], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60)  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "sluice inspect: standard output: No space left on device (what it shows is incomplete)\n"
    )
