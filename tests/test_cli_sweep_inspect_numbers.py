"""``sluice inspect --connection`` with a number no connection has (below
zero, past any id): one line and status 2, not an empty listing that reads
as "nothing happened on that connection"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_replay_cli import connect_only

SLUICE = str(Path(sys.executable).with_name("sluice"))


@pytest.mark.e2e
@pytest.mark.parametrize("number", ["-1", "99999999999999999999999"])
def test_a_connection_number_no_connection_has_is_a_usage_error(
    tmp_path: Path, number: str
) -> None:
    recording = connect_only(tmp_path)
    done = subprocess.run([SLUICE, "inspect", "--connection", number, str(recording)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(f"sluice inspect: argument --connection: '{number}'"), done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == ""


@pytest.mark.parametrize(
    ("text", "said"),
    [("-1", "a count must not be negative"), ("99999999999999999999999", "too large a count")],
)
def test_a_count_out_of_range_says_which_way(text: str, said: str) -> None:
    import argparse

    from sluice.config import count

    with pytest.raises(argparse.ArgumentTypeError, match=said):
        count(text)
