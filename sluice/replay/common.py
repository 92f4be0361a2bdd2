"""What the replay and serve of every protocol share.

``ReplayError`` (a replay that cannot go on), ``parse_speed`` (the value of
``--speed``), ``Listening`` (where ``sluice serve`` listens, plain and TLS),
``announce`` and ``until_signalled`` (how serve starts and stops),
``close_due`` (how replay closes what the recording shows closed). The
commands themselves are ``sluice/commands/replay.py`` and ``serve.py``.
"""

from __future__ import annotations

import argparse
import math
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import trio

from sluice.addresses import Address, advertised, parse_address, parse_host
from sluice.errors import ConfigError
from sluice.proxy.dial import TlsServerConfig, open_listeners, server_ssl_context

DEFAULT_LISTEN = "127.0.0.1:6650"

K = TypeVar("K")
L = TypeVar("L")


class ReplayError(Exception):
    pass


def parse_speed(text: str) -> float:
    if text == "asap":
        return 0.0
    if text == "realtime":
        return 1.0
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--speed {text!r}: use asap, realtime or a number") from None
    if not 0 < value < math.inf:
        raise ConfigError("--speed must be a positive number")
    return value


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


def announce(what: str, recording: Path, truncated: Sequence[Path] = ()) -> None:
    """What ``serve`` answers as, and the files of the recording cut off
    mid-record (the writer was stopped): served up to where they end."""
    for path in truncated:
        print(f"[serve] note: {path} ends with an incomplete record (the writer was stopped): "
              "served up to it", file=sys.stderr)  # fmt: skip
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


async def close_due(
    closes: Sequence[tuple[int, K]],
    done: int,
    index: int,
    lives: Mapping[K, L],
    close: Callable[[L], Awaitable[None]],
) -> int:
    """Close the live connections the recording shows closed before the
    frame of ``index`` (``closes``: (where, connection) in order, the first
    ``done`` of them closed already), side by side: ``close`` waits for a
    connection's answers and closes it, so answers that never come cost
    one timeout for them all, not one each, one after another. How many of
    ``closes`` are done now."""
    ending = []
    while done < len(closes) and closes[done][0] <= index:
        live = lives.get(closes[done][1])
        if live is not None:
            ending.append(live)
        done += 1
    async with trio.open_nursery() as closing:
        for live in ending:
            closing.start_soon(close, live)
    return done
