"""HAProxy's PROXY protocol (v1 text, v2 binary), sans-I/O: who the client
really is when a balancer stands in front of Sluice, and the header Sluice
writes in front of its own connections to brokers.

``HeaderReader`` is fed the first bytes of a connection. ``wanted`` says how
many more it may be given without reading past the header, so that what
follows (a TLS ClientHello, the protocol's first frame) stays in the socket
for whoever reads next; ``feed`` returns the ``ProxyHeader`` once it is
whole and raises ``HeaderError`` (with a short ``reason``, a metric label)
as soon as the bytes cannot be a header. ``v2_header`` writes one.

The specification: haproxy.org, doc/proxy-protocol.txt. Protocol-neutral:
nothing here knows Pulsar or Cursus.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

import crc32c as _crc32c

from sluice.addresses import Address

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

_V2_LOCAL, _V2_PROXY = 0x0, 0x1
_AF_UNSPEC, _AF_INET, _AF_INET6, _AF_UNIX = 0x0, 0x1, 0x2, 0x3
_STREAM = 0x1
_ADDRESS_SIZE = {_AF_INET: 12, _AF_INET6: 36, _AF_UNIX: 216}
_PP2_TYPE_CRC32C = 0x03
_V2_HEAD = struct.Struct("!12sBBH")


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
            if len(data) < _V2_FIXED:
                return _V2_FIXED - len(data)
            return _V2_FIXED + int.from_bytes(data[14:16], "big") - len(data)
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
        return ProxyHeader(1, *_v1_addresses(data[len(V1_SIGNATURE) : end]), len(data))

    # --- v2 ------------------------------------------------------------------------

    def _v2(self, data: bytes) -> ProxyHeader | None:
        if not data.startswith(V2_SIGNATURE[: len(data)]):
            raise _missing(data)
        if len(data) < _V2_FIXED:
            return None
        _, version_command, family_protocol, length = _V2_HEAD.unpack_from(data)
        if version_command >> 4 != 2:
            raise HeaderError("malformed", f"PROXY v2 header of version {version_command >> 4}")
        command = version_command & 0xF
        if command not in (_V2_LOCAL, _V2_PROXY):
            raise HeaderError("malformed", f"PROXY v2 header with command {command}")
        if length > V2_MAX_LENGTH:
            raise HeaderError(
                "oversized", f"PROXY v2 header announces {length} bytes, over {V2_MAX_LENGTH}"
            )
        if len(data) < _V2_FIXED + length:
            return None
        body = data[_V2_FIXED:]
        if command == _V2_LOCAL:  # the balancer's own connection: the body is ignored
            return ProxyHeader(2, None, None, len(data))
        family, protocol = family_protocol >> 4, family_protocol & 0xF
        if family == _AF_UNSPEC:  # addresses of a kind the sender could not say
            return ProxyHeader(2, None, None, len(data))
        if family not in _ADDRESS_SIZE or protocol != _STREAM:
            raise HeaderError(
                "malformed", f"PROXY v2 header for family/protocol {family_protocol:#04x}, not TCP"
            )
        size = _ADDRESS_SIZE[family]
        if length < size:
            raise HeaderError(
                "malformed", f"PROXY v2 header of {length} bytes cannot hold its addresses ({size})"
            )
        _check_tlvs(data, _V2_FIXED + size)
        if family == _AF_UNIX:
            return ProxyHeader(2, None, None, len(data))
        width = 4 if family == _AF_INET else 16
        src, dst = (_unmapped(ipaddress.ip_address(body[at : at + width])) for at in (0, width))
        sport, dport = struct.unpack_from("!HH", body, 2 * width)
        return ProxyHeader(2, Address(str(src), sport), Address(str(dst), dport), len(data))


def _missing(data: bytes) -> HeaderError:
    return HeaderError("missing", f"no PROXY header: the connection starts with {data[:8]!r}")


def _v1_wanted(data: bytes) -> int:
    """A v1 line's bytes that are surely still to come: each field not yet
    begun needs a space and a character, the line its CRLF."""
    if data.endswith(b"\r"):
        return 1
    fields = data[len(V1_SIGNATURE) :].split(b" ")
    if fields[0] not in (b"TCP4", b"TCP6") or len(fields) > 5:
        return 2  # UNKNOWN (anything up to CRLF), or malformed: found at CRLF or the limit
    return (5 - len(fields)) * 2 + 2 + (1 if fields[-1] == b"" else 0)


def _v1_addresses(line: bytes) -> tuple[Address | None, Address | None]:
    fields = line.split(b" ")
    if fields[0] == b"UNKNOWN":
        return None, None
    if fields[0] not in (b"TCP4", b"TCP6"):
        raise HeaderError("malformed", f"PROXY v1 line with protocol {fields[0][:8]!r}")
    if len(fields) != 5:
        raise HeaderError("malformed", f"PROXY v1 line with {len(fields)} fields, not 5")
    version = 4 if fields[0] == b"TCP4" else 6
    src, dst = (_v1_ip(field, version) for field in fields[1:3])
    sport, dport = (_v1_port(field) for field in fields[3:5])
    return Address(src, sport), Address(dst, dport)


def _v1_ip(field: bytes, version: int) -> str:
    try:
        ip = ipaddress.ip_address(field.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise HeaderError("malformed", f"PROXY v1 address {field[:40]!r} is not an IP") from None
    if ip.version != version:
        raise HeaderError("malformed", f"PROXY v1 address {ip} is not IPv{version}")
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        raise HeaderError("malformed", f"PROXY v1 address {ip} names a zone")
    return str(_unmapped(ip))


def _v1_port(field: bytes) -> int:
    if not (field.isdigit() and len(field) <= 5 and int(field) <= 65535):
        raise HeaderError("malformed", f"PROXY v1 port {field[:8]!r} is not 0 to 65535")
    return int(field)


def _check_tlvs(header: bytes, start: int) -> None:
    """The TLVs after the addresses fit exactly; a CRC32C one matches.
    Types Sluice does not know are skipped, as the specification asks."""
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
    IPv4-mapped IPv6."""
    ips = [_ip(a) for a in (source, destination)]
    if source is None or destination is None or ips[0] is None or ips[1] is None:
        return V2_SIGNATURE + bytes([0x20 | _V2_LOCAL, 0]) + b"\0\0"
    src, dst = ips[0], ips[1]
    if src.version != dst.version:
        src, dst = (ipaddress.IPv6Address(f"::ffff:{ip}") if ip.version == 4 else ip
                    for ip in (src, dst))  # fmt: skip
    family = _AF_INET if src.version == 4 else _AF_INET6
    body = src.packed + dst.packed + struct.pack("!HH", source.port, destination.port)
    head = bytes([0x20 | _V2_PROXY, family << 4 | _STREAM]) + len(body).to_bytes(2, "big")
    return V2_SIGNATURE + head + body


def _ip(address: Address | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if address is None:
        return None
    try:
        ip = ipaddress.ip_address(address.host.split("%", 1)[0])
    except ValueError:
        return None
    return _unmapped(ip)


def _unmapped(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IPv4-mapped IPv6 address as the IPv4 address it stands for (one
    client, one per-IP count, however its balancer wrote it)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def starts_like_a_header(data: bytes) -> bool:
    """Whether the first bytes of a connection (however few) begin either
    signature: for sources that may not send one."""
    if not data:
        return False
    return any(sig.startswith(data[: len(sig)]) for sig in (V1_SIGNATURE, V2_SIGNATURE))
