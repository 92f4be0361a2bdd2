"""``sluice record snapshot``: write a running proxy's flight recorder out.

A thin client of the admin endpoint's ``POST /recording/snapshot`` (see
``sluice.proxy.admin``); the proxy must run with ``--record DIR
--record-ring SIZE``. It prints the snapshot's capture directory, which
``inspect``, ``replay``, ``serve`` and ``analyze`` read like any recording.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sluice.commands.faults import AdminError, call
from sluice.commands.proxy import read_token
from sluice.errors import ConfigError
from sluice.proxy.admin import MAX_SNAPSHOT_SECONDS


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
        type=Path,
        metavar="FILE",
        help="file holding the proxy's admin token (snapshots need it; default: none)",
    )
    snap.add_argument(
        "--last",
        type=float,
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


def run(args: argparse.Namespace) -> int:
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
