"""What every client connection's session has, whichever kind it turns out to be."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice.protocols.pulsar import Frame
from sluice.proxy.framing import FrameStream

if TYPE_CHECKING:
    from sluice.proxy.server import Proxy


class ClientSession:
    """A client connection after its CONNECT: the proxy, the stream, its ids."""

    def __init__(
        self, proxy: Proxy, client: FrameStream, connect: Frame, conn: int, name: str
    ) -> None:
        self.proxy = proxy
        self.client = client
        self.connect = connect  # the client's CONNECT frame
        self.conn = conn  # connection id (metrics, recordings)
        self.name = name  # "conn-<id> <peer>", the prefix of every log line about it
