"""`sluice analyze`: a local name with Hadoop's glob characters is that name.

Spark globs every path it reads: a folder ``run[1]`` (or ``a*b``, ``x{y}``,
``what?``) was taken for a pattern, matched nothing, and the job failed with
``[PATH_NOT_FOUND] Path does not exist: file:/…/run[1]``; an ``--out`` of
such a name was written, then not found when each table was read back. A
local path is handed to Spark with those characters escaped."""

from __future__ import annotations

import collections
import shutil
import subprocess
from pathlib import Path

import pytest

from sluice.analyze.job import literal
from sluice.analyze.standalone import loopback_env
from tests.helpers.support import SLUICE
from tests.test_analyze import rows_of

GOLDEN = Path(__file__).parent / "golden" / "analyze" / "inputs"
SEGMENTS = sorted(GOLDEN.glob("sluice-20261128T172607-bf2cfe0d70e7-*.sluice"))


def test_glob_characters_are_escaped() -> None:
    assert literal("/data/run[1]/a*b?{x,y}") == r"/data/run\[1\]/a\*b\?\{x,y\}"
    assert literal("/data/back\\slash") == "/data/back\\\\slash"
    assert literal("/data/plain run#2 %20:x") == "/data/plain run#2 %20:x"


@pytest.mark.e2e
def test_folders_named_like_globs_are_read_and_written(tmp_path: Path) -> None:
    inputs = tmp_path / "run[1]"
    inputs.mkdir()
    for segment in SEGMENTS[:2]:
        shutil.copy(segment, inputs / segment.name)
    named = tmp_path / "what?{3}.sluice"  # a file named: read whatever its name
    shutil.copy(SEGMENTS[2], named)
    out = tmp_path / "out[*]"
    result = subprocess.run(
        [*SLUICE, "analyze", str(inputs), str(named), "--out", str(out), "--master", "local[1]"],
        capture_output=True, text=True, timeout=600, check=False, env=loopback_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    files = {Path(f["file"]).name: f for f in rows_of(out / "files")}
    assert sorted(files) == sorted([*(s.name for s in SEGMENTS[:2]), named.name])
    assert not any(f["damaged"] for f in files.values())
    frames = collections.Counter(Path(f["file"]).name for f in rows_of(out / "frames"))
    assert frames == {name: f["frames"] for name, f in files.items()}
    assert (out / "report.html").is_file()
