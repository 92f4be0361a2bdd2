"""What the replay and serve of every protocol share.

``ReplayError`` (a replay that cannot go on), ``parse_speed`` (the value of
``--speed``) and ``Pace`` (keeping to it), ``Listening`` (where ``sluice
serve`` listens, plain and TLS),
``announce`` and ``until_signalled`` (how serve starts and stops),
``close_due`` (how replay closes what the recording shows closed),
``Outbound`` (sending to and closing a live connection, each bounded by
``--timeout``), ``nothing_to_replay`` (the refusal of a recording with no
client frame),
``Withheld`` and ``Withholding`` (which recorded frames the recording proxy
kept from the broker: not sent, their injected answers not expected). The
commands themselves are ``sluice/commands/replay.py`` and ``serve.py``.
"""

from __future__ import annotations

import argparse
import math
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import trio

from sluice.addresses import Address, advertised, parse_address, parse_host
from sluice.errors import ConfigError
from sluice.proxy.dial import TlsServerConfig, open_listeners, server_ssl_context
from sluice.recording.reader import RecordedConnection, RecordedFrame
from sluice.replay.outcome import broker_only_said, web_left_out

DEFAULT_LISTEN = "127.0.0.1:6650"

K = TypeVar("K")
L = TypeVar("L")


class ReplayError(Exception):
    pass


class BrokerUnreachable(ReplayError):
    """The broker to replay against cannot be reached: a failure (exit 1),
    not a mistake in the command."""


def cannot_reach(broker: object, exc: OSError) -> ReplayError:
    """Why a dial to the broker failed, as replay says it: a broker down is
    ``BrokerUnreachable``; a certificate not trusted is a mistake in the
    command's TLS settings (``--broker-tls-ca``), a ``ReplayError``."""
    text = f"cannot reach broker {broker}: {exc}"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return ReplayError(text)
        cause = cause.__cause__
    return BrokerUnreachable(text)


def nothing_to_replay(
    recording: object,
    refused: Sequence[str] = (),
    http: int = 0,
    ws: int = 0,
    broker_only: Sequence[tuple[str, str, int]] = (),
) -> ReplayError:
    """The refusal of a recording with no client frame of the binary
    protocol (at ``recording``), saying what the capture held instead: the
    connections the recording proxy ``refused`` at the handshake, ``http``
    exchanges and ``ws`` frames of the HTTP listener. Nothing would be sent
    nor compared: "equivalent" (exit 0) would be vacuous, and a check that
    relies on it would pass whatever the broker does."""
    why = ["no client frames of the binary protocol"]
    if refused:
        why.append(f"{', '.join(refused)} refused by the recording proxy at the handshake "
                   "(never reached a broker)")  # fmt: skip
    why += [said for said, _, _ in broker_only_said(list(broker_only))]
    if http or ws:
        why.append(f"{web_left_out(http, ws)} in the capture (replay covers the binary "
                   "protocol, not the HTTP listener's traffic)")  # fmt: skip
    return ReplayError(f"{recording}: nothing to replay: {'; '.join(why)}")


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


class Pace:
    """``--speed``: each client frame goes out no sooner than the time
    between it and the one before it when recorded (divided by ``speed``)
    after the one before it went out; 0 (asap): as soon as it may. The wait
    for the answers it depends on counts toward that time, as the broker's
    answering did when recorded (it is inside the recorded gap), rather than
    coming on top of it."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self._recorded_ns: int | None = None  # the frame before, when recorded
        self._sent = 0.0  # and when it went out (trio's clock)

    async def next(self, recorded_ns: int) -> None:
        """Wait until the frame recorded at ``recorded_ns`` is due; it goes
        out now."""
        if self.speed and self._recorded_ns is not None:
            gap = max(0, recorded_ns - self._recorded_ns) / 1e9 / self.speed
            await trio.sleep_until(self._sent + gap)
        self._recorded_ns = recorded_ns
        self._sent = trio.current_time()


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


class Outbound:
    """The sending side of one live replay connection: ``send`` and
    ``close`` (the stream's own, e.g. ``send_all`` and ``aclose``), each
    bounded by ``--timeout``. A broker that takes nothing (hung, its
    process stopped) must not hold replay forever once the socket's buffers
    are full: the connection is given up, and what it was to be answered
    is missing."""

    def __init__(
        self, send: Callable[[bytes], Awaitable[None]], close: Callable[[], Awaitable[None]]
    ) -> None:
        self._send = send
        self._close = close
        # Sending on it failed (the broker closed it, or took nothing for
        # --timeout): nothing more is sent on it.
        self.broken = False

    async def send(self, data: bytes, timeout: float) -> str | None:
        """Send ``data`` within ``timeout``: None when it went out, else why
        not, said once (then ``""``: nothing more is sent on it)."""
        if self.broken:
            return ""
        with trio.move_on_after(timeout):
            try:
                await self._send(data)
                return None
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.broken = True
                return "the broker closed the connection"
        self.broken = True
        await self.close(timeout)
        return (f"the broker took nothing for {timeout:g}s (it stopped reading): "
                "connection given up")  # fmt: skip

    async def close(self, timeout: float) -> None:
        """Close it, in ``timeout`` at most (a TLS close_notify to a broker
        that reads nothing would wait forever; cancelled, it closes at once)."""
        with trio.move_on_after(timeout):
            await self._close()


@dataclass(frozen=True)
class Withheld:
    """What the recording proxy kept from the broker or changed on the way
    when a connection was recorded: client frames a fault rule dropped or
    answered itself, or a message filter refused (``held``: the broker never
    got them, so replay does not send them); the answers Sluice wrote in the
    broker's place (``injected``: no broker is expected to send them); and
    client frames a filter changed (``sent``: replay sends them as the
    broker got them, the protocol's decoded frame)."""

    held: frozenset[int] = frozenset()
    injected: frozenset[int] = frozenset()
    sent: Mapping[int, Any] = field(default_factory=dict)


class Withholding:
    """Works out one connection's ``Withheld`` from its fault annotations
    (``faults``), whatever the protocol: ``answers(request, reply)`` says
    whether the broker frame ``reply`` may be the answer to the client frame
    ``request`` (Pulsar: by request id or producer and sequence id; Cursus,
    whose replies carry no ids: any reply), ``answerable(request)`` whether
    a client frame is answered at all. A protocol adds what else its proxy
    holds back (Pulsar: filters' verdicts) with ``answer_after`` and
    ``held``/``injected``, then takes ``done``."""

    def __init__(
        self,
        conn: RecordedConnection,
        answers: Callable[[Any, Any], bool],
        answerable: Callable[[Any], bool],
    ) -> None:
        self.conn = conn
        self.answers = answers
        self.answerable = answerable
        self.held: set[int] = set()
        self.injected: set[int] = set()

    def answer_after(self, rf: RecordedFrame, start: int) -> RecordedFrame | None:
        """The first broker frame from capture position ``start`` on that
        may answer ``rf``, not claimed as injected already."""
        if not self.answerable(rf.frame):
            return None
        return next((b for b in self.conn.frames if not b.from_client and b.index >= start
                     and b.index not in self.injected
                     and self.answers(rf.frame, b.frame)), None)  # fmt: skip

    def faults(self) -> Withholding:
        """Claim the client frames fault rules dropped (``drop``) or answered
        in the broker's place (``error``), and those answers."""
        conn = self.conn
        for fault in conn.faults:
            if not fault.from_client or fault.action not in ("drop", "error"):
                continue
            # The frame it acted on was recorded before it (with the rest of
            # its read: up to 32 Pulsar frames, one Cursus frame): the latest
            # of its command not yet claimed, preferring, for an error, the
            # one the injected answer that follows the fault answers, and for
            # a drop, one never answered.
            before = [rf for rf in reversed(conn.frames)
                      if rf.from_client and rf.index < fault.index and rf.index not in self.held
                      and rf.frame.name == fault.command]  # fmt: skip
            if not before:
                continue
            chosen = before[0]
            for rf in before:
                if fault.action == "error":
                    answer = self.answer_after(rf, fault.index)
                    if answer is not None:
                        chosen = rf
                        self.injected.add(answer.index)
                        break
                elif self.answerable(rf.frame) and self.answer_after(rf, rf.index) is None:
                    chosen = rf
                    break
            self.held.add(chosen.index)
        return self

    def done(self, sent: Mapping[int, Any] | None = None) -> Withheld:
        return Withheld(frozenset(self.held), frozenset(self.injected), dict(sent or {}))
