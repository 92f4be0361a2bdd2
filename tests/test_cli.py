"""The command line as users meet it: help texts, version, and a self-contained checkout."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sluice import __version__
from sluice.commands import _subparsers, build_parser, main
from tests.helpers.support import SLUICE

ROOT = Path(__file__).resolve().parent.parent


def _commands(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command by its words, e.g. "proxy" and "faults add"."""
    found = {}
    for name, sub in _subparsers(parser).items():
        words = f"{prefix} {name}".strip()
        found[words] = sub
        found.update(_commands(sub, words))
    return found


SUBCOMMANDS = sorted(_commands(build_parser()))
# Metavars that name the unit of a numeric option (P: a probability, 0 to 1).
UNITS = {"SECONDS", "BYTES", "N", "PORT", "P"}


def _options(command: str) -> list[argparse.Action]:
    parser = _commands(build_parser())[command]
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def _help_entries(text: str) -> dict[str, str]:
    """Each option's entry in ``--help`` output, by its longest flag, as one line."""
    entries: dict[str, str] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("  -"):
            current = [line.strip()]
            flags = re.findall(r"--?[a-z][a-z0-9-]*", line.split("  ")[1])
            entries[max(flags, key=len)] = ""
            key = max(flags, key=len)
        elif current is not None and line.startswith("    "):
            current.append(line.strip())
        else:
            current = None
            continue
        entries[key] = " ".join(current)
    return entries


def test_every_subcommand_is_covered() -> None:
    assert {"proxy", "inspect", "replay", "serve", "analyze", "demo", "faults add",
            "faults list", "faults remove", "faults clear"} <= set(SUBCOMMANDS)  # fmt: skip


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_states_every_default_and_unit(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*command.split(), "--help"])
    assert exit_.value.code == 0
    entries = _help_entries(capsys.readouterr().out)
    problems = []
    for action in _options(command):
        flag = max(action.option_strings, key=len)
        if not action.help:
            problems.append(f"{flag}: no help text")
            continue
        entry = entries.get(flag)
        assert entry is not None, f"{flag} missing from help"
        if action.nargs != 0 and "default" not in entry:  # switches are off unless given
            problems.append(f"{flag}: help does not state the default: {entry!r}")
        if action.type in (int, float) and action.metavar not in UNITS:
            problems.append(f"{flag}: numeric option without a unit metavar ({action.metavar})")
    assert not problems, "\n".join(problems)


def test_help_shows_the_actual_default_values(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["proxy", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for expected in (
        "--max-connections N client connections open at once; more are refused (default: 10000)",
        "--drain-timeout SECONDS",
        "(default: 20.0)",
        "--max-redirects N",
        "(default: 5)",
    ):
        assert expected in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"sluice {__version__}"


def _repository_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


@pytest.mark.e2e
def test_nothing_refers_outside_the_checkout() -> None:
    """A user's clone has nothing beside it: no file may reach for a sibling directory."""
    # Spelled as patterns so that this file does not match itself.
    outside = re.compile(r"\.\./shar[e]d|shar[e]d/referenc[e]|parent\s*/\s*\"shar[e]d\"")
    files = _repository_files()
    assert len(files) > 50  # the listing saw the repository
    offenders = []
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if outside.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("embedded", ["pulsar-lite", "apache-pulsar"])
@pytest.mark.e2e
def test_demo_runs_on_each_embedded_broker(embedded: str) -> None:
    """`sluice demo` (the README's first command) end to end, on both brokers."""
    done = subprocess.run(
        [*SLUICE, "demo", "--embedded", embedded, "--messages", "40"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "sent 40, received 40, in order" in done.stdout
    assert ", 0 invalid" in done.stdout
    assert f"(embedded {embedded}, pid " in done.stderr
    recording = re.search(r"recording +(\S+)", done.stdout)
    assert recording and Path(recording.group(1)).is_dir()
    shutil.rmtree(recording.group(1))
