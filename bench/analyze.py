"""`sluice analyze` throughput on local Spark over >= 1 GB of real recordings.

    python bench/analyze.py [--data DIR] [--gigabytes 1.0] [--cores 2]

The data set is made once (and reused) from real traffic: the official client
publishing 4 KiB messages through a `sluice proxy` with
`--record-payloads full` in front of pulsar-lite, with a consumer reading them
back, so recordings hold SEND, SEND_RECEIPT, MESSAGE, FLOW and ACK frames in
realistic proportions. Then `sluice analyze` runs on local[N] and the bench
prints MB of recordings per second and frames per second.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pulsar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sluice.embedded import EmbeddedBroker
from tests.support import SLUICE, client, start_proxy


def size_of(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*.sluice"))


def make_data(directory: Path, target: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    body = b"x" * 4096
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        proxy = start_proxy(
            broker.url,
            Path(tmp),
            "--record",
            str(directory),
            "--record-payloads",
            "full",
            "--record-max-bytes",
            str(64 << 20),
        )
        try:
            topic = "persistent://public/default/bench-analyze"
            with client(proxy.url) as c:
                consumer = c.subscribe(topic, "bench", receiver_queue_size=2000)
                stop = threading.Event()

                def consume() -> None:
                    while not stop.is_set():
                        try:
                            consumer.acknowledge(consumer.receive(timeout_millis=500))
                        except pulsar.Timeout:
                            continue

                reader = threading.Thread(target=consume)
                reader.start()
                producer = c.create_producer(
                    topic,
                    batching_enabled=False,
                    max_pending_messages=2000,
                    block_if_queue_full=True,
                )
                started = time.monotonic()
                while size_of(directory) < target:
                    for _ in range(2000):
                        producer.send_async(body, lambda res, mid: None)
                    producer.flush()
                    done = size_of(directory)
                    rate = done / (time.monotonic() - started) / 1e6
                    print(f"  recorded {done / 1e9:.2f} GB ({rate:.0f} MB/s)", file=sys.stderr)
                stop.set()
                reader.join()
            proxy.terminate()
        finally:
            proxy.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, default=Path(tempfile.gettempdir()) / "sluice-bench-recordings"
    )
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    target = int(args.gigabytes * 1e9)
    if not args.data.exists() or size_of(args.data) < target:
        print(f"making {args.gigabytes} GB of recordings in {args.data} ...", file=sys.stderr)
        make_data(args.data, target)
    total = size_of(args.data)
    files = len(list(args.data.rglob("*.sluice")))
    with tempfile.TemporaryDirectory() as out:
        started = time.monotonic()
        result = subprocess.run(
            [*SLUICE, "analyze", str(args.data), "--out", out, "--master", f"local[{args.cores}]"],
            capture_output=True,
            text=True,
            check=False,
        )
        elapsed = time.monotonic() - started
    if result.returncode != 0:
        print(result.stderr[-3000:], file=sys.stderr)
        return 1
    frames = int(result.stderr.rsplit("[analyze] ", 1)[1].split()[0])
    where = f"analyze on local[{args.cores}]: {total / 1e9:.2f} GB in {files} files"
    print(f"{where}, {frames:,} frames, {elapsed:.0f} s wall (Spark start-up included)")
    print(f"  {total / 1e6 / elapsed:,.1f} MB/s of recordings, {frames / elapsed:,.0f} frames/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
