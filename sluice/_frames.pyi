# Types of the compiled frame scanner (rust/src/lib.rs, built by maturin).

def scan(
    data: bytes, pos: int, max_total: int
) -> list[tuple[int, int, int, int, int, int, int, int, int]]:
    """One tuple per complete frame from ``pos``: (stop, kind, metadata_offset,
    payload_offset, checksum, a, b, c, properties); kind 0: decode in Python."""
