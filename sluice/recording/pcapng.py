"""Recorded traffic as a pcapng file that Wireshark and tshark open.

Each recorded connection becomes a synthetic TCP conversation: a
three-way handshake when it opened, one segment per recorded frame (split at
64000 bytes), and FINs when it closed, with consistent sequence numbers and
real IP and TCP checksums. Addresses come from the recording; names that are
not IP addresses are mapped to stable addresses in 10.0.0.0/8. A connection
with an IPv6 end is an IPv6 conversation, its IPv4 end (the broker a client
reached over IPv6 was dialled over IPv4) written as IPv4-mapped
(``::ffff:a.b.c.d``): one TCP conversation has one address family. The TCP
payload is exactly the recorded bytes: payloads appear only in recordings
made with ``--record-payloads full``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import struct
from dataclasses import dataclass
from typing import BinaryIO

LINKTYPE_RAW = 101  # packets start at the IP header (IPv4 or IPv6, by its version)
MAX_SEGMENT = 64000
_SYN, _ACK, _PSH, _FIN = 0x02, 0x10, 0x08, 0x01


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\x00"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ipv4_of(host: str) -> bytes:
    """The host as 4 bytes: itself if an IPv4 address, else a stable 10.x.y.z."""
    try:
        address = ipaddress.ip_address(host)
        if isinstance(address, ipaddress.IPv4Address):
            return address.packed
    except ValueError:
        pass
    digest = hashlib.sha256(host.encode()).digest()
    return bytes([10, digest[0], digest[1], max(1, digest[2])])


def ip_of(host: str) -> bytes:
    """The host as 4 bytes (IPv4, an IPv4-mapped IPv6 address too), 16 bytes
    (IPv6), or, for a name, a stable 10.x.y.z."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # (a zone: fe80::1%eth0)
    except ValueError:
        return ipv4_of(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.packed
    return address.packed


def _as_ipv6(address: bytes) -> bytes:
    """An IPv4 address as IPv4-mapped IPv6 (``::ffff:a.b.c.d``); IPv6 as it is."""
    return address if len(address) == 16 else b"\x00" * 10 + b"\xff\xff" + address


def split_host_port(text: str, default_port: int) -> tuple[str, int]:
    value = text.split("://", 1)[-1].rstrip("/")
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        return value.strip("[]"), default_port
    return host.strip("[]"), int(port)


@dataclass
class _Flow:
    client: tuple[bytes, int]
    server: tuple[bytes, int]
    seq: list[int]  # next sequence number: [client, server]
    ip_id: int = 0


class PcapngWriter:
    def __init__(self, out: BinaryIO, comment: str = "") -> None:
        """``comment``: shown by Wireshark as the capture's comment
        (Statistics > Capture File Properties), e.g. how to decode it."""
        self.out = out
        self.packets = 0
        self._flows: dict[object, _Flow] = {}
        options = b""
        if comment:
            text = comment.encode()
            options = struct.pack("<HH", 1, len(text)) + text + b"\x00" * (-len(text) % 4)
            options += struct.pack("<HH", 0, 0)
        self._block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1) + options)
        # Interface: raw IP, timestamps in nanoseconds (if_tsresol = 9).
        options = struct.pack("<HHB3x", 9, 1, 9) + struct.pack("<HH", 0, 0)
        self._block(1, struct.pack("<HHI", LINKTYPE_RAW, 0, 0) + options)

    def _block(self, kind: int, body: bytes) -> None:
        body += b"\x00" * (-len(body) % 4)
        length = len(body) + 12
        self.out.write(struct.pack("<II", kind, length) + body + struct.pack("<I", length))

    def _packet(self, ts_ns: int, packet: bytes) -> None:
        head = struct.pack("<IIIII", 0, ts_ns >> 32, ts_ns & 0xFFFFFFFF, len(packet), len(packet))
        self._block(6, head + packet)
        self.packets += 1

    def _segment(self, flow: _Flow, from_client: bool, flags: int, data: bytes, ts_ns: int) -> None:
        src, dst = (flow.client, flow.server) if from_client else (flow.server, flow.client)
        mine, theirs = (0, 1) if from_client else (1, 0)
        seq, ack = flow.seq[mine], flow.seq[theirs] if flags != _SYN else 0
        tcp = struct.pack("!HHIIBBHHH", src[1], dst[1], seq, ack, 5 << 4, flags, 65535, 0, 0)
        size = len(tcp) + len(data)
        if len(src[0]) == 16:  # IPv6: its pseudo-header (RFC 8200 8.1), no IP checksum
            pseudo = src[0] + dst[0] + struct.pack("!IxxxB", size, 6)
        else:
            pseudo = src[0] + dst[0] + struct.pack("!BBH", 0, 6, size)
        checksum = _checksum(pseudo + tcp + data)
        tcp = tcp[:16] + struct.pack("!H", checksum) + tcp[18:]
        flow.ip_id = (flow.ip_id + 1) & 0xFFFF
        if len(src[0]) == 16:
            ip = struct.pack("!IHBB16s16s", 6 << 28, size, 6, 64, src[0], dst[0])
        else:
            ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + size, flow.ip_id,
                             0x4000, 64, 6, 0, src[0], dst[0])  # fmt: skip
            ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
        self._packet(ts_ns, ip + tcp + data)
        advance = len(data) + (1 if flags & (_SYN | _FIN) else 0)
        flow.seq[mine] = (flow.seq[mine] + advance) & 0xFFFFFFFF

    def open(self, key: object, client: str, server: str, ts_ns: int) -> None:
        chost, cport = split_host_port(client, 40000)
        shost, sport = split_host_port(server, 6650)
        caddr, saddr = ip_of(chost), ip_of(shost)
        if len(caddr) != len(saddr):  # one family per conversation: IPv6's
            caddr, saddr = _as_ipv6(caddr), _as_ipv6(saddr)
        seed = hashlib.sha256(repr(key).encode()).digest()
        flow = _Flow(
            (caddr, cport),
            (saddr, sport),
            [int.from_bytes(seed[:4], "big"), int.from_bytes(seed[4:8], "big")],
        )
        self._flows[key] = flow
        self._segment(flow, True, _SYN, b"", ts_ns)
        self._segment(flow, False, _SYN | _ACK, b"", ts_ns)
        self._segment(flow, True, _ACK, b"", ts_ns)

    def data(self, key: object, from_client: bool, payload: bytes, ts_ns: int) -> None:
        flow = self._flows.get(key)
        if flow is None:
            return
        for start in range(0, len(payload), MAX_SEGMENT):
            chunk = payload[start : start + MAX_SEGMENT]
            self._segment(flow, from_client, _ACK | _PSH, chunk, ts_ns)

    def close(self, key: object, ts_ns: int) -> None:
        flow = self._flows.pop(key, None)
        if flow is None:
            return
        self._segment(flow, True, _FIN | _ACK, b"", ts_ns)
        self._segment(flow, False, _FIN | _ACK, b"", ts_ns)
        self._segment(flow, True, _ACK, b"", ts_ns)
