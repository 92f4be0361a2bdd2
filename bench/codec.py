"""Decode + validate throughput of the Pulsar codec, against crc32c as the ceiling.

    python bench/codec.py [--rounds 7] [--frames 200000]

(a) 100-byte SEND frames: frames per second.
(b) 64 KiB payload SEND frames: bytes per second.
(c) 1 KiB SEND frames (bench/peers.py's unbatched rows): µs per frame.

Each workload is decoded three ways, in turn: ``FrameDecoder`` with the
Python decoder alone (``compiled=False``, the reference), ``FrameDecoder``
with the compiled scanner (what the proxy runs: Python frame objects, their
commands parsed only when asked for), and the floor: the compiled scanner
alone over the same bytes (``sluice._frames.scan``: boundaries, sizes,
CRC32-C, command and metadata checked, ids read), with no Python object per
frame.

Each workload is one byte stream of real-shaped frames (command, checksum,
metadata, payload), fed to ``FrameDecoder`` in reads of ``READ_SIZE`` bytes
(what the proxy asks the socket for), with every frame fully decoded and
validated: command and metadata parsed, required fields checked, CRC32-C
verified. The ceiling is crc32c alone over the same frames. The process is
pinned to one core. The machine is shared and noisy, so each figure is the
median of several rounds, with the best shown beside it.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable

import crc32c

from sluice.protocols.pulsar import FrameDecoder, Type, command, encode_payload, pb
from sluice.protocols.pulsar.decoder import COMPILED_SCAN, max_frame_size
from sluice.protocols.pulsar.frame import DEFAULT_MAX_MESSAGE_SIZE

READ_SIZE = 256 * 1024
TARGET_FRAMES_PER_S = 250_000
TARGET_BYTES_PER_S = 1.5e9


def make_frames(count: int, payload_size: int) -> list[bytes]:
    frames = []
    send = command(Type.Value("SEND"), pb.CommandSend(producer_id=3, sequence_id=0))
    meta = pb.MessageMetadata(producer_name="standalone-0-17", sequence_id=0, publish_time=0)
    body = os.urandom(payload_size)
    for i in range(count):
        send.send.sequence_id = i
        meta.sequence_id = i
        meta.publish_time = 1_763_730_000_000 + i
        frames.append(encode_payload(send, meta, body))
    return frames


def reads(frames: list[bytes], size: int = READ_SIZE) -> list[bytes]:
    data = b"".join(frames)
    return [data[i : i + size] for i in range(0, len(data), size)]


def time_decode(chunks: list[bytes], expected: int, compiled: bool = False) -> float:
    decoder = FrameDecoder(compiled=compiled)
    count = 0
    bad = 0
    start = time.perf_counter()
    for chunk in chunks:
        decoder.receive_data(chunk)
        for frame in decoder.frames():
            count += 1
            if frame.error is not None:
                bad += 1
    elapsed = time.perf_counter() - start
    if count != expected or bad:
        raise SystemExit(f"decoded {count} frames ({bad} invalid), expected {expected} valid")
    return elapsed


def time_scan(chunks: list[bytes], expected: int) -> float:
    """The floor: the compiled scanner alone, whole frames of each read."""
    scan = COMPILED_SCAN
    assert scan is not None
    limit = max_frame_size(DEFAULT_MAX_MESSAGE_SIZE) - 4
    count = bad = 0
    rest = b""
    start = time.perf_counter()
    for chunk in chunks:
        data = rest + chunk if rest else chunk
        found = scan(data, 0, limit)
        count += len(found)
        bad += sum(1 for f in found if not f[1])
        rest = data[found[-1][0] :] if found else data
    elapsed = time.perf_counter() - start
    if count != expected or bad:
        raise SystemExit(f"scanned {count} frames ({bad} left), expected {expected} valid")
    return elapsed


def time_crc(frames: list[bytes]) -> float:
    crc = crc32c.crc32c
    start = time.perf_counter()
    for frame in frames:
        crc(frame)
    return time.perf_counter() - start


def rounds(fn: Callable[[], float], n: int) -> tuple[float, float]:
    """(median, best) elapsed seconds."""
    samples = [fn() for _ in range(n)]
    return statistics.median(samples), min(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--frames", type=int, default=200_000, help="frames in workload (a)")
    parser.add_argument("--large-frames", type=int, default=4_000, help="frames in workload (b)")
    args = parser.parse_args()

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(
        f"crc32c hardware: {crc32c.hardware_based}; read size {READ_SIZE // 1024} KiB; "
        f"{args.rounds} rounds, median (best)"
    )

    if COMPILED_SCAN is None:
        raise SystemExit("the compiled frame path is not built (./dev setup)")
    print(
        "| workload | Python decoder | compiled (the proxy's) | floor: scan alone | crc32c alone |"
    )
    print("|---|---|---|---|---|")
    for name, count, size, unit in (
        ("(a) SEND, 100 B payload", args.frames, 100, "frames"),
        ("(b) SEND, 64 KiB payload", args.large_frames, 64 * 1024, "bytes"),
        ("(c) SEND, 1 KiB payload", args.frames // 4, 1024, "us"),
    ):
        frames = make_frames(count, size)
        chunks = reads(frames)
        total = sum(map(len, frames))
        cells = []
        ways: list[Callable[[], float]] = [
            functools.partial(time_decode, chunks, count),
            functools.partial(time_decode, chunks, count, compiled=True),
            functools.partial(time_scan, chunks, count),
            functools.partial(time_crc, frames),
        ]
        for fn in ways:
            med, best = rounds(fn, args.rounds)
            if unit == "frames":
                cells.append(f"{count / med:,.0f} frames/s ({count / best:,.0f})")
            elif unit == "bytes":
                cells.append(f"{total / med / 1e6:,.0f} MB/s ({total / best / 1e6:,.0f})")
            else:
                cells.append(f"{med / count * 1e6:.2f} µs/frame ({best / count * 1e6:.2f})")
        print(f"| {name} ({len(frames[0])} B frames) | " + " | ".join(cells) + " |")
    print(
        f"targets: (a) {TARGET_FRAMES_PER_S:,} frames/s, (b) {TARGET_BYTES_PER_S / 1e6:,.0f} MB/s,"
        " for the compiled column"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
