"""`sluice analyze --master`: a master URL Spark cannot parse is said at once, in one line.

Spark takes a malformed ``--master`` only once its JVM has started, and says
so with a Java stack trace and a line that does not name the master
(``[JAVA_GATEWAY_EXITED] Java gateway process exited…``). It is said before
Spark starts."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sluice.commands.analyze import master_problem
from tests.helpers.support import SLUICE

GOLDEN = Path(__file__).parent / "golden" / "analyze" / "inputs"
SMALL = GOLDEN / "sluice-20261128T172607-bf2cfe0d70e7-0001.sluice"


@pytest.mark.parametrize(
    "master",
    ["local", "local[2]", "local[*]", "local[4,2]", "local[*, 3]", "local-cluster[2,1,1024]",
     "spark://127.0.0.1:7077", "spark://a:7077,b:7077", "yarn", "k8s://https://k:6443"],
)  # fmt: skip
def test_masters_spark_takes_are_taken(master: str) -> None:
    assert master_problem(master) is None


@pytest.mark.parametrize(
    "master", ["bogus", "local[x]", "spark:/x", "spark://", "spark://h", "locale", ""]
)
def test_masters_spark_cannot_parse_are_said_so(master: str) -> None:
    problem = master_problem(master)
    assert problem is not None and problem.startswith(f"--master {master!r}: ")
    assert "\n" not in problem


def analyze(tmp_path: Path, master: str) -> tuple[subprocess.CompletedProcess[str], float]:
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(SMALL, inputs / SMALL.name)
    started = time.monotonic()
    result = subprocess.run(
        [*SLUICE, "analyze", str(inputs), "--out", str(tmp_path / "out"), "--master", master],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return result, time.monotonic() - started


@pytest.mark.e2e
def test_a_master_spark_cannot_parse_is_one_line_before_spark_starts(tmp_path: Path) -> None:
    result, seconds = analyze(tmp_path, "bogus")
    assert result.stderr == (
        "sluice analyze: --master 'bogus': not a Spark master URL (local, local[N], "
        "local[*], spark://HOST:PORT, yarn, k8s://URL)\n"
    )
    assert result.returncode == 2
    assert seconds < 10  # no JVM started
    assert not (tmp_path / "out").exists()
