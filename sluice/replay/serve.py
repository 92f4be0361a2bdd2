"""``sluice serve``: act as the broker, answering from a recording.

How is the protocol's (``ProtocolSpec.serve``, picked by the recording's
header): Pulsar's in ``replay/pulsar.py``, Cursus's in ``replay/cursus.py``.
It only listens: no outbound connection is ever opened.
"""

from __future__ import annotations

import argparse
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from sluice.addresses import Address, advertised, parse_address, parse_host
from sluice.errors import ConfigError
from sluice.protocols import registry
from sluice.proxy.dial import TlsServerConfig, open_listeners, server_ssl_context
from sluice.recording.format import RecordingError, protocol_of
from sluice.replay.outcome import Report

DEFAULT_LISTEN = "127.0.0.1:6650"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recording", type=Path, help="a recording file or directory")
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
        type=Path,
        metavar="FILE",
        help="certificate chain (PEM) for --listen-tls (default: none)",
    )
    parser.add_argument(
        "--tls-key", type=Path, metavar="FILE", help="private key (PEM) (default: none)"
    )
    parser.add_argument(
        "--advertise-host",
        metavar="HOST",
        help="host put in lookup and metadata answers for clients to dial (default: the "
        "listen host as written, or this host's name when that is a wildcard)",
    )


@dataclass(frozen=True)
class Listening:
    """Where serve listens: plain, TLS (with its context), or both."""

    plain: Address | None
    tls: Address | None = None
    context: ssl.SSLContext | None = None
    advertise_host: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Listening:
        tls = None
        if args.listen_tls is not None:
            tls = parse_address(args.listen_tls, what="--listen-tls")
        if args.listen is not None:
            plain: Address | None = parse_address(args.listen, what="--listen")
        else:
            plain = None if tls is not None else parse_address(DEFAULT_LISTEN)
        host = None
        if args.advertise_host is not None:
            host = parse_host(args.advertise_host, what="--advertise-host")
        if tls is None:
            if args.tls_cert or args.tls_key:
                raise ConfigError("--tls-cert and --tls-key are for --listen-tls")
            return cls(plain, advertise_host=host)
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("--listen-tls needs --tls-cert and --tls-key")
        context = server_ssl_context(TlsServerConfig(args.tls_cert, args.tls_key))
        return cls(plain, tls, context, host)

    async def open(self) -> tuple[list[trio.abc.Listener[Any]], Address | None, Address | None]:
        """The listeners, and the plain and TLS addresses clients are told to dial:
        the host as written (or --advertise-host), the port as bound."""
        listeners: list[trio.abc.Listener[Any]] = []
        bound: list[Address | None] = []
        for address in (self.plain, self.tls):
            if address is None:
                bound.append(None)
                continue
            tcp = await open_listeners(address)
            port = tcp[0].socket.getsockname()[1]
            bound.append(advertised(address.host, port, self.advertise_host))
            if address is self.tls:
                assert self.context is not None
                listeners += [
                    trio.SSLListener(t, self.context, https_compatible=False) for t in tcp
                ]
            else:
                listeners += tcp
        return listeners, bound[0], bound[1]


def announce(what: str, recording: Path) -> None:
    print(f"[serve] answering as {what} from {recording}; Ctrl-C to stop",
          file=sys.stderr, flush=True)  # fmt: skip


async def until_signalled(
    handler: Callable[[Any], Awaitable[None]], listeners: list[trio.abc.Listener[Any]]
) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                break
        nursery.cancel_scope.cancel()


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
    print(
        f"served {report.requests} requests, pushed {report.pushed} messages, "
        f"{len(report.unmatched)} without a recorded answer"
    )
    for what in report.unmatched:
        print(f"  no recorded answer: {what}")
    return 0 if not report.unmatched else 1
