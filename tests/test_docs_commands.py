"""The `sluice` command lines README.md and docs/*.md show, read as a shell
reads them (a backslash before the end of a line continues it, a quote
runs on across lines, `#` starts a comment), parse with sluice's own
parser: every option a doc names exists, takes the values the doc gives it,
and a copied command is one command. Their relative links lead to a file
that exists, and their `#anchors` to a heading in it."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.commands import build_parser
from sluice.commands.proxy import config_from
from sluice.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMANDS = ("proxy", "faults", "record", "inspect", "view", "demo", "replay", "serve", "analyze")
# What a doc writes for "the rest as above" or "the path it printed": such a
# line shows some options, not a whole command.
PLACEHOLDERS = ("...", "…")
# Where a shell command line ends before its end (a redirect, a pipe, a second command).
ENDS = (">", ">>", "2>", "|", "&&", ";", "&")


def code_lines(text: str) -> Iterator[list[str]]:
    """Each fenced block's lines."""
    block: list[str] | None = None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if block is None:
                block = []
            else:
                yield block
                block = None
        elif block is not None:
            block.append(line)


def shell_commands(lines: list[str]) -> Iterator[str]:
    """The block's command lines as a shell joins them: a backslash right
    before the line's end continues it, and so does a quote still open."""
    pending = ""
    for line in lines:
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        yield pending
        pending = ""
    if pending:
        yield pending


def sluice_commands(path: Path) -> Iterator[str]:
    for block in code_lines(path.read_text()):
        for command in shell_commands(block):
            text = command.strip().removeprefix("$ ")
            first = text.split(maxsplit=2)
            if len(first) >= 2 and first[0] == "sluice" and first[1] in COMMANDS:
                yield text


def arguments(command: str) -> list[str] | None:
    """The arguments after `sluice`, optional parts of a synopsis
    (`[--open]`) taken as given; None for a line with a placeholder."""
    # `[--save-dir DIR]` -> `--save-dir DIR`, innermost first.
    while True:
        bare = re.sub(r"(?<=\s)\[(--[^\[\]]*)\]", r"\1", command)
        if bare == command:
            break
        command = bare
    if any(mark in command for mark in PLACEHOLDERS) or "$(" in command:
        return None
    tokens = shlex.split(command, comments=True)
    for number, token in enumerate(tokens):
        if token in ENDS:
            tokens = tokens[:number]
            break
    return tokens[1:]


def all_commands() -> list[tuple[str, str]]:
    return [(path.name, command) for path in DOCS for command in sluice_commands(path)]


def test_the_docs_show_commands() -> None:
    # The reading above found what it should: a change to it that finds
    # nothing would pass every command.
    found = all_commands()
    assert len(found) > 50
    shown = {command.split()[1] for _, command in found}
    assert shown >= {"proxy", "faults", "record", "inspect", "view", "replay", "serve", "analyze"}


@pytest.mark.parametrize(("doc", "command"), all_commands())
def test_a_command_the_docs_show_parses(
    doc: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = arguments(command)
    if args is None:
        return  # "sluice faults add ... --drop": some options, not a command
    try:
        build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"{doc}: {command!r}: {capsys.readouterr().err.strip()}")


def transcripts() -> list[tuple[str, str, str]]:
    """`$ sluice proxy ...` lines with the line a doc shows it answer."""
    found = []
    for path in DOCS:
        for block in code_lines(path.read_text()):
            for number, line in enumerate(block[:-1]):
                if line.startswith("$ sluice proxy "):
                    found.append((path.name, line.removeprefix("$ "), block[number + 1]))
    return found


def _proxy_config(command: str) -> str:
    """What `sluice proxy` says of the command's settings before it starts
    anything: "" when they make a configuration."""
    args = arguments(command)
    assert args is not None and args[0] == "proxy"
    try:
        config_from(build_parser().parse_args(args))
    except ConfigError as exc:
        return str(exc)
    return ""


# The files a doc's command names are the reader's (keys, certificates, a token).
MISSING_FILE = re.compile(r"no such file|cannot read it", re.IGNORECASE)


@pytest.mark.parametrize(
    "command", [c for _, c in all_commands() if c.startswith("sluice proxy ") and "…" not in c]
)
def test_a_proxy_the_docs_show_would_start(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refused only for a file of the reader's that is not here: not, say, a
    # --broker that is the proxy's own listener.
    monkeypatch.chdir(tmp_path)
    if any(command == shown for _, shown, _ in transcripts()):
        return  # shown failing on purpose, below
    said = _proxy_config(command)
    assert not said or MISSING_FILE.search(said), said


def test_the_docs_show_what_a_proxy_says() -> None:
    found = transcripts()
    assert found
    for doc, command, answer in found:
        said = _proxy_config(command)
        assert f"sluice proxy: {said}" == answer, f"{doc}: {command}"


def test_a_comment_after_a_continuation_ends_the_command() -> None:
    # `--a \    # note` escapes a space, not the end of the line: the
    # command ends there, and its next line is a command of its own.
    lines = [
        "sluice proxy --broker pulsar://b:6650 \\",
        "    --admin 127.0.0.1:9090 \\  # note",
        "--x",
    ]
    commands = list(shell_commands(lines))
    assert len(commands) == 2
    args = arguments(commands[0])
    assert args is not None and args[-1] == " "


def test_a_quote_runs_across_lines() -> None:
    lines = [
        "sluice proxy --broker pulsar://b:6650 \\",
        '  --filter \'schema:{"a": 1,',
        ' "b": 2}\'',
    ]
    (command,) = shell_commands(lines)
    assert arguments(command) == [
        "proxy", "--broker", "pulsar://b:6650", "--filter", 'schema:{"a": 1,\n "b": 2}'
    ]  # fmt: skip


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    inside = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading and not inside:
            name = slug(heading.group(1))
            count = seen.get(name, 0)
            seen[name] = count + 1
            found.add(name if count == 0 else f"{name}-{count}")
    return found


def test_every_relative_link_leads_somewhere() -> None:
    broken = []
    links = 0
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto:
            links += 1
            name, _, anchor = target.partition("#")
            file = (doc.parent / name).resolve() if name else doc
            if not file.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{doc.relative_to(ROOT)}: {target}: no such heading")
    assert links > 50
    assert not broken, "\n".join(broken)


def test_the_anchor_of_a_heading() -> None:
    assert slug("Authentication (`--auth-mode passthrough|proxy`)") == (
        "authentication---auth-mode-passthroughproxy"
    )
    assert slug("Anonymized copies: `sluice record anonymize`") == (
        "anonymized-copies-sluice-record-anonymize"
    )
