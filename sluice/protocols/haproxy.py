"""HAProxy's PROXY protocol (v1 text, v2 binary), sans-I/O: who the client
really is when a balancer stands in front of Sluice, and the header Sluice
writes in front of its own connections to brokers.

``HeaderReader`` is fed the first bytes of a connection. ``wanted`` says how
many more it may be given without reading past the header, so that what
follows (a TLS ClientHello, the protocol's first frame) stays in the socket
for whoever reads next; ``feed`` returns the ``ProxyHeader`` once it is
whole and raises ``HeaderError`` (with a short ``reason``, a metric label)
as soon as the bytes cannot be a header. ``v2_header`` writes one.

The header's fields are read and written by PyPI's ``proxy-protocol``
(``proxyprotocol``); what is ours is the framing (how much to read, when a
header is whole or cannot be one), the limits, the reasons a header is
refused, a few checks the library does not make, and the CRC32C check (see
``_check_tlvs``). The specification: haproxy.org, doc/proxy-protocol.txt.
Protocol-neutral: nothing here knows Pulsar or Cursus.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass

import crc32c as _crc32c
from proxyprotocol import (
    ProxyProtocolChecksumError,
    ProxyProtocolIncompleteError,
    ProxyProtocolSyntaxError,
)
from proxyprotocol.result import (
    ProxyResult,
    ProxyResultIPv4,
    ProxyResultIPv6,
    ProxyResultLocal,
    ProxyResultType,
    is_ipv4,
    is_ipv6,
    is_unknown,
)
from proxyprotocol.v1 import ProxyProtocolV1
from proxyprotocol.v2 import ProxyProtocolV2, ProxyProtocolV2Header

from sluice.addresses import Address, unmapped

V1_SIGNATURE = b"PROXY "
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
# The longest v1 line the specification allows, CRLF included.
V1_MAX = 107
# The smallest v1 line ("PROXY UNKNOWN\r\n"): as many bytes as may be read
# before knowing which version this is (a v2 header has at least 16).
_FIRST_READ = 15
_V2_FIXED = 16
# The most address and TLV bytes a v2 header may announce. The addresses
# take 216 at most (AF_UNIX); balancers add a few TLVs (SSL details, a VPC
# endpoint id). Anything longer is refused before it is read.
V2_MAX_LENGTH = 2048

# Why a header was refused: each is a metric label (proxy_header_<reason>).
REASONS = ("missing", "malformed", "truncated", "oversized", "checksum", "unlisted", "timeout")

# The address block's size per family (the specification's), where the TLVs start.
_ADDRESS_SIZE = {ProxyResultType.IPv4: 12, ProxyResultType.IPv6: 36, ProxyResultType.UNIX: 216}
_PP2_TYPE_CRC32C = 0x03

_V1 = ProxyProtocolV1()
_V2 = ProxyProtocolV2()


class HeaderError(Exception):
    """The bytes are not an acceptable PROXY header; ``reason`` is one of
    ``REASONS``, the message says what was wrong (never the bytes at length)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        assert reason in REASONS, reason
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A header read: ``source`` is the client, ``destination`` the address
    it dialled at the balancer. None for both: a v2 LOCAL header (the
    balancer's own connection, a health check), v1 ``UNKNOWN``, or an
    address family without IP addresses: the connection's own addresses
    stand."""

    version: int
    source: Address | None
    destination: Address | None
    size: int


class HeaderReader:
    """One connection's PROXY header, fed as it arrives."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._v2_head: ProxyProtocolV2Header | None = None
        self.header: ProxyHeader | None = None

    @property
    def wanted(self) -> int:
        """How many bytes may be read next without reading past the header
        (0: the header is whole)."""
        if self.header is not None:
            return 0
        data = self._buffer
        if len(data) < _FIRST_READ:
            return _FIRST_READ - len(data)
        if data[0] == V2_SIGNATURE[0]:
            if self._v2_head is None:
                return _V2_FIXED - len(data)
            return _V2_FIXED + self._v2_head.data_len - len(data)
        return min(_v1_wanted(bytes(data)), V1_MAX - len(data))

    def feed(self, data: bytes) -> ProxyHeader | None:
        """Take bytes read (at most ``wanted``); the header once it is whole.
        Raises HeaderError as soon as they cannot be one."""
        if len(data) > self.wanted:
            raise ValueError(f"fed {len(data)} bytes, {self.wanted} wanted")
        self._buffer += data
        buffer = bytes(self._buffer)
        if buffer[:1] == V2_SIGNATURE[:1]:
            self.header = self._v2(buffer)
        else:
            self.header = self._v1(buffer)
        return self.header

    def end(self) -> None:
        """The peer closed before the header was whole: always an error."""
        if self.header is not None:
            return
        if not self._buffer:
            raise HeaderError("missing", "the connection closed before sending a PROXY header")
        raise HeaderError(
            "truncated", f"the connection closed after {len(self._buffer)} bytes of a PROXY header"
        )

    # --- v1 ------------------------------------------------------------------------

    def _v1(self, data: bytes) -> ProxyHeader | None:
        """Framing: the line ends at its first CRLF, within ``V1_MAX``; the
        library reads the fields of a whole line."""
        if not data.startswith(V1_SIGNATURE[: len(data)]):
            raise _missing(data)
        end = data.find(b"\r\n")
        if end < 0:
            if b"\n" in data or b"\r" in data[:-1]:
                raise HeaderError("malformed", "PROXY v1 line with a stray CR or LF")
            if len(data) >= V1_MAX:
                raise HeaderError("oversized", f"PROXY v1 line longer than {V1_MAX} bytes")
            return None
        if end != len(data) - 2:
            raise HeaderError("malformed", "PROXY v1 line shorter than its first read")
        try:
            result = _V1.unpack(data)
        except ProxyProtocolIncompleteError:  # cannot be: the line ends in CRLF
            raise HeaderError("malformed", "PROXY v1 line not whole at its CRLF") from None
        except ValueError as error:  # ProxyProtocolSyntaxError, a bad address or port
            raise HeaderError("malformed", _v1_refusal(error)) from None
        if is_unknown(result):
            return ProxyHeader(1, None, None, len(data))
        if not (is_ipv4(result) or is_ipv6(result)):
            raise HeaderError("malformed", f"PROXY v1 line read as {result.type.name}")
        _check_v1_ports(data)
        source, destination = (_address(ip, port) for ip, port in (result.source, result.dest))
        return ProxyHeader(1, source, destination, len(data))

    # --- v2 ------------------------------------------------------------------------

    def _v2(self, data: bytes) -> ProxyHeader | None:
        if not data.startswith(V2_SIGNATURE[: len(data)]):
            raise _missing(data)
        if len(data) < _V2_FIXED:
            return None
        if self._v2_head is None:
            self._v2_head = _v2_head(data[:_V2_FIXED])
        head = self._v2_head
        if len(data) < _V2_FIXED + head.data_len:
            return None
        if head.command == "local":  # the balancer's own connection: the body is ignored
            return ProxyHeader(2, None, None, len(data))
        if head.type is ProxyResultType.UNKNOWN:  # AF_UNSPEC: addresses the sender could not say
            return ProxyHeader(2, None, None, len(data))
        if head.type is None or head.protocol is not socket.SOCK_STREAM:
            raise HeaderError(
                "malformed", f"PROXY v2 header for family/protocol {data[13]:#04x}, not TCP"
            )
        size = _ADDRESS_SIZE[head.type]
        if head.data_len < size:
            raise HeaderError(
                "malformed",
                f"PROXY v2 header of {head.data_len} bytes cannot hold its addresses ({size})",
            )
        try:
            result: ProxyResult = _V2.unpack(data)
        except ProxyProtocolChecksumError as error:
            result = error.result  # _check_tlvs decides: see there
        except (ValueError, struct.error) as error:  # a syntax error, a path not ASCII
            raise HeaderError("malformed", f"PROXY v2 header: {_said(error)}") from None
        _check_tlvs(data, _V2_FIXED + size)
        if is_ipv4(result) or is_ipv6(result):
            source, destination = (_address(ip, port) for ip, port in (result.source, result.dest))
            return ProxyHeader(2, source, destination, len(data))
        return ProxyHeader(2, None, None, len(data))  # AF_UNIX: the socket's own addresses


def _missing(data: bytes) -> HeaderError:
    return HeaderError("missing", f"no PROXY header: the connection starts with {data[:8]!r}")


def _said(error: Exception) -> str:
    return (str(error) or type(error).__name__)[:100]


def _v1_wanted(data: bytes) -> int:
    """A v1 line's bytes that are surely still to come: each field not yet
    begun needs a space and a character, the line its CRLF."""
    if data.endswith(b"\r"):
        return 1
    fields = data[len(V1_SIGNATURE) :].split(b" ")
    if fields[0] not in (b"TCP4", b"TCP6") or len(fields) > 5:
        return 2  # UNKNOWN (anything up to CRLF), or malformed: found at CRLF or the limit
    return (5 - len(fields)) * 2 + 2 + (1 if fields[-1] == b"" else 0)


def _v1_refusal(error: ValueError) -> str:
    if isinstance(error, ProxyProtocolSyntaxError):
        return f"PROXY v1 line: {_said(error)}"
    return f"PROXY v1 line with an address or port out of place: {_said(error)}"


def _check_v1_ports(line: bytes) -> None:
    """The library reads a v1 port with ``int()``, which also takes ``+80``,
    ``8_0``, ``\\t80`` and ``000080``: only up to five digits are a port."""
    for field in line[len(V1_SIGNATURE) : -2].split(b" ")[3:5]:
        if not (field.isdigit() and len(field) <= 5):
            raise HeaderError("malformed", f"PROXY v1 port {field[:8]!r} is not 0 to 65535")


def _v2_head(fixed: bytes) -> ProxyProtocolV2Header:
    """The fixed 16 bytes, read by the library; refused here if they cannot
    start a header Sluice takes, before the body is read."""
    try:
        head = _V2.unpack_header(fixed)
    except ProxyProtocolSyntaxError:
        raise HeaderError("malformed", f"PROXY v2 header of version {fixed[12] >> 4}") from None
    if head.command is None:
        raise HeaderError("malformed", f"PROXY v2 header with command {fixed[12] & 0xF}")
    if head.data_len > V2_MAX_LENGTH:
        raise HeaderError(
            "oversized", f"PROXY v2 header announces {head.data_len} bytes, over {V2_MAX_LENGTH}"
        )
    return head


def _address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> Address:
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        raise HeaderError("malformed", f"PROXY header address {ip} names a zone")
    return Address(str(unmapped(ip)), port)


def _check_tlvs(header: bytes, start: int) -> None:
    """The TLVs after the addresses fit exactly; a CRC32C one matches.
    Types Sluice does not know are skipped, as the specification asks.

    Kept here rather than left to the library, which reads TLVs leniently
    (one cut short or running past the header is dropped or shortened
    without a word) and checks a CRC32C over its own copy of the TLVs,
    sorted by type and with repeats merged, rather than over the bytes
    sent: a valid header whose TLVs come in another order (the
    specification sets none) fails its check there."""
    at = start
    while at < len(header):
        if at + 3 > len(header):
            raise HeaderError("malformed", "PROXY v2 header ends inside a TLV")
        kind, size = header[at], int.from_bytes(header[at + 1 : at + 3], "big")
        value = at + 3
        if value + size > len(header):
            raise HeaderError("malformed", f"PROXY v2 TLV {kind:#04x} runs past the header")
        if kind == _PP2_TYPE_CRC32C:
            if size != 4:
                raise HeaderError("malformed", "PROXY v2 CRC32C TLV is not 4 bytes")
            zeroed = header[:value] + b"\0\0\0\0" + header[value + 4 :]
            if _crc32c.crc32c(zeroed) != int.from_bytes(header[value : value + 4], "big"):
                raise HeaderError("checksum", "PROXY v2 header's CRC32C does not match")
        at = value + size


def v2_header(source: Address | None, destination: Address | None) -> bytes:
    """A v2 header naming ``source`` as the client and ``destination`` as
    the address it dialled; LOCAL (the sender's own connection) when either
    is not an IP address. An IPv4 address beside an IPv6 one is written as
    IPv4-mapped IPv6. The library adds a CRC32C TLV to every header."""
    ips = [_ip(a) for a in (source, destination)]
    result: ProxyResult
    if source is None or destination is None or ips[0] is None or ips[1] is None:
        result = ProxyResultLocal()
    else:
        src, dst = ips[0], ips[1]
        if isinstance(src, ipaddress.IPv4Address) and isinstance(dst, ipaddress.IPv4Address):
            result = ProxyResultIPv4(
                (src, source.port), (dst, destination.port), protocol=socket.SOCK_STREAM
            )
        else:
            src6, dst6 = (_mapped(ip) for ip in (src, dst))
            result = ProxyResultIPv6(
                (src6, source.port), (dst6, destination.port), protocol=socket.SOCK_STREAM
            )
    return bytes(_V2.pack(result))


def _ip(address: Address | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if address is None:
        return None
    try:
        ip = ipaddress.ip_address(address.host.split("%", 1)[0])
    except ValueError:
        return None
    return unmapped(ip)


def _mapped(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv6Address:
    if isinstance(ip, ipaddress.IPv4Address):
        return ipaddress.IPv6Address(f"::ffff:{ip}")
    return ip


def starts_like_a_header(data: bytes) -> bool:
    """Whether the first bytes of a connection (however few) begin either
    signature: for sources that may not send one."""
    if not data:
        return False
    return any(sig.startswith(data[: len(sig)]) for sig in (V1_SIGNATURE, V2_SIGNATURE))
