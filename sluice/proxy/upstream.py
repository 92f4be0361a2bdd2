"""Connections Sluice opens to brokers on its own account.

Lookups are forwarded over these, with Sluice's own request ids (clients'
ids are private to their connections). ``handshake`` is also what proxied
connections use to connect to their broker on the client's behalf.
"""

from __future__ import annotations

import itertools
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from sluice import __version__
from sluice.protocols.pulsar import Frame, ProtocolError, Type, command, encode, pb
from sluice.proxy.config import Address
from sluice.proxy.framing import FrameStream, dial

if TYPE_CHECKING:
    from sluice.proxy.metrics import Metrics

log = logging.getLogger("sluice.upstream")

PROTOCOL_VERSION = max(pb.ProtocolVersion.values())
SLUICE_VERSION = f"Sluice/{__version__}"


class UpstreamError(Exception):
    """A broker could not be reached, refused us, or went away."""

    def __init__(self, message: str, error: int = pb.ServiceNotReady) -> None:
        super().__init__(message)
        self.message = message
        self.error = error


async def handshake(stream: FrameStream, connect: pb.CommandConnect, timeout: float) -> Frame:
    """Send CONNECT and wait for CONNECTED. Raises UpstreamError otherwise."""
    await stream.send(encode(command(Type.Value("CONNECT"), connect)))
    with trio.move_on_after(timeout):
        try:
            frame = await stream.receive_frame()
        except ProtocolError as exc:
            raise UpstreamError(f"broker broke the protocol during handshake: {exc}") from exc
        if frame is None:
            raise UpstreamError("broker closed the connection during handshake")
        if frame.type == Type.Value("CONNECTED"):
            return frame
        if frame.type == Type.Value("ERROR"):
            raise UpstreamError(f"broker refused CONNECT: {frame.body.message}", frame.body.error)
        raise UpstreamError(f"broker answered CONNECT with {frame.name}")
    raise UpstreamError(f"broker did not answer CONNECT within {timeout:g}s")


class BrokerConnection:
    """One connection to a broker, multiplexing requests by request_id."""

    def __init__(self, stream: FrameStream, address: Address, connected: Frame) -> None:
        self.stream = stream
        self.address = address
        self.connected = connected
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[trio.Event, list[Frame]]] = {}
        self.closed = False

    @classmethod
    async def open(
        cls,
        nursery: trio.Nursery,
        address: Address,
        *,
        timeout: float,
        tls: ssl.SSLContext | None,
    ) -> BrokerConnection:
        try:
            raw = await dial(address, timeout=timeout, tls=tls)
        except OSError as exc:
            raise UpstreamError(f"cannot reach broker {address}: {exc}") from exc
        stream = FrameStream(raw)
        try:
            connected = await handshake(
                stream,
                pb.CommandConnect(client_version=SLUICE_VERSION, protocol_version=PROTOCOL_VERSION),
                timeout,
            )
        except (UpstreamError, trio.BrokenResourceError, OSError) as exc:
            await raw.aclose()
            if isinstance(exc, UpstreamError):
                raise
            raise UpstreamError(f"broker {address} dropped the connection: {exc}") from exc
        conn = cls(stream, address, connected)
        nursery.start_soon(conn._read_loop)
        return conn

    async def request(self, type_: int, body: Any, timeout: float) -> Frame:
        """Send a request (its request_id is set here) and wait for its answer."""
        if self.closed:
            raise UpstreamError(f"connection to broker {self.address} is closed")
        rid = next(self._ids)
        body.request_id = rid
        slot: tuple[trio.Event, list[Frame]] = (trio.Event(), [])
        self._waiting[rid] = slot
        try:
            try:
                await self.stream.send(encode(command(type_, body)))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise UpstreamError(f"connection to broker {self.address} broke") from exc
            with trio.move_on_after(timeout):
                await slot[0].wait()
            if not slot[1]:
                if self.closed:
                    raise UpstreamError(f"broker {self.address} closed the connection")
                raise UpstreamError(
                    f"broker {self.address} did not answer within {timeout:g}s",
                    pb.ServiceNotReady,
                )
            return slot[1][0]
        finally:
            self._waiting.pop(rid, None)

    async def _read_loop(self) -> None:
        try:
            while (frame := await self.stream.receive_frame()) is not None:
                if frame.type == Type.Value("PING"):
                    await self.stream.send(encode(command(Type.Value("PONG"))))
                    continue
                body = frame.body
                rid = getattr(body, "request_id", None) if body is not None else None
                slot = self._waiting.get(rid) if isinstance(rid, int) else None
                if slot is not None:
                    slot[1].append(frame)
                    slot[0].set()
        except (trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError) as exc:
            if not self.closed:  # not our own aclose()
                log.info("upstream connection to %s ended: %s", self.address, exc)
        finally:
            self.closed = True
            for event, _ in self._waiting.values():
                event.set()
            await self.stream.aclose()

    async def aclose(self) -> None:
        self.closed = True
        await self.stream.aclose()


class UpstreamPool:
    """At most one open BrokerConnection per broker address, opened on demand."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        timeout: float,
        tls_for: Callable[[Address], ssl.SSLContext | None],
        metrics: Metrics | None = None,
    ) -> None:
        self._metrics = metrics
        self._nursery = nursery
        self._timeout = timeout
        self._tls_for = tls_for
        self._connections: dict[Address, BrokerConnection] = {}
        self._locks: dict[Address, trio.Lock] = {}

    async def get(self, address: Address) -> BrokerConnection:
        lock = self._locks.setdefault(address, trio.Lock())
        async with lock:
            conn = self._connections.get(address)
            if conn is None or conn.closed:
                started = trio.current_time()
                try:
                    conn = await BrokerConnection.open(
                        self._nursery, address, timeout=self._timeout, tls=self._tls_for(address)
                    )
                except UpstreamError:
                    if self._metrics is not None:
                        self._metrics.upstream_dial_failures.inc()
                    raise
                if self._metrics is not None:
                    self._metrics.upstream_dial.observe(trio.current_time() - started)
                self._connections[address] = conn
            return conn

    async def aclose(self) -> None:
        for conn in list(self._connections.values()):
            await conn.aclose()
        self._connections.clear()
