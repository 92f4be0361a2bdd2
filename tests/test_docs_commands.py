"""The `sluice` command lines README.md and docs/*.md show, read as a shell
reads them (a backslash before the end of a line continues it, a quote
runs on across lines, `#` starts a comment), parse with sluice's own
parser: every option a doc names exists, takes the values the doc gives it,
and a copied command is one command. A line that shows some options after
a placeholder (`sluice faults add ... --drop`) shows options of that
command, and what a comment says a command does (`# listens on ...`) is
what its settings make. Their relative links lead to a file that exists,
and their `#anchors` to a heading in it."""

from __future__ import annotations

import argparse
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


def words(command: str) -> list[str] | None:
    """The command's words as the shell passes them, `sluice` first, optional
    parts of a synopsis (`[--open]`) taken as given; None for one that runs
    a command of its own (`$(...)`)."""
    # `[--save-dir DIR]` -> `--save-dir DIR`, innermost first.
    while True:
        bare = re.sub(r"(?<=\s)\[(--[^\[\]]*)\]", r"\1", command)
        if bare == command:
            break
        command = bare
    if "$(" in command:
        return None
    tokens = shlex.split(command, comments=True)
    for number, token in enumerate(tokens):
        if token in ENDS:
            return tokens[:number]
    return tokens


def arguments(command: str) -> list[str] | None:
    """The arguments after `sluice`; None for a line with a placeholder
    for some of them (`sluice faults add ... --drop`). One inside a word
    (`./capture/snapshot-…`, `GLOB…`) is the reader's part of that word, and
    one in a comment (`# prints: ...`) no part of the command."""
    tokens = words(command)
    if tokens is None or any(token in PLACEHOLDERS for token in tokens):
        return None
    marks = "|".join(map(re.escape, PLACEHOLDERS))
    return [re.sub(marks, "x", token) for token in tokens[1:]]


def variants(args: list[str]) -> list[list[str]]:
    """A synopsis's `--payloads filler|hash|none` as one command per value."""
    for number, arg in enumerate(args):
        if re.fullmatch(r"[\w-]+(\|[\w-]+)+", arg):
            return [
                variant
                for value in arg.split("|")
                for variant in variants([*args[:number], value, *args[number + 1 :]])
            ]
    return [args]


def subcommand(parser: argparse.ArgumentParser, names: list[str]) -> argparse.ArgumentParser:
    """The parser of `sluice NAMES...` (`faults add`)."""
    for name in names:
        (choices,) = [
            action.choices
            for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
        ]
        parser = choices[name]
    return parser


def options_after_placeholder(command: str) -> None:
    """`sluice faults add ... --command PONG --drop`: the options shown after
    the placeholder are options of `sluice faults add`, with values it takes
    (what the placeholder stands for, the required ones, left out)."""
    tokens = words(command)
    assert tokens is not None
    (at,) = [number for number, token in enumerate(tokens) if token in PLACEHOLDERS]
    shown = tokens[at + 1 :]
    assert shown and shown[0].startswith("--"), f"no option shown after the placeholder: {command}"
    parser = subcommand(build_parser(), tokens[1:at])
    for action in parser._actions:
        action.required = False
    for group in parser._mutually_exclusive_groups:
        group.required = False
    parsed = parser.parse_args(shown)
    for token in shown:
        if token.startswith("--"):
            action = parser._option_string_actions[token.partition("=")[0]]
            assert getattr(parsed, action.dest) != action.default, f"{token} took no value"


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
    try:
        if args is None:  # "sluice faults add ... --drop": some options, not a command
            options_after_placeholder(command)
        else:
            for variant in variants(args):
                parsed = build_parser().parse_args(variant)
                assert parsed.sluice_command == args[0]
    except SystemExit as exc:
        pytest.fail(f"{doc}: {command!r}: exit {exc.code}: {capsys.readouterr().err.strip()}")


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


# The files a doc's command names are the reader's (keys, certificates, a
# token): "no such file: ca.pem", "--admin-token-file admin-token: No such
# file or directory", "key 'payments' (payments.pub.pem): cannot read it: ...".
MISSING_FILE = re.compile(
    r"no such file: (\S+)$|([^\s()]+)\)?: (?:cannot read it: )?No such file or directory$"
)


def shown_failing(command: str) -> bool:
    return any(command == shown for _, shown, _ in transcripts())


@pytest.mark.parametrize(
    "command",
    [
        c
        for _, c in all_commands()
        if c.startswith("sluice proxy ") and arguments(c) is not None and not shown_failing(c)
    ],
)
def test_a_proxy_the_docs_show_would_start(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refused only for a file of the reader's that is not here, one the
    # command names: not, say, a --broker that is the proxy's own listener,
    # or a file of sluice's own it looks for.
    monkeypatch.chdir(tmp_path)
    said = _proxy_config(command)
    if said:
        missing = MISSING_FILE.search(said)
        assert missing, said
        name = next(group for group in missing.groups() if group)
        args = arguments(command)
        assert args is not None and any(name in arg for arg in args), said
        assert not Path(name).exists(), said


def test_a_proxy_the_docs_show_listens_where_they_say() -> None:
    # proxy.md: `sluice proxy --broker ...   # listens on 127.0.0.1:6650`
    said = [
        (c, re.search(r"# listens on (\S+)", c))
        for _, c in all_commands()
        if c.startswith("sluice proxy ")
    ]
    promised = [(c, m.group(1)) for c, m in said if m]
    assert promised
    for command, address in promised:
        args = arguments(command)
        assert args is not None
        listen = config_from(build_parser().parse_args(args)).listen
        assert listen is not None and f"{listen.host}:{listen.port}" == address, command


def test_a_view_the_docs_show_serves_where_they_say() -> None:
    # view.md: `sluice view ./capture   # http://127.0.0.1:8088/ (--listen HOST:PORT ...)`
    said = [
        (c, re.search(r"# http://([^/\s]+)/", c))
        for _, c in all_commands()
        if c.startswith("sluice view ")
    ]
    promised = [(c, m.group(1)) for c, m in said if m]
    assert promised
    for command, address in promised:
        args = arguments(command)
        assert args is not None and "--listen" not in args
        assert build_parser().parse_args(args).listen == address, command


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
