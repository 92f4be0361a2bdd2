"""Sluice beside the Apache Pulsar Proxy: one broker, the same clients, one run.

    python bench/peers.py [--rounds 3] [--scale 1.0] [--paths direct,apache-proxy,...]
                          [--starts 3] [--warmup-passes N] [--png bench/peers.png]
                          [--markdown FILE] [--workloads 'py 1K,py consume']

One Apache Pulsar standalone (the release sluice/brokers/apache-pulsar/pom.xml
pins) and, in front of it, every path at once:

  direct          the clients dial the broker
  apache-proxy    the Apache Pulsar Proxy of the same release (our proxy.conf:
                  zero-copy mode on, Netty aligned to the release's own)
  sluice          `sluice proxy` with validation and metrics, no recording
  sluice-record   the same with --record (payloads hashed), as in production
  sluice-workers  the same as `sluice` with --workers 2
  sluice-filter-noop  `sluice` plus --filter bench.peers:Noop on the bench's topics,
                  produce direction: every produced message unpacked and passed
  sluice-schema   `sluice` plus --filter schema on the bench's topics, produce
                  direction: every produced message checked against the topic's
                  JSON schema (fetched from the broker with GET_SCHEMA)
  sluice-encrypt  `sluice` plus --filter encrypt on the bench's topics, produce
                  direction: every produced entry encrypted in Pulsar's
                  end-to-end format (AES-256-GCM, the data key wrapped with a
                  2048-bit RSA key)
  sluice-live     `sluice` with someone watching it live the whole run (a
                  thread asking POST /live as `sluice view --live` does); every
                  other sluice path has the same live tap, idle

The default --paths are the first five; the two filter paths and the live
one are asked for by name (--paths direct,sluice,sluice-filter-noop,sluice-schema). When
either is asked for, every produce workload on every path of that run sends
JSON records (``{"id": N, "name": "peers", "blob": "xx..."}``, each line
exactly the row's size: pulsar-perf --payload-file, the Python client the
same lines) instead of pulsar-perf's own payload and the Python x's,
and each of its topics is given a JSON schema through the admin API before
its first client: the rows of a run compare, byte for byte, and the schema
filter has something real to check. A run without the filter paths sends
what it always has, so its rows compare with earlier runs'. After the
rounds every Sluice path's /metrics is read: a message a filter refused
(sluice_filter_rejected_total) or raised on ends the run with an error, as
does a filter path whose filter saw fewer messages than its produce rows
counted in their windows (sluice_filter_messages_total; for the encrypt
path, sealed on the compiled path, sluice_filter_replaced_total): it would
measure plain Sluice.
With `sluice` in the run too, a second table sets each filter path's rows
beside `sluice`'s: msg/s and proxy CPU per message, each as the ratio of
the filter row to the `sluice` row of the same round, median (min-max) of
the rounds. The filters are produce-only, so the consume rows of the filter
paths are connections no filter wants, on the compiled path.

Before the rounds, warm-up passes (``warm_up``): pulsar-perf at 1 KiB full
rate and its consume through every path, pass after pass, until the Apache
Pulsar Proxy's CPU per message moved by less than 10% on both from one pass
to the next (2 to 8 passes; ``--warmup-passes N`` fixes the count). A JVM
measured cold reads two to three times its warm CPU per message, and a
production proxy runs for days: the rounds compare warm proxies. At least 3
rounds are measured, and each cell shows its median with the min-max of the
rounds, so a ratio is read with its noise.

Workloads, each on a fresh topic, every path in turn, the order of the paths
rotated from round to round:

  perf 1K max       pulsar-perf produce, 1 KiB, batching off, no rate limit
  perf consume      pulsar-perf consume of the "perf 1K max" topic from the start
  perf 100B batch   pulsar-perf produce, 100 B, batching on, no rate limit
  perf 1K @R/s      pulsar-perf produce, 1 KiB, batching off, at R = 100, 1000
                    and 10,000 msg/s, with pulsar-perf consume reading along
                    (end-to-end latency); 10 s at 100 msg/s, 5 s at the others
  py 1K / py 100B   the official Python client (bench/e2e.py's workloads)
  py consume
  idle              no client: the proxy's own CPU with nothing to relay

Every figure is taken over the send window, not the client's life. For
pulsar-perf (a JVM that starts, connects, sends, waits and exits) a sampler
reads, every 0.2 s, the broker's counter for the topic (msgInCounter, or
msgOutCounter when consuming, from the admin API's topic stats) together
with the proxy's CPU clock; the window runs from the first sample that saw
messages to the last sample before the counter stopped, so pulsar-perf's
start-up and tail fall outside it. msg/s is the messages counted in that
window over its length; proxy CPU per message is the proxy's CPU in the same
window over the same messages. For the Python client (in this process) the
window is marked exactly: from the first send (or, consuming, the
subscription) to the last receipt (the last message). Proxy CPU is the
kernel's per-process CPU clock (nanoseconds, every thread, summed over the
proxy's process tree: the JVM, Sluice's workers). The idle row measures each
proxy with no client over the same length as the timed pulsar-perf runs; its
rate, divided by a row's msg/s, is given beside each row ("idle µs/msg"), so
what the traffic costs is the difference.

Publish latency (p50/p99/p99.9) is pulsar-perf's histogram, end-to-end the
reading consumer's. Peak RSS is sampled over the whole workload. The Apache
Pulsar Proxy's transport is read from its memory maps (Netty's native epoll
library loaded or not), and whether it relays with splice(2) from an strace
count of its syscalls while 2,000 1 KiB messages cross it, after the timed
rounds. Start time (process start to the first answered CONNECT) is the
median of --starts starts of each proxy. Every Sluice row is also given as a
ratio to the Apache Pulsar Proxy row ("vs peer": msg/s, publish and
end-to-end p99, proxy CPU per message): the ratio of the two medians, then
in brackets the min-max of the rounds' own ratios (each round's value over
the peer's in the same round), e.g. ``1.18 (0.95-1.31)``. The broker, the proxy and the clients
share the machine's cores.

The floor beside each Sluice row is what the compiled frame path alone
costs per message over frames like the row's, in this process, no sockets
(``floor()``): the scanner (boundaries, sizes, CRC32-C, the hot commands'
fields and metadata) and the read's accounting, in 256 KiB reads. The
rest of the row's CPU is the sockets, the waits and the Python around them.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench
from bench.fleet import cpu_seconds as tree_cpu_seconds
from bench.fleet import process_tree, reaped_cpu_seconds, rss_bytes
from sluice.brokers.apache_pulsar import (
    ApachePulsar,
    ApachePulsarProxy,
    Runtime,
    answered_connect,
    jvm_flags,
)
from sluice.brokers.embedded import BrokerError
from sluice.filters import PASS, Filter, Message, NoSettings, Verdict
from sluice.recording.writer import pieces

if TYPE_CHECKING:
    # Imported where used: the proxy imports this module for Noop, and
    # tests.helpers.support brings the Pulsar client library along.
    from tests.helpers.support import ProxyProcess

PATHS = ["direct", "apache-proxy", "sluice", "sluice-record", "sluice-workers"]
FILTER_PATHS = ["sluice-filter-noop", "sluice-schema", "sluice-encrypt"]  # asked for by name
LIVE_PATH = "sluice-live"  # asked for by name
BESIDE = [*FILTER_PATHS, LIVE_PATH]  # set beside `sluice` in a table of their own
KNOWN = PATHS + BESIDE
# The topics the filter paths' filters apply to: every topic of the bench.
FILTER_TOPICS = ["public/default/peers-*"]
# The JSON schema of the filter runs' topics: an Avro record definition, as
# Pulsar's JSON schemas are; every payload is one such record.
RECORD = {
    "type": "record",
    "name": "PeersRecord",
    "namespace": "sluice.bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "blob", "type": "string"},
    ],
}
JSON_LINES = 100  # distinct payloads of each size (pulsar-perf picks one at random)
RATES = [100, 1000, 10_000]  # msg/s of the fixed-rate workloads
SAMPLE = 0.2  # seconds between samples of the broker's counters and the proxy's CPU
PROBE = 2000  # 1 KiB messages sent through the Apache Pulsar Proxy under strace
WATCH_TIMEOUT = 15.0  # seconds a live watcher's request may take


def log(text: str) -> None:
    print(f"[peers] {text}", file=sys.stderr, flush=True)


# --- the filters ----------------------------------------------------------------


class Noop(Filter[NoSettings]):
    """Passes every produced message: what unpacking each message and
    calling a filter costs, the filter doing nothing."""

    def on_produce(self, message: Message) -> Verdict:
        return PASS


def filter_flag(name: str, settings: dict[str, Any] | None = None) -> str:
    """``--filter`` for ``name``, on the bench's topics, produce direction."""
    table: dict[str, Any] = {"topics": FILTER_TOPICS, "direction": "produce"}
    if settings:
        table["settings"] = settings
    return f"{name}:" + json.dumps(table)


def bench_key_pair(tmp: Path) -> tuple[Path, Path]:
    """An RSA key pair for the encrypt path: (public, private), PEM."""
    public, private = tmp / "peers.pub.pem", tmp / "peers.pem"
    if not public.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        traditional = serialization.PrivateFormat.TraditionalOpenSSL  # as the Java client reads
        private.write_bytes(key.private_bytes(serialization.Encoding.PEM, traditional,
                                              serialization.NoEncryption()))  # fmt: skip
        spki = serialization.PublicFormat.SubjectPublicKeyInfo
        public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, spki))
    return public, private


def json_lines(size: int) -> list[bytes]:
    """JSON_LINES records of RECORD, each exactly ``size`` bytes."""
    lines = []
    for i in range(JSON_LINES):
        head = json.dumps({"id": i, "name": "peers", "blob": ""})[:-2]  # up to the blob's text
        pad = size - len(head) - 2
        if pad < 0:
            raise SystemExit(f"a JSON record does not fit in {size} bytes")
        line = (head + "x" * pad + '"}').encode()
        assert len(line) == size and json.loads(line)["id"] == i
        lines.append(line)
    return lines


@dataclass
class Payloads:
    """JSON records of RECORD as the produce workloads' payloads, in files
    for pulsar-perf (--payload-file, one a line) and lists for the Python client."""

    folder: Path
    files: dict[int, Path] = field(default_factory=dict)

    def lines(self, size: int) -> list[bytes]:
        return json_lines(size)

    def file(self, size: int) -> Path:
        if size not in self.files:
            path = self.folder / f"payloads-{size}.jsonl"
            path.write_bytes(b"\n".join(self.lines(size)) + b"\n")
            self.files[size] = path
        return self.files[size]


def give_schema(broker: ApachePulsar, name: str) -> None:
    """Topic ``name`` (not yet used) given RECORD as its JSON schema."""
    local = name.removeprefix("persistent://")
    body = {"type": "JSON", "schema": json.dumps(RECORD), "properties": {}}
    status, text = broker.admin("POST", f"/admin/v2/schemas/{local}/schema", body)
    if status != 200:
        raise SystemExit(f"POST the schema of {name}: HTTP {status} {text[:300]}")


# What a filter path's filter did: refused, raised on (either ends the run),
# ran its hook on, changed (the encrypt path's sealing counts there).
REFUSED = ("sluice_filter_rejected_total", "sluice_filter_errors_total")
SEEN = ("sluice_filter_messages_total", "sluice_filter_replaced_total")
# Which of SEEN says that a filter path's filter saw its messages.
SEEN_BY = {
    "sluice-filter-noop": "sluice_filter_messages_total",
    "sluice-schema": "sluice_filter_messages_total",
    "sluice-encrypt": "sluice_filter_replaced_total",
}


def filter_counts(admin: int) -> dict[str, float]:
    """REFUSED and SEEN, each summed over its labels, from the /metrics of
    the proxy whose admin endpoint is on loopback port ``admin``."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    counts = dict.fromkeys(REFUSED + SEEN, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in counts:
            counts[name] += float(line.rsplit(" ", 1)[1])
    return counts


# --- the paths -------------------------------------------------------------------


@dataclass
class Path_:
    """One way from the clients to the broker."""

    name: str
    url: str
    pid: int | None  # the proxy's process, None when direct
    start_seconds: float | None
    stop: Callable[[], None]
    admin: int | None = None  # Sluice's admin port (/metrics)
    # The private key its consumers decrypt with (the encrypt path's topics
    # hold ciphertext): pulsar-perf consume -v, the Python client's reader.
    private_key: Path | None = None
    watcher: Watcher | None = None  # sluice-live's: someone watching it

    @property
    def perf_consume(self) -> tuple[str, ...]:
        return ("-v", str(self.private_key)) if self.private_key else ()


ADMIN = re.compile(r"listening \(admin\) on [\d.]+:(\d+)")  # the proxy's log, at start


def start_sluice(broker: ApachePulsar, tmp: Path, name: str, *extra: str) -> Path_:
    from tests.helpers.support import start_proxy

    started = time.monotonic()
    proxy: ProxyProcess = start_proxy(broker.url, tmp, "--admin", "127.0.0.1:0", *extra,
                                      wait=False)  # fmt: skip
    try:
        answered_connect(("127.0.0.1", proxy.port), started + 60)
    except BrokerError as exc:
        proxy.kill()
        raise SystemExit(f"{name} did not start: {exc}\n{proxy.log()[-3000:]}") from None
    seconds = time.monotonic() - started
    admin = ADMIN.search(proxy.log())
    return Path_(name, proxy.url, proxy.pid, seconds, proxy.kill,
                 int(admin.group(1)) if admin else None)  # fmt: skip


def start_path(name: str, broker: ApachePulsar, tmp: Path) -> Path_:
    if name == "direct":
        return Path_(name, broker.url, None, None, lambda: None)
    if name == "apache-proxy":
        log_path = tmp / f"apache-proxy-{time.monotonic_ns()}.log"
        peer = ApachePulsarProxy(broker, log_path=log_path, say=log).start()
        return Path_(name, peer.url, peer.pid, peer.start_seconds, peer.close)
    if name == "sluice":
        return start_sluice(broker, tmp, name)
    if name == "sluice-record":
        record = tmp / f"rec-{time.monotonic_ns()}"
        return start_sluice(broker, tmp, name, "--record", str(record),
                            "--record-payloads", "hash")  # fmt: skip
    if name == "sluice-workers":
        return start_sluice(broker, tmp, name, "--workers", "2")
    if name == "sluice-filter-noop":
        # Imported by the proxy as bench.peers: the checkout is on its
        # sys.path wherever its sluice package is (python -m sluice from
        # the checkout, or the editable install's .pth).
        return start_sluice(broker, tmp, name, "--filter", filter_flag("bench.peers:Noop"))
    if name == "sluice-schema":
        return start_sluice(broker, tmp, name, "--filter", filter_flag("schema"))
    if name == "sluice-encrypt":
        public, private = bench_key_pair(tmp)
        flag = filter_flag("encrypt", {"public_keys": {"peers": str(public)}})
        started = start_sluice(broker, tmp, name, "--filter", flag)
        started.private_key = private
        return started
    if name == LIVE_PATH:
        token = tmp / "live-token"
        token.write_text(secrets.token_hex(16))
        path = start_sluice(broker, tmp, name, "--admin-token-file", str(token))
        if path.admin is None:
            raise SystemExit(f"{name}: its admin port is not in its log")
        watcher = Watcher(path.admin, token.read_text())
        try:
            watcher.answered(WATCH_TIMEOUT)
        except SystemExit:
            watcher.stop()
            path.stop()
            raise
        path.watcher = watcher
        stop = path.stop

        def stopped() -> None:
            watcher.stop()
            stop()

        path.stop = stopped
        return path
    raise SystemExit(f"unknown path {name!r}; known: {', '.join(KNOWN)}")


class Watcher:
    """Someone watching a proxy live: a thread asking its ``POST /live`` for
    the records after the last it has, as ``sluice view --live`` does, from
    start to ``stop``; it keeps the answers' bytes and nothing else. A
    request that fails is tried again; ``answered`` and ``still_answered``
    say whether it is watching at all (a refused token or a closed port
    would otherwise leave `sluice-live` an unwatched `sluice`)."""

    def __init__(self, admin: int, token: str) -> None:
        self.url = f"http://127.0.0.1:{admin}/live"
        self.token = token
        self.bytes = 0
        self.answers = 0
        self.failures = 0
        self.last_answer: float | None = None  # time.monotonic()
        self.error = ""  # the last request's failure
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-watcher", daemon=True)
        self._thread.start()

    def answered(self, timeout: float) -> None:
        """Until the first answer; SystemExit with the failure after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while self.answers == 0:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise SystemExit(f"sluice-live: {self.url} gave no answer in {timeout:g} s "
                                 f"({self.failures} tries; last: {self.error or '-'})")  # fmt: skip
            time.sleep(0.05)

    def still_answered(self, within: float) -> None:
        """SystemExit unless an answer came in the last ``within`` seconds."""
        last = self.last_answer
        if last is None or time.monotonic() - last > within:
            ago = "never" if last is None else f"{time.monotonic() - last:.0f} s ago"
            tries = f"{self.failures} failed tries; last: {self.error or '-'}"
            raise SystemExit(f"sluice-live: {self.url} last answered {ago} ({tries})")

    def _run(self) -> None:
        after = ""
        while not self._stop.is_set():
            request = urllib.request.Request(
                self.url, data=json.dumps({"after": after}).encode(), method="POST",
                headers={"Authorization": f"Bearer {self.token}"},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=WATCH_TIMEOUT) as answer:
                    data = json.loads(answer.read())
                records, after = data["records"], data["next"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.failures += 1
                self.error = f"{type(exc).__name__}: {exc}"
                self._stop.wait(0.5)
                continue
            self.bytes += len(records)
            self.answers += 1
            self.last_answer = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(20)


# --- measuring -------------------------------------------------------------------------


Percentiles = tuple[float, float, float]  # p50, p99, p99.9 in ms


def process_cpu(pid: int) -> float:
    """CPU seconds of process ``pid``, every thread, live or ended: the
    kernel's per-process CPU clock (nanoseconds; /proc's ticks are 10 ms,
    too coarse for the CPU of a few hundred messages)."""
    try:
        return time.clock_gettime((~pid << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    except OSError:
        return tree_cpu_seconds([pid])


@dataclass
class Sample:
    at: float  # time.monotonic()
    count: int  # the broker's counter for the topic
    cpu: float  # the proxy's CPU seconds so far


@dataclass
class Span:
    """What a send window held."""

    seconds: float
    messages: int
    cpu: float  # the proxy's CPU seconds in it


class Meter:
    """The proxy tree's CPU at chosen moments (``mark``) or, given a counter,
    sampled with it every SAMPLE seconds; its peak RSS throughout."""

    def __init__(self, pid: int | None, counter: Callable[[], int] | None = None) -> None:
        self.pid = pid
        self.counter = counter
        self.samples: list[Sample] = []
        self.marks: list[Sample] = []
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _pids(self) -> list[int]:
        return [] if self.pid is None else process_tree(self.pid)

    def cpu(self) -> float:
        """The tree's CPU seconds: each live process's clock, plus what the
        processes reaped (a `--workers` worker that died and was restarted;
        10 ms ticks, as the kernel keeps them)."""
        pids = self._pids()
        return sum(process_cpu(pid) for pid in pids) + reaped_cpu_seconds(pids)

    def sample(self) -> Sample:
        """The counter and the CPU, both at the middle of the counter's read."""
        before, cpu_before = time.monotonic(), self.cpu()
        count = self.counter() if self.counter else 0
        after, cpu_after = time.monotonic(), self.cpu()
        return Sample((before + after) / 2, count, (cpu_before + cpu_after) / 2)

    def mark(self) -> None:
        self.marks.append(Sample(time.monotonic(), 0, self.cpu()))

    def _run(self) -> None:
        while True:
            if self.counter is not None:
                self.samples.append(self.sample())
            self.peak = max(self.peak, rss_bytes(self._pids()))
            if self._stop.wait(SAMPLE):
                return

    def __enter__(self) -> Meter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.counter is not None:
            self.samples.append(self.sample())
        self.peak = max(self.peak, rss_bytes(self._pids()))

    def marked(self, messages: int) -> Span:
        """The span between the first and the last ``mark``."""
        first, last = self.marks[0], self.marks[-1]
        return Span(last.at - first.at, messages, last.cpu - first.cpu)

    def window(self) -> Span:
        """The send window the counter saw: from the first sample with messages
        counted to the last one before the count stopped, start-up and tail
        left out; for a run too short for that (fewer than three samples
        while the count moved), from the last sample before the first message
        to the first sample after the last."""
        if len(self.samples) < 2 or self.samples[-1].count == self.samples[0].count:
            raise SystemExit(f"the broker counted no messages: {self.samples!r}")
        low, high = self.samples[0].count, self.samples[-1].count
        moving = [s for s in self.samples if low < s.count < high]
        if len(moving) >= 3:
            first, last = moving[0], moving[-1]
        else:
            first = [s for s in self.samples if s.count == low][-1]
            last = next(s for s in self.samples if s.count == high)
        return Span(last.at - first.at, last.count - first.count, last.cpu - first.cpu)


def topic_stats(broker: ApachePulsar, name: str) -> dict[str, Any] | None:
    """The admin API's stats of topic ``name``; None until it exists."""
    path = "/admin/v2/" + name.replace("://", "/", 1) + "/stats"
    status, text = broker.admin("GET", path, timeout=10)
    if status == 404:
        return None
    if status != 200:
        raise SystemExit(f"GET {path}: HTTP {status} {text[:300]}")
    stats: dict[str, Any] = json.loads(text)
    return stats


def topic_counter(broker: ApachePulsar, name: str, key: str) -> Callable[[], int]:
    """The broker's running count of messages into (msgInCounter) or out of
    (msgOutCounter) topic ``name``, kept as each message is published or
    dispatched; 0 until the topic exists."""

    def count() -> int:
        stats = topic_stats(broker, name)
        return 0 if stats is None else int(stats[key])

    return count


def wait_subscribed(
    broker: ApachePulsar, name: str, sub: str, reader: subprocess.Popen[str]
) -> None:
    """Until subscription ``sub`` of ``name`` has a consumer (a JVM takes
    seconds to start on a busy machine; a reader that subscribed late would
    miss the first messages and wait for them forever)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if reader.poll() is not None:
            raise SystemExit(f"pulsar-perf consume exited:\n{reader.communicate()[0][-3000:]}")
        stats = topic_stats(broker, name)
        if stats and stats.get("subscriptions", {}).get(sub, {}).get("consumers"):
            return
        time.sleep(0.2)
    raise SystemExit(f"pulsar-perf consume did not subscribe to {name} in 120 s")


@dataclass
class Figures:
    rate: float = 0.0  # msg/s over the send window
    publish: Percentiles | None = None  # p50, p99, p99.9 in ms
    e2e: Percentiles | None = None
    cpu_us: float | None = None  # proxy CPU per message over the send window
    peak_rss: int = 0
    window: float = 0.0  # seconds
    idle_cpu: float | None = None  # CPU seconds per second, the idle row only
    messages: int = 0  # the broker's count over the send window


def figures(span: Span, pid: int | None, meter: Meter) -> Figures:
    return Figures(
        rate=span.messages / span.seconds,
        cpu_us=None if pid is None else span.cpu / span.messages * 1e6,
        peak_rss=meter.peak,
        window=span.seconds,
        messages=span.messages,
    )


COUNT = re.compile(r"Aggregated throughput stats --- (\d+) records (?:sent|received)")
LATENCY = re.compile(r"Aggregated latency stats --- Latency: mean: +[\d.]+ ms - med: +([\d.]+) "
                     r"- 95pct: +[\d.]+ - 99pct: +([\d.]+) - 99.9pct: +([\d.]+)")  # fmt: skip


def perf(runtime: Runtime, *args: str, timeout: float = 300) -> tuple[int, Percentiles]:
    """Run pulsar-perf; (messages, (p50, p99, p99.9) ms) from its summary. Its
    own msg/s is not used: 4.0.8 reports every 10 s whatever -i says, and its
    overall figure divides by the time until it exits."""
    try:
        done = subprocess.run(runtime.perf(*args), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-2000:]
        raise SystemExit(
            f"pulsar-perf {' '.join(args[:1])} ran past {timeout:.0f} s: {tail!r}"
        ) from None
    out = done.stdout + done.stderr
    count, latency = COUNT.search(out), LATENCY.search(out)
    if done.returncode != 0 or count is None or latency is None:
        raise SystemExit(f"pulsar-perf {' '.join(args[:2])} failed:\n{out[-3000:]}")
    p50, p99, p999 = (float(g) for g in latency.groups())
    return int(count.group(1)), (p50, p99, p999)


Topics = dict[str, tuple[str, int]]  # a workload's name for a topic: (topic, messages)


def topic() -> str:
    return f"persistent://public/default/peers-{uuid.uuid4().hex[:10]}"


@dataclass
class Run:
    """What a workload runs against."""

    runtime: Runtime
    broker: ApachePulsar
    path: Path_
    topics: Topics
    payloads: Payloads | None = None  # JSON records, or pulsar-perf's and the x's


def produce_topic(r: Run) -> str:
    """A fresh topic to produce to; given RECORD as its schema when the run
    sends JSON records."""
    name = topic()
    if r.payloads is not None:
        give_schema(r.broker, name)
    return name


def perf_payload(r: Run, size: int) -> list[str]:
    """pulsar-perf produce's payload flags: ``size`` bytes of its own, or
    the run's JSON records of that size."""
    if r.payloads is None:
        return ["-s", str(size)]
    return ["--payload-file", str(r.payloads.file(size))]


def bodies(r: Run, size: int) -> list[bytes] | None:
    """The Python client's payloads: the run's JSON records, or None (x's)."""
    return None if r.payloads is None else r.payloads.lines(size)


@dataclass
class Workload:
    name: str
    run: Callable[[Run], Figures]
    produces: bool = True  # its messages go through a produce filter
    reads: str | None = None  # the row whose messages it consumes (run before it)


def wl_perf_max(
    size: int, seconds: int, batched: bool, keep: str | None = None
) -> Callable[[Run], Figures]:
    def run(r: Run) -> Figures:
        name = produce_topic(r)
        # -r 0 sends nothing: a rate no path reaches is "no limit"; at most
        # 1000 messages wait for their receipts (pulsar-perf's own default
        # lets hundreds of thousands pile up, and latency is then queueing).
        args = ["produce", "-u", r.path.url, *perf_payload(r, size), "-r", "10000000",
                "-o", "1000", "-time", str(seconds)]  # fmt: skip
        if not batched:
            args.append("-db")
        with Meter(r.path.pid, topic_counter(r.broker, name, "msgInCounter")) as meter:
            sent, latency = perf(r.runtime, *args, name)
        if keep:
            r.topics[keep] = (name, sent)
        result = figures(meter.window(), r.path.pid, meter)
        result.publish = latency
        return result

    return run


def wl_perf_rate(size: int, rate: int, seconds: int) -> Callable[[Run], Figures]:
    def run(r: Run) -> Figures:
        name = produce_topic(r)
        count = rate * seconds
        command = r.runtime.perf("consume", "-u", r.path.url, "-ss", "e2e", "-m", str(count),
                                 *r.path.perf_consume, name)  # fmt: skip
        reader = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            wait_subscribed(r.broker, name, "e2e", reader)
            with Meter(r.path.pid, topic_counter(r.broker, name, "msgInCounter")) as meter:
                _, latency = perf(
                    r.runtime, "produce", "-u", r.path.url, *perf_payload(r, size),
                    "-r", str(rate), "-m", str(count), "-db", name,
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
        result = figures(meter.window(), r.path.pid, meter)
        result.publish, result.e2e = latency, (p50, p99, p999)
        return result

    return run


def wl_perf_consume(source: str) -> Callable[[Run], Figures]:
    def run(r: Run) -> Figures:
        name, count = r.topics[source]
        with Meter(r.path.pid, topic_counter(r.broker, name, "msgOutCounter")) as meter:
            perf(r.runtime, "consume", "-u", r.path.url, "-ss", "all", "-sp", "Earliest",
                 "-m", str(count), *r.path.perf_consume, name)  # fmt: skip
        return figures(meter.window(), r.path.pid, meter)

    return run


def py_produce(
    url: str,
    name: str,
    count: int,
    size: int,
    batched: bool,
    meter: Meter,
    payloads: list[bytes] | None = None,
) -> None:
    """bench/e2e.py's produce, marked from the first send to the last receipt;
    ``payloads``: sent in turn instead of ``size`` x's."""
    import pulsar

    from tests.helpers.support import client

    sent = itertools.islice(itertools.cycle(payloads or [b"x" * size]), count)
    with client(url) as c:
        producer = c.create_producer(
            name,
            batching_enabled=batched,
            batching_max_messages=1000,
            batching_max_publish_delay_ms=5,
            max_pending_messages=2000,
            block_if_queue_full=True,
        )
        done = threading.Semaphore(0)
        failed: list[Any] = []

        def on_receipt(result: Any, _msg_id: Any) -> None:
            if result != pulsar.Result.Ok:
                failed.append(result)
            done.release()

        meter.mark()
        for body in sent:
            producer.send_async(body, on_receipt)
        producer.flush()
        for _ in range(count):
            if not done.acquire(timeout=120):
                raise SystemExit("timed out waiting for send receipts")
        meter.mark()
        if failed:
            raise SystemExit(f"{len(failed)} sends failed: {failed[0]}")


def py_consume(
    url: str, name: str, count: int, meter: Meter, private_key: Path | None = None
) -> None:
    """bench/e2e.py's consume, marked from the subscription to the last message."""
    import pulsar

    from tests.helpers.support import client

    crypto = {}
    if private_key is not None:
        crypto["crypto_key_reader"] = pulsar.CryptoKeyReader("", str(private_key))
    with client(url) as c:
        consumer = c.subscribe(
            name,
            f"bench-{uuid.uuid4().hex[:6]}",
            initial_position=pulsar.InitialPosition.Earliest,
            receiver_queue_size=2000,
            **crypto,
        )
        meter.mark()
        for _ in range(count):
            consumer.acknowledge(consumer.receive(timeout_millis=60_000))
        meter.mark()


def wl_py_produce(
    size: int, count: int, batched: bool, keep: str | None = None
) -> Callable[[Run], Figures]:
    def run(r: Run) -> Figures:
        name = produce_topic(r)
        if keep:
            r.topics[keep] = (name, count)
        with Meter(r.path.pid) as meter:
            py_produce(r.path.url, name, count, size, batched, meter, bodies(r, size))
        return figures(meter.marked(count), r.path.pid, meter)

    return run


def wl_py_consume(source: str, count: int) -> Callable[[Run], Figures]:
    def run(r: Run) -> Figures:
        name, _ = r.topics[source]
        with Meter(r.path.pid) as meter:
            py_consume(r.path.url, name, count, meter, r.path.private_key)
        return figures(meter.marked(count), r.path.pid, meter)

    return run


def wl_idle(seconds: float) -> Callable[[Run], Figures]:
    def run(r: Run) -> Figures:
        with Meter(r.path.pid) as meter:
            meter.mark()
            time.sleep(seconds)
            meter.mark()
        span = meter.marked(0)
        idle = None if r.path.pid is None else span.cpu / span.seconds
        return Figures(peak_rss=meter.peak, window=span.seconds, idle_cpu=idle)

    return run


IDLE = "idle"


def workloads(scale: float, only: Sequence[str] = ()) -> list[Workload]:
    """The rows, in the order they run; ``only``: these (by name) and the
    rows they read, with the idle row always (its rate is every row's)."""

    def n(count: int) -> int:
        return max(100, int(count * scale))

    seconds = max(4, int(5 * scale))
    # At 100 msg/s, twice as long: a thousand messages at scale 1.
    at_rate = [
        Workload(
            f"perf 1K @{rate:,}/s", wl_perf_rate(1024, rate, seconds * (2 if rate < 1000 else 1))
        )
        for rate in RATES
    ]
    rows = [
        # Consumed right after it is written: the broker deletes a topic
        # with no producer and no subscription after 60 s (its default).
        Workload("perf 1K max", wl_perf_max(1024, seconds, False, keep="perf-1k")),
        Workload("perf consume", wl_perf_consume("perf-1k"), produces=False, reads="perf 1K max"),
        Workload("perf 100B batch", wl_perf_max(100, seconds, True)),
        *at_rate,
        Workload("py 1K", wl_py_produce(1024, n(10_000), False, keep="py-1k")),
        Workload("py 100B batch", wl_py_produce(100, n(50_000), True)),
        Workload("py consume", wl_py_consume("py-1k", n(10_000)), produces=False, reads="py 1K"),
        Workload(IDLE, wl_idle(seconds), produces=False),
    ]
    if not only:
        return rows
    unknown = set(only) - {w.name for w in rows}
    if unknown:
        names = ", ".join(repr(w.name) for w in rows)
        raise ValueError(f"no workload {sorted(unknown)[0]!r}: the workloads are {names}")
    wanted = set(only) | {IDLE}
    wanted |= {w.reads for w in rows if w.name in wanted and w.reads is not None}
    return [w for w in rows if w.name in wanted]


# --- the floor: the compiled path alone -------------------------------------------

FLOOR_READ = 256 * 1024  # the relay's read size
FLOOR_BATCH = 100  # messages per batch in the batched floor


def _floor_frames(kind: str, count: int) -> tuple[list[bytes], list[bytes]]:
    """Frames like a workload's (client's, broker's), ``count`` messages."""
    import random

    from sluice.protocols.pulsar import Type, command, encode, encode_payload, pb

    t = Type.Value
    rng = random.Random(7)
    client: list[bytes] = []
    broker: list[bytes] = []
    if kind == "batch":
        for seq in range(count // FLOOR_BATCH):
            entries = b""
            for i in range(FLOOR_BATCH):
                meta_i = pb.SingleMessageMetadata(payload_size=100, sequence_id=i)
                single = meta_i.SerializeToString()
                entries += len(single).to_bytes(4, "big") + single + rng.randbytes(100)
            meta = pb.MessageMetadata(producer_name="standalone-0-1", sequence_id=seq,
                                      publish_time=seq, num_messages_in_batch=FLOOR_BATCH,
                                      uncompressed_size=len(entries))  # fmt: skip
            body = pb.CommandSend(producer_id=0, sequence_id=seq, num_messages=FLOOR_BATCH)
            client.append(encode_payload(command(t("SEND"), body), meta, entries))
            mid = pb.MessageIdData(ledgerId=1, entryId=seq)
            receipt = pb.CommandSendReceipt(producer_id=0, sequence_id=seq, message_id=mid)
            broker.append(encode(command(t("SEND_RECEIPT"), receipt)))
        return client, broker
    for seq in range(count):
        meta = pb.MessageMetadata(producer_name="standalone-0-1", sequence_id=seq,
                                  publish_time=seq, uncompressed_size=1024)  # fmt: skip
        mid = pb.MessageIdData(ledgerId=1, entryId=seq)
        if kind == "produce":
            body = pb.CommandSend(producer_id=0, sequence_id=seq, num_messages=1)
            client.append(encode_payload(command(t("SEND"), body), meta, rng.randbytes(1024)))
            receipt = pb.CommandSendReceipt(producer_id=0, sequence_id=seq, message_id=mid)
            broker.append(encode(command(t("SEND_RECEIPT"), receipt)))
        else:  # consume
            message = pb.CommandMessage(consumer_id=0, message_id=mid)
            broker.append(encode_payload(command(t("MESSAGE"), message), meta,
                                         rng.randbytes(1024)))  # fmt: skip
            ack = pb.CommandAck(consumer_id=0, ack_type=pb.CommandAck.Individual,
                                message_id=[mid])  # fmt: skip
            client.append(encode(command(t("ACK"), ack)))
    return client, broker


def floor() -> dict[str, float] | None:
    """CPU µs per message of the compiled path alone over frames like each
    workload's, no sockets: the scanner (boundaries, sizes, CRC32-C, the
    hot commands' fields and metadata) and the read's accounting (the send
    table, tallies by topic), in 256 KiB reads; best of 5. Keys: produce
    (1 KiB SEND and its receipt), consume (1 KiB MESSAGE and its ACK),
    batch (100 B messages, FLOOR_BATCH to a SEND). None where not built."""
    try:
        from sluice._frames import SendTable, scan_batch
    except ImportError:
        return None
    from sluice.protocols.pulsar.decoder import max_frame_size

    max_total = max_frame_size(5 * 1024 * 1024) - 4
    count = 20_000
    out = {}
    for kind in ("produce", "consume", "batch"):
        # the frames in reads of up to FLOOR_READ bytes, cut between frames
        client, broker = (pieces(side, FLOOR_READ) for side in _floor_frames(kind, count))
        best = float("inf")
        for _ in range(5):
            table = SendTable()
            topics = {0: "persistent://public/default/floor"}
            started = time.process_time()
            for data in client:
                batch = scan_batch(data, 0, max_total)
                assert batch is not None and batch.stop == len(data)
                table.account_client(batch, batch.start, 1.0, topics)
            for data in broker:
                batch = scan_batch(data, 0, max_total)
                assert batch is not None and batch.stop == len(data)
                table.account_broker(batch, batch.start, 2.0, topics)
            best = min(best, time.process_time() - started)
        out[kind] = best / count * 1e6
    return out


def floor_of(load: str, floors: dict[str, float] | None) -> float | None:
    """The floor that belongs to a workload's row."""
    if floors is None or load == IDLE:
        return None
    if "batch" in load:
        return floors["batch"]
    return floors["consume" if "consume" in load else "produce"]


# --- the peer's transport ----------------------------------------------------------


STRACE_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")
RELAY_CALLS = "splice,read,readv,write,writev,sendto,recvfrom,sendmsg,recvmsg"


def native_epoll(pid: int) -> bool:
    """Whether Netty's native epoll transport is loaded in process ``pid``."""
    try:
        return "libnetty_transport_native_epoll" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def syscalls_while(pid: int, traffic: Callable[[], None], out: Path) -> dict[str, int] | None:
    """Relaying syscalls process ``pid`` made, every thread, while ``traffic``
    ran: strace -f -c attached for that time. None without strace."""
    strace = shutil.which("strace")
    if strace is None:
        return None
    tracer = subprocess.Popen(
        [strace, "-f", "-c", "-e", f"trace={RELAY_CALLS}", "-o", str(out), "-p", str(pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(2)  # attached to every thread
        if tracer.poll() is not None:
            log(f"strace could not attach: {tracer.stderr.read() if tracer.stderr else ''}")
            return None
        traffic()
    finally:
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)
        try:
            tracer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            tracer.kill()
            tracer.wait()
    with contextlib.suppress(OSError):
        return strace_counts(out.read_text())
    return {}


def strace_counts(summary: str) -> dict[str, int]:
    """Each call's count from ``strace -c``'s summary table."""
    calls: dict[str, int] = {}
    for line in summary.splitlines():
        row = STRACE_ROW.match(line)
        if row and row.group(2) != "total":
            calls[row.group(2)] = int(row.group(1))
    return calls


def peer_transport(path: Path_, broker: ApachePulsar, tmp: Path) -> str:
    """The Apache Pulsar Proxy's transport and whether it relays with splice."""
    assert path.pid is not None
    transport = (
        "Netty native epoll (libnetty_transport_native_epoll mapped)"
        if native_epoll(path.pid)
        else "Java NIO (Netty's native epoll not loaded)"
    )

    def traffic() -> None:
        with Meter(None) as meter:
            py_produce(path.url, topic(), PROBE, 1024, False, meter)

    traffic()  # classes loaded and code compiled: no jar reads in the count
    calls = syscalls_while(path.pid, traffic, tmp / "apache-proxy.strace")
    if calls is None:
        return f"{transport}; splice not checked (no strace)"
    spliced = calls.get("splice", 0)
    others = ", ".join(f"{k} {v:,}" for k, v in sorted(calls.items()) if k != "splice")
    copied = sum(v for k, v in calls.items() if k != "splice")
    if spliced and spliced >= copied:
        verdict = "relays with splice (most relaying syscalls are splice)"
    elif spliced:
        verdict = "splices, but most relaying syscalls copy (read/write family)"
    else:
        verdict = "does not relay with splice"
    return (
        f"{transport}; {verdict}: {spliced:,} splice calls while {PROBE:,} 1 KiB messages "
        f"crossed it (strace -f -c; also {others or 'no other relaying calls'})"
    )


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

        def med(values: list[float | None]) -> float | None:
            present = [v for v in values if v is not None]
            return statistics.median(present) if present else None

        return Figures(
            rate=statistics.median(r.rate for r in self.runs),
            publish=med3([r.publish for r in self.runs]),
            e2e=med3([r.e2e for r in self.runs]),
            cpu_us=med([r.cpu_us for r in self.runs]),
            peak_rss=max(r.peak_rss for r in self.runs),
            window=statistics.median(r.window for r in self.runs),
            idle_cpu=med([r.idle_cpu for r in self.runs]),
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


@dataclass
class Results:
    cells: dict[tuple[str, str], Cell]
    starts: dict[str, list[float]]  # proxy: seconds from start to first answered CONNECT
    transport: str | None
    version: str
    # Each Sluice path's filter counters after the rounds (filter_counts).
    filtered: dict[str, dict[str, float]] = field(default_factory=dict)
    warm_passes: int = 0  # warm-up passes before the rounds (warm_up)


def start_times(
    names: list[str], broker: ApachePulsar, tmp: Path, more: int
) -> dict[str, list[float]]:
    """``more`` further starts of each proxy, one at a time, each stopped after."""
    times: dict[str, list[float]] = {}
    for name in names:
        if name == "direct":
            continue
        for _ in range(more):
            path = start_path(name, broker, tmp)
            try:
                assert path.start_seconds is not None
                times.setdefault(name, []).append(path.start_seconds)
            finally:
                path.stop()
    return times


WARM_LOADS = ("perf 1K max", "perf consume")  # the JITs' and the caches' hot paths
SETTLED = 0.10  # a warm-up pass changed the peer's CPU per message by less than this
WARM_PASSES = (2, 8)  # at least, at most


def watched_path(names: list[str]) -> str | None:
    """The path whose CPU per message decides when the warm-up is done: the
    Apache Pulsar Proxy, or without it the first path with a proxy process
    (``direct`` has none); None when there is none."""
    if "apache-proxy" in names:
        return "apache-proxy"
    return next((name for name in names if name != "direct"), None)


def warm_up(args: argparse.Namespace, names: list[str], loads: list[Workload], run_of: Any) -> int:
    """Traffic through every path, in passes, before anything is measured.

    The rule: each pass runs WARM_LOADS (pulsar-perf 1 KiB at full rate, then
    consuming it) through every path; passes go on until the Apache Pulsar
    Proxy's CPU per message (or, without it, the first proxy path's: direct
    has no proxy CPU to watch) changed by less than SETTLED on each of those
    workloads from one pass to the next, at least WARM_PASSES[0] and at most
    WARM_PASSES[1] passes (with no proxy path at all, WARM_PASSES[0]). The
    JVMs (the peer's, the broker's, pulsar-perf's own start each time) have
    then compiled their hot paths, and every Sluice path has run the same
    traffic. The passes are logged, never counted."""
    if args.warmup_passes == 0:
        log("warm-up: none (--warmup-passes 0)")
        return 0
    watched = watched_path(names)
    warm = [load for load in loads if load.name in WARM_LOADS]
    least, most = WARM_PASSES if args.warmup_passes is None else (args.warmup_passes,) * 2
    if watched is None:  # nothing whose CPU settles: the least passes
        most = least
    before: dict[str, float] = {}
    for done in range(1, most + 1):
        now: dict[str, float] = {}
        for name in names:
            run = run_of(name)
            for load in warm:
                result = load.run(run)
                cpu = "" if result.cpu_us is None else f", {result.cpu_us:8.1f} µs/msg"
                log(f"  warm-up {done}: {name:15} {load.name:14} {result.rate:9,.0f} msg/s{cpu}")
                if name == watched and result.cpu_us:
                    now[load.name] = result.cpu_us
        changes = [abs(now[k] - before[k]) / before[k] for k in now if before.get(k)]
        settled = len(changes) == len(warm) and max(changes) < SETTLED
        log(f"warm-up pass {done}: {watched} changed by "
            + (", ".join(f"{c:.0%}" for c in changes) or "-"))  # fmt: skip
        if done >= least and (settled or args.warmup_passes is not None):
            return done
        before = now
    if watched is None:
        log(f"warm-up: {most} passes (no proxy path whose CPU could settle)")
    else:
        log(f"warm-up: {watched} had not settled after {most} passes; measuring anyway")
    return most


def measure(args: argparse.Namespace) -> Results:
    names = args.paths
    loads = workloads(args.scale, args.workloads)
    cells: dict[tuple[str, str], Cell] = {}
    starts: dict[str, list[float]] = {}
    transport = None
    filtered: dict[str, dict[str, float]] = {}
    produced: dict[str, int] = {}  # per path: the produce rows' windows' messages
    warm_passes = 0
    with tempfile.TemporaryDirectory(prefix="sluice-peers-") as tmp_name:
        tmp = Path(tmp_name)
        # Any filter path: JSON records on every path (the module's docstring).
        payloads = Payloads(tmp) if set(names) & set(FILTER_PATHS) else None
        with ApachePulsar(log_path=tmp / "broker.log", say=log) as broker:
            assert broker.runtime is not None
            runtime = broker.runtime
            with running_paths(names, broker, tmp) as paths:
                for name, path in paths.items():
                    if path.start_seconds is not None:
                        starts[name] = [path.start_seconds]
                # (Warmed by its own rows, whichever rows are measured.)
                warm_passes = warm_up(args, names, workloads(args.scale), lambda name: Run(
                    runtime, broker, paths[name], {}, payloads))  # fmt: skip
                for round_ in range(args.rounds):
                    order = names[round_ % len(names) :] + names[: round_ % len(names)]
                    log(f"round {round_ + 1}/{args.rounds}: {', '.join(order)}")
                    for name in order:
                        run = Run(runtime, broker, paths[name], {}, payloads)
                        for load in loads:
                            result = load.run(run)
                            cells.setdefault((name, load.name), Cell()).runs.append(result)
                            if load.produces:
                                produced[name] = produced.get(name, 0) + result.messages
                            cpu = "" if result.cpu_us is None else f", {result.cpu_us:8.1f} µs/msg"
                            if result.idle_cpu is not None:
                                cpu = f", {result.idle_cpu * 1e3:.2f} ms CPU/s idle"
                            log(f"  {name:15} {load.name:18} {result.rate:9,.0f} msg/s "
                                f"over {result.window:5.2f} s{cpu}")  # fmt: skip
                for name, path in paths.items():
                    if path.watcher is not None:  # watched to the end, or the row is not live
                        path.watcher.still_answered(2 * WATCH_TIMEOUT)
                    if path.admin is not None:
                        filtered[name] = filter_counts(path.admin)
                    elif name in FILTER_PATHS:
                        raise SystemExit(f"{name}: its admin port is not in its log")
                refused = {n: c for n, c in filtered.items() if any(c[key] for key in REFUSED)}
                if refused:
                    raise SystemExit(f"filters refused or raised on messages: {refused}")
                if unseen := unfiltered(filtered, produced):
                    raise SystemExit(unseen)
                if "apache-proxy" in paths:
                    transport = peer_transport(paths["apache-proxy"], broker, tmp)
                    log(f"apache-proxy: {transport}")
            if args.starts > 1:
                log(f"{args.starts - 1} more starts of each proxy")
                for name, seconds in start_times(names, broker, tmp, args.starts - 1).items():
                    starts.setdefault(name, []).extend(seconds)
            version = runtime.version
    return Results(cells, starts, transport, version, filtered, warm_passes)


def unfiltered(filtered: dict[str, dict[str, float]], produced: dict[str, int]) -> str | None:
    """What is wrong when a filter path's filter saw fewer messages than
    its produce rows counted in their windows (a lower bound: the windows
    leave start-up, tail and the warm-up out), else None: a filter path
    whose filter matched none of the bench's topics measures plain Sluice."""
    short = [
        f"{name}: its filter saw {counts[SEEN_BY[name]]:,.0f} messages "
        f"({SEEN_BY[name]}), of at least {produced.get(name, 0):,} produced through it"
        for name, counts in filtered.items()
        if name in SEEN_BY and counts[SEEN_BY[name]] < produced.get(name, 0)
    ]
    return "; ".join(short) or None


# --- the report ------------------------------------------------------------------------


def fmt_lat(values: Percentiles | None) -> str:
    return "-" if values is None else " / ".join(f"{v:.1f}" for v in values)


def ratio(mine: float | None, theirs: float | None) -> str:
    if mine is None or theirs is None or theirs == 0:
        return "-"
    return f"{mine / theirs:.2f}"


def ratio_spread(
    mine: float | None,
    theirs: float | None,
    mine_each: list[float | None],
    theirs_each: list[float | None],
) -> str:
    """The ratio of the medians, then the min-max of the rounds' own ratios
    (round i's value over the peer's in round i): ``1.18 (0.95-1.31)``;
    never the lowest over the lowest."""
    text = ratio(mine, theirs)
    each = [m / t for m, t in zip(mine_each, theirs_each, strict=False) if m is not None and t]
    if text == "-" or not each:
        return text
    return f"{text} ({min(each):.2f}-{max(each):.2f})"


def _rate(f: Figures) -> float | None:
    return f.rate


def _cpu(f: Figures) -> float | None:
    return f.cpu_us


def _publish_p99(f: Figures) -> float | None:
    return f.publish[1] if f.publish else None


def _e2e_p99(f: Figures) -> float | None:
    return f.e2e[1] if f.e2e else None


def versus_peer(figure: Callable[[Figures], float | None], cell: Cell, peer: Cell | None) -> str:
    """A "vs peer" column: ``figure`` of ``cell`` over the peer's, the ratio
    of the medians with the min-max of the rounds' own ratios; empty without
    a peer (its own row, direct)."""
    if peer is None:
        return ""
    return ratio_spread(figure(cell.median()), figure(peer.median()),
                        [figure(r) for r in cell.runs], [figure(r) for r in peer.runs])  # fmt: skip


def idle_rates(cells: dict[tuple[str, str], Cell], names: list[str]) -> dict[str, float]:
    """Each proxy's CPU seconds per second with no client (the idle row)."""
    rates = {}
    for name in names:
        cell = cells.get((name, IDLE))
        idle = cell.median().idle_cpu if cell else None
        if idle is not None:
            rates[name] = idle
    return rates


def table(
    cells: dict[tuple[str, str], Cell],
    names: list[str],
    loads: list[str],
    floors: dict[str, float] | None = None,
) -> str:
    head = ("| workload | path | msg/s | vs peer | publish p50 / p99 / p99.9 ms | vs peer p99 "
            "| e2e p50 / p99 / p99.9 ms | vs peer p99 | proxy CPU µs/msg | vs peer "
            "| floor µs/msg | idle µs/msg | peak RSS MiB |")  # fmt: skip
    lines = [head, "|" + "---|" * 13]
    idle = idle_rates(cells, names)
    for load in loads:
        if load == IDLE:
            continue
        peer_cell = cells.get(("apache-proxy", load))
        for name in names:
            cell = cells[(name, load)]
            f = cell.median()
            versus = peer_cell if name.startswith("sluice") else None
            rates = [r.rate for r in cell.runs]
            cpus = [r.cpu_us for r in cell.runs if r.cpu_us is not None]
            row = [
                load, name, f"{f.rate:,.0f} ({min(rates):,.0f}-{max(rates):,.0f})",
                versus_peer(_rate, cell, versus),
                fmt_lat(f.publish),
                versus_peer(_publish_p99, cell, versus),
                fmt_lat(f.e2e),
                versus_peer(_e2e_p99, cell, versus),
                "-" if f.cpu_us is None else f"{f.cpu_us:.1f} ({min(cpus):.1f}-{max(cpus):.1f})",
                versus_peer(_cpu, cell, versus),
                f"{floor_of(load, floors):.2f}"
                if name.startswith("sluice") and floor_of(load, floors) is not None else "",
                f"{idle[name] / f.rate * 1e6:.1f}" if name in idle and f.rate else "-",
                "-" if not f.peak_rss else f"{f.peak_rss / 2**20:.0f}",
            ]  # fmt: skip
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def spread(values: list[float], form: str = ".2f") -> str:
    """Median (min-max), each formatted by ``form`` (two decimals)."""
    if not values:
        return "-"
    return f"{statistics.median(values):{form}} ({min(values):{form}}-{max(values):{form}})"


def filter_table(cells: dict[tuple[str, str], Cell], names: list[str], loads: list[str]) -> str:
    """The filter paths and the live one beside `sluice`: msg/s and proxy CPU
    per message, and each as a ratio to `sluice`'s in the same round
    (median, min-max of the rounds)."""
    shown = ["sluice", *(n for n in names if n in BESIDE)]
    lines = ["| workload | path | msg/s | vs sluice | proxy CPU µs/msg | vs sluice |",
             "|" + "---|" * 6]  # fmt: skip
    for load in loads:
        if load == IDLE:
            continue
        base = cells[("sluice", load)].runs
        for name in shown:
            cell = cells[(name, load)]
            f = cell.median()
            rates = [a.rate / b.rate for a, b in zip(cell.runs, base, strict=False) if b.rate]
            cpus = [a.cpu_us / b.cpu_us for a, b in zip(cell.runs, base, strict=False)
                    if a.cpu_us is not None and b.cpu_us]  # fmt: skip
            row = [load, name, f"{f.rate:,.0f}", spread(rates) if name != "sluice" else "",
                   "-" if f.cpu_us is None else f"{f.cpu_us:.1f}",
                   spread(cpus) if name != "sluice" else ""]  # fmt: skip
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def picture(cells: dict[tuple[str, str], Cell], names: list[str], out: Path) -> None:
    """Publish and end-to-end latency percentiles per path, at each fixed rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = list(dict.fromkeys(load for (_, load) in cells if "@" in load))
    fig, axes = plt.subplots(len(loads), 2, figsize=(11, 3.6 * len(loads)), squeeze=False)
    labels = ["p50", "p99", "p99.9"]
    width = 0.8 / len(names)
    for row, load in zip(axes, loads, strict=True):
        for ax, what in zip(row, ("publish", "e2e"), strict=True):
            for i, name in enumerate(names):
                values = getattr(cells[(name, load)].median(), what) or (0.0, 0.0, 0.0)
                xs = [x + i * width for x in range(3)]
                ax.bar(xs, values, width, label=name)
            ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(3)], labels)
            ax.set_ylabel("ms")
            ax.set_title(f"{what} latency, {load}")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds, path order rotated (default: 3)"
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply message counts and run lengths"
    )
    parser.add_argument("--paths", type=lambda s: s.split(","), default=PATHS,
                        help=f"comma-separated, from {','.join(KNOWN)} "
                        f"(default: {','.join(PATHS)})")  # fmt: skip
    parser.add_argument(
        "--workloads", type=lambda s: [w.strip() for w in s.split(",") if w.strip()], default=[],
        metavar="NAMES", help="comma-separated rows by name, e.g. 'py 1K,py consume' (a consume "
        "row brings the row it reads; default: every row)",
    )  # fmt: skip
    parser.add_argument(
        "--starts", type=int, default=3, help="timed starts of each proxy (default: 3)"
    )
    parser.add_argument("--png", type=Path, default=Path(__file__).with_name("peers.png"),
                        help="latency picture (default: bench/peers.png)")  # fmt: skip
    parser.add_argument("--markdown", type=Path, help="also write the table here (default: no)")
    parser.add_argument(
        "--warmup-passes", type=int, metavar="N",
        help="exactly N warm-up passes (0: none, for a quick look only); default: until the "
        f"peer's CPU per message settles within {SETTLED * 100:.0f}%%, {WARM_PASSES[0]} to "
        f"{WARM_PASSES[1]} passes",
    )  # fmt: skip
    args = parser.parse_args()
    unknown = set(args.paths) - set(KNOWN)
    if unknown or args.rounds < 3 or args.scale <= 0 or args.starts < 1:
        parser.error(
            f"bad --paths {sorted(unknown)}"
            if unknown
            else "--rounds at least 3 (a median needs its spread), --starts at least 1, --scale > 0"
        )
    if args.warmup_passes is not None and args.warmup_passes < 0:
        parser.error("--warmup-passes: 0 or more")
    try:
        workloads(args.scale, args.workloads)
    except ValueError as exc:
        parser.error(f"--workloads: {exc}")
    started = time.monotonic()
    results = measure(args)  # (a broker that cannot start: bench.run says it)
    loads = [w.name for w in workloads(args.scale, args.workloads)]
    import platform

    import pulsar

    cells = results.cells
    floors = floor() if any(n.startswith("sluice") for n in args.paths) else None
    idle = idle_rates(cells, args.paths)
    idle_seconds = statistics.median(
        cells[(n, IDLE)].median().window for n in args.paths if (n, IDLE) in cells
    )
    flags = " ".join(f for f in jvm_flags(512, 512) if f.startswith("-X"))
    lines = [
        f"{time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} CPUs "
        f"({len(os.sched_getaffinity(0))} usable); Apache Pulsar {results.version} standalone; "
        f"pulsar-perf {results.version}; pulsar-client {pulsar.__version__}; "
        f"{args.rounds} rounds, scale {args.scale}; medians (min-max of the rounds); vs peer: "
        "ratio of medians (min-max of each round's own ratio); "
        + (
            f"warmed by {results.warm_passes} passes of {' and '.join(WARM_LOADS)} through "
            "every path first (rule: bench/peers.py warm_up)"
            if results.warm_passes
            else "NOT warmed up (--warmup-passes 0)"
        ),
        "",
        table(cells, args.paths, loads, floors),
        "",
        f"Idle, no client, {idle_seconds:.0f} s each round: "
        + ", ".join(f"{n} {v * 1e3:.2f} ms of CPU per s" for n, v in idle.items()),
        "",
        "Start to the first answered CONNECT, median (min-max) of "
        + f"{args.starts} starts: "
        + ", ".join(
            f"{n} {statistics.median(t):.2f} s ({min(t):.2f}-{max(t):.2f})"
            for n, t in results.starts.items()
        ),
    ]
    if "sluice" in args.paths and set(args.paths) & set(BESIDE):
        sent = "JSON records on every path" if set(args.paths) & set(FILTER_PATHS) else (
            "the usual payloads")  # fmt: skip
        lines += ["", f"Filters and live watching beside `sluice` ({sent}; ratios: each "
                  "round's row over the same round's `sluice` row, median (min-max) of "
                  f"{args.rounds} rounds):",
                  "", filter_table(cells, args.paths, loads)]  # fmt: skip
    if any(n in FILTER_PATHS for n in results.filtered):
        lines += ["", "Filters after the rounds (/metrics): " + ", ".join(
            f"{n} refused {c['sluice_filter_rejected_total']:.0f}, "
            f"raised on {c['sluice_filter_errors_total']:.0f}, "
            f"saw {c[SEEN_BY[n]]:,.0f}"
            for n, c in results.filtered.items() if n in FILTER_PATHS)]  # fmt: skip
    if floors is not None:
        lines += ["", "Floor: the compiled path alone over frames like the row's, no sockets "
                  "(the scanner, CRC32-C included, and the read's accounting, 256 KiB reads, "
                  f"best of 5; 100 B messages {FLOOR_BATCH} to a batch)"]  # fmt: skip
    if results.transport:
        lines += ["", f"Apache Pulsar Proxy (JVM {flags}): {results.transport}"]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if ("direct" in args.paths or len(args.paths) > 1) and any("@" in n for n in loads):
        picture(cells, args.paths, args.png)
        log(f"picture: {args.png}")
    log(f"done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    bench.run(main)
