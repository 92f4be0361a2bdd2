"""The driver JVM's class cache (sluice/analyze/jvm.py): the first run
makes the archive, put in place only once its JVM exited cleanly; later
runs map it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sluice.analyze import jvm
from sluice.analyze.jvm import ClassCache, class_cache
from tests.helpers.support import SLUICE
from tests.test_analyze import read_tables

GOLDEN = Path(__file__).parent / "golden" / "analyze" / "inputs"


def exiting(code: int) -> subprocess.Popen[bytes]:
    """A process that waits for its stdin to end, as the gateway's JVM does,
    then exits with ``code``."""
    script = f"import sys; sys.stdin.read(); sys.exit({code})"
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)


@pytest.mark.e2e
def test_a_part_from_a_jvm_that_failed_never_gets_the_archives_name(tmp_path: Path) -> None:
    cache = ClassCache(tmp_path / "driver-k.jsa", tmp_path / "driver-k.1.part")
    assert cache.making is not None
    cache.making.write_bytes(b"half an archive")  # a JVM that maps it dies
    assert not cache.keep(exiting(1))
    assert not cache.archive.exists() and not cache.making.exists()


@pytest.mark.e2e
def test_a_part_from_a_jvm_that_exited_cleanly_becomes_the_archive(tmp_path: Path) -> None:
    cache = ClassCache(tmp_path / "driver-k.jsa", tmp_path / "driver-k.1.part")
    assert cache.making is not None
    cache.making.write_bytes(b"an archive")
    assert cache.keep(exiting(0))
    assert cache.archive.read_bytes() == b"an archive" and not cache.making.exists()


def test_an_archive_there_is_mapped_and_none_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path))
    assert class_cache(os.environ) is None  # a first run: only its mark
    (mark,) = (tmp_path / "spark").iterdir()
    assert mark.suffix == ".seen"
    first = class_cache(os.environ)
    assert first is not None and first.making is not None
    assert f"-XX:ArchiveClassesAtExit={first.making}" in first.java_options()
    first.archive.write_bytes(b"made")
    again = class_cache(os.environ)
    assert again == ClassCache(first.archive, None)
    assert f"-XX:SharedArchiveFile={first.archive} -Xshare:auto" in again.java_options()


def test_no_cache_when_turned_off_under_spark_submit_or_on_a_path_spark_splits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "cache"))
    assert class_cache(os.environ) is None  # the first run's mark
    assert class_cache(os.environ) is not None
    assert class_cache({**os.environ, "SLUICE_SPARK_CLASS_CACHE": "off"}) is None
    assert class_cache({**os.environ, "PYSPARK_GATEWAY_PORT": "4040"}) is None
    assert class_cache({**os.environ, "JAVA_HOME": str(tmp_path / "no-java")}) is None
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "a cache"))
    assert class_cache(os.environ) is None


def test_making_an_archive_keeps_the_ones_used_last_and_young_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "spark"
    folder.mkdir()
    for age, name in enumerate(["driver-a.jsa", "driver-b.jsa", "driver-c.jsa", "driver-d.jsa"]):
        (folder / name).write_bytes(b"x")
        os.utime(folder / name, (1e9 - age * 100, 1e9 - age * 100))  # a: used last
    (folder / "driver-a.9.part").write_bytes(b"a dead run's")
    os.utime(folder / "driver-a.9.part", (1e9, 1e9))
    (folder / "driver-b.10.part").write_bytes(b"a run still writing")
    assert class_cache(os.environ) is None  # the first run's mark
    (mark,) = folder.glob("*.seen")
    made = class_cache(os.environ)
    assert made is not None and made.making is not None
    kept = ["driver-a.jsa", "driver-b.jsa"]  # the KEPT - 1 used last, and the one made
    assert len(kept) + 1 == jvm.KEPT
    assert sorted(p.name for p in folder.iterdir()) == sorted([*kept, "driver-b.10.part",
                                                              mark.name])  # fmt: skip


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two runs on a fresh cache: the first makes the archive, the second
    maps it; each logs where the JVM loaded Spark's classes from."""
    tmp = tmp_path_factory.mktemp("class-cache")
    runs: dict[str, Any] = {"cache": tmp / "cache"}
    # A run before these (the mark a first run leaves: it makes no archive).
    assert class_cache({**os.environ, "SLUICE_CACHE_DIR": str(runs["cache"])}) is None
    for name in ("first", "second"):
        loaded = tmp / f"{name}-classes.log"
        env = {**os.environ, "SLUICE_CACHE_DIR": str(runs["cache"]),
               "SLUICE_SPARK_DRIVER_JAVA_OPTIONS":
                   f"-XX:TieredStopAtLevel=1 -Xlog:class+load=info:file={loaded}"}  # fmt: skip
        result = subprocess.run(
            [*SLUICE, "analyze", str(GOLDEN), "--out", str(tmp / name), "--master", "local[1]"],
            capture_output=True, text=True, timeout=600, env=env, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = {"result": result, "out": tmp / name, "loaded": loaded.read_text()}
    return runs


CONTEXT = "org.apache.spark.SparkContext source:"


@pytest.mark.e2e
def test_the_first_run_makes_the_archive_and_says_so(two_runs: dict[str, Any]) -> None:
    first = two_runs["first"]
    said = first["result"].stderr
    assert "keeping the JVM's classes for faster starts (once)" in said
    folder = two_runs["cache"] / "spark"
    (archive,) = folder.glob("driver-*.jsa")
    assert sorted(p.suffix for p in folder.iterdir()) == [".jsa", ".seen"]  # no part left
    assert archive.stat().st_size > 10_000_000
    assert f"{CONTEXT} shared objects file (top)" not in first["loaded"]
    assert CONTEXT in first["loaded"]
    # The JVM's own lines about the archive stay out of the user's terminal.
    assert "[cds]" not in said + first["result"].stdout


@pytest.mark.e2e
def test_the_second_run_maps_it_and_gives_the_same_tables(two_runs: dict[str, Any]) -> None:
    second = two_runs["second"]
    assert "keeping the JVM's classes" not in second["result"].stderr
    assert f"{CONTEXT} shared objects file (top)" in second["loaded"]
    assert read_tables(second["out"]) == read_tables(two_runs["first"]["out"])
