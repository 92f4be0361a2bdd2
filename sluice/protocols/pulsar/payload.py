"""Looking inside a message payload, on request: decompression and batches.

None of this runs on the proxy's hot path; frames are forwarded as bytes.
Inspection, recording with payloads and replay call these when they need the
application messages. Problems raise ``RemoteProtocolError`` (never fatal:
the frame boundaries are fine, only its contents are not).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass

import cramjam
from google.protobuf.message import DecodeError

from sluice.protocols.pulsar import pulsar_api_pb2 as pb
from sluice.protocols.pulsar.errors import Problem, RemoteProtocolError
from sluice.protocols.pulsar.frame import Frame, missing_fields

_U32 = struct.Struct(">I")

# uncompressed_size comes from the peer and sizes an allocation; refuse absurd
# values instead of trusting them.
MAX_UNCOMPRESSED_SIZE = 256 * 1024 * 1024
# Messages in one batch, at most, when the proxy takes a batch apart for
# filters. Each costs Python objects and a filter's run, and a batch of
# empty entries compresses to almost nothing: 1.4 KB of ZSTD held 2.8
# million of them, 24 s of the proxy's one Python thread and 1.3 GB. A
# hundred times the official clients' default batchingMaxMessages (1,000),
# so that a producer that raised it for tiny messages is not refused: such
# a batch costs the thread under a second and some 50 MB. (Offline tools,
# sluice record anonymize, take apart what a recording holds.)
MAX_BATCH_MESSAGES = 100_000

CODEC_NAMES: dict[int, str] = {
    value: pb.CompressionType.Name(value) for value in pb.CompressionType.values()
}
# Decompress into a buffer; the bytes written. Raw Snappy is what Pulsar
# producers write (LZ4: raw blocks, see _lz4).
_DECOMPRESS_INTO: dict[int, Callable[[bytes | memoryview, mmap.mmap], int]] = {
    pb.ZLIB: cramjam.zlib.decompress_into,
    pb.ZSTD: cramjam.zstd.decompress_into,
    pb.SNAPPY: cramjam.snappy.decompress_raw_into,
}


def compress(codec: int, data: bytes) -> bytes:
    """Compress ``data`` the way Pulsar producers do for ``codec``."""
    if codec == pb.NONE:
        return bytes(data)
    if codec == pb.LZ4:
        return bytes(cramjam.lz4.compress_block(data, store_size=False))
    if codec == pb.ZLIB:
        return bytes(cramjam.zlib.compress(data))
    if codec == pb.ZSTD:
        return bytes(cramjam.zstd.compress(data))
    if codec == pb.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    raise ValueError(f"unknown compression type {codec}")


def decompress(codec: int, data: bytes | memoryview, uncompressed_size: int) -> bytes:
    """Undo ``codec``; the result must be ``uncompressed_size`` bytes long."""
    if codec == pb.NONE:
        return bytes(data)
    name = CODEC_NAMES.get(codec)
    if name is None:
        raise RemoteProtocolError(Problem.PARSE, f"unknown compression type {codec}")
    if not 0 <= uncompressed_size <= MAX_UNCOMPRESSED_SIZE:
        raise RemoteProtocolError(
            Problem.TOO_LARGE, f"{name} payload claims {uncompressed_size} uncompressed bytes"
        )
    # Never more than one byte past the promise: overlong content shows as
    # an error, and a payload that expands to gigabytes (a few kilobytes of
    # ZSTD can) is stopped there instead of unpacked whole. The buffer is
    # anonymous memory: pages the content does not reach are never touched,
    # so a size claimed and not delivered costs nothing. (cramjam pads its
    # output to any size hint it is given, so sizes are never passed as
    # hints: the real length is compared below instead.)
    try:
        if codec == pb.LZ4:
            result = _lz4(data, uncompressed_size)
        else:
            with mmap.mmap(-1, uncompressed_size + 1) as buffer:
                result = buffer[: _DECOMPRESS_INTO[codec](data, buffer)]
    except cramjam.DecompressionError as exc:
        raise RemoteProtocolError(
            Problem.PARSE,
            f"{name} payload does not decompress to the {uncompressed_size} bytes "
            f"its metadata says: {exc}",
        ) from exc
    if len(result) != uncompressed_size:
        raise RemoteProtocolError(
            Problem.FRAMING,
            f"{name} payload has {len(result)} bytes, metadata says {uncompressed_size}",
        )
    return result


def _lz4(data: bytes | memoryview, size: int) -> bytes:
    """A raw LZ4 block of exactly ``size`` bytes (it stores no length).

    cramjam's ``decompress_block_into`` miscounts some valid blocks (2.14:
    115 bytes read back as 111), so ``decompress_block`` is used: it refuses
    content longer than the length it is given, and pads shorter content
    with zeros, so one byte less must be refused too."""
    if size:
        try:
            cramjam.lz4.decompress_block(data, output_len=size - 1)
        except cramjam.DecompressionError:
            pass  # longer than that (or no block at all: said next)
        else:
            raise RemoteProtocolError(
                Problem.FRAMING, f"LZ4 payload has fewer bytes than the {size} its metadata says"
            )
    return bytes(cramjam.lz4.decompress_block(data, output_len=size))


def payload_bytes(frame: Frame) -> bytes:
    """The frame's payload, decompressed."""
    meta = frame.metadata
    if meta is None:
        raise RemoteProtocolError(
            Problem.MISSING_FIELD, f"{frame.name} frame has no message metadata"
        )
    if is_batch(meta):  # before any decompressing: the count is said up front
        _check_batch_count(meta.num_messages_in_batch)
    return decompress(meta.compression, frame.payload, meta.uncompressed_size)


def is_batch(meta: pb.MessageMetadata) -> bool:
    # Producers with batching on mark even one-message batches this way.
    return meta.HasField("num_messages_in_batch")


@dataclass(frozen=True, slots=True)
class Message:
    """One application message: a whole payload, or one entry of a batch."""

    metadata: pb.SingleMessageMetadata | None  # None for a non-batched message
    payload: bytes


def split_batch(data: bytes, count: int, limit: int | None = None) -> list[Message]:
    """Parse ``count`` entries of ``[size][SingleMessageMetadata][payload]``
    (at most ``limit``: the proxy's filters give ``MAX_BATCH_MESSAGES``)."""
    if limit is not None:
        _check_batch_count(count, limit)
    view = memoryview(data)
    out: list[Message] = []
    pos = 0
    end = len(data)
    for index in range(count):
        if pos + 4 > end:
            raise RemoteProtocolError(
                Problem.FRAMING, f"batch ends after {index} of {count} entries"
            )
        (meta_size,) = _U32.unpack_from(data, pos)
        meta_end = pos + 4 + meta_size
        if meta_end > end:
            raise RemoteProtocolError(
                Problem.FRAMING, f"batch entry {index}: metadata overruns batch"
            )
        try:
            single = pb.SingleMessageMetadata.FromString(data[pos + 4 : meta_end])
        except DecodeError as exc:
            raise RemoteProtocolError(Problem.PARSE, f"batch entry {index}: {exc}") from exc
        if not single.IsInitialized():
            raise RemoteProtocolError(
                Problem.MISSING_FIELD, f"batch entry {index} lacks {missing_fields(single)}"
            )
        payload_end = meta_end + single.payload_size
        if single.payload_size < 0 or payload_end > end:
            raise RemoteProtocolError(
                Problem.FRAMING, f"batch entry {index}: payload overruns batch"
            )
        out.append(Message(single, bytes(view[meta_end:payload_end])))
        pos = payload_end
    if pos != end:
        raise RemoteProtocolError(Problem.TRAILING, f"{end - pos} bytes after the last batch entry")
    return out


def _check_batch_count(count: int, limit: int = MAX_BATCH_MESSAGES) -> None:
    if count > limit:
        raise RemoteProtocolError(
            Problem.TOO_LARGE, f"batch of {count} messages: at most {limit} are taken apart"
        )


def messages(frame: Frame) -> list[Message]:
    """The application messages a SEND or MESSAGE frame carries."""
    meta = frame.metadata
    data = payload_bytes(frame)
    if meta is None or not is_batch(meta):
        return [Message(None, data)]
    return split_batch(data, meta.num_messages_in_batch, MAX_BATCH_MESSAGES)


def build_batch(entries: list[tuple[pb.SingleMessageMetadata, bytes]]) -> bytes:
    """Serialize batch entries (the inverse of ``split_batch``)."""
    parts: list[bytes] = []
    for single, payload in entries:
        meta = single.SerializeToString()
        parts += [_U32.pack(len(meta)), meta, payload]
    return b"".join(parts)
