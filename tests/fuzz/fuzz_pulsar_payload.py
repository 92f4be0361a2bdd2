"""Fuzz harness: Pulsar payload inspection, decompression and batches.

Input: ``[codec u8][uncompressed_size u32][entries u16][payload]``, as a
frame's metadata and payload would give them (codecs 5 to 7 are unknown
ones). Promises checked:

- ``payload.decompress`` raises nothing but a non-fatal
  ``RemoteProtocolError``, and what it returns has the promised size
  (when compressed);
- ``payload.split_batch`` likewise, and its entries, built into a batch
  again (``build_batch``), split into the same entries;
- what ``compress`` makes, ``decompress`` undoes.
"""

from __future__ import annotations

import struct

from sluice.protocols.pulsar import payload, pb
from sluice.protocols.pulsar.errors import RemoteProtocolError
from tests.fuzz.common import check

HEAD = struct.Struct(">BIH")
KNOWN_CODECS = frozenset(payload.CODEC_NAMES)


def refused(exc: RemoteProtocolError) -> None:
    check(not exc.fatal, f"payload inspection raised a fatal error: {exc!r}")
    exc.server_error_name  # noqa: B018 (every problem has a ServerError)


def entries(messages: list[payload.Message]) -> list[tuple[bytes, bytes]]:
    return [(m.metadata.SerializeToString() if m.metadata else b"", m.payload) for m in messages]


def TestOneInput(data: bytes) -> None:
    if len(data) < HEAD.size:
        return
    codec_byte, size, count = HEAD.unpack_from(data)
    codec = codec_byte % 8
    body = data[HEAD.size :]
    if codec in KNOWN_CODECS:
        packed = payload.compress(codec, body)
        check(payload.decompress(codec, packed, len(body)) == body, "compress is not undone")
    try:
        plain = payload.decompress(codec, body, size)
    except RemoteProtocolError as exc:
        refused(exc)
        return
    # Uncompressed payloads keep their own length (producers may leave the size out).
    if codec != pb.NONE:
        check(len(plain) == size, f"{len(plain)} bytes decompressed, {size} promised")
    if not count:
        return
    try:
        split = payload.split_batch(plain, count)
    except RemoteProtocolError as exc:
        refused(exc)
        return
    check(len(split) == count, f"{len(split)} batch entries, {count} promised")
    meta = [m.metadata for m in split]
    check(all(m is not None for m in meta), "a batch entry without metadata")
    rebuilt = payload.build_batch([(m.metadata, m.payload) for m in split if m.metadata])
    again = payload.split_batch(rebuilt, count)
    check(entries(again) == entries(split), "a batch built from its entries splits otherwise")
