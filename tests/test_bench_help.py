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
SCRIPTS = sorted(path.name for path in BENCH.glob("*.py") if path.name != "__init__.py")


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


@pytest.mark.e2e
def test_a_source_changed_in_python_or_rust_says_so(tmp_path: Path) -> None:
    """What a bench prints of the tree it ran: the commit, and whether the
    sources differ from it (an uncommitted Rust change is built into the
    extension and counts as much as a Python one)."""
    from tests.helpers.support import describe_source

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c",
                        "user.email=t@t", *args], check=True, capture_output=True)  # fmt: skip

    for name in ("sluice/a.py", "rust/src/a.rs", "docs/a.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    clean = describe_source(tmp_path)
    assert clean.startswith(f"{tmp_path} at ") and "uncommitted" not in clean
    (tmp_path / "docs/a.md").write_text("2\n")
    assert describe_source(tmp_path) == clean  # not a source
    for name in ("rust/src/a.rs", "sluice/a.py"):
        (tmp_path / name).write_text("2\n")
        assert describe_source(tmp_path) == clean + " + uncommitted changes"
        git("checkout", "-q", "--", name)


@pytest.mark.e2e
def test_the_readme_names_every_option_of_peers() -> None:
    """bench/README.md's usage of peers.py (the headline bench) lists every
    option its --help prints (it lacked --starts, and --png, whose default
    is the committed picture)."""
    import re

    usage = run_bench("peers.py", "--help").stdout
    options = set(re.findall(r"(--[a-z][a-z-]+)", usage)) - {"--help"}
    readme = (BENCH / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if "bench/peers.py [" in ln)
    assert options and options <= set(re.findall(r"(--[a-z][a-z-]+)", line)), (options, line)


def test_a_broker_that_cannot_start_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import bench
    from sluice.brokers.embedded import BrokerError

    def main() -> int:
        raise BrokerError("cannot run the broker /x/pulsar-lite: Permission denied")

    with pytest.raises(SystemExit) as exited:
        bench.run(main)
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.endswith(": cannot run the broker /x/pulsar-lite: Permission denied\n")
    assert err.count("\n") == 1 and "Traceback" not in err
