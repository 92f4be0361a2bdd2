"""Cursus decompression: a frame that inflates past the limit is refused
without allocating what it would inflate to."""

from __future__ import annotations

import tracemalloc

import cramjam
import pytest

from sluice.protocols.cursus import Compression, Problem, decode_frame, frame
from sluice.protocols.cursus.compression import compress, decompress


def _bomb(kind: Compression, size: int) -> bytes:
    zeros = b"\0" * size
    if kind is Compression.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(zeros))
    return compress(zeros, kind)


@pytest.mark.parametrize("kind", [Compression.ZSTD, Compression.LZ4, Compression.SNAPPY])
def test_a_decompression_bomb_is_refused_without_inflating_it(kind: Compression) -> None:
    # 1 MiB frames: at most 4 MiB decompressed. The bomb says 18 MiB or more
    # (snappy compresses zeros about 21 to 1; the others, far better).
    limit = 1024 * 1024
    bomb = _bomb(kind, (18 if kind is Compression.SNAPPY else 96) * 1024 * 1024)
    assert len(bomb) < limit
    tracemalloc.start()
    try:
        f = decode_frame(frame(bomb), from_client=True, compression=kind, max_frame_size=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f.error is not None and f.error.problem is Problem.TOO_LARGE
    assert f.error.code == "decode_failed"
    assert peak < 12 * limit, f"{peak} bytes held to refuse it"


@pytest.mark.parametrize("kind", [Compression.ZSTD, Compression.LZ4, Compression.SNAPPY])
def test_bounded_decompression_still_reads_what_fits(kind: Compression) -> None:
    data = bytes(range(256)) * 4000 + b"\0" * 3_000_000
    packed = compress(data, kind)
    assert decompress(packed, kind, len(data)) == data
    with pytest.raises(Exception) as raised:
        decompress(packed, kind, len(data) - 1)
    assert raised.value.problem is Problem.TOO_LARGE  # type: ignore[attr-defined]
    with pytest.raises(Exception) as broken:
        decompress(packed[: len(packed) // 2], kind, len(data))
    assert broken.value.problem in (Problem.PARSE, Problem.TOO_LARGE)  # type: ignore[attr-defined]
    assert decompress(compress(b"", kind), kind, 10) == b""
