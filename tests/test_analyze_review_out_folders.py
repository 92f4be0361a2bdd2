"""`sluice analyze --out DIR`: a folder of DIR named like a table but holding
something else is not written over.

Each table replaces the folder of its name under DIR (``files``,
``connections``, ``frames``, ...): with ``--out`` a folder in use (``--out
.``, ``--out ~/work``), a ``files`` or ``frames`` folder of the user's was
removed with everything in it. Only folders that hold a table (Parquet
parts and Spark's marker files: an earlier run's) are replaced; any other
is said in one line before Spark starts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sluice.commands.analyze import _not_tables
from tests.helpers.support import SLUICE

GOLDEN = Path(__file__).parent / "golden" / "analyze" / "inputs"
SMALL = GOLDEN / "sluice-20261128T172607-bf2cfe0d70e7-0001.sluice"


def test_a_folder_of_other_files_is_not_a_table(tmp_path: Path) -> None:
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "notes.txt").write_text("mine")
    assert _not_tables(str(tmp_path)) == (
        f"--out {tmp_path}: {tmp_path / 'files'} holds files that are no table of an earlier "
        "run (notes.txt): give another --out"
    )


def test_a_file_named_like_a_table_is_not_a_table(tmp_path: Path) -> None:
    (tmp_path / "latency").write_text("mine")
    problem = _not_tables(str(tmp_path))
    assert problem is not None and f"{tmp_path / 'latency'} is a file" in problem


def test_an_earlier_runs_tables_are_replaced(tmp_path: Path) -> None:
    spark = tmp_path / "connections"  # as Spark's writer leaves a table
    spark.mkdir()
    for name in ("_SUCCESS", "._SUCCESS.crc", "part-00000-1f-c000.snappy.parquet",
                 ".part-00000-1f-c000.snappy.parquet.crc"):  # fmt: skip
        (spark / name).write_bytes(b"")
    ours = tmp_path / "frames"  # as the executors leave it, one part cut short by a kill
    ours.mkdir()
    for name in ("_SUCCESS", "part-0123abcd.parquet", "part-empty.parquet",
                 "part-0123abcd.parquet.4242.tmp"):  # fmt: skip
        (ours / name).write_bytes(b"")
    (tmp_path / "http").mkdir()  # an interrupted run's, empty
    (tmp_path / "report.html").write_text("an earlier report")  # replaced, as documented
    (tmp_path / "notes").mkdir()  # no table's name: left alone
    (tmp_path / "notes" / "x.txt").write_text("mine")
    assert _not_tables(str(tmp_path)) is None
    assert _not_tables(str(tmp_path / "not-there-yet")) is None


@pytest.mark.e2e
def test_a_users_folder_is_left_alone(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(SMALL, inputs / SMALL.name)
    work = tmp_path / "work"
    (work / "frames").mkdir(parents=True)
    (work / "frames" / "shot-001.png").write_bytes(b"\x89PNG")
    result = subprocess.run(
        [*SLUICE, "analyze", str(inputs), "--out", str(work), "--master", "local[1]"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert (work / "frames" / "shot-001.png").read_bytes() == b"\x89PNG"
    assert result.stderr == (
        f"sluice analyze: --out {work}: {work / 'frames'} holds files that are no table of an "
        "earlier run (shot-001.png): give another --out\n"
    )
    assert result.returncode == 2
