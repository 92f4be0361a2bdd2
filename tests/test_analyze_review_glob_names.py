"""`sluice analyze`: a local name with Hadoop's glob characters is that name.

Spark globs every path it reads: a folder ``run[1]`` (or ``a*b``, ``x{y}``,
``what?``) was taken for a pattern, matched nothing, and the job failed with
``[PATH_NOT_FOUND] Path does not exist: file:/…/run[1]``; an ``--out`` of
such a name was written, then not found when each table was read back. A
local path is handed to Spark with those characters escaped."""

from __future__ import annotations

from sluice.analyze.job import literal


def test_glob_characters_are_escaped() -> None:
    assert literal("/data/run[1]/a*b?{x,y}") == r"/data/run\[1\]/a\*b\?\{x,y\}"
    assert literal("/data/back\\slash") == "/data/back\\\\slash"
    assert literal("/data/plain run#2 %20:x") == "/data/plain run#2 %20:x"


# Read and written through Spark: test_analyze.py's `awkward` run, whose
# input folder, named file and output carry these characters.
