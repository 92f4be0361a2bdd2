"""``sluice demo --embedded apache-pulsar`` with a cache it cannot use: a
cache directory that is not one (a file where it should be, a read-only
home), or a classpath listing that is not text any more. Each is one line
that says what is wrong, not a Python traceback."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.brokers.apache_pulsar import POM, pulsar_version

pytestmark = pytest.mark.e2e  # runs the sluice command


def _demo(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", "demo", "--embedded", "apache-pulsar",
         "--messages", "2"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
        env={**os.environ, **env},
    )  # fmt: skip


def _said(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [x for x in result.stderr.splitlines() if not x.startswith("[demo] ")]


def test_a_cache_directory_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.write_text("not a directory\n")
    result = _demo({"SLUICE_CACHE_DIR": str(cache)})
    assert result.returncode == 1, result.stderr
    lines = _said(result)
    assert "Traceback" not in result.stderr
    assert len(lines) == 1 and lines[0].startswith("sluice demo: "), result.stderr
    assert str(cache) in lines[0] and "SLUICE_CACHE_DIR" in lines[0]


def test_a_classpath_listing_that_is_not_text_is_fetched_again(tmp_path: Path) -> None:
    home = tmp_path / f"pulsar-{pulsar_version()}"
    home.mkdir()
    (home / "pom.sha256").write_text(hashlib.sha256(POM.read_bytes()).hexdigest() + "\n")
    (home / "classpath.txt").write_bytes(b"\xff\xfe\x00garbage\x80")
    java = Path(os.path.realpath(subprocess.check_output(["sh", "-c", "command -v java"],
                                                         text=True).strip()))  # fmt: skip
    # No Maven on the PATH: fetching again is said to need it (rather than
    # fetching 240 MB here).
    result = _demo(
        {"SLUICE_CACHE_DIR": str(tmp_path), "PATH": str(tmp_path / "bin"),
         "JAVA_HOME": str(java.parent.parent)}
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert _said(result) == ["sluice demo: fetching Apache Pulsar needs Maven (mvn): "
                             "./dev setup installs it"], result.stderr  # fmt: skip
