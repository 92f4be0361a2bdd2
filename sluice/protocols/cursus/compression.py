"""The broker-wide compression setting, applied as the broker applies it.

A Cursus broker has one ``compression_type``. It decompresses every frame a
client sends with it (text commands too) and never compresses what it sends
back. There is no marker in the frame: a gzip body sent to a broker set to
``none`` is read as if it were plain.

``gzip`` is what the real client implements. ``snappy`` (block format),
``lz4`` (frame format) and ``zstd`` are the other algorithms a broker may be
configured with; they are provided for symmetry and are not checked against
a real peer.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Callable

import cramjam

from sluice.protocols.cursus.errors import (
    DECODE_FAILED,
    LocalProtocolError,
    Problem,
    RemoteProtocolError,
)


class Compression(enum.Enum):
    NONE = "none"
    GZIP = "gzip"
    SNAPPY = "snappy"
    LZ4 = "lz4"
    ZSTD = "zstd"

    @classmethod
    def parse(cls, name: str) -> Compression:
        """``""`` and ``"none"`` are both no compression, as in the client."""
        try:
            return cls(name.lower() or "none")
        except ValueError:
            known = ", ".join(c.value for c in cls)
            raise ValueError(f"unknown compression {name!r} (known: {known})") from None


def compress(data: bytes, compression: Compression) -> bytes:
    if compression is Compression.NONE:
        return data
    if compression is Compression.GZIP:
        obj = zlib.compressobj(wbits=31)
        return obj.compress(data) + obj.flush()
    try:
        if compression is Compression.SNAPPY:
            return bytes(cramjam.snappy.compress_raw(data))
        if compression is Compression.LZ4:
            return bytes(cramjam.lz4.compress(data))
        return bytes(cramjam.zstd.compress(data))
    except Exception as exc:  # cramjam raises its own CompressionError
        raise LocalProtocolError(Problem.PARSE, f"{compression.value}: {exc}") from None


def decompress(data: bytes, compression: Compression, limit: int) -> bytes:
    """``data`` decompressed, at most ``limit`` bytes of it.

    Raises ``RemoteProtocolError`` (``ERROR: decode_failed``) for data that
    does not decompress, and ``TOO_LARGE`` past ``limit``.
    """
    if compression is Compression.NONE:
        return data
    try:
        if compression is Compression.GZIP:
            out = _gunzip(data, limit)
        elif compression is Compression.SNAPPY:
            # A snappy block states its length first: checked before
            # anything that size is allocated.
            if cramjam.snappy.decompress_raw_len(data) > limit:
                raise _too_large(limit)
            out = bytes(cramjam.snappy.decompress_raw(data))
        elif compression is Compression.LZ4:
            out = _into(cramjam.lz4.decompress_into, data, limit)
        else:
            out = _into(cramjam.zstd.decompress_into, data, limit)
    except RemoteProtocolError:
        raise
    except Exception as exc:
        raise RemoteProtocolError(
            Problem.PARSE,
            f"{compression.value} decompression failed: {exc}",
            code=DECODE_FAILED,
        ) from None
    if len(out) > limit:
        raise _too_large(limit)
    return out


# The first output buffer for lz4 and zstd: this many times the input, at
# least _FIRST_BUFFER; then four times larger each time, up to the limit.
_FIRST_RATIO = 8
_FIRST_BUFFER = 64 * 1024
# What cramjam says when the output does not fit the buffer it was given.
_BUFFER_FULL = "failed to write whole buffer"


def _into(decompress_into: Callable[[bytes, bytearray], int], data: bytes, limit: int) -> bytes:
    """``data`` decompressed into buffers no larger than ``limit + 1``: a
    frame of a few kilobytes may inflate to gigabytes (zstd, lz4), and
    ``decompress`` would hold all of it before its length could be checked."""
    size = min(limit + 1, max(_FIRST_BUFFER, _FIRST_RATIO * len(data)))
    while True:
        buffer = bytearray(size)
        try:
            n = decompress_into(data, buffer)
        except Exception as exc:
            if _BUFFER_FULL not in str(exc):
                raise
            if size > limit:
                raise _too_large(limit) from None
            size = min(limit + 1, size * 4)
            continue
        if n > limit:
            raise _too_large(limit)
        del buffer[n:]
        return bytes(buffer)


def _gunzip(data: bytes, limit: int) -> bytes:
    """Every gzip member in ``data`` (as Go's reader reads them), bounded."""
    parts: list[bytes] = []
    total = 0
    rest = data
    while True:
        obj = zlib.decompressobj(wbits=31)
        chunk = obj.decompress(rest, limit - total + 1)
        total += len(chunk)
        parts.append(chunk)
        if total > limit:
            raise _too_large(limit)
        if not obj.eof:
            if obj.unconsumed_tail:
                raise _too_large(limit)
            raise zlib.error("gzip stream is truncated")
        rest = obj.unused_data
        if not rest:
            return b"".join(parts)


def _too_large(limit: int) -> RemoteProtocolError:
    return RemoteProtocolError(
        Problem.TOO_LARGE, f"decompresses to more than {limit} bytes", code=DECODE_FAILED
    )
