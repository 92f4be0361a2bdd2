"""`sluice analyze` without Java: said in one line before Spark starts.

A local Spark needs a JVM; without one PySpark printed ``JAVA_HOME is not
set`` and then ``[JAVA_GATEWAY_EXITED] Java gateway process exited before
sending its port number`` (exit 1), which does not say what to install."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sluice.commands.analyze import java_problem
from tests.helpers.support import SLUICE

GOLDEN = Path(__file__).parent / "golden" / "analyze" / "inputs"
SMALL = GOLDEN / "sluice-20261128T172607-bf2cfe0d70e7-0001.sluice"


def fake_java(folder: Path) -> Path:
    folder.mkdir(parents=True)
    java = folder / "java"
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    return java


def test_no_java_anywhere_is_said(tmp_path: Path) -> None:
    assert java_problem({"PATH": str(tmp_path)}) == (
        "a local Spark needs Java 17 or later: no java on PATH and JAVA_HOME is not set "
        "(or give --remote sc://HOST:PORT: the server runs Spark)"
    )


def test_java_on_the_path_is_enough(tmp_path: Path) -> None:
    fake_java(tmp_path / "bin")
    assert java_problem({"PATH": f"/nonexistent:{tmp_path / 'bin'}"}) is None


def test_java_home_is_what_spark_uses(tmp_path: Path) -> None:
    fake_java(tmp_path / "jdk" / "bin")
    assert java_problem({"PATH": "", "JAVA_HOME": str(tmp_path / "jdk")}) is None
    assert java_problem({"PATH": "", "JAVA_HOME": str(tmp_path / "none")}) == (
        f"a local Spark needs Java 17 or later: JAVA_HOME is {tmp_path / 'none'}, "
        "which has no bin/java"
    )


def test_under_spark_submit_the_jvm_is_there() -> None:
    assert java_problem({"PATH": "", "PYSPARK_GATEWAY_PORT": "4242"}) is None


@pytest.mark.e2e
def test_analyze_without_java_says_so_at_once(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(SMALL, inputs / SMALL.name)
    tools = tmp_path / "tools"  # everything on PATH but java
    tools.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name != "java" and not (tools / name).exists():
                (tools / name).symlink_to(Path(folder, name))
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"} | {"PATH": str(tools)}
    result = subprocess.run(
        [*SLUICE, "analyze", str(inputs), "--out", str(tmp_path / "out"), "--master", "local[1]"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert result.stderr == (
        "sluice analyze: a local Spark needs Java 17 or later: no java on PATH and JAVA_HOME "
        "is not set (or give --remote sc://HOST:PORT: the server runs Spark)\n"
    )
    assert result.returncode == 2
