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


def run_bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / script), *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_benches_are_found() -> None:
    assert {"peers.py", "cursus_e2e.py", "hotpath.py"} <= set(SCRIPTS)


@pytest.mark.e2e
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_bench_prints_its_usage(script: str) -> None:
    done = run_bench(script, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:"), done.stdout[:500]
    assert "Traceback" not in done.stderr


@pytest.mark.e2e
def test_a_checkout_is_taken_as_a_source_to_compare_with(tmp_path: Path) -> None:
    """The benches that run another tree's proxy take a checkout, and say
    why they refuse a directory that is not one. (Each call stops at a later
    check, before starting anything.)"""
    here = str(BENCH.parent)
    fleet = run_bench("fleet.py", "--rounds", "0")  # its default source: this checkout
    assert fleet.returncode == 2 and "--rounds must be at least 1" in fleet.stderr, fleet.stderr
    e2e = run_bench("e2e.py", "--against", here, "--profile", str(tmp_path / "p"))
    assert e2e.returncode == 2 and "profile one proxy at a time" in e2e.stderr, e2e.stderr
    for script, flag in (("fleet.py", "--source"), ("e2e.py", "--against"),
                         ("instructions.py", "--against")):  # fmt: skip
        refused = run_bench(script, flag, str(tmp_path))
        assert refused.returncode == 2, refused.stderr
        assert f"{flag} {tmp_path}: no sluice/commands/__init__.py there" in refused.stderr


@pytest.mark.e2e
def test_syscalls_are_counted_for_the_paced_step_only() -> None:
    refused = run_bench("instructions.py", "--syscalls", "--only", "produce")
    assert refused.returncode == 2, refused.stderr
    assert "--syscalls counts --only along's calls" in refused.stderr
    assert "Traceback" not in refused.stderr
