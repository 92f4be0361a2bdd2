"""What one connection's input may cost the proxy: the work and memory a
frame makes, bounded whatever a client (or broker) sends."""

from __future__ import annotations

import struct

from sluice.protocols.pulsar import Frame, FrameDecoder
from sluice.protocols.pulsar.decoder import NEED_DATA


def test_a_large_frame_in_small_reads_is_joined_once_not_at_every_read() -> None:
    """Each read of the Python path asks the decoder for a scanned batch
    (``take_batch``) and then its frames, as ``PulsarConnection._relay``
    does. A 4 MiB frame sent 1,000 bytes a read was copied whole at every
    read (4,195 reads, 8.8 GB copied, 2 s of CPU): the bytes the decoder's
    contiguous buffer held, summed over the reads, grew as the square of
    the frame's size."""
    size = 4 * 1024 * 1024
    frame = struct.pack(">I", size - 4) + bytes(size - 4)
    decoder = FrameDecoder()
    held = 0
    reads = 0
    out: list[Frame] = []
    for i in range(0, size, 1000):
        decoder.receive_data(frame[i : i + 1000])
        reads += 1
        batch = decoder.take_batch()
        if batch is not None:
            out.extend(batch)
        out.extend(decoder.frames())
        held += len(decoder._head)
    assert [len(f.raw) for f in out] == [size]
    assert decoder.next_event() is NEED_DATA
    # Linear: each byte is in the contiguous buffer about once (here: the
    # first read's bytes at every read, then the frame once, joined whole).
    assert reads == 4195
    assert held < reads * 1000 + 2 * size, held
