"""``sluice record anonymize`` given a capture whose file name is not UTF-8
(a directory named in Latin-1): a copy, or one line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_replay_cli import connect_only

SLUICE = str(Path(sys.executable).with_name("sluice"))


@pytest.mark.e2e
def test_a_capture_named_in_latin1_is_anonymized(tmp_path: Path) -> None:
    made = connect_only(tmp_path)
    named = tmp_path / os.fsdecode(b"caf\xe9.sluice")
    made.rename(named)
    out = tmp_path / "out"
    done = subprocess.run([SLUICE, "record", "anonymize", str(named), str(out)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    assert [p.suffix for p in out.iterdir()] == [".sluice"]
