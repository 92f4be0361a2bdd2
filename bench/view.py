"""``sluice view`` on a capture of 1,000,000 frames: time to the first screen,
per page, and the server's memory.

    python bench/view.py [--frames N]

Writes a synthetic Pulsar capture (SEND and SEND_RECEIPT pairs on 20
producer connections over 10 topics, one frame in 1,000 with a broker
error, payloads kept), starts ``sluice view`` on it as a user would, and
asks what the page asks:

- first screen: from starting the process to the page, its status and the
  first page of frames answered (the index is still being built then);
- indexed: when the whole capture has been read;
- per page: a page deep in the capture, unfiltered and filtered (the first
  filtered page reads every frame once; later pages do not);
- memory: the server's VmRSS once the index is built, and per frame.

Loopback only; the server is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sluice.brokers.embedded import free_port
from sluice.protocols.pulsar import Type, command, encode, encode_payload, pb
from sluice.recording.format import PayloadPolicy, header, packer

SLUICE = [sys.executable, "-m", "sluice"]


def write_capture(path: Path, frames: int) -> None:
    pack = packer()
    t0, w0 = time.monotonic_ns(), time.time_ns()
    with open(path, "wb") as out:
        out.write(pack(header(capture="bench0000000", segment=1, started_ns=w0,
                              payloads=PayloadPolicy.FULL, sluice_version="bench")))  # fmt: skip
        conns = 20
        for c in range(1, conns + 1):
            client = f"127.0.0.1:{40000 + c}"
            conn = {"k": "conn", "c": c, "t": t0, "w": w0, "client": client,
                    "broker": "127.0.0.1:6650", "kind": "proxied", "listener": "plain"}  # fmt: skip
            out.write(pack(conn))
            topic = f"persistent://public/default/bench-{c % 10}"
            producer = command(Type.Value("PRODUCER"), pb.CommandProducer(
                topic=topic, producer_id=1, request_id=1))  # fmt: skip
            raw = encode(producer)
            out.write(
                pack({"k": "frame", "c": c, "d": 0, "t": t0, "w": w0, "n": len(raw), "raw": raw})
            )
            success = pb.CommandProducerSuccess(request_id=1, producer_name=f"p{c}")
            raw = encode(command(Type.Value("PRODUCER_SUCCESS"), success))
            out.write(
                pack({"k": "frame", "c": c, "d": 1, "t": t0, "w": w0, "n": len(raw), "raw": raw})
            )
        sent = 0
        seq: dict[int, int] = {}
        while sent < frames:
            c = sent // 2 % conns + 1
            s = seq.get(c, 0)
            t = t0 + sent * 10_000  # 100,000 frames a second
            if sent % 2 == 0:
                cmd = command(Type.Value("SEND"), pb.CommandSend(producer_id=1, sequence_id=s))
                meta = pb.MessageMetadata(producer_name="p", sequence_id=s, publish_time=1)
                raw = encode_payload(cmd, meta, b"payload-%08d" % sent)
                d = 0
            else:
                if sent % 2000 == 1:
                    raw = encode(command(Type.Value("SEND_ERROR"), pb.CommandSendError(
                        producer_id=1, sequence_id=s, error=pb.PersistenceError,
                        message="bench")))  # fmt: skip
                else:
                    raw = encode(command(Type.Value("SEND_RECEIPT"), pb.CommandSendReceipt(
                        producer_id=1, sequence_id=s)))  # fmt: skip
                seq[c] = s + 1
                d = 1
            out.write(pack({"k": "frame", "c": c, "d": d, "t": t, "w": w0 + (t - t0),
                            "n": len(raw), "raw": raw}))  # fmt: skip
            sent += 1


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=120) as answer:
        return json.loads(answer.read()) if "api/" in url else answer.read()


def timed(url: str) -> tuple[float, Any]:
    started = time.monotonic()
    data = get(url)
    return time.monotonic() - started, data


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=1_000_000, help="frames (default 1000000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-view-bench-") as tmp:
        capture = Path(tmp) / "bench.sluice"
        started = time.monotonic()
        write_capture(capture, args.frames)
        print(f"[view] wrote {args.frames} frames, {capture.stat().st_size / 1e6:.0f} MB, "
              f"in {time.monotonic() - started:.1f} s", file=sys.stderr)  # fmt: skip
        port = free_port()
        base = f"http://127.0.0.1:{port}/"
        started = time.monotonic()
        server = subprocess.Popen([*SLUICE, "view", str(capture), "--listen", f"127.0.0.1:{port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                    break
                except OSError:
                    time.sleep(0.01)
            get(base)
            get(base + "app.js")
            status = get(base + "api/status")
            first = get(base + "api/frames?offset=0&limit=200")
            first_screen = time.monotonic() - started
            print(f"[view] first screen: {first_screen:.2f} s ({len(first['rows'])} rows, "
                  f"{status['frames']} frames indexed so far)", file=sys.stderr)  # fmt: skip
            while get(base + "api/status")["building"]:
                time.sleep(0.2)
            indexed = time.monotonic() - started
            rss = rss_kib(server.pid)
            deep, page = timed(base + f"api/frames?offset={args.frames // 2}&limit=200")
            assert len(page["rows"]) == 200
            filtered_first, page = timed(base + "api/frames?topic=bench-3&offset=0&limit=200")
            filtered_next, _ = timed(base + f"api/frames?topic=bench-3&offset={page['total'] // 2}"
                                     "&limit=200")  # fmt: skip
            problems, found = timed(base + "api/frames?problems=1&limit=200")
            detail, _ = timed(base + f"api/frame/{args.frames // 3}")
            summary, _ = timed(base + "api/summary")
            timeline, _ = timed(base + "api/timeline")
        finally:
            server.kill()
            server.wait()
    rows = [
        ("first screen (start to page + first 200 rows)", f"{first_screen:.2f} s"),
        ("whole capture indexed", f"{indexed:.1f} s"),
        ("a page of 200 in the middle, unfiltered", f"{deep * 1000:.0f} ms"),
        (
            "first filtered page (topic), reads every frame once",
            f"{filtered_first * 1000:.0f} ms, {page['total']} frames match",
        ),
        ("next filtered page", f"{filtered_next * 1000:.0f} ms"),
        ("problems only (first page)", f"{problems * 1000:.0f} ms, {found['total']} frames"),
        ("a frame's detail", f"{detail * 1000:.0f} ms"),
        ("summary / timeline (first ask)", f"{summary * 1000:.0f} / {timeline * 1000:.0f} ms"),
        (
            "server memory, indexed",
            f"{rss / 1024:.0f} MiB ({rss * 1024 / args.frames:.0f} B/frame)",
        ),
    ]
    print(f"\n| {args.frames} frames | |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
