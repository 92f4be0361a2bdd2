"""The broker dies (SIGKILL) under a live producer and comes back on the same
address and data directory: every message the client got a receipt for is
there afterwards, clients reconnect through Sluice on their own, and
Sluice's state (allow-list, lookups, metrics) stays right."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pulsar
import pytest

from sluice.brokers.embedded import free_port
from tests.helpers.reliability import (
    AdminProxy,
    Produced,
    RestartableBroker,
    body,
    describe_missing,
    open_fds,
    peak_rss_bytes,
    pulsar_client,
    read_all,
    start_admin_proxy,
    wait_until,
)
from tests.helpers.support import RawClient, tcp_connections


@dataclass
class RestartOutcome:
    sent: int
    acked: int
    failed: int
    consumed: int  # distinct acknowledged messages read back
    lost: list[bytes]  # acknowledged, never read back
    live_after_restart: int  # distinct messages the live consumer got after the restart
    reconnect_seconds: float  # restart to the first receipt after it
    # Of those, the ones a direct read from the broker (no proxy) lacks too:
    # the broker's own loss or stall, not Sluice's.
    lost_direct: list[bytes] = field(default_factory=list)
    peak_rss: int = 0
    fds_before: int = 0
    fds_after: int = 0
    log: str = ""
    errors: dict[str, float] = field(default_factory=dict)


def broker_restart(
    tmp_path: Path,
    topic: str,
    *,
    messages: int,
    kill_after: int,
    down_seconds: float = 0.5,
    through_proxy: bool = True,
) -> RestartOutcome:
    """Produce ``messages`` 1 KiB messages; SIGKILL the broker once
    ``kill_after`` have receipts, restart it ``down_seconds`` later."""
    broker = RestartableBroker(tmp_path / "broker-data").start()
    proxy: AdminProxy | None = None
    try:
        if through_proxy:
            proxy = start_admin_proxy(broker.url, tmp_path)
        url = proxy.url if proxy else broker.url
        fds_before = open_fds(proxy.pid) if proxy else 0
        produced = Produced()
        live: set[bytes] = set()
        restarted_at = 0.0
        stop_live = threading.Event()
        with pulsar_client(url) as c:
            consumer = c.subscribe(topic, "live", initial_position=pulsar.InitialPosition.Earliest)

            def consume() -> None:
                while not stop_live.is_set():
                    try:
                        msg = consumer.receive(timeout_millis=200)
                    except pulsar.Timeout:
                        continue
                    except Exception:  # the client closing under us
                        return
                    if restarted_at and time.monotonic() > restarted_at:
                        live.add(msg.data())
                    consumer.acknowledge(msg)

            reader = threading.Thread(target=consume, daemon=True)
            reader.start()
            producer = c.create_producer(
                topic,
                batching_enabled=False,
                block_if_queue_full=True,
                max_pending_messages=200,
                send_timeout_millis=60_000,
            )
            killed = False
            for i in range(messages):
                content = body("restart", i)
                producer.send_async(content, produced.callback(content))
                if not killed and len(produced.acked) >= kill_after:
                    broker.kill()
                    killed = True
                    time.sleep(down_seconds)
                    broker.start()
                    restarted_at = time.monotonic()
                time.sleep(0.0005)
            producer.flush()
            for _ in range(messages):
                assert produced.done.acquire(timeout=120), "a send never completed"
            assert killed, "the broker was never killed: too few messages"
            if proxy is not None:  # the client reconnected through Sluice, never around it
                direct = [r for _, r in tcp_connections(os.getpid()) if r[1] == broker.port]
                assert not direct, f"the client dialled the broker itself: {direct}"
            after = [t for t in produced.ack_times if t > restarted_at]
            reconnect = (min(after) - restarted_at) if after else float("inf")
            acked = set(produced.acked)
            # The live consumer keeps reading across the restart.
            wait_until(lambda: len(live) > 0, 30, "the live consumer to get messages again")
            stop_live.set()
            reader.join(5)
            producer.close()
        consumed = read_all(url, topic, acked, timeout=10)
        outcome = RestartOutcome(
            sent=messages,
            acked=len(acked),
            failed=len(produced.failed),
            consumed=len(acked & consumed),
            lost=sorted(acked - consumed),
            live_after_restart=len(live),
            reconnect_seconds=reconnect,
        )
        if outcome.lost and proxy is not None:
            outcome.lost_direct = sorted(
                set(outcome.lost) - read_all(broker.url, topic, set(outcome.lost), timeout=10)
            )
        if proxy is not None:
            outcome.peak_rss = peak_rss_bytes(proxy.pid)
            wait_until(
                lambda: proxy is not None and proxy.metric("sluice_connections_active") == 0,
                10,
                "every client connection to close",
            )
            outcome.fds_after = open_fds(proxy.pid)
            outcome.fds_before = fds_before
            outcome.log = proxy.proxy.log()
            check_proxy_state(proxy, broker)
            outcome.errors = {
                "lookups failed": proxy.metric("sluice_lookups_total", outcome="failed"),
                "dial failures": proxy.metric("sluice_upstream_dial_failures_total"),
            }
        return outcome
    finally:
        if proxy is not None:
            proxy.kill()
        broker.stop()


def check_proxy_state(proxy: AdminProxy, broker: RestartableBroker) -> None:
    """After the restart the proxy still knows what it knew, and no more."""
    assert proxy.proxy.process.poll() is None, "the proxy died"
    assert "Traceback" not in proxy.proxy.log(), proxy.proxy.log()[-3000:]
    # The broker is still allowed; an address nobody named is still refused.
    with RawClient(proxy.proxy.port) as raw:
        assert raw.connect(f"127.0.0.1:{broker.port}").name == "CONNECTED"
    with RawClient(proxy.proxy.port) as raw:
        refused = raw.connect(f"127.0.0.1:{free_port()}")
        assert refused.name == "ERROR", refused.name
    # Lookups were answered, the upstream is up again, nothing is left open.
    assert proxy.metric("sluice_lookups_total", outcome="answered") >= 2
    wait_until(lambda: proxy.metric("sluice_upstream_up") == 1, 20, "sluice_upstream_up == 1")
    wait_until(
        lambda: proxy.metric("sluice_connections_active") == 0, 10, "no open client connections"
    )
    opened = proxy.metric("sluice_connections_opened_total")
    closed = proxy.metric("sluice_connections_closed_total")
    assert opened == closed > 0, (opened, closed)


@pytest.mark.e2e
def test_acknowledged_messages_survive_a_broker_kill(tmp_path: Path, topic: str) -> None:
    outcome = broker_restart(tmp_path, topic, messages=1500, kill_after=400)
    assert not outcome.lost, (
        f"acknowledged messages not read back through Sluice: {describe_missing(set(outcome.lost))}"
        f"; of those, missing from a direct read of the broker too: "
        f"{describe_missing(set(outcome.lost_direct))}"
    )
    assert outcome.acked >= 400
    assert outcome.consumed == outcome.acked
    # The producer got receipts again after the restart without being recreated.
    assert outcome.reconnect_seconds < 30, outcome.reconnect_seconds
    assert outcome.live_after_restart > 0
    assert outcome.fds_after <= outcome.fds_before + 2, (outcome.fds_before, outcome.fds_after)
