"""An empty path on the command line (an unset ``$REC`` in a script, an
empty SLUICE_RECORD in a compose file): one line and status 2, not the
working directory in its place (recording into it, reading every capture
in it, or a message about "." the user never wrote)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_replay_cli import connect_only

SLUICE = str(Path(sys.executable).with_name("sluice"))


CASES: list[tuple[list[str], dict[str, str], str]] = [
    (["inspect", ""], {}, "sluice inspect: argument recording: "),
    (["inspect", "--pcap", "", "REC"], {}, "sluice inspect: argument --pcap: "),
    (["replay", "--broker", "pulsar://127.0.0.1:1", "--transcript", "", "REC"], {},
     "sluice replay: argument --transcript: "),
    (["serve", ""], {}, "sluice serve: argument recording: "),
    (["record", "anonymize", "REC", ""], {}, "sluice record anonymize: argument OUT: "),
    (["record", "anonymize", "REC", "out", "--report", ""], {},
     "sluice record anonymize: argument --report: "),
    (["faults", "list", "--admin", "127.0.0.1:1", "--admin-token-file", ""], {},
     "sluice faults list: argument --admin-token-file: "),
    (["proxy", "--broker", "pulsar://127.0.0.1:1", "--record", "", "--print-config"], {},
     "sluice proxy: argument --record: "),
    (["proxy", "--broker", "pulsar://127.0.0.1:1", "--print-config"], {"SLUICE_RECORD": ""},
     "sluice proxy: SLUICE_RECORD: "),
]  # fmt: skip


@pytest.mark.e2e
@pytest.mark.parametrize(("argv", "env", "said"), CASES)
def test_an_empty_path_is_a_usage_error(
    tmp_path: Path, argv: list[str], env: dict[str, str], said: str
) -> None:
    recording = connect_only(tmp_path)  # the working directory holds a capture
    argv = [str(recording) if word == "REC" else word for word in argv]
    done = subprocess.run([SLUICE, *argv], capture_output=True, text=True, timeout=30,
                          cwd=tmp_path, env={**os.environ, **env})  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(said), done.stderr
    assert "an empty path names no file" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [recording.name]  # nothing written
