"""`sluice analyze` throughput: Arrow decoding against the previous implementation.

    python bench/analyze.py [--data DIR] [--gigabytes 1.0] [--baseline REF] [--out DIR]

Data (made once, then reused): a real session through `sluice proxy
--record-payloads full` in front of pulsar-lite, driven by the official
client: several rounds of fresh clients (lookups, connection churn), each
with non-batched 1 KiB producers and batching producers on four topics,
consumers that receive and acknowledge, an exclusive subscription taken
twice (ConsumerBusy) and a corrupt SEND (an invalid frame and a
SEND_ERROR). That capture is then repeated as many captures as needed for
the target size (a fleet of sidecars), each with a new capture id and its
wall clock shifted by a minute, record by record through the recording
format's own packer. The previous implementation reads recording format 1
only; it is given a format 1 copy of the same data (what today's reader
makes of it), so it is spared the summaries format 2 leaves to readers.

Then, on the same data in the same run:

- the previous implementation (the `sluice` package at `--baseline`, by
  default the commit before the Arrow pipeline) on local[2];
- the current one on local[1], local[2] and local[4] (the scaling table);
- the current one on a standalone cluster started from PySpark's own
  distribution (a master and two one-core workers on 127.0.0.1), whose
  tables are checked equal to the local run's.

Each run is a whole `sluice analyze` process (Spark start-up, every table
and the report included). It prints MB/s and frames/s, overall and per
core, and leaves the report and a screenshot of it (headless Chromium) in
`--out`.

Before those, the executors' own work alone: `decode_segment` (what
`mapInArrow` runs: the recording format's reader, the summaries, the Arrow
batches) over every segment in one process, no Spark, in CPU seconds, with
the Python summaries (`SLUICE_FRAMES=python`) and with the compiled ones,
each in a fresh process. `--decode-only` stops there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack
import pulsar

from sluice.embedded import EmbeddedBroker
from sluice.pipeline.standalone import StandaloneCluster, loopback_env
from sluice.recording.format import SUFFIX, pack, read_records
from tests.support import SLUICE, RawClient, client, start_proxy
from tests.test_pipeline import differences, render

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "d9b19db"  # the last commit with the rdd.flatMap pipeline
TOPICS = [
    f"persistent://public/default/bench-{name}" for name in ("orders", "clicks", "audit", "logs")
]


def size_of(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob(f"*{SUFFIX}"))


def session(proxy_url: str, proxy_port: int, broker_port: int, rounds: int) -> None:
    """A realistic mix of traffic through the proxy, ``rounds`` times."""
    body = b"k" * 1024
    for n in range(rounds):
        with client(proxy_url) as c:
            consumers = [
                c.subscribe(
                    t, "bench", receiver_queue_size=1000, consumer_type=pulsar.ConsumerType.Shared
                )
                for t in TOPICS
            ]
            try:  # an exclusive subscription taken twice: a ConsumerBusy error
                first = c.subscribe(
                    TOPICS[0], f"solo-{n}", consumer_type=pulsar.ConsumerType.Exclusive
                )
                c.subscribe(TOPICS[0], f"solo-{n}", consumer_type=pulsar.ConsumerType.Exclusive)
            except pulsar.PulsarException:
                pass
            first.close()
            stop = threading.Event()

            def consume(consumer: Any, stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    try:
                        consumer.acknowledge(consumer.receive(timeout_millis=200))
                    except pulsar.Timeout:
                        continue

            readers = [threading.Thread(target=consume, args=(k,)) for k in consumers]
            for reader in readers:
                reader.start()
            producers = []
            for i, topic in enumerate(TOPICS):
                producers.append(
                    c.create_producer(
                        topic,
                        batching_enabled=False,
                        max_pending_messages=1000,
                        block_if_queue_full=True,
                    )
                )
                if i % 2 == 0:
                    producers.append(
                        c.create_producer(
                            topic,
                            batching_enabled=True,
                            batching_max_messages=10,
                            batching_max_publish_delay_ms=5,
                            block_if_queue_full=True,
                        )
                    )
            for k in range(1500):
                for producer in producers:
                    producer.send_async(body, lambda res, mid: None, properties={"n": str(k)})
            for producer in producers:
                producer.flush()
                producer.close()
            time.sleep(1.0)
            stop.set()
            for reader in readers:
                reader.join()
            for consumer in consumers:
                consumer.close()
        with RawClient(proxy_port) as raw:  # a corrupt SEND: invalid frame, SEND_ERROR
            name = raw.producer(broker_port, TOPICS[3], producer_id=9)
            raw.send_message(name, 9, 0, b"x" * 1024, corrupt=True)
            raw.receive_type("SEND_ERROR")


def record_sample(directory: Path, rounds: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        proxy = start_proxy(
            broker.url,
            Path(tmp),
            "--record",
            str(directory),
            "--record-payloads",
            "full",
            "--record-max-bytes",
            str(16 << 20),
        )
        try:
            session(proxy.url, proxy.port, broker.port, rounds)
            assert proxy.terminate() == 0, proxy.log()[-2000:]
        finally:
            proxy.kill()


def repeat(sample: Path, directory: Path, copy: int) -> None:
    """The sample capture again as capture ``copy``: new id, wall clock + copy minutes."""
    capture = uuid.UUID(int=copy + 1).hex[-12:]
    shift = copy * 60 * 10**9
    for path in sorted(sample.glob(f"*{SUFFIX}")):
        target = directory / path.name.replace(path.name.split("-")[-2], capture)
        with path.open("rb") as src, target.open("wb") as out:
            for record in msgpack.Unpacker(src, raw=False, strict_map_key=False,
                                           max_buffer_size=1 << 28):  # fmt: skip
                if record["k"] == "header":
                    record["capture"] = capture
                    record["started"] += shift
                elif "w" in record:
                    record["w"] += shift
                out.write(pack(record))


def make_data(directory: Path, target: int) -> None:
    sample = directory / "sample"
    if not sample.exists() or not any(sample.glob(f"*{SUFFIX}")):
        print("  recording a sample session through the proxy ...", file=sys.stderr)
        record_sample(sample, rounds=4)
    each = size_of(sample)
    copies = directory / "captures"
    copies.mkdir(parents=True, exist_ok=True)
    copy = len({p.name.split("-")[-2] for p in copies.glob(f"*{SUFFIX}")})
    while size_of(directory) - each < target:
        repeat(sample, copies, copy)
        copy += 1
    print(f"  {copy} captures of {each / 1e6:.1f} MB", file=sys.stderr)


def version_1_copy(inputs: Path, directory: Path) -> Path:
    """The data as recording format version 1, for the previous pipeline,
    which reads nothing newer: every record as today's reader gives it (the
    summaries the proxy now leaves to readers filled in), under a version 1
    header. Made once, next to the data."""
    copy = directory / "captures-v1"
    if copy.exists() and size_of(copy) > 0:
        return copy
    print("  writing a recording format 1 copy for the previous pipeline ...", file=sys.stderr)
    partial = directory / "captures-v1.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for path in sorted(inputs.glob(f"*{SUFFIX}")):
        with (partial / path.name).open("wb") as out:
            for record in read_records(path):
                if record["k"] == "header":
                    record["version"] = 1
                out.write(pack(record))
    partial.rename(copy)
    return copy


def data_version(inputs: Path) -> int:
    first = next(iter(sorted(inputs.glob(f"*{SUFFIX}"))))
    with first.open("rb") as handle:
        header: dict[str, Any] = next(iter(msgpack.Unpacker(handle, raw=False)))
    return int(header["version"])


def baseline_tree(ref: str, where: Path) -> Path:
    """The ``sluice`` package as it was at ``ref`` (git archive), for the old pipeline."""
    archive = where / "baseline.tar"
    subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), ref, "sluice"],
        check=True,
    )
    tree = where / "baseline"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def analyze(
    data: Path, out: Path, master: str, *, pythonpath: Path | None = None
) -> tuple[float, int, str]:
    """One whole `sluice analyze` run: wall seconds, frames, stderr."""
    env = loopback_env()
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    started = time.monotonic()
    result = subprocess.run(
        [*SLUICE, "analyze", str(data), "--out", str(out), "--master", master],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=pythonpath or ROOT,
        timeout=1800,
    )
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"analyze on {master} failed:\n{result.stderr[-3000:]}")
    frames = int(result.stderr.rsplit("[analyze] ", 1)[1].split()[0])
    return elapsed, frames, result.stderr


def decode_alone(inputs: Path) -> tuple[float, int]:
    """CPU seconds and frame rows of ``decode_segment`` over every segment
    of ``inputs``, in this process."""
    from sluice.pipeline.decode import decode_segment

    cpu = 0.0
    frames = 0
    for path in sorted(inputs.rglob(f"*{SUFFIX}")):
        content = path.read_bytes()
        started = time.process_time()
        for batch in decode_segment(str(path), content):
            if batch.column(0)[0].as_py() == "frame":
                frames += batch.num_rows
        cpu += time.process_time() - started
    return cpu, frames


def decode_floor(inputs: Path, total: int) -> list[str]:
    """The executors' decode alone, Python and compiled summaries, each in a
    fresh process: table rows (CPU seconds; the 2-core figure is half)."""
    rows = []
    for name, frames_env in (("Python summaries", "python"), ("compiled summaries", "")):
        env = {**os.environ, "SLUICE_FRAMES": frames_env}
        result = subprocess.run(
            [sys.executable, __file__, "--decode-alone", str(inputs)],
            capture_output=True, text=True, check=True, env=env, cwd=ROOT,
        )  # fmt: skip
        cpu, frames = json.loads(result.stdout.strip().splitlines()[-1])
        rows.append(line(f"decode_segment alone, {name} (CPU s)", 1, total, frames, cpu))
        print(rows[-1], file=sys.stderr)
    return rows


def line(name: str, cores: int, total: int, frames: int, seconds: float) -> str:
    mbs = total / 1e6 / seconds
    fps = frames / seconds
    return (
        f"| {name} | {cores} | {seconds:.1f} s | {mbs:,.1f} | {fps:,.0f} | "
        f"{mbs / cores:,.1f} | {fps / cores:,.0f} | {os.getloadavg()[0]:.1f} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, default=Path(tempfile.gettempdir()) / "sluice-bench-mix"
    )
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--baseline", default=BASELINE, help="git ref of the old pipeline")
    parser.add_argument("--no-baseline", action="store_true", help="skip the old pipeline")
    parser.add_argument("--cores", default="1,2,4", help="local[N] runs of the new pipeline")
    parser.add_argument("--no-cluster", action="store_true", help="skip the standalone cluster")
    parser.add_argument(
        "--out", type=Path, default=Path(tempfile.gettempdir()) / "sluice-bench-analysis"
    )
    parser.add_argument(
        "--decode-only", action="store_true", help="only the executors' decode, without Spark"
    )
    parser.add_argument("--decode-alone", type=Path, help=argparse.SUPPRESS)  # a child's job
    args = parser.parse_args()
    if args.decode_alone:
        print(json.dumps(decode_alone(args.decode_alone)))
        return 0
    target = int(args.gigabytes * 1e9)
    args.data.mkdir(parents=True, exist_ok=True)
    if size_of(args.data / "captures") < target:
        print(f"making {args.gigabytes} GB of recordings in {args.data} ...", file=sys.stderr)
        make_data(args.data, target)
    inputs = args.data / "captures"
    total = size_of(inputs)
    files = len(list(inputs.rglob(f"*{SUFFIX}")))
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    rows = decode_floor(inputs, total)
    if args.decode_only:
        print(f"data: {total / 1e9:.2f} GB in {files} segment files")
        print("\n".join(rows))
        return 0
    frames = 0
    stderr = ""
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_baseline:
            tree = baseline_tree(args.baseline, Path(tmp))
            old = version_1_copy(inputs, args.data) if data_version(inputs) > 1 else inputs
            seconds, frames, _ = analyze(old, Path(tmp) / "old", "local[2]", pythonpath=tree)
            rows.append(line(f"previous ({args.baseline}, rdd.flatMap)", 2, total, frames, seconds))
            print(rows[-1], file=sys.stderr)
        for cores in [int(c) for c in args.cores.split(",")]:
            out = args.out / f"local{cores}"
            seconds, frames, said = analyze(inputs, out, f"local[{cores}]")
            stderr = said if cores == 2 or not stderr else stderr
            rows.append(line("Arrow (mapInArrow)", cores, total, frames, seconds))
            print(rows[-1], file=sys.stderr)
        local = args.out / "local2" if (args.out / "local2").exists() else out
        stages = [s for s in stderr.splitlines() if s.startswith("[analyze]")]
        cluster_note = "standalone cluster: skipped"
        if not args.no_cluster:
            with StandaloneCluster(Path(tmp) / "cluster", workers=2) as cluster:
                out = args.out / "cluster"
                seconds, frames, _ = analyze(inputs, out, cluster.url)
                rows.append(line(f"Arrow on {cluster.url} (2 workers)", 2, total, frames, seconds))
                print(rows[-1], file=sys.stderr)
            differ = differences(local, out)
            cluster_note = "standalone cluster: every table equal to the local run's" + (
                f", EXCEPT {differ}" if differ else ""
            )
            if differ:
                print(cluster_note, file=sys.stderr)
                return 1
    picture = args.out / "report.png"
    render(local / "report.html", picture)
    print(
        f"data: {total / 1e9:.2f} GB in {files} segment files, {frames:,} frames, "
        f"recording format {data_version(inputs)}"
    )
    print(
        "| pipeline | cores | wall | MB/s | frames/s | MB/s per core | frames/s per core "
        "| host load after |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(cluster_note)
    print("stages of the local[2] run:")
    print("\n".join(f"  {s}" for s in stages))
    print(f"report: {local / 'report.html'}, screenshot: {picture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
