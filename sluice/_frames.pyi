# Types of the compiled frame scanner (rust/src/lib.rs, built by maturin).

from typing import Any

def scan(
    data: bytes, pos: int, max_total: int
) -> list[tuple[int, int, int, int, int, int, int, int, int]]:
    """One tuple per complete frame from ``pos``: (stop, kind, metadata_offset,
    payload_offset, checksum, a, b, c, properties); kind 0: decode in Python."""

def pack_frames(prefix: bytes, frames: list[Any], payloads: int) -> list[bytes | None]:
    """The recorder's frame records (payloads: 0 full, 1 hash, 2 size); None
    for each frame left to the Python recorder."""
