"""A trio byte stream seen as Pulsar frames, and dialing helpers."""

from __future__ import annotations

import ssl

import trio

from sluice.protocols.pulsar import CLOSED, DEFAULT_MAX_MESSAGE_SIZE, Frame, FrameDecoder
from sluice.proxy.config import Address, TlsClientConfig

# How much one read asks the socket for. The codec benchmark feeds the
# decoder reads of this size too.
READ_SIZE = 256 * 1024


class FrameStream:
    """Frames in, bytes out, over one trio stream.

    Sends are serialized with a lock: several tasks may answer on the same
    connection (the relay pumps, keepalive, drain).
    """

    def __init__(
        self, stream: trio.abc.Stream, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    ) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(max_message_size)
        self._send_lock = trio.StrictFIFOLock()
        self.bytes_in = 0
        self.bytes_out = 0

    async def receive_frame(self) -> Frame | None:
        """The next frame; None when the peer closed cleanly.

        Raises ``RemoteProtocolError`` (fatal) when framing is lost, and
        trio's stream errors when the connection breaks.
        """
        while True:
            event = self.decoder.next_event()
            if isinstance(event, Frame):
                return event
            if event is CLOSED:
                return None
            data = await self.stream.receive_some(READ_SIZE)
            self.bytes_in += len(data)
            self.decoder.receive_data(data)

    async def receive_chunk(self) -> bytes:
        """Raw bytes for callers that decode themselves (b"" at end of stream)."""
        data = bytes(await self.stream.receive_some(READ_SIZE))
        self.bytes_in += len(data)
        return data

    async def send(self, data: bytes) -> None:
        async with self._send_lock:
            await self.stream.send_all(data)
            self.bytes_out += len(data)

    async def aclose(self) -> None:
        await self.stream.aclose()


def client_ssl_context(config: TlsClientConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(config.ca) if config.ca else None)
    context.check_hostname = config.verify_hostname
    if not config.verify_hostname:
        # Hostname checks off means the operator trusts the network path.
        context.verify_mode = ssl.CERT_NONE if config.ca is None else ssl.CERT_REQUIRED
    if config.cert is not None:
        context.load_cert_chain(str(config.cert), str(config.key) if config.key else None)
    return context


async def dial(
    address: Address,
    *,
    timeout: float,
    tls: ssl.SSLContext | None = None,
) -> trio.abc.Stream:
    """Open a TCP (optionally TLS) connection, all within ``timeout`` seconds.

    Raises ``OSError`` with a readable message on failure or timeout.
    """
    stream: trio.abc.Stream
    with trio.move_on_after(timeout) as scope:
        tcp = await trio.open_tcp_stream(address.host, address.port)
        if tls is None:
            return tcp
        stream = trio.SSLStream(tcp, tls, server_hostname=address.host, https_compatible=False)
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError as exc:
            await tcp.aclose()
            raise OSError(f"TLS handshake with {address} failed: {exc.__cause__ or exc}") from exc
        return stream
    assert scope.cancelled_caught
    raise OSError(f"connecting to {address} timed out after {timeout:g}s")
