"""K client processes through Sluice vs straight to the broker, in one run (#16).

    python bench/fleet.py [--clients 1,4,8] [--messages N] [--quick]
                          [--kind direct,proxy] [--workers 1,auto] [--record off,on]
                          [--workloads unbatched,batched] [--rounds 3]

One embedded pulsar-lite broker; K client processes (the official
pulsar-client, one `pulsar.Client` each), each producing to its own topic and
then consuming that topic from the earliest message. The clients are set up
first (producer created, or connection to the broker made), then all start
at one signal; a step's msg/s is the messages of all clients divided by the
wall time from the first start to the last client's end.

Configurations, for every K: direct to the broker, then through one
`sluice proxy` subprocess for every combination of `--workers` (1 and auto)
and recording (off, and on with `--record DIR --record-payloads hash`). A
fresh proxy is started for each configuration and K, so its peak RSS is that
of the K clients' connections. Workloads: 1 KiB messages unbatched, and
100 B messages batched (`--batched-messages`, default 5x `--messages`).

Per step, besides msg/s and the ratio to direct with the same K: the proxy's
CPU time per message (user + system from /proc of the proxy process and of
all its descendants, the workers, including children they have reaped),
the proxy's peak RSS (VmRSS summed over the same processes, sampled every
0.2 s during the step), the broker's CPU per message (the machine's cores are
shared by clients, broker and proxy), and a delivery check: consumed messages
are deduplicated by content (pulsar-lite 0.2.0 may redeliver under load) and
compared with those produced.

``--rounds N`` (3; 1 with ``--quick``) runs the whole sweep N times, each
round starting at another configuration, so that none is always measured
first (the broker's state changes as a run goes on). Rows are labelled with
their round, and the summary's comparisons pair configurations of the same
round. The table at the end gives, per configuration, workload, step and
client count, the median of the rounds' own ratios to direct (each round's
proxy msg/s over that same round's direct msg/s) with their min-max, and
how many rounds it is of: a round the broker stalled (``*``) on either side,
or that failed, is left out of the ratio.

Loopback only; every process started here is stopped by PID on exit, Ctrl-C
and errors included. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import multiprocessing
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench
from sluice.brokers.embedded import EmbeddedBroker, free_port
from tests.helpers.support import source_error

_TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_INTERVAL = 0.2  # seconds between RSS samples
WARM_UP = 500  # untimed 1 KiB messages per client before each configuration's steps


# --- /proc ---------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat from field 3 (state) on; the command name may hold spaces."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children(pid: int) -> list[int]:
    """Direct children of ``pid``: /proc/PID/task/*/children, or a scan of
    /proc for processes whose parent is ``pid`` where the kernel lacks it."""
    try:
        out: list[int] = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
        return out
    except FileNotFoundError:
        if not Path(f"/proc/{pid}").exists():
            return []
    except OSError:
        return []
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int(_stat_fields(int(entry.name))[1]) == pid:
                    out.append(int(entry.name))
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants alive now."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += _children(current)
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes, with that of children they have
    reaped (a worker that died and was restarted still counts)."""
    return _ticks(pids, 11, 15) / _TICK  # utime stime cutime cstime


def reaped_cpu_seconds(pids: list[int]) -> float:
    """The CPU of the children these processes have reaped (cutime and
    cstime): what a per-process clock of the live ones no longer counts
    once a worker died and was restarted."""
    return _ticks(pids, 13, 15) / _TICK


def _ticks(pids: list[int], first: int, stop: int) -> int:
    """The sum of /proc/PID/stat's fields ``first`` to ``stop`` (from
    _stat_fields) over ``pids``, those gone since skipped."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            ticks += sum(int(f) for f in _stat_fields(pid)[first:stop])
    return ticks


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
    return total


class Meter:
    """CPU of the proxy tree and of the broker over one step, and the proxy
    tree's peak RSS sampled while the step runs."""

    def __init__(self, proxy_pid: int | None, broker_pid: int) -> None:
        self.proxy_pid = proxy_pid
        self.broker_pid = broker_pid
        self.proxy_cpu = 0.0
        self.broker_cpu = 0.0
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _proxy_pids(self) -> list[int]:
        return [] if self.proxy_pid is None else process_tree(self.proxy_pid)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL):
            self.peak_rss = max(self.peak_rss, rss_bytes(self._proxy_pids()))

    def begin(self) -> None:
        pids = self._proxy_pids()
        self.peak_rss = rss_bytes(pids)
        self.proxy_cpu = -cpu_seconds(pids)
        self.broker_cpu = -cpu_seconds([self.broker_pid])
        if self.proxy_pid is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()

    def end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        pids = self._proxy_pids()
        self.proxy_cpu += cpu_seconds(pids)
        self.broker_cpu += cpu_seconds([self.broker_pid])
        self.peak_rss = max(self.peak_rss, rss_bytes(pids))


# --- the client processes ----------------------------------------------------------
#
# Each runs client_process: it takes a job (a dict) from its pipe, sets up
# (client, producer or connection), answers ("ready", None), waits for "go",
# runs and answers ("done", result) -- or ("error", text) at any point.


def payload(client: int, seq: int, size: int) -> bytes:
    """A unique message body: "client:seq:" padded to ``size`` bytes."""
    head = b"%d:%d:" % (client, seq)
    return head + b"x" * (size - len(head))


def client_process(conn: Connection, index: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent cleans up on Ctrl-C
    os.dup2(2, 1)  # the C++ client logs to stdout: keep the table on stdout clean
    import pulsar

    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            step = _produce if job["step"] == "produce" else _consume
            result = step(pulsar, logger, conn, index, job)
        except Exception as exc:
            conn.send(("error", f"client {index}: {type(exc).__name__}: {exc}"))
        else:
            conn.send(("done", result))


def _await_go(conn: Connection) -> None:
    conn.send(("ready", None))
    if conn.recv() != "go":
        raise RuntimeError("expected the start signal")


def _produce(pulsar: Any, logger: Any, conn: Connection, index: int, job: dict[str, Any]) -> Any:
    count: int = job["count"]
    bodies = [payload(index, seq, job["size"]) for seq in range(count)]
    done = threading.Semaphore(0)
    failed: list[str] = []

    def on_receipt(result: Any, _msg_id: Any) -> None:
        if result != pulsar.Result.Ok:
            failed.append(str(result))
        done.release()

    client = pulsar.Client(job["url"], operation_timeout_seconds=30, logger=logger)
    try:
        producer = client.create_producer(
            job["topic"],
            batching_enabled=job["batching"],
            batching_max_messages=1000,
            batching_max_publish_delay_ms=5,
            max_pending_messages=1000,
            block_if_queue_full=True,
            send_timeout_millis=int(job["timeout"] * 1000),
        )
        _await_go(conn)
        start = time.monotonic()
        deadline = start + job["timeout"]
        for body in bodies:
            producer.send_async(body, on_receipt)
        producer.flush()
        for _ in range(count):
            if not done.acquire(timeout=max(0.01, deadline - time.monotonic())):
                raise TimeoutError("send receipts did not arrive in time")
        end = time.monotonic()
        producer.close()
    finally:
        client.close()
    return {
        "start": start,
        "end": end,
        "messages": count - len(failed),
        "failed": len(failed),
        "why": failed[0] if failed else "",
    }


def _consume(pulsar: Any, logger: Any, conn: Connection, index: int, job: dict[str, Any]) -> Any:
    sent: int = job["count"]  # sequence numbers 0..sent-1 were sent
    expected: int = job["expected"]  # of which this many were acknowledged
    size: int = job["size"]
    seen = bytearray(sent)
    distinct = received = bad = 0
    client = pulsar.Client(job["url"], operation_timeout_seconds=30, logger=logger)
    try:
        client.get_topic_partitions(job["topic"])  # the connection is up before the clock
        _await_go(conn)
        start = last = time.monotonic()
        deadline = start + job["timeout"]
        consumer = client.subscribe(
            job["topic"],
            f"fleet-{uuid.uuid4().hex[:8]}",
            initial_position=pulsar.InitialPosition.Earliest,
            receiver_queue_size=job["queue"],
        )
        while distinct < expected:
            wait_s = min(job["idle"], deadline - time.monotonic())
            if wait_s <= 0:
                break
            try:
                msg = consumer.receive(timeout_millis=int(wait_s * 1000) + 1)
            except pulsar.Timeout:
                break  # nothing for a while: the rest is lost
            received += 1
            data = msg.data()
            consumer.acknowledge(msg)
            try:
                seq = int(data.split(b":", 2)[1])
            except (IndexError, ValueError):
                bad += 1
                continue
            if not 0 <= seq < sent or data != payload(index, seq, size):
                bad += 1
            elif not seen[seq]:
                seen[seq] = 1
                distinct += 1
                last = time.monotonic()
        consumer.close()
    finally:
        client.close()
    return {
        "start": start,
        "end": last,
        "messages": distinct,
        "duplicates": received - distinct - bad,
        "bad": bad,
        "lost": expected - distinct,
    }


class StepFailed(Exception):
    pass


class Fleet:
    """``size`` client processes, started once and given one job each per step."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.context = multiprocessing.get_context("spawn")
        self.processes: list[BaseProcess] = []
        self.conns: list[Connection] = []

    def start(self) -> None:
        for index in range(self.size):
            ours, theirs = self.context.Pipe()
            process = self.context.Process(
                target=client_process, args=(theirs, index), name=f"fleet-client-{index}"
            )
            process.daemon = True
            process.start()
            theirs.close()
            self.processes.append(process)
            self.conns.append(ours)

    def stop(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        deadline = time.monotonic() + 5
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.join(5)
        for conn in self.conns:
            conn.close()
        self.processes, self.conns = [], []

    def restart(self) -> None:
        self.stop()
        self.start()

    def run(self, jobs: list[dict[str, Any]], timeout: float, meter: Meter) -> list[Any]:
        """Give job i to client i; once all are set up, start them at once and
        measure until the last one is done."""
        conns = self.conns[: len(jobs)]
        for conn, job in zip(conns, jobs, strict=True):
            conn.send(job)
        self._collect(conns, "ready", time.monotonic() + 60)
        meter.begin()
        try:
            for conn in conns:
                conn.send("go")
            return self._collect(conns, "done", time.monotonic() + timeout + 30)
        finally:
            meter.end()

    def _collect(self, conns: list[Connection], kind: str, deadline: float) -> list[Any]:
        results: dict[int, Any] = {}
        pending = {id(c): c for c in conns}
        while pending:
            ready = wait(list(pending.values()), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise StepFailed(f"{len(pending)} client(s) not {kind} in time")
            for conn in ready:
                assert isinstance(conn, Connection)
                try:
                    got, value = conn.recv()
                except (EOFError, OSError):
                    raise StepFailed("a client process died") from None
                if got == "error":
                    raise StepFailed(str(value))
                results[id(conn)] = value
                del pending[id(conn)]
        return [results[id(c)] for c in conns]


# --- the proxy ---------------------------------------------------------------------


class ProxyProcess:
    """`sluice proxy` as a subprocess in its own session (Ctrl-C reaches
    only this script, which stops it), ready when its /readyz says so."""

    def __init__(
        self, broker_url: str, workers: str, record: Path | None, tmp: Path, source: Path
    ) -> None:
        self.port = free_port()
        self.admin = free_port()
        self.log_path = tmp / f"proxy-{self.port}.log"
        args = [sys.executable, "-m", "sluice", "proxy", "--broker", broker_url,
                "--listen", f"127.0.0.1:{self.port}", "--admin", f"127.0.0.1:{self.admin}",
                "--workers", workers, "--drain-timeout", "3", "--log-level", "warning"]  # fmt: skip
        if record is not None:
            args += ["--record", str(record), "--record-payloads", "hash"]
        # Imported here, not at the top: spawned client processes re-import
        # this script, and should load pulsar only after moving its stdout.
        from tests.helpers.support import run_from

        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            **run_from(source))  # fmt: skip
        self.known: set[int] = {self.process.pid}

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the proxy exited ({self.process.returncode}):\n"
                                   f"{self.log_tail()}")  # fmt: skip
            try:
                url = f"http://127.0.0.1:{self.admin}/readyz"
                with urllib.request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200:
                        self.known.update(process_tree(self.pid))
                        return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the proxy was not ready in {timeout:g}s:\n{self.log_tail()}")
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM (the supervisor drains its workers), then SIGKILL whatever
        of the processes seen is left, by PID."""
        if self.process.poll() is None:
            self.known.update(process_tree(self.pid))
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in self.known - {self.pid}:
            with contextlib.suppress(OSError):
                if b"sluice" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)


# --- the benchmark -----------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    name: str
    label: str
    size: int
    batching: bool
    messages: int  # per client


@dataclass(frozen=True)
class Config:
    workers: str | None  # None: direct to the broker
    record: bool = False
    auto: int = 0  # what --workers auto means here

    @property
    def label(self) -> str:
        if self.workers is None:
            return "direct"
        workers = f"auto={self.auto}" if self.workers == "auto" else self.workers
        return f"sluice w={workers}" + (" rec" if self.record else "")


@dataclass
class Row:
    config: Config
    clients: int
    workload: Workload
    step: str
    rate: float = 0.0
    proxy_cpu: float | None = None  # µs per message
    proxy_rss: int | None = None  # bytes
    broker_cpu: float = 0.0
    check: str = ""
    lost: int = 0  # messages produced but never consumed: the rate is of a part
    failed: str = ""
    round: int = 0


def csv_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", help="client process counts (default 1,4,8; quick 1,2)")
    parser.add_argument(
        "--messages", type=int, help="1 KiB messages per client (default 20000; quick 5000)"
    )
    parser.add_argument(
        "--batched-messages", type=int, help="100 B batched messages per client (5x --messages)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of a minute or two")
    parser.add_argument("--kind", default="direct,proxy", help="direct,proxy or one of them")
    parser.add_argument("--workers", default="1,auto", help="proxy --workers values (1,auto)")
    parser.add_argument("--record", default="off,on", help="proxy recording: off,on")
    parser.add_argument("--workloads", default="unbatched,batched", help="unbatched,batched")
    parser.add_argument(
        "--rounds",
        type=int,
        help="repeat the sweep, each round in another order of configurations (default 3; quick 1)",
    )
    parser.add_argument(
        "--step-timeout", type=float, default=300.0, help="seconds one step may take"
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=20.0,
        help="a consumer that gets nothing for this long counts the rest as lost",
    )
    parser.add_argument(
        "--receiver-queue",
        type=int,
        default=1000,
        help="consumers' receiver_queue_size (default 1000)",
    )
    parser.add_argument(
        "--source",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="run the proxy from the sluice package in this directory, e.g. an exported "
        "commit (default: this checkout)",
    )
    args = parser.parse_args()
    args.source = args.source.resolve()
    problem = source_error(args.source, "--source")
    if problem is not None:
        parser.error(problem)
    args.clients = args.clients or ("1,2" if args.quick else "1,4,8")
    args.messages = args.messages or (5000 if args.quick else 20000)
    args.batched_messages = args.batched_messages or 5 * args.messages
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def configurations(args: argparse.Namespace, auto: int) -> list[Config]:
    kinds = csv_list(args.kind)
    bad = set(kinds) - {"direct", "proxy"}
    records = csv_list(args.record)
    bad |= set(records) - {"on", "off"}
    workers = csv_list(args.workers)
    bad |= {w for w in workers if w != "auto" and not w.isdigit()}
    if bad:
        raise SystemExit(f"not understood: {', '.join(sorted(bad))}")
    out = [Config(None)] if "direct" in kinds else []
    if "proxy" in kinds:
        out += [Config(w, r == "on", auto) for w in workers for r in records]
    return out


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def run_step(
    fleet: Fleet,
    row: Row,
    url: str,
    topics: list[str],
    counts: list[int],
    proxy: ProxyProcess | None,
    broker: EmbeddedBroker,
    args: argparse.Namespace,
    *,
    quiet: bool = False,
) -> list[Any]:
    """One produce or consume step over ``row.clients`` clients; fills ``row``."""
    workload = row.workload
    jobs = [
        {"step": row.step, "url": url, "topic": topic, "count": workload.messages,
         "expected": expected, "size": workload.size, "batching": workload.batching,
         "timeout": args.step_timeout, "idle": args.idle_timeout,
         "queue": args.receiver_queue}
        for topic, expected in zip(topics, counts, strict=True)
    ]  # fmt: skip
    assert broker.pid is not None
    meter = Meter(proxy.pid if proxy else None, broker.pid)
    results = fleet.run(jobs, args.step_timeout, meter)
    messages = sum(r["messages"] for r in results)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    row.rate = messages / wall if wall > 0 and messages else 0.0
    per = max(messages, 1)
    row.broker_cpu = meter.broker_cpu / per * 1e6
    if proxy is not None:
        row.proxy_cpu = meter.proxy_cpu / per * 1e6
        row.proxy_rss = meter.peak_rss
    if row.step == "produce":
        failed = sum(r["failed"] for r in results)
        row.check = f"{failed} failed" if failed else "ok"
    else:
        lost = row.lost = sum(r["lost"] for r in results)
        dups = sum(r["duplicates"] for r in results)
        bad = sum(r["bad"] for r in results)
        parts = [f"{n} {what}" for n, what in ((lost, "lost"), (dups, "dup"), (bad, "bad")) if n]
        row.check = ", ".join(parts) or "ok"
    if quiet:
        return results
    cpu = f", proxy {row.proxy_cpu:.1f} µs/msg, {meter.peak_rss / 2**20:.0f} MiB" if proxy else ""
    log(f"  {row.step:<7} {row.rate:>10,.0f} msg/s over {wall:5.1f}s{cpu}, "
        f"broker {row.broker_cpu:.1f} µs/msg, {row.check}")  # fmt: skip
    return results


def run_config(
    fleet: Fleet,
    config: Config,
    clients: int,
    workloads: list[Workload],
    broker: EmbeddedBroker,
    tmp: Path,
    args: argparse.Namespace,
    rows: list[Row],
    proxies: list[ProxyProcess],
    round_: int = 0,
) -> None:
    proxy = None
    if config.workers is not None:
        record = tmp / f"rec-{uuid.uuid4().hex[:8]}" if config.record else None
        proxy = ProxyProcess(broker.url, config.workers, record, tmp, args.source)
        proxies.append(proxy)
        proxy.wait_ready()
    try:
        url = proxy.url if proxy else broker.url
        # Untimed: every client produces and consumes a few messages first, so
        # that nothing measured pays for first connections and lazy set-up.
        warm = Workload("warm-up", "warm-up", 1024, False, WARM_UP)
        topics = [f"persistent://public/default/fleet-warm-{uuid.uuid4().hex[:10]}-{i}"
                  for i in range(clients)]  # fmt: skip
        for step in ("produce", "consume"):
            try:
                run_step(fleet, Row(config, clients, warm, step), url, topics,
                         [WARM_UP] * clients, proxy, broker, args, quiet=True)  # fmt: skip
            except StepFailed as exc:
                log(f"  warm-up {step} failed: {exc}")
                fleet.restart()
        for workload in workloads:
            log(f"{config.label}, {clients} client(s), {workload.label}, "
                f"{workload.messages:,} messages each")  # fmt: skip
            run = uuid.uuid4().hex[:10]
            topics = [f"persistent://public/default/fleet-{run}-{i}" for i in range(clients)]
            counts = [workload.messages] * clients
            for step in ("produce", "consume"):
                row = Row(config, clients, workload, step, round=round_)
                rows.append(row)
                try:
                    results = run_step(fleet, row, url, topics, counts, proxy, broker, args)
                except StepFailed as exc:
                    row.failed = str(exc).splitlines()[0][:60]
                    log(f"  {step} FAILED: {exc}")
                    fleet.restart()
                    if step == "produce":
                        rows.append(Row(config, clients, workload, "consume",
                                        failed="no produce", round=round_))  # fmt: skip
                        break
                    continue
                if step == "produce":
                    counts = [r["messages"] for r in results]
    finally:
        if proxy is not None:
            proxy.stop()
            proxies.remove(proxy)


def print_table(rows: list[Row], configs: list[Config], workloads: list[Workload]) -> None:
    direct = {
        (r.clients, r.workload.name, r.step, r.round): r.rate
        for r in rows
        if r.config.workers is None and not r.failed and not r.lost
    }
    order = {c: i for i, c in enumerate(configs)}
    wl_order = {w.name: i for i, w in enumerate(workloads)}
    rows = sorted(rows, key=lambda r: (wl_order[r.workload.name], r.step != "produce",
                                       r.clients, order[r.config], r.round))  # fmt: skip
    rounds = len({r.round for r in rows}) > 1
    width = max(19, *(len(c.label) + (4 if rounds else 0) for c in configs))  # " #N"
    head = (f"{'configuration':<{width}} {'clients':>7} {'workload':<16} {'step':<8} {'msg/s':>9} "
            f"{'ratio':>6} {'proxy µs/msg':>12} {'proxy RSS MiB':>13} {'broker µs/msg':>13}  "
            f"check")  # fmt: skip
    print(head)
    print("-" * len(head))
    previous = None
    for r in rows:
        group = (r.workload.name, r.step, r.clients)
        if previous is not None and group != previous:
            print()
        previous = group
        base = direct.get((r.clients, r.workload.name, r.step, r.round))
        label = f"{r.config.label} #{r.round + 1}" if rounds else r.config.label
        if r.failed:
            print(f"{label:<{width}} {r.clients:>7} {r.workload.label:<16} {r.step:<8} "
                  f"{'FAILED':>9}  {r.failed}")  # fmt: skip
            continue
        ratio = "-" if r.config.workers is None else "n/a"
        if base and r.config.workers is not None and not r.lost:
            ratio = f"{r.rate / base:.2f}"
        rate = f"{r.rate:,.0f}" + ("*" if r.lost else "")
        cpu = "-" if r.proxy_cpu is None else f"{r.proxy_cpu:.1f}"
        rss = "-" if r.proxy_rss is None else f"{r.proxy_rss / 2**20:.0f}"
        print(f"{label:<{width}} {r.clients:>7} {r.workload.label:<16} {r.step:<8} "
              f"{rate:>9} {ratio:>6} {cpu:>12} {rss:>13} {r.broker_cpu:>13.1f}  "
              f"{r.check}")  # fmt: skip


def print_summary(rows: list[Row], configs: list[Config]) -> None:
    """Workers auto vs 1 (same recording, clients, workload and step), and
    the lowest proxy/direct ratios."""
    rate = {
        (r.config, r.clients, r.workload.name, r.step, r.round): r
        for r in rows
        if not r.failed and not r.lost
    }
    for record in (False, True):
        one = next((c for c in configs if c.workers == "1" and c.record == record), None)
        if one is None:
            continue
        many = [c for c in configs if c.workers not in (None, "1") and c.record == record]
        for other in many:
            ratios = []
            cpu = []
            for (config, clients, workload, step, round_), row in rate.items():
                base = rate.get((one, clients, workload, step, round_))
                if config == other and base is not None and base.rate > 0:
                    ratios.append(row.rate / base.rate)
                    if row.proxy_cpu is not None and base.proxy_cpu:
                        cpu.append(row.proxy_cpu / base.proxy_cpu)
            if ratios:
                print(f"{other.label} vs {one.label}: msg/s ratio median "
                      f"{statistics.median(ratios):.2f}, lowest {min(ratios):.2f}, highest "
                      f"{max(ratios):.2f} over {len(ratios)} steps; CPU/msg ratio median "
                      f"{statistics.median(cpu) if cpu else float('nan'):.2f}")  # fmt: skip
    direct = {
        (r.clients, r.workload.name, r.step, r.round): r.rate
        for r in rows
        if r.config.workers is None and not r.failed and not r.lost
    }
    for config in configs:
        if config.workers is None:
            continue
        against = [
            (row.rate / direct[(c, w, s, n)], c, w, s)
            for (cfg, c, w, s, n), row in rate.items()
            if cfg == config and direct.get((c, w, s, n))
        ]
        if against:
            low = min(against)
            print(f"{config.label}: lowest ratio to direct {low[0]:.2f} "
                  f"({low[1]} clients, {low[2]}, {low[3]})")  # fmt: skip


Key = tuple[Config, int, str, str]  # configuration, clients, workload name, step


@dataclass(frozen=True)
class Versus:
    """A configuration's msg/s over direct's, round by round."""

    ratios: tuple[float, ...]  # each round's own ratio, of the rounds used, in round order
    rounds: int  # rounds the configuration's step was measured in

    def text(self) -> str:
        """``median (min-max) used/rounds``: ``1.02 (0.95-1.10) 3/3``."""
        used = f"{len(self.ratios)}/{self.rounds}"
        if not self.ratios:
            return f"- {used}"
        if len(self.ratios) == 1:
            return f"{self.ratios[0]:.2f} {used}"
        low, high = min(self.ratios), max(self.ratios)
        return f"{statistics.median(self.ratios):.2f} ({low:.2f}-{high:.2f}) {used}"


def _usable(row: Row) -> bool:
    """Measured whole: not failed, and the broker did not stall (``*``)."""
    return not row.failed and not row.lost and row.rate > 0


def ratios_to_direct(rows: list[Row]) -> dict[Key, Versus]:
    """Each proxy configuration's msg/s over direct's, per clients, workload
    and step: every round's proxy msg/s over the same round's direct msg/s.
    A round the broker stalled (``*``) or that failed, on either side, is
    left out of both (never the lowest over the lowest)."""
    direct = {(r.clients, r.workload.name, r.step, r.round): r.rate
              for r in rows if r.config.workers is None and _usable(r)}  # fmt: skip
    measured: dict[Key, set[int]] = {}
    ratios: dict[Key, list[float]] = {}
    for r in sorted(rows, key=lambda r: r.round):
        if r.config.workers is None:
            continue
        key = (r.config, r.clients, r.workload.name, r.step)
        measured.setdefault(key, set()).add(r.round)
        kept = ratios.setdefault(key, [])
        base = direct.get((r.clients, r.workload.name, r.step, r.round))
        if base and _usable(r):
            kept.append(r.rate / base)
    return {key: Versus(tuple(ratios[key]), len(measured[key])) for key in measured}


def ratio_table(rows: list[Row], configs: list[Config], workloads: list[Workload]) -> str:
    """Per workload and step, a row per configuration and a column per client
    count: direct's msg/s, and each proxy configuration's ratio to it, as
    median (min-max) of the rounds' own ratios and the rounds used of those
    measured."""
    versus = ratios_to_direct(rows)
    clients = sorted({r.clients for r in rows})
    lines = [
        "msg/s over direct's, round by round (a round's proxy msg/s over the same round's "
        "direct msg/s):",
        "median (min-max) of the rounds used / measured; a round stalled (*) or failed on "
        "either side is left out of both",
    ]
    width = max(19, *(len(c.label) for c in configs))
    for workload in workloads:
        for step in ("produce", "consume"):
            if not any(r.workload.name == workload.name and r.step == step for r in rows):
                continue
            table: list[list[str]] = [
                [f"{workload.label}, {step}"]
                + [f"{k} client{'s' if k > 1 else ''}" for k in clients]
            ]
            for config in configs:
                cells = [config.label if config.workers is not None else "direct (msg/s)"]
                for k in clients:
                    if config.workers is not None:
                        got = versus.get((config, k, workload.name, step))
                        cells.append("" if got is None else got.text())
                        continue
                    mine = [r for r in rows if r.config == config and r.clients == k
                            and r.workload.name == workload.name and r.step == step]  # fmt: skip
                    rates = [r.rate for r in mine if _usable(r)]
                    used = f"{len(rates)}/{len({r.round for r in mine})}"
                    cells.append("" if not mine else f"- {used}" if not rates else
                                 f"{statistics.median(rates):,.0f} ({min(rates):,.0f}-"
                                 f"{max(rates):,.0f}) {used}")  # fmt: skip
                table.append(cells)
            widths = [max(width, *(len(t[0]) for t in table))]
            widths += [max(len(t[i]) for t in table) for i in range(1, len(clients) + 1)]
            lines.append("")
            for cells in table:
                lines.append("  ".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True))
                             .rstrip())  # fmt: skip
    return "\n".join(lines)


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    def handler(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main() -> int:
    args = parse_args()
    from sluice.proxy.workers import available_cpus

    auto = available_cpus()
    clients = [int(k) for k in csv_list(args.clients)]
    every = [
        Workload("unbatched", "1 KiB unbatched", 1024, False, args.messages),
        Workload("batched", "100 B batched", 100, True, args.batched_messages),
    ]
    wanted = csv_list(args.workloads)
    workloads = [w for w in every if w.name in wanted]
    if not workloads or not clients or min(clients) < 1:
        raise SystemExit("nothing to run: check --clients and --workloads")
    configs = configurations(args, auto)
    rows: list[Row] = []
    proxies: list[ProxyProcess] = []
    began = time.monotonic()
    load_before = _loadavg()
    interrupted = False
    with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="sluice-fleet-") as tmp_dir:
        tmp = Path(tmp_dir)
        broker = EmbeddedBroker(data_dir=tmp / "broker")
        fleet = Fleet(max(clients))
        try:
            broker.start()
            fleet.start()
            log(f"broker {broker.url} (pid {broker.pid}), {fleet.size} client processes, "
                f"--workers auto = {auto}")  # fmt: skip
            for round_ in range(args.rounds):
                shift = round_ % len(configs)
                for k in clients:
                    for config in configs[shift:] + configs[:shift]:
                        run_config(fleet, config, k, workloads, broker, tmp, args, rows,
                                   proxies, round_)  # fmt: skip
        except KeyboardInterrupt:
            interrupted = True
            log("interrupted: stopping everything; the table shows the steps done")
        finally:
            for proxy in proxies:
                proxy.stop()
            fleet.stop()
            broker.stop()

    from tests.helpers.support import describe_source  # late, as in ProxyProcess

    print(f"bench/fleet.py, {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}: "
          f"{os.cpu_count()} CPUs ({auto} available), Python {platform.python_version()}; "
          f"{args.messages:,} 1 KiB / {args.batched_messages:,} 100 B messages per client, "
          f"{args.rounds} round(s); "
          f"{(time.monotonic() - began) / 60:.1f} min; load average {load_before} before, "
          f"{_loadavg()} after")  # fmt: skip
    print(f"proxy: sluice from {describe_source(args.source)}; pulsar-client "
          f"{_version('pulsar-client')}, pulsar-lite {_version('pulsar-lite')}")  # fmt: skip
    print("ratio: msg/s over direct's with the same clients, workload and step; proxy µs/msg "
          "and RSS: supervisor + workers")  # fmt: skip
    print()
    print_table(rows, configs, workloads)
    print("* not every message was consumed (pulsar-lite stopped dispatching for "
          f"{args.idle_timeout:g}s): msg/s of those that were, no ratio")  # fmt: skip
    print()
    print_summary(rows, configs)
    print()
    print(ratio_table(rows, configs, workloads))
    return 130 if interrupted else 0


if __name__ == "__main__":
    bench.run(main)
