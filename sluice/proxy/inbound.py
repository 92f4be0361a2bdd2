"""Who a connection is really from: the PROXY protocol header a balancer
writes in front of it (``--proxy-protocol-in``), read before anything else
on the socket, on every listener (the protocol's, TLS or not, and admin).

Sources in ``--proxy-protocol-from`` must send a header (v1 or v2); anyone
else must not: their first bytes are peeked at, never taken, so a client
dialling Sluice directly is served as before. On the admin endpoint a
listed source may send none (``optional``: a kubelet's probe from a listed
address): an HTTP request never begins like a header, so its first bytes,
peeked at, say whether one comes. Either way the header is read
to its last byte and no further (``HeaderReader``), so that a TLS
ClientHello or the protocol's first frame stays for the reader after it.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import trio

from sluice.addresses import Address, unmapped
from sluice.errors import ConfigError
from sluice.protocols.haproxy import (
    V1_SIGNATURE,
    V2_SIGNATURE,
    HeaderError,
    HeaderReader,
    ProxyHeader,
    starts_like_a_header,
)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# How soon the first bytes of a connection are looked at again while they
# are only a part of a PROXY signature (``ProxyProtocolIn._header_comes``).
PEEK_AGAIN = 0.01


def parse_sources(rules: Iterable[str], what: str = "--proxy-protocol-from") -> tuple[Network, ...]:
    """CIDRs (or single addresses) as networks; ConfigError names a bad one."""
    networks: list[Network] = []
    for rule in rules:
        for part in rule.split(","):
            text = part.strip()
            if not text:
                continue
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                raise ConfigError(f"{what} {text!r}: expected an address or a CIDR") from None
    return tuple(networks)


@dataclass(frozen=True)
class ProxyProtocolIn:
    """``--proxy-protocol-in`` on the listeners: whose headers are taken,
    and how long a header may take to arrive."""

    sources: tuple[Network, ...]
    timeout: float

    def trusts(self, host: str) -> bool:
        """Whether ``host`` is a listed source. An IPv4 client is one client
        however it is written: 10.0.0.9, or ::ffff:10.0.0.9 as a dual-stack
        listener sees it (and logs it, so a rule may be written so too)."""
        try:
            ip = unmapped(ipaddress.ip_address(host.split("%", 1)[0]))
        except ValueError:
            return False
        forms: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...] = (ip,)
        if isinstance(ip, ipaddress.IPv4Address):
            forms = (ip, ipaddress.IPv6Address(f"::ffff:{ip}"))
        return any(form in network for form in forms for network in self.sources)

    async def read(
        self, stream: trio.abc.Stream, peer: Address, *, optional: bool = False
    ) -> ProxyHeader | None:
        """The header of a connection from ``peer`` (a listed source), or None
        for anyone else who sent none. Raises HeaderError: a header from an
        unlisted source, none from a listed one (unless ``optional``), a bad
        or late one."""
        raw = transport(stream)
        if not self.trusts(peer.host):
            await self._refuse_headers(raw, peer)
            return None
        if optional and not await self._header_comes(raw):
            return None
        reader = HeaderReader()
        with trio.move_on_after(self.timeout):
            try:
                while reader.wanted:
                    data = await raw.receive_some(reader.wanted)
                    if not data:
                        reader.end()
                    reader.feed(bytes(data))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                reader.end()
            return reader.header
        raise HeaderError("timeout", f"no whole PROXY header within {self.timeout:g}s")

    async def _header_comes(self, raw: trio.abc.Stream) -> bool:
        """Whether a connection begins with a header: its first bytes looked
        at without being taken, as many as it takes to tell (``POST`` and
        ``PROXY`` begin alike). Undecided within the timeout, or nothing to
        look at: as if one came (its reader then says what is wrong)."""
        sock = getattr(raw, "socket", None)
        if sock is None:
            return True
        with trio.move_on_after(self.timeout):
            while True:
                try:
                    first = await sock.recv(len(V2_SIGNATURE), socket.MSG_PEEK)
                except OSError:
                    return False
                if not starts_like_a_header(first):  # (nothing at all: closed)
                    return False
                if first.startswith((V1_SIGNATURE, V2_SIGNATURE)):
                    return True
                await trio.sleep(PEEK_AGAIN)  # a part of a signature so far
        return True

    async def _refuse_headers(self, raw: trio.abc.Stream, peer: Address) -> None:
        """A source that may not send a header: look at its first bytes
        (waiting for them at most the timeout) without taking them, as many
        as it takes to tell: a request that comes a byte at a time begins
        with ``P`` as ``PROXY `` does. Undecided within the timeout: served
        as before (the protocol says what is wrong with its bytes)."""
        sock = getattr(raw, "socket", None)
        if sock is None:
            return
        with trio.move_on_after(self.timeout):
            while True:
                try:
                    first = await sock.recv(len(V2_SIGNATURE), socket.MSG_PEEK)
                except OSError:
                    return
                if not starts_like_a_header(first):  # (nothing at all: closed)
                    return
                if first.startswith((V1_SIGNATURE, V2_SIGNATURE)):
                    break
                await trio.sleep(PEEK_AGAIN)  # a part of a signature so far
            raise HeaderError(
                "unlisted", f"a PROXY header from {peer.host}, which --proxy-protocol-from "
                "does not list"
            )  # fmt: skip


def transport(stream: trio.abc.Stream) -> trio.abc.Stream:
    """The TCP stream under a TLS one (whose handshake has not started:
    ``trio.SSLListener`` reads nothing before the first receive)."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    return stream


def peer_address(stream: trio.abc.Stream) -> Address:
    """The other end of the TCP connection (``?:0`` when there is none)."""
    try:
        host, port = transport(stream).socket.getpeername()[:2]  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return Address("?", 0)
    return Address(host, port)


def local_address(stream: trio.abc.Stream) -> Address | None:
    """The address the peer dialled (this end of the TCP connection)."""
    try:
        host, port = transport(stream).socket.getsockname()[:2]  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return None
    return Address(host, port)
