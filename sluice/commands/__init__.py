"""The ``sluice`` command line: one module here per command.

``sluice NAME`` is ``sluice/commands/NAME.py``: its options
(``add_arguments``) and what it does with them (``run``), calling into the
package that does the work (``proxy/``, ``recording/``, ``replay/``,
``view/``, ``analyze/``, ``brokers/``). This module builds the parser and
applies settings from the environment and TOML (``sluice/config.py``).
"""

# ruff: noqa: E402 (SIGHUP and SIGINT are held before the imports, which take most of the start)
from __future__ import annotations

import os
import signal
import sys
from types import FrameType

# The exit status of a command stopped by Ctrl-C (a shell's for SIGINT),
# and of one whose standard output was closed when it started (`>&-`).
INTERRUPTED = 128 + 2
NO_STDOUT = 2


def _interrupted_while_starting(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C while the ``sluice`` script loads its modules: one line and a
    shell's status for SIGINT, not the traceback of the import it cut (no
    work has begun: nothing to finish or clean up)."""
    command = next((word for word in sys.argv[1:] if not word.startswith("-")), None)
    name = f"sluice {command}" if command else "sluice"
    os.write(2, f"{name}: interrupted\n".encode(errors="surrogateescape"))
    os._exit(INTERRUPTED)


# Until `main` runs the command, which takes Ctrl-C as KeyboardInterrupt.
# Only in the `sluice` script or `python -m sluice` (a program importing
# Sluice keeps its own handlers) and where SIGINT is not ignored (a shell's
# background job).
if (
    sys.argv
    and (
        os.path.basename(sys.argv[0]) == "sluice"
        or sys.argv[0].endswith(os.path.join("sluice", "__main__.py"))
    )
    and signal.getsignal(signal.SIGINT) is signal.default_int_handler
):
    signal.signal(signal.SIGINT, _interrupted_while_starting)

from sluice.proxy import hangup

# The `sluice` script imports this module first: from now on `sluice proxy`
# takes a SIGHUP as a reload once it serves, not as its end.
hangup.hold_for_script()

import argparse
import contextlib
import io
import select
from pathlib import Path
from typing import Any, NoReturn, TextIO, cast

from sluice import __version__, config
from sluice.errors import ConfigError, leaves


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it already says it.

    Options whose default is "nothing" (None, an empty list) say in their
    own words what happens without them, e.g. "(default: off)".
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            "default" in text
            or not action.option_strings
            or action.nargs == 0
            or action.default in (None, [], argparse.SUPPRESS)
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class Parser(argparse.ArgumentParser):
    """Usage errors as one line (and exit 2), not a usage block; help with
    defaults. Flags are spelt whole: an abbreviation would pass unseen by
    the settings' layers (``config.apply`` asks which flags were given), so a
    list from the environment would be extended by it, not replaced."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def path_arg(text: str) -> Path:
    """The argument type of a file or directory option: a Path, but never
    from an empty string, which Path takes as the working directory (an
    unset ``$REC`` in a script, an empty SLUICE_RECORD: recording into the
    working directory, or reading every capture in it)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no file")
    return Path(text)


def output_problem(path: Path, flag: str, reading: Path) -> str | None:
    """Why ``path`` (the file of option ``flag``) cannot take a command's
    output, in one line; None if it can. Checked before any work: the
    directory it goes in must exist, it must not be a directory, and it
    must not be ``reading`` (or a file in it), which writing would destroy."""
    if path.is_dir():
        return f"{flag} {path}: is a directory"
    if not path.parent.is_dir():
        return f"{flag} {path}: no directory {path.parent}"
    target = path.resolve()
    source = reading.resolve()
    if target == source or (source.is_dir() and source in target.parents and
                            target.suffix == ".sluice"):  # fmt: skip
        return f"{flag} {path}: that is the recording being read"
    return None


def build_parser() -> argparse.ArgumentParser:
    # Each command is the module of its name here: add_arguments and run.
    from sluice.commands import analyze, demo, faults, inspect, proxy, record, replay, serve, view

    parser = Parser(
        prog="sluice",
        description="Protocol-aware TCP proxy and traffic recorder for Apache Pulsar and Cursus.",
    )
    parser.add_argument("--version", action="version", version=f"sluice {__version__}")
    # (Not "command": `faults add --command NAME` has that dest, and a
    # subparser's defaults overwrite the parent's.)
    commands = parser.add_subparsers(dest="sluice_command", metavar="COMMAND", parser_class=Parser)
    # name, module (add_arguments + run), one-line help, description, settings from env/TOML
    table: list[tuple[str, Any, str, str, bool]] = [
        ("proxy", proxy, "run the proxy in front of a Pulsar (or Cursus) broker",
         "Relay Pulsar clients to brokers, keeping them routed through Sluice.", True),
        ("faults", faults, "add, list and remove a running proxy's fault rules",
         "Make the broker misbehave on purpose: protocol-level fault rules on a running "
         "proxy's admin endpoint (see docs/faults.md).", False),
        ("record", record,
         "snapshot a running proxy's recent traffic; anonymize a capture on disk",
         "Act on recordings: `record snapshot` writes a running proxy's in-memory ring "
         "(--record-ring) to a new capture; `record anonymize` writes a copy of a capture "
         "on disk with its names and credentials replaced.", False),
        ("inspect", inspect,
         "show a recording: timeline, JSON lines, summary, or pcapng for Wireshark",
         "Read Sluice recordings (a file or a directory of them).", False),
        ("view", view, "read a recording in the browser (or export it as one HTML file)",
         "Serve a web page over a recording: connections, a timeline, every frame with its "
         "detail, filters that live in the link, and a summary.", False),
        ("demo", demo,
         "see Sluice work: embedded broker, proxy, real client traffic, a report",
         "Start the embedded pulsar-lite broker and Sluice in front of it, run a "
         "produce/consume workload with the official client through the proxy, and report "
         "what happened.", False),
        ("replay", replay,
         "re-run a recording's clients against a broker and report what changed",
         "Replay a recording against a broker; exit 0 equivalent, 1 diverged, "
         "2 usage or connection errors.", False),
        ("serve", serve, "act as the broker, answering clients from a recording (offline)",
         "Answer live Pulsar or Cursus clients from a recording, as the broker did.", False),
        ("analyze", analyze,
         "turn many recordings into Parquet tables and a report (PySpark)",
         "Analyse recordings with Spark (local by default): tables frames, connections, "
         "topic_minute, latency, errors, files, bad_segments, http and filtered; and "
         "report.html.", False),
    ]  # fmt: skip
    for name, module, summary, description, settings in table:
        sub = commands.add_parser(name, help=summary, description=description)
        module.add_arguments(sub)
        if settings:
            add_config_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


class ClosedOutput(OSError):
    """What writing to a standard output that was closed at start raises."""


class _Closed(io.TextIOBase):
    """Standard output when it was closed at start (``sluice ... >&-``):
    what is written there raises ClosedOutput, so a command that writes
    output ends with one line saying it was lost, not a traceback, nor
    success with nothing written; one that writes none works."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise ClosedOutput(9, "standard output is closed")

    def flush(self) -> None:
        pass


class OutputFailed(OSError):
    """What writing to standard output raised (``> file`` on a full disk),
    told apart from the errors of the files a command opens itself."""


class _Guarded:
    """Standard output while a command runs: its write errors, but a closed
    reader's (BrokenPipeError, said apart), raise OutputFailed; the rest is
    the stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputFailed(exc.errno, exc.strerror or str(exc)) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputFailed(exc.errno, exc.strerror or str(exc)) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if sys.stdout is None:  # started with descriptor 1 closed
        _hold_descriptor(1)
        sys.stdout = _Closed()
    elif isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.errors == "strict":
        # A path that is not UTF-8 (a directory named in Latin-1) is held
        # with its bytes escaped: written back as those bytes, as a shell
        # shows and takes the name, not a UnicodeEncodeError once the work
        # is done.
        sys.stdout.reconfigure(errors="surrogateescape")
    parser = build_parser()
    command = next((a for a in argv if not a.startswith("-")), None)
    subparser = _subparsers(parser).get(command or "")
    settings = None
    if subparser is not None and command is not None and takes_settings(subparser):
        try:
            settings = config.apply(subparser, command, argv[argv.index(command) + 1 :],
                                    commands=tuple(_subparsers(parser)))  # fmt: skip
        except config.SettingsError as exc:
            for line in str(exc).splitlines():  # one mistake a line
                print(f"sluice {command}: {line}", file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    args.argv = argv  # the command line as given: a proxy reads its settings again from it
    if args.sluice_command is None:
        parser.print_help()
        return 2
    if getattr(args, "print_config", False):
        assert subparser is not None and settings is not None
        sys.stdout.write(config.render(subparser, args, settings))
        return 0
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the command's now
    stdout = sys.stdout
    if not isinstance(stdout, _Closed):
        sys.stdout = cast(TextIO, _Guarded(stdout))
    try:
        result: int = args.run(args)
        sys.stdout.flush()  # here, not at exit, where a closed reader is a traceback
    except OutputFailed as exc:
        _to_nowhere(stdout)  # what it holds yet would fail the interpreter's last flush
        print(f"{_name(args)}: standard output: {exc.strerror} (what it shows is incomplete)",
              file=sys.stderr)  # fmt: skip
        return 1
    except ClosedOutput:
        print(f"{_name(args)}: standard output is closed: what it would show is lost",
              file=sys.stderr)  # fmt: skip
        return NO_STDOUT
    except BrokenPipeError:
        if not _stdout_gone():
            raise
        # Whoever read our output stopped (`sluice inspect DIR | head`): stop
        # quietly with the status a shell gives a command SIGPIPE ended.
        _to_nowhere(stdout)
        return 128 + 13
    except BaseException as exc:
        # Ctrl-C in the middle of long work (reading a capture, a replay,
        # where trio may hand it over in a group): one line and a shell's
        # status for SIGINT, not a traceback.
        if not any(isinstance(e, KeyboardInterrupt) for e in leaves(exc)):
            raise
        print(f"{_name(args)}: interrupted", file=sys.stderr)
        return INTERRUPTED
    finally:
        if sys.stdout is not stdout and isinstance(sys.stdout, _Guarded):
            sys.stdout = stdout
    return result


def _to_nowhere(stream: TextIO | io.TextIOBase) -> None:
    """Point ``stream``'s descriptor at /dev/null: what it still holds goes
    nowhere at the interpreter's last flush, instead of failing again."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # not a file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _hold_descriptor(fd: int) -> None:
    """Open /dev/null as ``fd`` if it is closed, so that no file opened
    later (a recording, a pcapng) gets it, nor a process started as its
    standard output."""
    try:
        os.fstat(fd)
    except OSError:
        opened = os.open(os.devnull, os.O_WRONLY)
        if opened != fd:
            os.close(opened)


def _name(args: argparse.Namespace) -> str:
    """The command's name as its messages start: ``sluice record snapshot``."""
    words = ["sluice", args.sluice_command]
    action = next((getattr(args, dest) for dest in vars(args)
                   if dest.endswith("_command") and dest != "sluice_command"), None)  # fmt: skip
    if isinstance(action, str):
        words.append(action)
    return " ".join(words)


def _stdout_gone() -> bool:
    """Whether standard output's reader is gone (a pipe or socket whose other
    end closed reads as an error when polled), so a BrokenPipeError was ours
    to write to it, not a socket's the command should have handled."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))


def parse_again(argv: list[str]) -> argparse.Namespace:
    """The settings of command line ``argv`` read again as ``main`` read
    them (the same flags and environment; the ``--config`` file as it is
    now); ConfigError, one line a mistake, when they no longer parse."""
    parser = build_parser()
    command = next((a for a in argv if not a.startswith("-")), "")
    subparser = _subparsers(parser).get(command)
    if subparser is None:
        raise ConfigError(f"not a command line of sluice: {' '.join(argv)}")
    if takes_settings(subparser):
        try:
            config.apply(subparser, command, argv[argv.index(command) + 1 :],
                         commands=tuple(_subparsers(parser)))  # fmt: skip
        except config.SettingsError as exc:
            raise ConfigError(str(exc)) from None
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = parser.parse_args(argv)
    except SystemExit:  # argparse's error: its last line says what
        lines = said.getvalue().strip().splitlines()
        raise ConfigError(lines[-1] if lines else "the settings do not parse") from None
    args.argv = argv
    return args


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps no public list
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def takes_settings(parser: argparse.ArgumentParser) -> bool:
    """Whether a command reads its flags' values from SLUICE_* variables and
    a TOML file too (the commands given --config); the others read only
    their command line, so a container's SLUICE_LISTEN, set for the proxy,
    is not also where `sluice view` listens."""
    return "--config" in parser._option_string_actions  # argparse keeps no public map


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config and --print-config, for commands whose flags are settings."""
    parser.add_argument(
        "--config",
        type=path_arg,
        metavar="FILE",
        help="read settings from this TOML file; flags and SLUICE_* variables win (default: none)",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective settings and where each came from, then exit",
    )
