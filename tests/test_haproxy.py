"""The PROXY protocol reader and writer (sluice/protocols/haproxy.py), on
bytes: every header read to its last byte and never a byte further, every
bad one refused with its reason."""

from __future__ import annotations

import random
import struct

import crc32c
import pytest

from sluice.addresses import Address
from sluice.protocols.haproxy import (
    V1_MAX,
    V2_MAX_LENGTH,
    V2_SIGNATURE,
    HeaderError,
    HeaderReader,
    ProxyHeader,
    starts_like_a_header,
    v2_header,
)

FOLLOWS = b"\x16\x03\x01\x02\x00" + b"the first frame, which must stay in the socket"


def read(stream: bytes, seed: int = 0) -> tuple[ProxyHeader, bytes]:
    """Read a header the way the proxy does, in reads of 1 to ``wanted``
    bytes; the header and what is left unread."""
    rng = random.Random(seed)
    reader = HeaderReader()
    at = 0
    while True:
        wanted = reader.wanted
        assert wanted > 0
        size = rng.randint(1, wanted)
        chunk = stream[at : at + size]
        at += len(chunk)
        if not chunk:
            reader.end()
        header = reader.feed(chunk)
        if header is not None:
            assert reader.wanted == 0
            return header, stream[at:]


def refused(stream: bytes, seed: int = 0) -> HeaderError:
    with pytest.raises(HeaderError) as caught:
        read(stream, seed)
    return caught.value


def v2(command: int, family: int, body: bytes) -> bytes:
    return V2_SIGNATURE + bytes([0x20 | command, family]) + struct.pack("!H", len(body)) + body


def inet(src: str, dst: str, sport: int, dport: int) -> bytes:
    return (
        bytes(map(int, src.split(".")))
        + bytes(map(int, dst.split(".")))
        + struct.pack("!HH", sport, dport)
    )


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(
    ("line", "source", "destination"),
    [
        (b"PROXY TCP4 127.0.0.23 127.0.0.1 56324 6650\r\n", Address("127.0.0.23", 56324),
         Address("127.0.0.1", 6650)),
        (b"PROXY TCP6 2001:db8::1 ::1 1 65535\r\n", Address("2001:db8::1", 1),
         Address("::1", 65535)),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 0 0\r\n", Address("1.2.3.4", 0), Address("5.6.7.8", 0)),
        (b"PROXY UNKNOWN\r\n", None, None),
        (b"PROXY UNKNOWN ffff::1 ffff::2 80 80\r\n", None, None),
    ],
)  # fmt: skip
def test_v1_is_read_to_its_crlf_and_no_further(
    line: bytes, source: Address | None, destination: Address | None, seed: int
) -> None:
    header, rest = read(line + FOLLOWS, seed)
    assert header == ProxyHeader(1, source, destination, len(line))
    assert rest == FOLLOWS


@pytest.mark.parametrize("seed", range(8))
def test_v2_is_read_to_its_length_and_no_further(seed: int) -> None:
    # An unknown TLV (0xEA, as AWS writes its VPC endpoint id) is skipped.
    tlv = bytes([0xEA, 0, 5]) + b"vpc-1"
    raw = v2(1, 0x11, inet("127.0.0.23", "127.0.0.1", 40000, 6651) + tlv)
    header, rest = read(raw + FOLLOWS, seed)
    assert header == ProxyHeader(
        2, Address("127.0.0.23", 40000), Address("127.0.0.1", 6651), len(raw)
    )
    assert rest == FOLLOWS


def test_v2_ipv6_local_unspec_and_unix() -> None:
    six = bytes(15) + b"\x01"
    header, _ = read(v2(1, 0x21, six + six + struct.pack("!HH", 7, 8)))
    assert header.source == Address("::1", 7)
    mapped = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 9])
    header, _ = read(v2(1, 0x21, mapped + six + struct.pack("!HH", 7, 8)))
    assert header.source == Address("10.0.0.9", 7)  # one client however it is written
    header, _ = read(b"PROXY TCP6 ::ffff:10.0.0.9 ::1 7 8\r\n")
    assert header.source == Address("10.0.0.9", 7)  # in v1 too
    for raw in (v2(0, 0x00, b""), v2(0, 0x11, b"ignored"), v2(1, 0x00, b""),
                v2(1, 0x31, bytes(216))):  # fmt: skip
        header, rest = read(raw + FOLLOWS)
        assert (header.source, header.destination, rest) == (None, None, FOLLOWS)


def test_a_crc32c_tlv_is_checked() -> None:
    body = inet("10.1.2.3", "10.0.0.1", 1000, 6650) + bytes([0x03, 0, 4, 0, 0, 0, 0])
    raw = bytearray(v2(1, 0x11, body))
    raw[-4:] = crc32c.crc32c(bytes(raw)).to_bytes(4, "big")
    assert read(bytes(raw))[0].source == Address("10.1.2.3", 1000)
    raw[-1] ^= 1
    assert refused(bytes(raw)).reason == "checksum"


def test_a_crc32c_is_checked_over_the_tlvs_as_sent() -> None:
    """The specification sets no order for TLVs: a CRC32C written before
    the TLVs of lower types (ALPN, here) checks out."""
    crc_then_alpn = bytes([0x03, 0, 4, 0, 0, 0, 0, 0x01, 0, 2]) + b"h2"
    raw = bytearray(v2(1, 0x11, inet("10.1.2.3", "10.0.0.1", 1000, 6650) + crc_then_alpn))
    raw[31:35] = crc32c.crc32c(bytes(raw)).to_bytes(4, "big")
    assert read(bytes(raw))[0].source == Address("10.1.2.3", 1000)
    raw[-1] ^= 1
    assert refused(bytes(raw)).reason == "checksum"


@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        # no header where one is required: a Pulsar frame, a TLS ClientHello, HTTP
        (b"\x00\x00\x00\x20\x00\x00\x00\x1c" + bytes(32), "missing"),
        (b"\x16\x03\x01\x00\xa0", "missing"),
        (b"GET /metrics HTTP/1.1\r\n", "missing"),
        (b"PROXX TCP4 1.2.3.4 5.6.7.8 1 2\r\n", "missing"),
        (b"\r\n\r\n\x00\r\nQUIX\n\x21\x11\x00\x0c" + bytes(12), "missing"),
        # truncated: the peer closes part-way
        (b"PROXY TCP4 127.0.0.23 127.0", "truncated"),
        (V2_SIGNATURE + b"\x21\x11\x00\x0c" + bytes(5), "truncated"),
        (V2_SIGNATURE[:7], "truncated"),
        (b"", "missing"),
        # oversized
        (b"PROXY UNKNOWN " + b"x" * V1_MAX + b"\r\n", "oversized"),
        (V2_SIGNATURE + b"\x21\x11\xff\xff" + bytes(64), "oversized"),
        (V2_SIGNATURE + b"\x21\x11" + struct.pack("!H", V2_MAX_LENGTH + 1), "oversized"),
        # malformed
        (b"PROXY TCP4 127.0.0.23 127.0.0.1 56324 66650\r\n", "malformed"),
        (b"PROXY TCP4 127.0.0.23 127.0.0.1 +5632 6650\r\n", "malformed"),
        (b"PROXY TCP4 ::1 127.0.0.1 1 2\r\n", "malformed"),
        (b"PROXY TCP4 127.0.0.023 127.0.0.1 1 2\r\n", "malformed"),
        (b"PROXY TCP4 127.0.0.23 127.0.0.1 1\r\n", "malformed"),
        (b"PROXY TCP4 127.0.0.23  127.0.0.1 1 2\r\n", "malformed"),
        (b"PROXY UDP4 127.0.0.23 127.0.0.1 1 2\r\n", "malformed"),
        (b"PROXY TCP4 127.0.0.23\n127.0.0.1 1 2\r\n", "malformed"),
        (b"PROXY TCP4 \xff\xfe.0.0.1 127.0.0.1 1 2\r\n", "malformed"),
        (b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n", "malformed"),  # a zone: no address elsewhere
        (b"PROXY X\r\n" + bytes(20), "malformed"),
        (V2_SIGNATURE + b"\x11\x11\x00\x0c" + bytes(12), "malformed"),  # version 1 in a v2
        (V2_SIGNATURE + b"\x22\x11\x00\x0c" + bytes(12), "malformed"),  # command 2
        (V2_SIGNATURE + b"\x21\x12\x00\x0c" + bytes(12), "malformed"),  # UDP
        (V2_SIGNATURE + b"\x21\x41\x00\x0c" + bytes(12), "malformed"),  # family 4
        (V2_SIGNATURE + b"\x21\x21\x00\x0c" + bytes(12), "malformed"),  # too short for IPv6
        (v2(1, 0x11, inet("1.2.3.4", "5.6.7.8", 1, 2) + b"\xea\x00"), "malformed"),  # cut TLV
        (v2(1, 0x11, inet("1.2.3.4", "5.6.7.8", 1, 2) + b"\xea\x00\x09ab"), "malformed"),
        (v2(1, 0x11, inet("1.2.3.4", "5.6.7.8", 1, 2) + b"\x03\x00\x02ab"), "malformed"),
    ],
)
def test_bad_headers_are_refused_with_their_reason(stream: bytes, reason: str) -> None:
    for seed in range(4):
        error = refused(stream, seed)
        assert error.reason == reason, error.message
        assert len(error.message) < 200


def test_oversized_v2_is_refused_before_its_body_is_read() -> None:
    reader = HeaderReader()
    assert reader.feed(V2_SIGNATURE + b"\x21\x11\xff") is None
    assert reader.wanted == 1  # the second byte of the length, nothing past it
    with pytest.raises(HeaderError, match="announces 65535 bytes") as caught:
        reader.feed(b"\xff")
    assert caught.value.reason == "oversized"


def test_more_than_wanted_is_a_caller_bug() -> None:
    with pytest.raises(ValueError):
        HeaderReader().feed(bytes(16))


@pytest.mark.parametrize(
    ("source", "destination", "family"),
    [
        (Address("127.0.0.23", 40000), Address("127.0.0.1", 6650), 0x11),
        (Address("2001:db8::7", 1), Address("::1", 2), 0x21),
        (Address("127.0.0.23", 40000), Address("::1", 6650), 0x21),  # mixed: mapped
    ],
)
def test_what_sluice_writes_reads_back(source: Address, destination: Address, family: int) -> None:
    raw = v2_header(source, destination)
    assert raw[13] == family
    header, rest = read(raw + FOLLOWS)
    assert rest == FOLLOWS
    assert header.source == source
    if family == 0x11 or destination.host == "::1":
        assert header.destination == destination
    # It carries a CRC32C: a byte changed on the way is refused.
    changed = bytearray(raw)
    changed[16] ^= 1  # the first byte of the source address
    assert refused(bytes(changed)).reason == "checksum"


def test_without_an_ip_sluice_writes_local() -> None:
    for source in (None, Address("?", 0), Address("broker.example", 1)):
        raw = v2_header(source, Address("127.0.0.1", 6650))
        assert raw[:14] == V2_SIGNATURE + b"\x20\x00"  # LOCAL, AF_UNSPEC
        header, rest = read(raw + FOLLOWS)
        assert (header.source, header.size, rest) == (None, len(raw), FOLLOWS)


def test_signatures_are_recognised_from_their_first_bytes() -> None:
    for data in (
        b"P",
        b"PROXY",
        b"PROXY TCP4 1",
        b"\r",
        b"\r\n\r\n\x00\r\nQU",
        V2_SIGNATURE + b"!",
    ):
        assert starts_like_a_header(data), data
    for data in (b"", b"\x00\x00\x00\x10", b"\x16\x03\x01", b"GET / HTTP/1.1", b"PROXZ", b"\r\r"):
        assert not starts_like_a_header(data), data


def test_a_v1_line_reads_the_same_however_it_is_cut() -> None:
    """Found by fuzzing (crashes/proxy_header/v1-stray-lf-past-the-limit): a
    stray LF and the length limit in one read gave "oversized", read in
    smaller pieces "malformed"; and a line whose CRLF fell just past the
    limit was taken when a read happened to end on it."""
    stray = b"PROXY UNKNOWN " + b"x" * 80 + b"\n" + b"y" * 40
    assert {refused(stray, seed).reason for seed in range(16)} == {"malformed"}
    too_long = b"PROXY UNKNOWN " + b"x" * (V1_MAX - 15) + b"\r\n"
    assert len(too_long) == V1_MAX + 1
    assert {refused(too_long, seed).reason for seed in range(16)} == {"oversized"}
    longest = b"PROXY UNKNOWN " + b"x" * (V1_MAX - 16) + b"\r\n"
    assert read(longest)[0].size == V1_MAX
