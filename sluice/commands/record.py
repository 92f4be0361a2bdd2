"""``sluice record``: what is done with recordings beside a proxy's own recording.

``snapshot`` writes a running proxy's flight recorder out: a thin client of
the admin endpoint's ``POST /recording/snapshot`` (see ``sluice.proxy.admin``);
the proxy must run with ``--record DIR --record-ring SIZE``. It prints the
snapshot's capture directory, which ``inspect``, ``replay``, ``serve`` and
``analyze`` read like any recording.

``anonymize IN OUT`` writes a copy of a capture with deterministic
pseudonyms in place of names, hosts and addresses, and no payloads (the work
is ``sluice.recording.anonymize``'s).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
from pathlib import Path

from sluice.commands import output_problem, path_arg
from sluice.commands.faults import AdminError, call
from sluice.commands.proxy import read_token
from sluice.config import seconds
from sluice.errors import ConfigError
from sluice.proxy.admin import MAX_SNAPSHOT_SECONDS
from sluice.recording.anonymize import FILLER, PAYLOAD_CHOICES, Options, anonymize
from sluice.recording.format import RecordingError
from sluice.recording.writer import private

KEY_BYTES = 32


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(
        dest="record_command", metavar="ACTION", required=True, parser_class=type(parser)
    )
    snap = actions.add_parser(
        "snapshot",
        help="write the flight recorder's recent past to a new capture",
        description="Write a running proxy's in-memory ring (--record-ring) to a new capture "
        "directory inside its --record directory, and print that directory.",
    )
    snap.add_argument(
        "--admin",
        required=True,
        metavar="HOST:PORT",
        help="the proxy's admin endpoint (its --admin); required, no default",
    )
    snap.add_argument(
        "--admin-token-file",
        type=path_arg,
        metavar="FILE",
        help="file holding the proxy's admin token (snapshots need it; default: none)",
    )
    snap.add_argument(
        "--last",
        type=seconds,
        metavar="SECONDS",
        help="only the last SECONDS of the ring (default: all of it)",
    )
    snap.add_argument(
        "--reason",
        metavar="TEXT",
        default="",
        help="why, kept in the capture and its directory name (default: none)",
    )
    snap.add_argument("--json", action="store_true", help="print the JSON the proxy answers")
    anon = actions.add_parser(
        "anonymize",
        help="copy a capture with pseudonyms for names, hosts and addresses, and no payloads",
        description="Write a copy of the capture IN (a file or a directory) into the new "
        "directory OUT in which tenants, namespaces, topics, producer, subscription and consumer "
        "names, roles, message keys, hosts and addresses, and property values are replaced by "
        "deterministic pseudonyms (the same original, the same pseudonym, under one key), and "
        "payloads' contents are dropped (see --payloads). "
        "inspect, view, replay and serve read the copy. See docs/recording-format.md.",
    )
    anon.add_argument("input", metavar="IN", type=path_arg, help="a recording file or directory")
    anon.add_argument("output", metavar="OUT", type=path_arg, help="a new (or empty) directory")
    anon.add_argument(
        "--key-file",
        type=path_arg,
        metavar="FILE",
        help="the secret key pseudonyms are made with: the same key gives the same pseudonyms, "
        "so captures anonymized with it can be compared (created with a new random key if "
        "missing; default: a new random key for this run only)",
    )
    anon.add_argument(
        "--payloads",
        choices=PAYLOAD_CHOICES,
        default=FILLER,
        help="what is kept of the payloads: their shape with zeros for contents, a batch's "
        "entries and the compression kept, so that replay and serve can run it (filler, the "
        "default, for a capture with payloads); or nothing but each one's size and SHA-256 "
        "(hash), or size (none)",
    )
    anon.add_argument(
        "--property-values",
        action="append",
        metavar="GLOB",
        help="replace the values of message and command properties whose key matches GLOB "
        "(repeatable; default: every property's value)",
    )
    anon.add_argument(
        "--property-keys",
        action="append",
        default=[],
        metavar="GLOB",
        help="replace the keys themselves of properties whose key matches GLOB (repeatable; "
        "default: keys are kept)",
    )
    anon.add_argument(
        "--report",
        type=path_arg,
        metavar="FILE",
        help="write what was replaced (counts, and the pseudonyms) as JSON to FILE (default: "
        "none; a summary line goes to stderr either way)",
    )
    anon.add_argument(
        "--reveal",
        action="store_true",
        help="with --report: put each original beside its pseudonym in the report (keep that "
        "file in the company)",
    )


def run(args: argparse.Namespace) -> int:
    if args.record_command == "anonymize":
        return run_anonymize(args)
    try:
        if args.last is not None and not 0 < args.last <= MAX_SNAPSHOT_SECONDS:
            raise ConfigError(f"--last is a number of seconds, above 0 and at most "
                              f"{MAX_SNAPSHOT_SECONDS}")  # fmt: skip
        token = read_token(args.admin_token_file)
        body: dict[str, object] = {"reason": args.reason}
        if args.last is not None:
            body["last"] = args.last
        answer = call(args.admin, "POST", "/recording/snapshot", token, body)
    except ConfigError as exc:
        print(f"sluice record snapshot: {exc}", file=sys.stderr)
        return 2
    except AdminError as exc:
        print(f"sluice record snapshot: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(answer["path"])
        print(f"{answer['records']} records, {answer['bytes']} bytes", file=sys.stderr)
    return 0


def run_anonymize(args: argparse.Namespace) -> int:
    def fail(message: str, status: int = 2) -> int:
        print(f"sluice record anonymize: {message}", file=sys.stderr)
        return status

    if args.reveal and args.report is None:
        return fail("--reveal needs --report FILE: the originals are not printed")
    if args.report is not None:
        problem = output_problem(args.report, "--report", args.input)
        if problem is not None:
            return fail(problem)
    try:
        key = _key(args.key_file)
    except ConfigError as exc:
        return fail(str(exc))
    options = Options(
        key,
        args.payloads,
        tuple(args.property_values or ("*",)),
        tuple(args.property_keys),
    )
    progress = (lambda line: print(line, file=sys.stderr)) if sys.stderr.isatty() else None
    made = not args.output.exists()
    # New or empty: what is in it, if this run fails, is this run's.
    fresh = made or (args.output.is_dir() and not any(args.output.iterdir()))
    try:
        report, names = anonymize(args.input, args.output, options, progress or (lambda _: None))
    except BaseException as exc:
        if fresh:
            # No half copy left (a file without its .part's rest, the files
            # after it missing), nor one that a second try is refused for.
            _empty(args.output, remove=made)
        if isinstance(exc, RecordingError):
            return fail(str(exc))
        if isinstance(exc, OSError):
            return fail(f"{exc.filename or args.output}: {exc.strerror or exc}", 1)
        raise  # Ctrl-C: main says it
    summary = report.to_json()
    replaced = names.report(args.reveal)
    if args.report is not None:
        try:
            with open(args.report, "w", opener=private) as handle:
                handle.write(json.dumps({**summary, **replaced}, indent=2) + "\n")
        except OSError as exc:
            return fail(f"{args.report}: {exc.strerror or exc}", 1)
    counts = ", ".join(f"{n} {kind}" for kind, n in replaced["replaced"].items())  # type: ignore[attr-defined]
    print(f"{args.output}: {summary['records']} records in {summary['files']} file(s); "
          f"replaced {counts or 'nothing'}; {summary['payloads_left_out']} payloads left out"
          + (f"; {summary['frames_withheld']} frames that did not parse kept without bytes"
             if summary["frames_withheld"] else ""), file=sys.stderr)  # fmt: skip
    for line in [*report.truncated, *report.skipped]:
        print(f"sluice record anonymize: {line}", file=sys.stderr)
    return 0


def _empty(directory: Path, *, remove: bool) -> None:
    """Take away what this run wrote in ``directory`` (new or empty before
    it), and the directory itself with ``remove`` (this run made it)."""
    if not directory.is_dir():
        return
    if remove:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _key(path: Path | None) -> bytes:
    """The pseudonyms' key: read from ``path``, made there if it is missing,
    or a new one for this run."""
    if path is None:
        return secrets.token_bytes(KEY_BYTES)
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = secrets.token_bytes(KEY_BYTES)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise ConfigError(f"--key-file {path}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "wb") as handle:
            handle.write(key)
        print(f"sluice record anonymize: a new key in {path}", file=sys.stderr)
        return key
    except OSError as exc:
        raise ConfigError(f"--key-file {path}: {exc.strerror or exc}") from None
    if len(key) < 16:
        raise ConfigError(f"--key-file {path}: {len(key)} bytes; a key needs at least 16")
    return key
