"""Every benchmark under bench/ answers ``--help`` with its usage.

A reader's first step with a bench is ``--help``; argparse formats help
text with ``%``, so a stray one (a percentage in an f-string) turns that
first step into a traceback. Each script runs in a process of its own,
as a user would run it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(path.name for path in BENCH.glob("*.py"))


def test_the_benches_are_found() -> None:
    assert {"peers.py", "cursus_e2e.py", "hotpath.py"} <= set(SCRIPTS)


@pytest.mark.e2e
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_bench_prints_its_usage(script: str) -> None:
    done = subprocess.run([sys.executable, str(BENCH / script), "--help"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:"), done.stdout[:500]
    assert "Traceback" not in done.stderr
