"""Decode + validate throughput of the Pulsar codec, against crc32c as the ceiling.

    python bench/codec.py [--rounds 7] [--frames 200000]

(a) 100-byte SEND frames: frames per second.
(b) 64 KiB payload SEND frames: bytes per second.

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
import os
import statistics
import sys
import time
from collections.abc import Callable

import crc32c

from sluice.protocols.pulsar import FrameDecoder, Type, command, encode_payload, pb

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


def time_decode(chunks: list[bytes], expected: int) -> float:
    decoder = FrameDecoder()
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

    small = make_frames(args.frames, 100)
    chunks = reads(small)
    med, best = rounds(lambda: time_decode(chunks, len(small)), args.rounds)
    cmed, _ = rounds(lambda: time_crc(small), args.rounds)
    rate, rate_best, ceiling = len(small) / med, len(small) / best, len(small) / cmed
    print(
        f"(a) SEND, 100 B payload ({len(small[0])} B frames): "
        f"{rate:,.0f} frames/s ({rate_best:,.0f}); crc32c alone {ceiling:,.0f} frames/s; "
        f"ratio {rate / ceiling:.3f}; target {TARGET_FRAMES_PER_S:,} "
        f"{'met' if rate >= TARGET_FRAMES_PER_S else 'NOT met'}"
    )

    large = make_frames(args.large_frames, 64 * 1024)
    chunks = reads(large)
    total = sum(map(len, large))
    med, best = rounds(lambda: time_decode(chunks, len(large)), args.rounds)
    cmed, _ = rounds(lambda: time_crc(large), args.rounds)
    rate, rate_best, ceiling = total / med, total / best, total / cmed
    print(
        f"(b) SEND, 64 KiB payload: {rate / 1e6:,.0f} MB/s ({rate_best / 1e6:,.0f}); "
        f"crc32c alone {ceiling / 1e6:,.0f} MB/s; ratio {rate / ceiling:.3f}; "
        f"target {TARGET_BYTES_PER_S / 1e6:,.0f} MB/s "
        f"{'met' if rate >= TARGET_BYTES_PER_S else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
