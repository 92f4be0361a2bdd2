"""``sluice faults`` given a rule id that is not UTF-8 (a name typed in a
Latin-1 terminal): the call is made and its outcome said, not a claim that
the endpoint answered something it never did."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.brokers.embedded import free_port

SLUICE = str(Path(sys.executable).with_name("sluice"))


@pytest.mark.e2e
def test_removing_a_rule_whose_id_is_not_utf8_says_what_happened() -> None:
    port = free_port()  # nothing listens there
    argv = [SLUICE, "faults", "remove", "--admin", f"127.0.0.1:{port}", os.fsdecode(b"caf\xe9")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(
        f"sluice faults remove: cannot reach the admin endpoint at 127.0.0.1:{port}: "
    ), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


@pytest.mark.e2e
def test_an_empty_rule_id_is_a_usage_error() -> None:
    """``--id ''`` (an unset variable in a script): refused before any call,
    not a rule added under an id the proxy picks, which the script's later
    ``remove $ID`` cannot name."""
    port = free_port()  # nothing listens there: the refusal comes first
    argv = [SLUICE, "faults", "add", "--admin", f"127.0.0.1:{port}", "--drop", "--id", ""]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "sluice faults: --id is empty: give the rule an id, or no --id\n"
