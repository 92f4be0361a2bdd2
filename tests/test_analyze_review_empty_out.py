"""`sluice analyze --out ""` (an unset variable quoted): refused, not the current folder.

An empty ``--out`` resolved to the folder the command ran in: the tables
were written there, and a ``frames`` folder in it removed first."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sluice.commands.analyze import _out_problem
from tests.helpers.support import SLUICE

GOLDEN = Path(__file__).parent / "golden" / "analyze" / "inputs"
SMALL = GOLDEN / "sluice-20261128T172607-bf2cfe0d70e7-0001.sluice"


@pytest.mark.parametrize("out", ["", "   "])
def test_an_empty_out_is_a_problem(out: str) -> None:
    said = f"--out {out!r}: an empty path (give the folder for the tables)"
    assert _out_problem(out, out) == said


@pytest.mark.e2e
def test_an_empty_out_leaves_the_current_folder_alone(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(SMALL, inputs / SMALL.name)
    here = tmp_path / "here"
    (here / "frames").mkdir(parents=True)
    (here / "frames" / "mine.txt").write_text("not a table")
    result = subprocess.run(
        [*SLUICE, "analyze", str(inputs), "--out", "", "--master", "local[1]"],
        capture_output=True, text=True, timeout=300, check=False, cwd=here,
    )  # fmt: skip
    assert result.stderr == (
        "sluice analyze: --out '': an empty path (give the folder for the tables)\n"
    )
    assert result.returncode == 2
    assert sorted(p.name for p in here.rglob("*")) == ["frames", "mine.txt"]
