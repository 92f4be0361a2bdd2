"""`sluice analyze --out`: a folder that cannot be made is said before Spark starts."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.support import SLUICE

GOLDEN = Path(__file__).parent / "golden" / "analyze" / "inputs"
SMALL = GOLDEN / "sluice-20261128T172607-bf2cfe0d70e7-0001.sluice"


@pytest.mark.e2e
def test_an_out_folder_that_cannot_be_made_is_said_at_once(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(SMALL, inputs / SMALL.name)
    blocker = tmp_path / "taken"
    blocker.write_text("a file, not a folder")
    out = blocker / "analysis"
    started = time.monotonic()
    result = subprocess.run(
        [*SLUICE, "analyze", str(inputs), "--out", str(out), "--master", "local[1]"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.stderr == (
        f"sluice analyze: --out {out}: cannot be made (Not a directory: {blocker})\n"
    )
    assert result.returncode == 2
    assert time.monotonic() - started < 5  # no Spark started
