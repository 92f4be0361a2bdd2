"""Faults survived, in figures (#17): one table, longer runs than the tests.

    python bench/soak.py [--quick] [--seed N]

Each row runs one fault with the real components (pulsar-lite, the official
pulsar-client, `sluice proxy` subprocesses) and the scenario code of
tests/reliability/, with bigger numbers:

- broker SIGKILL + restart under a producer of 1 KiB messages
  (block_if_queue_full), through Sluice and, for comparison, straight to
  the broker; acknowledged messages are read back from the start and
  deduplicated by content (pulsar-lite 0.2.0 may deliver an entry twice);
- `kill -9` of a recording proxy under load: SENDs acknowledged more than
  one flush interval before the kill that are missing from the recording;
- 100k fuzzed frames at the port beside a real producer/consumer pair;
- 1,000 idle connections (800 lookup, 200 relayed) answering pings;
- a consumer that stops reading while 64 MiB is published
  (tests/test_proxy_e2e.py's scenario), the proxy's RSS growth;
- token authentication: the real client's token through Sluice, then every
  artefact searched for it;
- a full tmpfs and a recording directory replaced by a file, one episode
  each, under a producer (needs root for the tmpfs);
- `sluice proxy --workers 2` whose supervisor is SIGKILLed while producers
  send through both workers, and a new proxy started on the same port
  (tests/test_workers.py's scenario): how soon the port is free, how soon
  the last worker is gone.

Columns: acknowledged / consumed / lost are messages (for the kill -9 row:
SENDs acknowledged before the last flush / recorded / missing from the
recording); reconnect is from the broker's restart to the first receipt
after it; errors are what the proxy counted; peak RSS is the proxy's
VmHWM; fds are the proxy's open files before and after. Every process is
stopped by PID on exit. Loopback only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench
from sluice.brokers.embedded import EmbeddedBroker
from tests.helpers.reliability import peak_rss_bytes, read_all, rss_bytes
from tests.helpers.support import start_proxy
from tests.reliability.test_auth import new_token, produce_and_consume, token_broker
from tests.reliability.test_broker_restart import broker_restart
from tests.reliability.test_disk import disk_trouble
from tests.reliability.test_fuzz_port import fuzz_port
from tests.reliability.test_idle import hold_idle
from tests.reliability.test_kill_recording import record_and_kill
from tests.test_proxy_e2e import stall_a_consumer
from tests.test_workers import kill_a_supervisor_under_load


@dataclass
class Row:
    fault: str
    acked: str = "-"
    consumed: str = "-"
    lost: str = "-"
    reconnect: str = "-"
    errors: str = "-"
    peak_rss: str = "-"
    fds: str = "-"
    seconds: float = 0.0


def mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sluice-soak-") as d:
        yield Path(d)


def topic(tag: str) -> str:
    return f"persistent://public/default/soak-{tag}-{time.monotonic_ns()}"


def restart_row(messages: int, through: bool) -> Row:
    with scratch() as tmp:
        o = broker_restart(
            tmp,
            topic("restart"),
            messages=messages,
            kill_after=messages // 4,
            through_proxy=through,
        )
    errors = f"sends failed {o.failed}"
    if through:
        errors = ", ".join(f"{k} {v:.0f}" for k, v in o.errors.items()) + ", " + errors
    return Row(
        "broker SIGKILL + restart, " + ("through Sluice" if through else "direct"),
        acked=f"{o.acked}/{o.sent}",
        consumed=str(o.consumed),
        lost=str(len(o.lost)),
        reconnect=f"{o.reconnect_seconds:.2f} s",
        errors=errors,
        peak_rss=mb(o.peak_rss) if through else "-",
        fds=f"{o.fds_before} → {o.fds_after}" if through else "-",
    )


def kill_row(broker: EmbeddedBroker, seconds: float) -> Row:
    with scratch() as tmp:
        o = record_and_kill(broker, tmp, topic("kill"), seconds=seconds, rate=300)
        missing = set(range(o.acked_before_cut)) - o.recorded_sends
    return Row(
        "proxy kill -9 while recording",
        acked=str(o.acked_before_cut),
        consumed=f"{len(o.recorded_sends)} recorded",
        lost=str(len(missing)),
        errors=f"torn tail {o.torn_bytes} B in {o.files} file(s)",
    )


def fuzz_row(frames: int, seed: int, messages: int) -> Row:
    with scratch() as tmp:
        o = fuzz_port(tmp, topic("fuzz"), frames=frames, seed=seed, messages=messages, slow=20)
    counted = {k: v for k, v in o.metrics.items() if k.startswith(("rejected", "invalid"))}
    return Row(
        f"{o.stats.frames} fuzzed frames on {o.stats.connections} connections + real pair",
        acked=str(o.acked),
        consumed=str(o.consumed),
        lost=str(o.lost),
        errors=", ".join(f"{k} {v:.0f}" for k, v in counted.items())
        + f", opened {o.metrics['opened']:.0f} = closed {o.metrics['closed']:.0f}",
        peak_rss=f"{mb(o.rss[0])} → {mb(o.rss[1])}",
        fds=f"{o.fds[0]} → {o.fds[1]}",
    )


def idle_row(broker: EmbeddedBroker, hold: float) -> Row:
    with scratch() as tmp:
        o = hold_idle(broker, tmp, lookup=800, proxied=200, hold=hold)
    return Row(
        f"{o.connections} idle connections for {hold:.0f} s",
        errors=(
            f"dropped {o.lost} (closed as silent {o.silent_closed}), pings answered {o.pings}, "
            f"{len(o.handshake_dropped)} unfinished CONNECTs closed after "
            f"{min(o.handshake_dropped):.1f}-{max(o.handshake_dropped):.1f} s"
        ),
        peak_rss=f"{mb(o.rss_before)} → {mb(o.peak_rss)}",
        fds=f"{o.fds_before} → {o.fds_after}",
    )


def stalled_row() -> Row:
    with scratch() as tmp:
        patient = EmbeddedBroker(settings={"keep_alive_interval_secs": 600})
        with patient as broker:
            proxy = start_proxy(broker.url, tmp)
            peak = [rss_bytes(proxy.pid)]
            before = peak[0]
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    with contextlib.suppress(OSError, AssertionError):
                        peak.append(rss_bytes(proxy.pid))
                    time.sleep(0.1)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            try:
                stall_a_consumer(proxy, broker, topic("stalled"))
            finally:
                stop.set()
                sampler.join(5)
                hwm = peak_rss_bytes(proxy.pid)
                proxy.kill()
    return Row(
        "consumer stops reading, 1000 x 64 KiB published",
        acked="1000",
        consumed="1000",
        lost="0",
        errors=f"RSS grew {(max(peak) - before) / 2**20:.1f} MiB while held",
        peak_rss=mb(hwm),
    )


def auth_row() -> Row:
    token = new_token()
    with scratch() as tmp, token_broker(token, anonymous_lookups=True) as broker:
        proxy = start_proxy(broker.url, tmp, "--record", str(tmp / "rec"), "--log-level", "debug")
        try:
            got = produce_and_consume(proxy.url, "persistent://public/default/soak-auth", token)
            assert proxy.terminate() == 0
        finally:
            proxy.kill()
        leaks = sum(
            token.encode() in path.read_bytes() for path in tmp.rglob("*") if path.is_file()
        )
        relayed = [c for c in broker.seen.connects if c.HasField("proxy_version")]
        unchanged = sum(c.auth_data == token.encode() for c in relayed)
    return Row(
        "token auth through Sluice (challenge on every relayed connection)",
        acked=str(len(got)),
        consumed=str(len(got)),
        lost="0",
        errors=(
            f"token unchanged on {unchanged}/{len(relayed)} relayed CONNECTs, "
            f"{len(broker.seen.auth_responses)} AUTH_RESPONSE relayed, "
            f"files holding the token {leaks}"
        ),
    )


def disk_row(broker: EmbeddedBroker, seconds: float) -> Row:
    if os.geteuid() != 0:
        return Row("disk full / directory gone (needs root for tmpfs)")
    with scratch() as tmp:
        name = topic("disk")
        o = disk_trouble(broker, tmp, name, episode_seconds=seconds)
        consumed = read_all(broker.url, name, o.acked_messages, timeout=10)
    return Row(
        f"disk full, then directory gone ({seconds:.0f} s each)",
        acked=f"{o.acked}/{o.sent}",
        consumed=str(len(consumed & o.acked_messages)),
        lost=str(len(o.acked_messages - consumed)),
        errors=(
            f"frames not recorded {o.dropped:.0f}, 'recording failed' lines {o.failure_lines} "
            f"for {o.episodes} episodes, gap records {o.gaps}"
        ),
    )


def supervisor_row(broker: EmbeddedBroker, per_producer: int) -> Row:
    with scratch() as tmp:
        o = kill_a_supervisor_under_load(broker.url, tmp, topic("supervisor"), per_producer)
    return Row(
        f"supervisor of 2 workers SIGKILLed, {o.producers} producers, new proxy on the port",
        acked=f"{len(o.acked)}/{o.attempted}",
        consumed=str(len(o.consumed & o.acked)),
        lost=str(len(o.acked - o.consumed)),
        errors=(
            f"sends failed {len(o.failures)}, port free after "
            f"{o.killed.ports_free * 1000:.0f} ms, workers gone after "
            f"{o.killed.workers_gone:.1f} s (drain timeout 3 s)"
        ),
    )


def table(rows: list[Row]) -> str:
    head = ["fault", "acknowledged", "consumed", "lost", "reconnect", "errors counted",
            "peak RSS", "fds before → after", "took"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.fault, r.acked, r.consumed, r.lost, r.reconnect, r.errors, r.peak_rss, r.fds,
                 f"{r.seconds:.0f} s"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller numbers, for a smoke run")
    parser.add_argument("--seed", type=int, default=17, help="the fuzzer's seed (default 17)")
    args, _ = parser.parse_known_args()
    quick = args.quick
    rows: list[Row] = []

    def timed(make: Callable[[], Row]) -> None:
        started = time.monotonic()
        row = make()
        row.seconds = time.monotonic() - started
        rows.append(row)
        print(f"[soak] {row.fault}: done", file=sys.stderr, flush=True)

    with EmbeddedBroker() as broker:
        messages = 4000 if quick else 20_000
        timed(lambda: restart_row(messages, True))
        timed(lambda: restart_row(messages, False))
        timed(lambda: kill_row(broker, 3 if quick else 10))
        timed(lambda: fuzz_row(10_000 if quick else 100_000, args.seed, 300 if quick else 3000))
        timed(lambda: idle_row(broker, 6 if quick else 30))
        timed(stalled_row)
        timed(auth_row)
        timed(lambda: disk_row(broker, 3 if quick else 10))
        timed(lambda: supervisor_row(broker, 150 if quick else 1000))
    print(table(rows))
    lost = [r for r in rows if r.lost not in ("0", "-")]
    if lost:
        print(f"\nLOST acknowledged messages in: {', '.join(r.fault for r in lost)}")
        return 1
    return 0


if __name__ == "__main__":
    bench.run(main)
