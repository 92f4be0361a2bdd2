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
`--out`. For each run it also prints what moves less with the machine's
load than wall time: the Spark jobs it ran (from Spark's event log) and the
CPU seconds of every process in its tree, read from /proc every 0.1 s:
the driver's Python, the JVM by thread (JIT compilers, task threads,
garbage collection, the rest: start-up, planning, code generation) and the
Python workers (the decoding).

Before those, the executors' own work alone: `decode_segment` (what
`mapInArrow` runs: the recording format's reader, the summaries, the Arrow
batches) over every segment in one process, no Spark, in CPU seconds, with
the Python summaries (`SLUICE_FRAMES=python`) and with the compiled ones,
each in a fresh process. `--decode-only` stops there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack
import pulsar

import bench
from sluice.analyze.standalone import StandaloneCluster, loopback_env
from sluice.brokers.embedded import EmbeddedBroker
from sluice.recording.format import SUFFIX, pack, read_records
from tests.helpers.support import SLUICE, RawClient, client, start_proxy
from tests.test_analyze import differences, render

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
    """The ``sluice`` package as it was at ``ref`` (git archive), for the old
    pipeline, with this checkout's compiled frame path (a build output git
    does not hold; a tree from before it never imports it)."""
    archive = where / "baseline.tar"
    subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), ref, "sluice"],
        check=True,
    )
    tree = where / "baseline"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    for built in (ROOT / "sluice").glob("_frames*.so"):
        shutil.copy(built, tree / "sluice" / built.name)
    return tree


def reads(tree: Path) -> int:
    """The newest recording format the ``sluice`` package in ``tree`` reads."""
    source = (tree / "sluice" / "recording" / "format.py").read_text()
    found = re.search(r"^VERSION\s*=\s*(\d+)", source, re.MULTILINE)
    return int(found.group(1)) if found else 1


@dataclass
class Run:
    seconds: float  # the whole process, Spark's start-up included
    job: float  # the job's own clock (its last line: "... in N s")
    frames: int
    stderr: str
    jobs: int
    cpu: dict[str, float]  # CPU seconds by component (COMPONENTS)


COMPONENTS = ("JIT", "JVM tasks", "JVM GC", "JVM other", "Python workers", "driver Python")
_HZ = os.sysconf("SC_CLK_TCK")


def _cpu_of(stat: str) -> tuple[str, int, float]:
    """(name, parent pid, user + system CPU seconds) from a /proc …/stat line."""
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / _HZ


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def _thread_component(name: str) -> str:
    if name.startswith(("C1 Compiler", "C2 Compiler")):
        return "JIT"
    if name.startswith("Executor task"):
        return "JVM tasks"
    if name.startswith(("GC Thread", "G1 ", "VM Thread", "ParGC", "GC ")):
        return "JVM GC"
    return "JVM other"


class CpuSampler:
    """CPU seconds of a process tree by component, sampled from /proc: the
    last value seen of every process and every JVM thread (a thread that
    ends between samples loses at most 0.1 s; the JVM's process total,
    which keeps ended threads, fills the rest in as "JVM other")."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.processes: dict[int, tuple[str, float]] = {}  # pid: (kind, cpu)
        self.threads: dict[tuple[int, int], tuple[str, float]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(0.1)

    def sample(self) -> None:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (stat := _read(f"/proc/{entry}/stat")):
                children.setdefault(_cpu_of(stat)[1], []).append(int(entry))
        todo = [self.root]
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            stat, command = _read(f"/proc/{pid}/stat"), _read(f"/proc/{pid}/cmdline")
            if not stat or command is None:
                continue
            program = command.split("\0")[0]
            # An ending process reads with no command line: it stays what
            # it was seen as last.
            kind = self.processes[pid][0] if pid in self.processes and not program else (
                "driver Python" if pid == self.root
                else "JVM" if program.endswith("java")
                else "Python workers" if "python" in program
                else "other"
            )  # fmt: skip
            self.processes[pid] = (kind, _cpu_of(stat)[2])
            if kind == "JVM":
                with contextlib.suppress(OSError):
                    for tid in os.listdir(f"/proc/{pid}/task"):
                        if thread := _read(f"/proc/{pid}/task/{tid}/stat"):
                            name, _, cpu = _cpu_of(thread)
                            self.threads[(pid, int(tid))] = (_thread_component(name), cpu)

    def __enter__(self) -> CpuSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def components(self) -> dict[str, float]:
        cpu = dict.fromkeys(COMPONENTS, 0.0)
        jvm = 0.0
        for kind, seconds in self.processes.values():
            if kind == "JVM":
                jvm += seconds
            elif kind in cpu:
                cpu[kind] += seconds
        for kind, seconds in self.threads.values():
            cpu[kind] += seconds
        cpu["JVM other"] += max(0.0, jvm - sum(s for _, s in self.threads.values()))
        return cpu


def spark_jobs(event_log: Path) -> int:
    """Jobs Spark started, from its event log."""
    jobs = 0
    for path in event_log.rglob("*"):
        if path.is_file():
            with path.open() as events:
                jobs += sum('"Event":"SparkListenerJobStart"' in line for line in events)
    return jobs


def analyze(data: Path, out: Path, master: str, *, pythonpath: Path | None = None) -> Run:
    """One whole `sluice analyze` run, its jobs and CPU by component."""
    env = loopback_env()
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    event_log = out.parent / f"{out.name}-events"
    shutil.rmtree(event_log, ignore_errors=True)
    event_log.mkdir(parents=True)
    env["PYSPARK_SUBMIT_ARGS"] = (
        f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir={event_log.as_uri()} "
        "--conf spark.eventLog.compress=false --conf spark.eventLog.rolling.enabled=false "
        "pyspark-shell"
    )
    started = time.monotonic()
    with subprocess.Popen(
        [*SLUICE, "analyze", str(data), "--out", str(out), "--master", master],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=pythonpath or ROOT,
    ) as process, CpuSampler(process.pid) as sampler:  # fmt: skip
        stderr = process.communicate(timeout=1800)[1]
    elapsed = time.monotonic() - started
    if process.returncode != 0:
        raise SystemExit(f"analyze on {master} failed:\n{stderr[-3000:]}")
    last = stderr.rsplit("[analyze] ", 1)[1]
    frames = int(last.split()[0])
    job = float(re.search(r" in ([\d.]+) s", last).group(1))  # type: ignore[union-attr]
    return Run(elapsed, job, frames, stderr, spark_jobs(event_log), sampler.components())


def decode_alone(inputs: Path) -> tuple[float, int]:
    """CPU seconds and frame rows of ``decode_segment`` over every segment
    of ``inputs``, in this process."""
    from sluice.analyze.decode import decode_segment

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
        rows.append(line(f"decode_segment alone, {name} (CPU s)", 1, total, frames, cpu) + " |")
        print(rows[-1], file=sys.stderr)
    return rows


def spread(values: list[float]) -> str:
    """The median and, for more than one value, min-max."""
    middle = statistics.median(values)
    if len(values) == 1:
        return f"{middle:.1f} s"
    return f"{middle:.1f} s ({min(values):.1f}-{max(values):.1f})"


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
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of the baseline and local[2], alternated"
    )
    parser.add_argument(
        "--scale", type=float, default=0.0, metavar="GB",
        help="also run local[2] on this many GB of the same mix (made once, beside --data)",
    )  # fmt: skip
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
    profiles: list[str] = []
    runs: dict[tuple[str, int], list[Run]] = {}

    def measured(name: str, cores: int, run: Run, size: int = total) -> None:
        runs.setdefault((name, cores), []).append(run)
        rows.append(line(name, cores, size, run.frames, run.seconds) + f" {run.job:.1f} s |")
        print(rows[-1], file=sys.stderr)
        cpu = run.cpu
        profiles.append(
            f"| {name} | {cores} | {run.seconds:.1f} s | {run.jobs} | {sum(cpu.values()):.1f} s | "
            + " | ".join(f"{cpu[c]:.1f}" for c in COMPONENTS)
            + " |"
        )
        print(profiles[-1], file=sys.stderr)

    same_as_before = "previous pipeline: not run"
    with tempfile.TemporaryDirectory() as tmp:
        tree = old = None
        if not args.no_baseline:
            tree = baseline_tree(args.baseline, Path(tmp))
            old = (
                version_1_copy(inputs, args.data) if data_version(inputs) > reads(tree) else inputs
            )
        for n in range(args.repeat):  # the baseline and local[2] alternated
            if tree is not None and old is not None:
                run = analyze(old, Path(tmp) / "old", "local[2]", pythonpath=tree)
                measured(f"previous ({args.baseline})", 2, run)
            for cores in [int(c) for c in args.cores.split(",") if n == 0 or c == "2"]:
                out = args.out / f"local{cores}"
                run = analyze(inputs, out, f"local[{cores}]")
                stderr = run.stderr if cores == 2 or not stderr else stderr
                frames = run.frames
                measured("current", cores, run)
        local = args.out / "local2" if (args.out / "local2").exists() else out
        if tree is not None and old == inputs:
            differ = differences(Path(tmp) / "old", local)
            same_as_before = f"previous pipeline ({args.baseline}): every table equal" + (
                f", EXCEPT {differ}" if differ else ""
            )
            if differ:
                print(same_as_before, file=sys.stderr)
                return 1
        elif tree is not None:
            same_as_before = "previous pipeline: read a format 1 copy, tables not compared"
        stages = [s for s in stderr.splitlines() if s.startswith("[analyze]")]
        if args.scale:  # the same mix, more of it: how time grows with size
            bigger = args.data.parent / f"{args.data.name}-{args.scale:g}g"
            bigger.mkdir(parents=True, exist_ok=True)
            if size_of(bigger / "captures") < int(args.scale * 1e9):
                print(f"making {args.scale} GB of recordings in {bigger} ...", file=sys.stderr)
                make_data(bigger, int(args.scale * 1e9))
            size = size_of(bigger / "captures")
            for _ in range(max(1, args.repeat // 2)):
                run = analyze(bigger / "captures", args.out / "scaled", "local[2]")
                measured(f"current, {size / 1e9:.2f} GB", 2, run, size)
        cluster_note = "standalone cluster: skipped"
        if not args.no_cluster:
            with StandaloneCluster(Path(tmp) / "cluster", workers=2) as cluster:
                out = args.out / "cluster"
                run = analyze(inputs, out, cluster.url)
                measured(f"current on {cluster.url} (2 workers; driver's CPU only)", 2, run)
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
        "| host load after | job clock |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("Medians, with the spread (min-max) of the runs:")
    print("| pipeline | cores | runs | job clock | whole process | CPU |")
    print("|---|---|---|---|---|---|")
    for (name, cores), each in runs.items():
        print(
            f"| {name} | {cores} | {len(each)} | {spread([r.job for r in each])} | "
            f"{spread([r.seconds for r in each])} | {spread([sum(r.cpu.values()) for r in each])} |"
        )
    print()
    print(
        "| pipeline | cores | wall | Spark jobs | CPU | "
        + " | ".join(COMPONENTS)
        + " |  (CPU seconds, from /proc)"
    )
    print("|---" * (5 + len(COMPONENTS)) + "|")
    print("\n".join(profiles))
    print(cluster_note)
    print(same_as_before)
    print("stages of the local[2] run:")
    print("\n".join(f"  {s}" for s in stages))
    print(f"report: {local / 'report.html'}, screenshot: {picture}")
    return 0


if __name__ == "__main__":
    bench.run(main)
