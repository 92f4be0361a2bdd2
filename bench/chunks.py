"""Peak memory of the proxy while it relays concurrent large chunked messages.

    python bench/chunks.py [--concurrency 10] [--size-mib 50]

Issue: relaying 10 concurrent 50 MiB chunked messages should keep the proxy's
peak RSS within a few frames per connection. The client splits each message
into chunks the size of the broker's frame limit (5 MiB), so a proxy that
streams frames needs a few of them per connection at most, never a message.

One embedded pulsar-lite broker, one `sluice proxy --record DIR
--record-payloads hash` process in front of it (recording as in production),
the official pulsar-client in this process. Each of N threads has its own
pulsar.Client (so its own connections through the proxy), sends one message
of random bytes to its own topic with chunking on and batching off, waits
until every thread has sent, then subscribes from the earliest message and
checks the SHA-256 of what comes back. The same is done straight to the
broker first, as the reference: pulsar-lite 0.2.0 sometimes loses a chunk on
its own, so losses are counted per mode rather than failing the run.

A thread reads the proxy's VmRSS from /proc every 50 ms; VmHWM (the kernel's
own peak) is read at the end. Growth = peak - idle RSS before the proxied
run, divided by the number of concurrent clients and by the frame size.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pulsar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench
from sluice.brokers.embedded import EmbeddedBroker, free_port
from tests.helpers.support import client, start_proxy

MiB = 1024 * 1024
FRAME_MIB = 5.0  # pulsar-lite's default max_message_size: the chunk (frame) size


def proc_status_kib(pid: int, key: str) -> int:
    """A ``kB`` field of /proc/PID/status (VmRSS, VmHWM), in KiB; 0 if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class RssSampler:
    """VmRSS of one process every ``interval`` seconds, in a daemon thread."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, str, int]] = []  # (time, phase, KiB)
        self.phase = "idle"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            kib = proc_status_kib(self.pid, "VmRSS")
            self.samples.append((time.monotonic(), self.phase, kib))
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def peak_mib(self, phase: str | None = None) -> float:
        kib = [k for _, p, k in self.samples if phase is None or p == phase]
        return max(kib, default=0) / 1024


@dataclass
class ModeResult:
    mode: str
    total: int
    outcomes: list[str] = field(default_factory=list)  # "ok" or what went wrong
    topics: list[str] = field(default_factory=list)
    digests: list[bytes] = field(default_factory=list)
    seconds: float = 0.0
    send_seconds: float = 0.0

    @property
    def ok(self) -> int:
        return sum(1 for o in self.outcomes if o == "ok")


def worker(
    url: str,
    topic: str,
    size: int,
    timeout_s: float,
    sent: threading.Barrier,
    outcomes: list[str],
    digests: list[bytes],
    index: int,
) -> None:
    """Send one chunked message, wait for the others to send, read it back."""
    outcome = "not started"
    reached_barrier = False
    try:
        data = os.urandom(size)
        digest = digests[index] = hashlib.sha256(data).digest()
        with client(url) as c:
            producer = c.create_producer(
                topic,
                chunking_enabled=True,
                batching_enabled=False,
                send_timeout_millis=int(timeout_s * 1000),
            )
            try:
                producer.send(data)
                outcome = "sent"
            except Exception as exc:  # pulsar raises its own Exception subclasses
                outcome = f"send failed: {type(exc).__name__}: {exc}"
            del data
            reached_barrier = True
            sent.wait(timeout_s)
            if outcome != "sent":
                return
            # Subscribing after the send: pulsar-lite 0.2.0 mixes up chunks it
            # dispatches to a consumer that was already waiting (direct too).
            consumer = c.subscribe(topic, "bench", initial_position=pulsar.InitialPosition.Earliest)
            try:
                msg = consumer.receive(timeout_millis=int(timeout_s * 1000))
            except pulsar.Timeout:
                outcome = "lost (receive timed out)"
                return
            got = msg.data()
            if len(got) != size:
                outcome = f"wrong size {len(got)}"
            elif hashlib.sha256(got).digest() != digest:
                outcome = "sha256 mismatch"
            else:
                outcome = "ok"
                consumer.acknowledge(msg)
    except threading.BrokenBarrierError:
        outcome = f"{outcome}; other senders did not finish in {timeout_s:.0f}s"
    except Exception as exc:
        outcome = f"{outcome}; failed: {type(exc).__name__}: {exc}"
    finally:
        if not reached_barrier:
            with contextlib.suppress(threading.BrokenBarrierError):
                sent.wait(timeout_s)
        outcomes[index] = outcome


def run_mode(
    mode: str,
    url: str,
    concurrency: int,
    size: int,
    timeout_s: float,
    sampler: RssSampler | None,
) -> ModeResult:
    result = ModeResult(mode, concurrency)
    outcomes = ["not finished"] * concurrency
    digests = [b""] * concurrency
    send_done = [0.0]

    def all_sent() -> None:
        send_done[0] = time.perf_counter()
        if sampler is not None:
            sampler.phase = "receive"

    sent = threading.Barrier(concurrency, action=all_sent)
    run = uuid.uuid4().hex[:8]
    topics = [f"persistent://public/default/chunks-{mode}-{run}-{i}" for i in range(concurrency)]
    threads = [
        threading.Thread(
            target=worker,
            args=(url, topics[i], size, timeout_s, sent, outcomes, digests, i),
            name=f"{mode}-{i}",
            daemon=True,
        )
        for i in range(concurrency)
    ]
    if sampler is not None:
        sampler.phase = "send"
    start = time.perf_counter()
    for t in threads:
        t.start()
    # Every step inside a worker has its own timeout; this bounds the sum.
    give_up = time.monotonic() + 3 * timeout_s + 30
    for t in threads:
        t.join(max(0.0, give_up - time.monotonic()))
    result.seconds = time.perf_counter() - start
    result.send_seconds = (send_done[0] or time.perf_counter()) - start
    if sampler is not None:
        sampler.phase = "after"
    result.outcomes = outcomes
    result.topics = topics
    result.digests = digests
    return result


def reread(url: str, topic: str, digest: bytes, timeout_s: float) -> bool:
    """Whether the broker still holds the message intact: a fresh subscription
    from the earliest message, nothing else running."""
    try:
        with client(url) as c:
            consumer = c.subscribe(
                topic, "reread", initial_position=pulsar.InitialPosition.Earliest
            )
            msg = consumer.receive(timeout_millis=int(timeout_s * 1000))
            return hashlib.sha256(msg.data()).digest() == digest
    except Exception:  # a timeout or anything else: not intact as far as we can tell
        return False


def recorder_metrics(admin_port: int) -> dict[str, float]:
    """The proxy's sluice_recorder_* figures from its /metrics."""
    out: dict[str, float] = {}
    try:
        url = f"http://127.0.0.1:{admin_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("sluice_recorder_") and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--concurrency", type=int, default=10,
        help="concurrent clients, each with its own connections and topic (default: 10)",
    )  # fmt: skip
    parser.add_argument(
        "--size-mib", type=float, default=50.0,
        help="size of each client's one chunked message, in MiB (default: 50)",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=180.0,
        help="seconds each send and each receive may take (default: 180)",
    )  # fmt: skip
    parser.add_argument(
        "--deadline", type=float, default=1200.0,
        help="seconds the whole run may take before it is killed (default: 1200)",
    )  # fmt: skip
    args = parser.parse_args()
    size = int(args.size_mib * MiB)
    n = args.concurrency

    pids: list[int] = []

    def watchdog() -> None:
        print(f"deadline of {args.deadline:.0f}s passed: killing the proxy and broker",
              file=sys.stderr, flush=True)  # fmt: skip
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        os._exit(3)

    timer = threading.Timer(args.deadline, watchdog)
    timer.daemon = True
    timer.start()

    results: list[ModeResult] = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        if broker.pid is not None:
            pids.append(broker.pid)
        admin = free_port()
        proxy = start_proxy(
            broker.url, Path(tmp), "--record", str(Path(tmp) / "rec"),
            "--record-payloads", "hash", "--admin", f"127.0.0.1:{admin}",
        )  # fmt: skip
        pids.append(proxy.pid)
        try:
            with RssSampler(proxy.pid) as sampler:
                print(f"direct: {n} x {args.size_mib:g} MiB ...", file=sys.stderr, flush=True)
                results.append(run_mode("direct", broker.url, n, size, args.timeout, None))
                time.sleep(1.0)  # let the idle samples settle
                idle_mib = proc_status_kib(proxy.pid, "VmRSS") / 1024
                print(f"proxy: {n} x {args.size_mib:g} MiB ...", file=sys.stderr, flush=True)
                results.append(run_mode("proxy", proxy.url, n, size, args.timeout, sampler))
                time.sleep(0.5)
            # Lost messages read again straight from the broker, one at a time:
            # intact there means the broker stored every chunk and lost the
            # dispatch, not the upload.
            intact: dict[str, list[bool]] = {}
            for r in results:
                for i, outcome in enumerate(r.outcomes):
                    if outcome.startswith("lost"):
                        ok = reread(broker.url, r.topics[i], r.digests[i], min(args.timeout, 30))
                        intact.setdefault(r.mode, []).append(ok)
            hwm_mib = proc_status_kib(proxy.pid, "VmHWM") / 1024
            after_mib = proc_status_kib(proxy.pid, "VmRSS") / 1024
            recorder = recorder_metrics(admin)
            log = proxy.log()
        finally:
            proxy.kill()
    timer.cancel()

    peak_mib = max(sampler.peak_mib(), hwm_mib)
    growth = peak_mib - idle_mib
    per_conn = growth / n
    direct, proxied = results
    print(f"{n} concurrent clients x {args.size_mib:g} MiB chunked message, "
          f"frames of {FRAME_MIB:g} MiB, proxy recording payload hashes")  # fmt: skip
    print(
        f"{'mode':<7} {'ok/total':>8} {'MiB relayed':>12} {'seconds':>8} {'MB/s':>7} "
        f"{'peak RSS MiB':>13} {'idle RSS MiB':>13}  growth per connection"
    )
    for r in results:
        moved = 2 * r.ok * size  # each message sent once and received once
        rate = moved / 1e6 / r.seconds if r.seconds else 0.0
        if r.mode == "proxy":
            rss = f"{peak_mib:>13.0f} {idle_mib:>13.0f}  "
            rss += f"{per_conn:.1f} MiB = {per_conn / FRAME_MIB:.1f} frames"
        else:
            rss = f"{'-':>13} {'-':>13}  -"
        print(
            f"{r.mode:<7} {f'{r.ok}/{r.total}':>8} {moved / MiB:>12.0f} {r.seconds:>8.1f} "
            f"{rate:>7.1f} {rss}"
        )
    print(
        f"peak growth {growth:.0f} MiB = {per_conn / FRAME_MIB:.1f} frames per connection "
        f"(VmHWM {hwm_mib:.0f} MiB, sampled VmRSS peak {sampler.peak_mib():.0f} MiB: "
        f"{sampler.peak_mib('send'):.0f} while sending, {sampler.peak_mib('receive'):.0f} "
        f"while receiving; {after_mib:.0f} MiB after)"
    )
    print(f"send phase: direct {direct.send_seconds:.1f}s, proxy {proxied.send_seconds:.1f}s")
    if recorder:
        print("recorder: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(recorder.items())))
    lost = {r.mode: r.total - r.ok for r in results}
    print(f"lost or failed: direct {lost['direct']}, proxy {lost['proxy']}")
    for mode, checks in intact.items():
        print(
            f"  {mode}: {sum(checks)} of {len(checks)} lost messages read back intact "
            "straight from the broker afterwards (stored, not dispatched)"
        )
    for r in results:
        for i, outcome in enumerate(r.outcomes):
            if outcome != "ok":
                print(f"  {r.mode} client {i}: {outcome}")
    if "Traceback" in log:
        print("the proxy's log has a Traceback:\n" + log[-3000:])
        return 1
    return 0


if __name__ == "__main__":
    bench.run(main)
