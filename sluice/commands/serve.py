"""``sluice serve``: act as the broker, answering from a recording.

How is the protocol's (``ProtocolSpec.serve``, picked by the recording's
header): Pulsar's in ``replay/pulsar.py``, Cursus's in ``replay/cursus.py``.
It only listens: no outbound connection is ever opened.
"""

from __future__ import annotations

import argparse
import sys

import trio

from sluice.commands import path_arg
from sluice.errors import ConfigError
from sluice.protocols import registry
from sluice.recording.format import RecordingError, protocol_of
from sluice.replay.common import DEFAULT_LISTEN, Listening
from sluice.replay.outcome import Report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recording", type=path_arg, help="a recording file or directory")
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"plain listener, where clients connect (default: {DEFAULT_LISTEN}, "
        "but none with --listen-tls)",
    )
    parser.add_argument(
        "--listen-tls",
        metavar="HOST:PORT",
        help="TLS listener, with --tls-cert and --tls-key (default: none); a Pulsar recording "
        "may be served on both, a Cursus one on one of them",
    )
    parser.add_argument(
        "--tls-cert",
        type=path_arg,
        metavar="FILE",
        help="certificate chain (PEM) for --listen-tls (default: none)",
    )
    parser.add_argument(
        "--tls-key", type=path_arg, metavar="FILE", help="private key (PEM) (default: none)"
    )
    parser.add_argument(
        "--advertise-host",
        metavar="HOST",
        help="host put in lookup and metadata answers for clients to dial (default: the "
        "listen host as written, or this host's name when that is a wildcard)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        listening = Listening.from_args(args)
    except ConfigError as exc:
        print(f"sluice serve: {exc}", file=sys.stderr)
        return 2
    try:
        spec = registry.get(protocol_of(args.recording))
        if spec.serve is None:
            raise ConfigError(f"{spec.title} recordings cannot be served")
        report: Report = trio.run(spec.load(spec.serve), args.recording, listening)
    except (RecordingError, ConfigError) as exc:
        print(f"sluice serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = " and ".join(str(a) for a in (listening.plain, listening.tls) if a is not None)
        print(f"sluice serve: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for line in report.lines():
        print(line)
    return 0 if not report.unmatched else 1
