"""The ``sluice`` command line."""

from __future__ import annotations

import argparse
import sys

from sluice import __version__


def build_parser() -> argparse.ArgumentParser:
    from sluice.proxy import cli as proxy_cli
    from sluice.replay import inspect as inspect_cli

    parser = argparse.ArgumentParser(
        prog="sluice",
        description="Protocol-aware TCP proxy and traffic recorder for Apache Pulsar.",
    )
    parser.add_argument("--version", action="version", version=f"sluice {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    proxy = commands.add_parser(
        "proxy",
        help="run the proxy in front of a Pulsar broker",
        description="Relay Pulsar clients to brokers, keeping them routed through Sluice.",
    )
    proxy_cli.add_arguments(proxy)
    proxy.set_defaults(run=proxy_cli.run)
    inspect = commands.add_parser(
        "inspect",
        help="show a recording: timeline, JSON lines, summary, or pcapng for Wireshark",
        description="Read Sluice recordings (a file or a directory of them).",
    )
    inspect_cli.add_arguments(inspect)
    inspect.set_defaults(run=inspect_cli.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
