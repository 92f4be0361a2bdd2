"""Sluice beside the Apache Pulsar Proxy: one broker, the same clients, one run.

    python bench/peers.py [--rounds 3] [--scale 1.0] [--paths direct,apache-proxy,...]
                          [--png bench/peers.png] [--markdown FILE]

One Apache Pulsar standalone (the release sluice/brokers/apache-pulsar/pom.xml
pins) and, in front of it, every path at once:

  direct          the clients dial the broker
  apache-proxy    the Apache Pulsar Proxy of the same release (our proxy.conf)
  sluice          `sluice proxy` with validation and metrics, no recording
  sluice-record   the same with --record (payloads hashed), as in production
  sluice-workers  the same as `sluice` with --workers 2

Workloads, each on a fresh topic, every path in turn, the order of the paths
rotated from round to round:

  perf 1K max     pulsar-perf produce, 1 KiB, batching off, no rate limit
  perf 1K @rate   pulsar-perf produce, 1 KiB, batching off, at a fixed rate,
                  with pulsar-perf consume reading along (end-to-end latency)
  perf 100B batch pulsar-perf produce, 100 B, batching on, no rate limit
  perf consume    pulsar-perf consume of the "perf 1K max" topic from the start
  py 1K / py 100B the official Python client (bench/e2e.py's workloads)
  py consume

Figures per path and workload, the median over rounds: msg/s, publish
latency p50/p99/p99.9 (pulsar-perf's own histograms), end-to-end latency
(the reading consumer's histogram), the proxy's CPU per message (user +
system from /proc over the proxy's process tree: the JVM's threads, Sluice's
workers), its peak RSS, and its time from start to the first answered
CONNECT. Every Sluice row is also given as a ratio to the Apache Pulsar Proxy
row. The broker, the proxy and the clients share the machine's cores.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Beside this file (run as a script, its folder is first on sys.path).
from e2e import consume as py_consume
from e2e import produce as py_produce
from fleet import cpu_seconds as tree_cpu_seconds
from fleet import process_tree, rss_bytes

from sluice.brokers.apache_pulsar import (
    ApachePulsar,
    ApachePulsarProxy,
    Runtime,
    answered_connect,
)
from sluice.embedded import BrokerError
from tests.support import ProxyProcess, start_proxy

PATHS = ["direct", "apache-proxy", "sluice", "sluice-record", "sluice-workers"]
SAMPLE = 0.1  # seconds between RSS samples


def log(text: str) -> None:
    print(f"[peers] {text}", file=sys.stderr, flush=True)


# --- the paths -------------------------------------------------------------------


@dataclass
class Path_:
    """One way from the clients to the broker."""

    name: str
    url: str
    pid: int | None  # the proxy's process, None when direct
    start_seconds: float | None
    stop: Callable[[], None]


def start_sluice(broker: ApachePulsar, tmp: Path, name: str, *extra: str) -> Path_:
    started = time.monotonic()
    proxy: ProxyProcess = start_proxy(broker.url, tmp, "--admin", "127.0.0.1:0", *extra,
                                      wait=False)  # fmt: skip
    answered_connect(("127.0.0.1", proxy.port), started + 60)
    return Path_(name, proxy.url, proxy.pid, time.monotonic() - started, proxy.kill)


def start_path(name: str, broker: ApachePulsar, tmp: Path) -> Path_:
    if name == "direct":
        return Path_(name, broker.url, None, None, lambda: None)
    if name == "apache-proxy":
        peer = ApachePulsarProxy(broker, log_path=tmp / "apache-proxy.log", say=log).start()
        return Path_(name, peer.url, peer.pid, peer.start_seconds, peer.close)
    if name == "sluice":
        return start_sluice(broker, tmp, name)
    if name == "sluice-record":
        record = tmp / "rec"
        return start_sluice(broker, tmp, name, "--record", str(record),
                            "--record-payloads", "hash")  # fmt: skip
    if name == "sluice-workers":
        return start_sluice(broker, tmp, name, "--workers", "2")
    raise SystemExit(f"unknown path {name!r}; known: {', '.join(PATHS)}")


# --- measuring -------------------------------------------------------------------------


Percentiles = tuple[float, float, float]  # p50, p99, p99.9 in ms


@dataclass
class Figures:
    rate: float = 0.0  # msg/s
    publish: Percentiles | None = None  # p50, p99, p99.9 in ms
    e2e: Percentiles | None = None
    cpu_us: float | None = None  # proxy CPU per message
    peak_rss: int = 0


class Meter:
    """The proxy tree's CPU over a step and its peak RSS while the step runs."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.cpu = 0.0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _pids(self) -> list[int]:
        return [] if self.pid is None else process_tree(self.pid)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE):
            self.peak = max(self.peak, rss_bytes(self._pids()))

    def __enter__(self) -> Meter:
        self.cpu = -tree_cpu_seconds(self._pids())
        if self.pid is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.cpu += tree_cpu_seconds(self._pids())
        self.peak = max(self.peak, rss_bytes(self._pids()))


INTERVAL = re.compile(r"Throughput (?:produced|received): +\d+ msg --- +([\d.]+) +msg/s")
THROUGHPUT = re.compile(r"Aggregated throughput stats --- (\d+) records (?:sent|received) --- "
                        r"([\d.]+) msg/s")  # fmt: skip
LATENCY = re.compile(r"Aggregated latency stats --- Latency: mean: +[\d.]+ ms - med: +([\d.]+) "
                     r"- 95pct: +[\d.]+ - 99pct: +([\d.]+) - 99.9pct: +([\d.]+)")  # fmt: skip


def perf(runtime: Runtime, *args: str, timeout: float = 300) -> tuple[int, float, Percentiles]:
    """Run pulsar-perf; (messages, msg/s, (p50, p99, p99.9) ms) from its summary."""
    try:
        done = subprocess.run(runtime.perf(*args), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-2000:]
        raise SystemExit(
            f"pulsar-perf {' '.join(args[:1])} ran past {timeout:.0f} s: {tail!r}"
        ) from None
    out = done.stdout + done.stderr
    rate, latency = THROUGHPUT.search(out), LATENCY.search(out)
    if done.returncode != 0 or rate is None or latency is None:
        raise SystemExit(f"pulsar-perf {' '.join(args[:2])} failed:\n{out[-3000:]}")
    p50, p99, p999 = (float(g) for g in latency.groups())
    # The steady rate: the median of its one-second reports, less the first
    # and the last (start-up and the tail); the overall figure for short runs.
    steady = [float(r) for r in INTERVAL.findall(out)][1:-1]
    messages_per_second = statistics.median(steady) if len(steady) >= 3 else float(rate.group(2))
    return int(rate.group(1)), messages_per_second, (p50, p99, p999)


Topics = dict[str, tuple[str, int]]  # a workload's name for a topic: (topic, messages)


def topic() -> str:
    return f"persistent://public/default/peers-{uuid.uuid4().hex[:10]}"


@dataclass
class Workload:
    name: str
    run: Callable[[Runtime, str, Topics], tuple[int, Figures]]


def wl_perf_max(
    size: int, seconds: int, batched: bool, keep: str | None = None
) -> Callable[[Runtime, str, Topics], tuple[int, Figures]]:
    def run(runtime: Runtime, url: str, topics: Topics) -> tuple[int, Figures]:
        name = topic()
        # -r 0 sends nothing: a rate no path reaches is "no limit"; at most
        # 1000 messages wait for their receipts (pulsar-perf's own default
        # lets hundreds of thousands pile up, and latency is then queueing).
        args = ["produce", "-u", url, "-s", str(size), "-r", "10000000", "-o", "1000",
                "-time", str(seconds), "-i", "1"]  # fmt: skip
        if not batched:
            args.append("-db")
        sent, rate, latency = perf(runtime, *args, name)
        if keep:
            topics[keep] = (name, sent)
        return sent, Figures(rate=rate, publish=latency)

    return run


def wl_perf_rate(
    size: int, rate: int, seconds: int
) -> Callable[[Runtime, str, Topics], tuple[int, Figures]]:
    def run(runtime: Runtime, url: str, topics: Topics) -> tuple[int, Figures]:
        name = topic()
        count = rate * seconds
        reader = subprocess.Popen(
            runtime.perf("consume", "-u", url, "-ss", "e2e", "-m", str(count), "-i", "1", name),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            time.sleep(2)  # the reader subscribes before the first message
            sent, got, latency = perf(
                runtime, "produce", "-u", url, "-s", str(size), "-r", str(rate),
                "-m", str(count), "-db", "-i", "1", name,
            )  # fmt: skip
            out, _ = reader.communicate(timeout=120)
        finally:
            if reader.poll() is None:
                reader.kill()
                reader.wait()
        e2e = LATENCY.search(out)
        if e2e is None:
            raise SystemExit(f"pulsar-perf consume gave no latency:\n{out[-3000:]}")
        p50, p99, p999 = (float(g) for g in e2e.groups())
        return sent, Figures(rate=got, publish=latency, e2e=(p50, p99, p999))

    return run


def wl_perf_consume(source: str) -> Callable[[Runtime, str, Topics], tuple[int, Figures]]:
    def run(runtime: Runtime, url: str, topics: Topics) -> tuple[int, Figures]:
        name, count = topics[source]
        got, rate, _ = perf(runtime, "consume", "-u", url, "-ss", "all", "-sp", "Earliest",
                            "-m", str(count), "-i", "1", name)  # fmt: skip
        return got, Figures(rate=rate)

    return run


def wl_py_produce(
    size: int, count: int, batched: bool, keep: str | None = None
) -> Callable[[Runtime, str, Topics], tuple[int, Figures]]:
    def run(runtime: Runtime, url: str, topics: Topics) -> tuple[int, Figures]:
        name = topic()
        if keep:
            topics[keep] = (name, count)
        return count, Figures(rate=py_produce(url, name, count, size, batched))

    return run


def wl_py_consume(source: str, count: int) -> Callable[[Runtime, str, Topics], tuple[int, Figures]]:
    def run(runtime: Runtime, url: str, topics: Topics) -> tuple[int, Figures]:
        name, _ = topics[source]
        return count, Figures(rate=py_consume(url, name, count))

    return run


def workloads(scale: float) -> list[Workload]:
    def n(count: int) -> int:
        return max(100, int(count * scale))

    seconds = max(4, int(5 * scale))
    return [
        Workload("perf 1K max", wl_perf_max(1024, seconds, False, keep="perf-1k")),
        Workload("perf 1K @1000/s", wl_perf_rate(1024, 1000, seconds)),
        Workload("perf 100B batch", wl_perf_max(100, seconds, True)),
        Workload("perf consume", wl_perf_consume("perf-1k")),
        Workload("py 1K", wl_py_produce(1024, n(10_000), False, keep="py-1k")),
        Workload("py 100B batch", wl_py_produce(100, n(50_000), True)),
        Workload("py consume", wl_py_consume("py-1k", n(10_000))),
    ]


# --- the run ---------------------------------------------------------------------------


@dataclass
class Cell:
    runs: list[Figures] = field(default_factory=list)

    def median(self) -> Figures:
        def med3(
            values: list[Percentiles | None],
        ) -> Percentiles | None:
            present = [v for v in values if v is not None]
            if not present:
                return None
            return (statistics.median(v[0] for v in present),
                    statistics.median(v[1] for v in present),
                    statistics.median(v[2] for v in present))  # fmt: skip

        cpus = [r.cpu_us for r in self.runs if r.cpu_us is not None]
        return Figures(
            rate=statistics.median(r.rate for r in self.runs),
            publish=med3([r.publish for r in self.runs]),
            e2e=med3([r.e2e for r in self.runs]),
            cpu_us=statistics.median(cpus) if cpus else None,
            peak_rss=max(r.peak_rss for r in self.runs),
        )


@contextlib.contextmanager
def running_paths(names: list[str], broker: ApachePulsar, tmp: Path) -> Iterator[dict[str, Path_]]:
    paths: dict[str, Path_] = {}
    try:
        for name in names:
            log(f"starting {name}")
            paths[name] = start_path(name, broker, tmp)
        yield paths
    finally:
        for p in paths.values():
            p.stop()


def measure(args: argparse.Namespace) -> tuple[dict[tuple[str, str], Cell], dict[str, Path_], str]:
    names = args.paths
    loads = workloads(args.scale)
    cells: dict[tuple[str, str], Cell] = {}
    with tempfile.TemporaryDirectory(prefix="sluice-peers-") as tmp_name:
        tmp = Path(tmp_name)
        with ApachePulsar(log_path=tmp / "broker.log", say=log) as broker:
            assert broker.runtime is not None
            runtime = broker.runtime
            with running_paths(names, broker, tmp) as paths:
                for round_ in range(args.rounds):
                    order = names[round_ % len(names) :] + names[: round_ % len(names)]
                    log(f"round {round_ + 1}/{args.rounds}: {', '.join(order)}")
                    for name in order:
                        path = paths[name]
                        topics: Topics = {}
                        for load in loads:
                            with Meter(path.pid) as meter:
                                count, figures = load.run(runtime, path.url, topics)
                            if path.pid is not None:
                                figures.cpu_us = meter.cpu / count * 1e6
                                figures.peak_rss = meter.peak
                            cells.setdefault((name, load.name), Cell()).runs.append(figures)
                            log(f"  {name:15} {load.name:16} {figures.rate:9,.0f} msg/s")
                starts = dict(paths)
            version = runtime.version
    return cells, starts, version


# --- the report ------------------------------------------------------------------------


def fmt_lat(values: Percentiles | None) -> str:
    return "-" if values is None else " / ".join(f"{v:.1f}" for v in values)


def ratio(mine: float | None, theirs: float | None) -> str:
    if mine is None or theirs is None or theirs == 0:
        return "-"
    return f"{mine / theirs:.2f}"


def table(cells: dict[tuple[str, str], Cell], names: list[str], loads: list[str]) -> str:
    head = ("| workload | path | msg/s | vs peer | publish p50 / p99 / p99.9 ms | vs peer p99 "
            "| e2e p50 / p99 / p99.9 ms | proxy CPU µs/msg | vs peer | peak RSS MiB |")  # fmt: skip
    lines = [head, "|" + "---|" * 10]
    for load in loads:
        peer = cells[("apache-proxy", load)].median() if ("apache-proxy", load) in cells else None
        for name in names:
            f = cells[(name, load)].median()
            versus = name.startswith("sluice") and peer is not None
            p99 = f.publish[1] if f.publish else None
            peer_p99 = peer.publish[1] if peer and peer.publish else None
            row = [
                load, name, f"{f.rate:,.0f}",
                ratio(f.rate, peer.rate) if versus and peer else "",
                fmt_lat(f.publish),
                ratio(p99, peer_p99) if versus else "",
                fmt_lat(f.e2e),
                "-" if f.cpu_us is None else f"{f.cpu_us:.1f}",
                ratio(f.cpu_us, peer.cpu_us) if versus and peer else "",
                "-" if not f.peak_rss else f"{f.peak_rss / 2**20:.0f}",
            ]  # fmt: skip
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def picture(cells: dict[tuple[str, str], Cell], names: list[str], out: Path) -> None:
    """Publish and end-to-end latency percentiles per path, at the fixed rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    load = next(load for (_, load) in cells if "@" in load)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    labels = ["p50", "p99", "p99.9"]
    width = 0.8 / len(names)
    for ax, what in zip(axes, ("publish", "e2e"), strict=True):
        for i, name in enumerate(names):
            values = getattr(cells[(name, load)].median(), what) or (0.0, 0.0, 0.0)
            xs = [x + i * width for x in range(3)]
            ax.bar(xs, values, width, label=name)
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(3)], labels)
        ax.set_ylabel("ms")
        ax.set_title(f"{what} latency, {load}")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds, path order rotated (default: 3)"
    )
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every message count (default: 1.0)")  # fmt: skip
    parser.add_argument("--paths", type=lambda s: s.split(","), default=PATHS,
                        help=f"comma-separated, from {','.join(PATHS)} (default: all)")  # fmt: skip
    parser.add_argument("--png", type=Path, default=Path(__file__).with_name("peers.png"),
                        help="latency picture (default: bench/peers.png)")  # fmt: skip
    parser.add_argument("--markdown", type=Path, help="also write the table here (default: no)")
    args = parser.parse_args()
    unknown = set(args.paths) - set(PATHS)
    if unknown or args.rounds < 1 or args.scale <= 0:
        parser.error(
            f"bad --paths {sorted(unknown)}" if unknown else "--rounds at least 1, --scale > 0"
        )
    started = time.monotonic()
    try:
        cells, paths, version = measure(args)
    except BrokerError as exc:
        print(f"peers: {exc}", file=sys.stderr)
        return 1
    loads = [w.name for w in workloads(args.scale)]
    import platform

    import pulsar

    lines = [
        f"{time.strftime('%Y-%m-%d')}, {platform.node()}, {os_cores()} cores; Apache Pulsar "
        f"{version} standalone; pulsar-perf {version}; pulsar-client {pulsar.__version__}; "
        f"{args.rounds} rounds, scale {args.scale}; medians",
        "",
        table(cells, args.paths, loads),
        "",
        "Start to first answered CONNECT: "
        + ", ".join(
            f"{n} {p.start_seconds:.2f} s" for n, p in paths.items() if p.start_seconds is not None
        ),
    ]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if "direct" in args.paths or len(args.paths) > 1:
        picture(cells, args.paths, args.png)
        log(f"picture: {args.png}")
    log(f"done in {time.monotonic() - started:.0f} s")
    return 0


def os_cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    sys.exit(main())
