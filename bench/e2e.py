"""The real client through Sluice vs straight to the broker, in one run.

    python bench/e2e.py [--rounds 3] [--scale 1.0] [--record] [--profile FILE]
                        [--only unbatched|batched] [--against DIR]

Four figures (two with ``--only``), each as messages per second, proxy /
direct, plus the proxy's own CPU time per message (the kernel's per-process
CPU clock, over the same window as the msg/s: the first send to the last
receipt, or the subscription to the last message):
  produce 1 KiB, batching off     consume 1 KiB (published unbatched)
  produce 100 B, batching on      consume 100 B (published batched)

One embedded pulsar-lite broker, one `sluice proxy` process in front of it,
the official pulsar-client in this process. Producing uses send_async with a
bounded queue and waits for every receipt; consuming subscribes from the
earliest message of a topic filled beforehand and receives them all. Direct
and proxied runs alternate, each on a fresh topic, and each figure is the
median of the rounds; the ratio's min-max is that of each round's own
proxy / direct. The broker, the proxy and the client share the
machine's cores, as they would in a sidecar.

``--against DIR`` also starts a second proxy from the sluice package in DIR
(e.g. ``git worktree add /tmp/before HEAD~1``) in front of the same broker,
takes it in turn with the others, and prints its figures beside this
checkout's: a before/after comparison measured in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulsar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench
from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers import support
from tests.helpers.support import client, describe_source, source_error, start_proxy

GOAL = 0.90
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` has used so far, every thread: the kernel's
    per-process CPU clock (nanoseconds; /proc's user + system ticks are 10 ms,
    a tenth of what 5,000 messages cost the proxy), /proc where it cannot
    be read."""
    try:
        return time.clock_gettime((~pid << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    except OSError:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK


def produce(
    url: str,
    topic: str,
    count: int,
    size: int,
    batching: bool,
    mark: Callable[[], None] = lambda: None,
) -> float:
    """msg/s from the first send to the last receipt; ``mark()`` at both."""
    body = b"x" * size
    with client(url) as c:
        producer = c.create_producer(
            topic,
            batching_enabled=batching,
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

        mark()
        start = time.perf_counter()
        for _ in range(count):
            producer.send_async(body, on_receipt)
        producer.flush()
        for _ in range(count):
            if not done.acquire(timeout=120):
                raise SystemExit("timed out waiting for send receipts")
        elapsed = time.perf_counter() - start
        mark()
        if failed:
            raise SystemExit(f"{len(failed)} sends failed: {failed[0]}")
    return count / elapsed


def along(
    url: str,
    topic: str,
    count: int,
    size: int,
    rate: float,
    window: Callable[[bool], None] | None = None,
) -> None:
    """Produce ``count`` messages at ``rate`` per second, unbatched, with a
    consumer on the same client reading along and acknowledging each one:
    the low-rate case, where every frame crosses a proxy on its own.
    ``window(True)`` is called just before the first message, and
    ``window(False)`` once the last was received."""
    body = b"x" * size
    with client(url) as c:
        consumer = c.subscribe(topic, f"along-{uuid.uuid4().hex[:6]}", receiver_queue_size=1000)
        producer = c.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
        received = [0]

        def read() -> None:
            while received[0] < count:
                try:
                    msg = consumer.receive(timeout_millis=60_000)
                except pulsar.Timeout:
                    return
                consumer.acknowledge(msg)
                received[0] += 1

        reader = threading.Thread(target=read)
        reader.start()
        if window is not None:
            window(True)
        start = time.perf_counter()
        for sent in range(count):
            pause = start + sent / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            producer.send_async(body, lambda *_: None)
        producer.flush()
        reader.join()
        if window is not None:
            window(False)
        if received[0] < count:
            raise Stalled(f"{received[0]:,} of {count:,} received, then none for 60 s")


def same_rounds(runs: list[dict[int, float]]) -> list[int]:
    """The rounds (keys of each mode's round: figure) that every mode
    completed, in order: a round the broker stalled on one mode is left out
    of every mode's medians, so medians and ratios are of the same rounds."""
    return sorted(set.intersection(*(set(rounds) for rounds in runs))) if runs else []


def ratio_range(mine: list[float], theirs: list[float]) -> str:
    """min-max of the rounds' own ratios (``mine[i] / theirs[i]``, round i
    of each): the noise a ratio of medians is read with."""
    each = [m / t for m, t in zip(mine, theirs, strict=True) if t]
    return f"{min(each):.2f}-{max(each):.2f}" if each else "-"


class Stalled(Exception):
    """Nothing arrived for a minute: pulsar-lite 0.2.0 sometimes stops
    dispatching to a subscription, with or without a proxy in the path."""


def consume(url: str, topic: str, count: int, mark: Callable[[], None] = lambda: None) -> float:
    """msg/s from the subscription to the last message; ``mark()`` at both."""
    with client(url) as c:
        consumer = c.subscribe(
            topic,
            f"bench-{uuid.uuid4().hex[:6]}",
            initial_position=pulsar.InitialPosition.Earliest,
            receiver_queue_size=2000,
        )
        mark()
        start = time.perf_counter()
        for received in range(count):
            try:
                msg = consumer.receive(timeout_millis=60_000)
            except pulsar.Timeout:
                raise Stalled(f"{received:,} of {count:,} received, then none for 60 s") from None
            consumer.acknowledge(msg)
        elapsed = time.perf_counter() - start
        mark()
    return count / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    parser.add_argument("--record", action="store_true", help="the proxy records, payloads hashed")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="run the proxy under cProfile and write its stats to FILE "
        "(read with python -m pstats; the CPU figures then include cProfile's overhead)",
    )
    parser.add_argument(
        "--only",
        choices=("unbatched", "batched"),
        help="run one workload only",
    )
    parser.add_argument(
        "--against",
        type=Path,
        metavar="DIR",
        help="also run a proxy from the sluice package in DIR and compare",
    )
    args = parser.parse_args()
    if args.against is not None:
        args.against = args.against.resolve()
        problem = source_error(args.against, "--against")
        if problem is not None:
            parser.error(problem)
        if args.profile is not None:
            parser.error("--profile and --against: profile one proxy at a time")
    if args.profile is not None:
        out = str(args.profile.resolve())
        support.SLUICE = [sys.executable, "-m", "cProfile", "-o", out, "-m", "sluice"]
    unbatched = int(5_000 * args.scale)
    batched = int(50_000 * args.scale)

    workloads: list[tuple[str, int, int, bool]] = [
        ("1 KiB, batching off", unbatched, 1024, False),
        ("100 B, batching on", batched, 100, True),
    ]
    if args.only is not None:
        workloads = [workloads[0 if args.only == "unbatched" else 1]]
    # (workload, step, mode): {round: figure}
    results: dict[tuple[str, str, str], dict[int, float]] = {}
    cpu: dict[tuple[str, str, str], dict[int, float]] = {}  # proxy CPU µs per message
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        extra = ["--record", str(Path(tmp) / "rec"), "--record-payloads", "hash"]
        recording = extra if args.record else []
        proxies = {"proxy": start_proxy(broker.url, Path(tmp), *recording)}
        try:
            if args.against is not None:
                (Path(tmp) / "against").mkdir()
                proxies["against"] = start_proxy(
                    broker.url, Path(tmp) / "against", *recording, source=args.against
                )
            urls = {"direct": broker.url, **{mode: p.url for mode, p in proxies.items()}}
            modes = list(urls)
            for round_ in range(args.rounds):
                for name, count, size, batching in workloads:
                    # A different order each round: none always runs first.
                    shift = round_ % len(modes)
                    for mode in modes[shift:] + modes[:shift]:
                        topic = f"persistent://public/default/bench-{uuid.uuid4().hex[:10]}"
                        pid = proxies[mode].pid if mode in proxies else None
                        for step in ("produce", "consume"):
                            # the proxy's CPU at the start and the end of the timed window
                            used: list[float] = []

                            def mark(pid: int | None = pid, used: list[float] = used) -> None:
                                if pid is not None:
                                    used.append(cpu_seconds(pid))

                            if step == "produce":
                                rate = produce(urls[mode], topic, count, size, batching, mark)
                            else:
                                try:
                                    rate = consume(urls[mode], topic, count, mark)
                                except Stalled as exc:
                                    print(f"round {round_ + 1}: {name} consume, {mode}: the "
                                          f"broker stalled ({exc}); left out of the medians",
                                          file=sys.stderr)  # fmt: skip
                                    continue
                            results.setdefault((name, step, mode), {})[round_] = rate
                            if pid is not None:
                                per = (used[-1] - used[0]) / count * 1e6
                                cpu.setdefault((name, step, mode), {})[round_] = per
                print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            for p in proxies.values():
                if args.profile is not None:
                    p.terminate()  # cProfile writes its stats on a clean exit
                p.kill()

    print(f"proxy: sluice from {describe_source(Path(__file__).resolve().parent.parent)}")
    print(f"proxy recording: {'on (payloads hashed)' if args.record else 'off'}")
    header = (
        f"{'workload':<22} {'step':<8} {'direct msg/s':>13} {'proxy msg/s':>12} {'ratio':>6} "
        f"{'min-max':>9} {'proxy CPU µs/msg':>17}"
    )
    if args.against is not None:
        print(f"against: sluice from {describe_source(args.against)}")
        header += f" {'against msg/s':>14} {'against µs/msg':>15} {'CPU change':>11}"
    print(header)
    worst = 1.0
    for name, *_ in workloads:
        for step in ("produce", "consume"):
            kept = same_rounds([results.get((name, step, mode), {}) for mode in modes])
            if not kept:
                print(f"{name:<22} {step:<8} n/a: no round completed on every path "
                      "(the broker stalled)")  # fmt: skip
                continue
            rates = {mode: [results[(name, step, mode)][n] for n in kept] for mode in modes}
            cpus = {mode: [cpu[(name, step, mode)][n] for n in kept] for mode in proxies}
            direct = statistics.median(rates["direct"])
            proxied = statistics.median(rates["proxy"])
            ratio = proxied / direct
            worst = min(worst, ratio)
            per = statistics.median(cpus["proxy"])
            spread = ratio_range(rates["proxy"], rates["direct"])
            line = (
                f"{name:<22} {step:<8} {direct:>13,.0f} {proxied:>12,.0f} {ratio:>6.2f} "
                f"{spread:>9} {per:>17.1f}"
            )
            if args.against is not None:
                other = statistics.median(rates["against"])
                other_per = statistics.median(cpus["against"])
                change = f"{(per / other_per - 1) * 100:+.0f} %" if other_per else "n/a"
                line += f" {other:>14,.0f} {other_per:>15.1f} {change:>11}"
            if len(kept) < args.rounds:
                line += f"  ({len(kept)} of {args.rounds} rounds: the others stalled)"
            print(line)
    print(f"lowest ratio {worst:.2f} (goal {GOAL:.2f}: {'met' if worst >= GOAL else 'NOT met'})")
    return 0


if __name__ == "__main__":
    bench.run(main)
