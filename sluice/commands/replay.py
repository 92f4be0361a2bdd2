"""``sluice replay``: re-drive a recording's clients against a broker and compare.

How is the protocol's (``ProtocolSpec.replay``, picked by the recording's
header): Pulsar's in ``replay/pulsar.py``, Cursus's in ``replay/cursus.py``.
Exit status: 0 equivalent (differences an incomplete recording explains,
``EXPECTED`` in the report, aside), 1 diverged or the broker cannot be
reached, 2 usage errors.
"""

from __future__ import annotations

import argparse
import sys

import trio

from sluice.commands import output_problem, path_arg
from sluice.config import seconds
from sluice.errors import ConfigError, leaves
from sluice.protocols import registry
from sluice.recording.format import RecordingError, protocol_of
from sluice.recording.writer import private
from sluice.replay.common import BrokerUnreachable, ReplayError, parse_speed
from sluice.replay.outcome import report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recording", type=path_arg, help="a recording file or directory")
    parser.add_argument(
        "--broker",
        required=True,
        metavar="URL",
        help="the broker to replay against; required, no default",
    )
    parser.add_argument(
        "--speed",
        default="asap",
        help="asap, realtime, or a multiplier of recorded time such as 2 or 0.5",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for an expected broker frame",
    )
    parser.add_argument(
        "--transcript",
        type=path_arg,
        metavar="FILE",
        help="write the normalised exchange here (default: not written)",
    )
    parser.add_argument(
        "--broker-tls-ca",
        type=path_arg,
        metavar="FILE",
        help="CA for the broker's certificate (default: system trust store)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress lines on stderr (the report is printed)"
    )


def run(args: argparse.Namespace) -> int:
    def say(text: str) -> None:
        if not args.quiet:
            print(f"[replay] {text}", file=sys.stderr, flush=True)

    try:
        if args.transcript is not None:
            problem = output_problem(args.transcript, "--transcript", args.recording)
            if problem is not None:
                raise ConfigError(problem)
        parse_speed(args.speed)
        spec = registry.get(protocol_of(args.recording))
        if spec.replay is None:
            raise ConfigError(f"{spec.title} recordings cannot be replayed")
        if args.broker_tls_ca is not None and not spec.parse_url(args.broker, what="--broker").tls:
            # (the scheme's "+ssl" forgotten: the CA would go unused, unsaid)
            raise ConfigError(f"--broker-tls-ca is for a broker reached over TLS; "
                              f"--broker {args.broker} is not one")  # fmt: skip
        outcome, transcript = trio.run(spec.load(spec.replay), args, say)
    except Exception as exc:
        known = [
            e for e in leaves(exc) if isinstance(e, RecordingError | ConfigError | ReplayError)
        ]
        if not known:
            raise
        print(f"sluice replay: {known[0]}", file=sys.stderr)
        # A broker down is a failure (1), as for every command; the rest
        # are mistakes in what was asked (2).
        return 1 if isinstance(known[0], BrokerUnreachable) else 2
    # The report first: a transcript that cannot be written must not take
    # the replay's outcome with it.
    report(outcome, sys.stdout)
    if args.transcript is not None:
        try:
            with open(args.transcript, "w", opener=private) as handle:
                handle.write("\n".join(transcript) + "\n")
        except OSError as exc:
            sys.stdout.flush()  # the report above this line
            print(f"sluice replay: --transcript {args.transcript}: {exc.strerror or exc} "
                  "(the report above is the replay's)", file=sys.stderr)  # fmt: skip
            return 2
    return 0 if outcome.equivalent else 1
