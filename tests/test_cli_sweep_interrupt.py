"""Ctrl-C while the ``sluice`` command starts (Python loading its modules,
a second or two on a busy machine): one line and a shell's status for
SIGINT, as once the command runs, not a traceback of the import it cut."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SLUICE = str(Path(sys.executable).with_name("sluice"))


def _interrupted_while_importing(
    argv: list[str], marker: str, command: tuple[str, ...] = (SLUICE,)
) -> tuple[int, list[str]]:
    """``sluice ARGV`` sent SIGINT once Python reports (PYTHONPROFILEIMPORTTIME)
    that it imported a module whose line holds ``marker``: its status and
    stderr lines other than the import report's."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    process = subprocess.Popen([*command, *argv], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, env=env)  # fmt: skip
    assert process.stderr is not None
    said: list[str] = []
    deadline = time.monotonic() + 60
    try:
        for raw in process.stderr:
            line = raw.decode(errors="replace")
            said.append(line)
            if marker in line:
                process.send_signal(signal.SIGINT)
                break
            assert time.monotonic() < deadline, "the command never imported " + marker
        said += [raw.decode(errors="replace") for raw in process.stderr]
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return code, [line.rstrip("\n") for line in said if not line.startswith("import time:")]


@pytest.mark.e2e
@pytest.mark.parametrize("marker", ["sluice.config", "sluice.commands.analyze"])
def test_ctrl_c_while_starting_is_one_line_and_status_130(tmp_path: Path, marker: str) -> None:
    code, lines = _interrupted_while_importing(["inspect", str(tmp_path)], marker)
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    assert code == 130, (code, lines)
    assert lines == ["sluice inspect: interrupted"]


@pytest.mark.e2e
def test_ctrl_c_while_python_m_sluice_starts_is_one_line_too(tmp_path: Path) -> None:
    code, lines = _interrupted_while_importing(["inspect", str(tmp_path)],
                                               "sluice.commands.analyze",
                                               (sys.executable, "-m", "sluice"))  # fmt: skip
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    assert (code, lines) == (130, ["sluice inspect: interrupted"])
