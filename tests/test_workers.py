"""`sluice proxy --workers N`: several processes behind one port, acting as one.

Shared state is tested in-process first (two SharedRouting / SharedLimits /
SharedBrokerPorts on the same files stand for two workers); then the real
proxy with real workers, the real client and broker: a lookup answered by
one worker and the CONNECT served by another (pinned with SIGSTOP), a worker
killed under a producer, metrics summed over workers, SIGTERM drain; and
Cursus's port-per-broker ports shared by two workers, each killed in turn.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pulsar
import pytest
import trio
from cursus import ConsumerMode, Producer, ProducerConfig

from sluice.addresses import Address
from sluice.brokers.embedded import EmbeddedBroker, free_port
from sluice.commands.faults import call
from sluice.commands.proxy import parse_workers
from sluice.errors import ConfigError
from sluice.protocols.pulsar import Type, command, encode, pb
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.proxy.admin import AdminRequest, Refused
from sluice.proxy.config import ProxyConfig
from sluice.proxy.pulsar import FrameStream, SharedRouting
from sluice.proxy.shared import (
    BROKER_PORTS_FILE,
    LIMITS_FILE,
    PLAIN,
    ROUTES_FILE,
    TLS,
    SharedBrokerPorts,
    SharedLimits,
    create_state,
)
from sluice.proxy.workers import (
    SCRAPE_TIMEOUT,
    Supervisor,
    Worker,
    _counters,
    _Counts,
    _Merged,
    _Totals,
    available_cpus,
    http,
)
from sluice.recording.reader import load
from tests.helpers.cursus_broker import open_cluster
from tests.helpers.reliability import wait_until
from tests.helpers.scripted_broker import ScriptedBroker, redirect_to
from tests.helpers.support import (
    QUIET,
    ProxyProcess,
    RawClient,
    client,
    holds_a_client,
    http_get,
    kill_with_workers,
    one_client_per_worker,
    start_proxy,
    stopped,
    tcp_connections,
    wait_ready,
    wait_stopped,
    worker_pids,
)
from tests.test_cursus_broker import collect_all, in_thread, produce
from tests.test_dashboards import scrape, value
from tests.test_proxy_scripted import answer, lookup

TOKEN = "workers-admin-token"

# --- shared state, in one process --------------------------------------------------


def test_a_broker_learned_by_one_worker_is_allowed_by_another(tmp_path: Path) -> None:
    create_state(tmp_path, 2)
    upstream = parse_broker_url("pulsar://127.0.0.1:6650")
    first = SharedRouting(upstream, tmp_path / ROUTES_FILE)
    second = SharedRouting(upstream, tmp_path / ROUTES_FILE)
    named = Address("10.0.0.7", 6651)
    assert not second.allowlist.allows(named)
    first.learn(parse_broker_url("pulsar+ssl://10.0.0.7:6651"), via_upstream=True)
    assert second.allowlist.allows(named)
    route = second.routes[named]
    assert route.tls and route.via_upstream
    # Learning the same broker again writes nothing new.
    size = (tmp_path / ROUTES_FILE).stat().st_size
    first.learn(parse_broker_url("pulsar+ssl://10.0.0.7:6651"), via_upstream=True)
    assert (tmp_path / ROUTES_FILE).stat().st_size == size
    assert not second.allowlist.allows(Address("10.0.0.8", 6651))


def test_connection_limits_are_totals_over_workers(tmp_path: Path) -> None:
    create_state(tmp_path, 2)
    table = tmp_path / LIMITS_FILE
    a = SharedLimits(5, 3, table, 0, 2)
    b = SharedLimits(5, 3, table, 1, 2)
    assert a.acquire("10.0.0.1") is None
    assert a.acquire("10.0.0.1") is None
    assert b.acquire("10.0.0.1") is None
    assert b.acquire("10.0.0.1") == "too many connections from 10.0.0.1"
    assert b.acquire("10.0.0.2") is None
    assert a.acquire("10.0.0.3") is None
    assert b.acquire("10.0.0.4") == "too many connections"
    a.release("10.0.0.1")
    assert b.acquire("10.0.0.1") is None
    # A worker restarted in b's place starts from zero, and so do b's counts.
    SharedLimits(5, 3, table, 1, 2).reset_row()
    assert a.acquire("10.0.0.5") is None and a.acquire("10.0.0.6") is None


def test_a_broker_port_is_given_once_whichever_worker_asks(tmp_path: Path) -> None:
    create_state(tmp_path, 2)
    first = SharedBrokerPorts(tmp_path / BROKER_PORTS_FILE)
    second = SharedBrokerPorts(tmp_path / BROKER_PORTS_FILE)
    pool = [19001, 19002, 19003]
    x, y = Address("Node-1", 9000), Address("node-2", 9000)
    assert first.assign(x, pool) == 19001
    assert second.assign(Address("node-1", 9000), pool) == 19001  # hosts compared lowercased
    assert second.assign(y, pool) == 19002
    assert first.broker_for(19002) == (y, PLAIN)
    # A broker's TLS port is another port, given once too.
    assert first.assign(y, pool, TLS) == 19003
    assert second.assign(y, pool, TLS) == 19003 and second.broker_for(19003) == (y, TLS)
    assert second.port_of(y, TLS) == 19003 and second.port_of(x, TLS) is None
    assert first.assign(Address("node-3", 9000), pool) is None  # every port has a broker
    assert first.assign(y, pool) == 19002
    # A name the journal cannot hold is refused, not given a port; a line
    # not written by assign() is never read as one.
    for bad in ("", "a b", "bad\udcff"):
        with pytest.raises(ValueError, match="cannot be given a port"):
            first.assign(Address(bad, 9000), [19004])
    with open(tmp_path / BROKER_PORTS_FILE, "a") as journal:
        journal.write("19004 node-9\nx node-9 9000\n19005 node-9 9000 quic\n")
        journal.write("19006 node-7 9000\n")  # before TLS ports: the main listener's kind
    assert SharedBrokerPorts(tmp_path / BROKER_PORTS_FILE).by_port == {}  # nothing read yet
    third = SharedBrokerPorts(tmp_path / BROKER_PORTS_FILE, main_kind=TLS)
    assert third.broker_for(19004) is None and third.broker_for(19005) is None
    assert third.broker_for(19001) == (Address("node-1", 9000), PLAIN)
    assert third.broker_for(19006) == (Address("node-7", 9000), TLS)


def test_cursus_workers_need_listener_ports() -> None:
    broker = parse_broker_url("pulsar://127.0.0.1:9000")
    with pytest.raises(ConfigError, match="--listener-ports"):
        ProxyConfig(broker=broker, protocol="cursus", listen=Address("127.0.0.1", 0), workers=2)
    ProxyConfig(broker=broker, protocol="cursus", listen=Address("127.0.0.1", 0), workers=2,
                listener_ports=(19000, 19009))  # fmt: skip
    # Keeping ports across restarts means keeping --listener-ports ports.
    with pytest.raises(ConfigError, match="--broker-ports-file keeps the ports of"):
        ProxyConfig(broker=broker, protocol="cursus", listen=Address("127.0.0.1", 0),
                    broker_ports_file=Path("ports"))  # fmt: skip


def test_workers_auto_and_bad_values() -> None:
    assert parse_workers("auto") == available_cpus() >= 1
    assert available_cpus() <= len(os.sched_getaffinity(0))
    assert parse_workers("3") == 3
    with pytest.raises(ConfigError, match="number or auto"):
        parse_workers("many")


def test_merged_metrics_sum_counters_and_keep_the_worst_up() -> None:
    def text(frames: float, up: float) -> str:
        return (f'# TYPE sluice_frames_total counter\nsluice_frames_total{{d="in"}} {frames}\n'
                f"# TYPE sluice_upstream_up gauge\nsluice_upstream_up {up}\n")  # fmt: skip

    merged = {f.name: f for f in _Merged([text(3, 1), text(4, 0)]).collect()}
    (frames,) = merged["sluice_frames"].samples
    assert frames.value == 7.0
    (up,) = merged["sluice_upstream_up"].samples
    assert up.value == 0.0


async def test_the_supervisor_takes_faults_slash_for_no_rule() -> None:
    """DELETE /faults/ (``sluice faults remove ""``) names no rule: a 400,
    and the supervisor's rule set (every worker's) stays whole."""
    config = ProxyConfig(broker=parse_broker_url("pulsar://127.0.0.1:6650"),
                         admin=Address("127.0.0.1", 0), admin_token=TOKEN)  # fmt: skip
    supervisor = Supervisor(config, 2)  # no worker running: nothing to tell
    try:
        auth = {"authorization": f"Bearer {TOKEN}"}
        rule = json.dumps({"match": {"command": "SEND"}, "action": "drop"}).encode()
        assert (await supervisor.faults(AdminRequest("POST", "/faults", auth, rule)))[0] == 201
        with pytest.raises(Refused) as refused:
            await supervisor.faults(AdminRequest("DELETE", "/faults/", auth, b""))
        assert refused.value.status == 400 and "no rule id" in refused.value.message
        assert [r["id"] for r in supervisor.rules] == ["f1"]
    finally:
        shutil.rmtree(supervisor._state, ignore_errors=True)


async def test_the_supervisor_holds_at_most_a_thousand_rules() -> None:
    """As one process does (POST /faults past MAX_RULES: 400): the
    supervisor's rule set, which every worker is given, had no bound."""
    config = ProxyConfig(broker=parse_broker_url("pulsar://127.0.0.1:6650"),
                         admin=Address("127.0.0.1", 0), admin_token=TOKEN)  # fmt: skip
    supervisor = Supervisor(config, 2)  # no worker running: nothing to tell
    try:
        auth = {"authorization": f"Bearer {TOKEN}"}
        supervisor.rules = [{"id": f"r{n}", "action": "drop", "match": {}} for n in range(1000)]
        rule = json.dumps({"action": "drop"}).encode()
        with pytest.raises(Refused) as refused:
            await supervisor.faults(AdminRequest("POST", "/faults", auth, rule))
        assert refused.value.status == 400 and "at most 1000 fault rules" in refused.value.message
        assert len(supervisor.rules) == 1000
    finally:
        shutil.rmtree(supervisor._state, ignore_errors=True)


def test_summed_counters_never_go_down_when_a_worker_is_stuck_or_restarted() -> None:
    def text(opened: int, active: int) -> str:
        return ("# TYPE sluice_connections_opened_total counter\n"
                f'sluice_connections_opened_total{{listener="plain"}} {opened}\n'
                "# TYPE sluice_connections_active gauge\n"
                f'sluice_connections_active{{listener="plain"}} {active}\n')  # fmt: skip

    totals = _Totals()
    numbers = iter(range(100))

    def summed(answers: dict[int, tuple[int, str]], number: int = -1) -> tuple[float, float]:
        counts = {i: (pid, _counters(t)) for i, (pid, t) in answers.items()}
        used, carried = totals.scraped(counts, next(numbers) if number < 0 else number)
        texts = [answers[i][1] for i in sorted(used)]
        found = {s.name: s.value for f in _Merged(texts, carried).collect()
                 for s in f.samples}  # fmt: skip
        return found["sluice_connections_opened_total"], found.get("sluice_connections_active", 0)

    assert summed({0: (10, text(5, 2)), 1: (11, text(7, 3))}) == (12, 5)
    # Worker 1 stuck: its count stays in (its gauge does not).
    assert summed({0: (10, text(6, 2))}) == (13, 2)
    # Worker 1 restarted (a new pid): what the old one said is kept.
    assert summed({0: (10, text(6, 2)), 1: (12, text(1, 1))}) == (14, 3)
    assert summed({0: (13, text(0, 0)), 1: (12, text(2, 1))}) == (15, 1)
    # Gone before it ever answered again: still counted.
    assert summed({1: (12, text(2, 1))}) == (15, 1)
    # Two scrapes at once, the one asked first ending last with the old pid's
    # answer: left out (it counted the worker as replaced twice).
    asked_first = next(numbers)
    assert summed({0: (20, text(4, 0)), 1: (12, text(2, 1))}) == (19, 1)  # asked second
    assert summed({0: (13, text(1, 0))}, asked_first) == (19, 0)  # (no gauge answered)
    assert summed({0: (20, text(4, 0)), 1: (12, text(2, 1))}) == (19, 1)


def test_a_removed_rules_carried_hits_are_forgotten() -> None:
    """Hits a replaced worker counted for rule x are carried in the sums,
    until x is removed: a new rule x starts at 0 (it showed the old hits)."""

    def rules(**hits: int) -> _Counts:
        return {"faults": ("", "counter", {("hits", (("id", k),)): float(v)
                                          for k, v in hits.items()})}  # fmt: skip

    totals = _Totals()
    totals.scraped({0: (100, rules(x=50, y=1))}, 0)
    _, carried = totals.scraped({0: (200, rules(x=2, y=0))}, 1)  # replaced: pid 100's kept
    assert carried["faults"][2] == {("hits", (("id", "x"),)): 50.0, ("hits", (("id", "y"),)): 1.0}
    totals.forget(("id", "x"))
    _, carried = totals.scraped({0: (200, rules(x=0, y=0))}, 2)
    assert carried["faults"][2] == {("hits", (("id", "y"),)): 1.0}
    totals.forget(None)
    assert totals.scraped({0: (200, rules(y=0))}, 3)[1] == {"faults": ("", "counter", {})}


async def test_a_start_that_cannot_bind_leaves_nothing_behind() -> None:
    """A port in use: the start fails (the error plain), and the state
    directory the supervisor made is gone (one was left per failed start)."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        listen = Address("127.0.0.1", taken.getsockname()[1])
        config = ProxyConfig(broker=parse_broker_url("pulsar://127.0.0.1:6650"), listen=listen)
        supervisor = Supervisor(config, 2)
        assert supervisor._state.is_dir()
        with pytest.raises(OSError):
            await supervisor.open()
        assert not supervisor._state.exists()
    finally:
        taken.close()


def test_readiness_of_workers_at_start_and_after() -> None:
    """/readyz: at start, ready once every worker is; afterwards, ready while
    one worker runs and reaches the broker (a restart or one worker's failed
    probe does not take a sidecar's pod out of its Service); never while
    draining."""
    supervisor = Supervisor(ProxyConfig(broker=parse_broker_url("pulsar://127.0.0.1:6650")), 2)
    first, second = supervisor.workers

    def run(worker: Worker, problem: str | None) -> None:  # as _run_worker, _watch_readiness
        worker.process = SimpleNamespace(returncode=None)  # type: ignore[assignment]
        worker.admin, worker.problem = Address("127.0.0.1", 1), problem

    upstream = frozenset({"upstream"})  # /readyz?exclude=upstream: listening is enough
    assert supervisor.readiness() == ["worker 0 starting", "worker 1 starting"]
    assert supervisor.readiness(upstream) == ["worker 0 starting", "worker 1 starting"]
    run(first, "")
    run(second, None)  # listening, not yet asked
    assert supervisor.readiness() == ["worker 1 starting"]
    run(second, "upstream pulsar://127.0.0.1:6650 not checked yet")
    assert supervisor.readiness() == ["worker 1: upstream pulsar://127.0.0.1:6650 not checked yet"]
    assert supervisor.readiness(upstream) == []
    run(second, "")
    supervisor.started = True  # as _watch_readiness sets it on seeing this
    assert supervisor.readiness() == []
    second.process = None  # died; being restarted
    assert supervisor.readiness() == []
    run(second, "upstream pulsar://127.0.0.1:6650 unreachable")
    assert supervisor.readiness() == []
    run(first, "upstream pulsar://127.0.0.1:6650 unreachable")
    assert supervisor.readiness() == [
        "worker 0: upstream pulsar://127.0.0.1:6650 unreachable",
        "worker 1: upstream pulsar://127.0.0.1:6650 unreachable",
    ]
    assert supervisor.readiness(upstream) == []
    first.process = second.process = None
    assert supervisor.readiness() == ["no worker running"]
    assert supervisor.readiness(upstream) == ["no worker running"]
    run(first, "")
    supervisor.draining = True
    assert supervisor.readiness() == ["draining"]
    assert supervisor.readiness(upstream) == ["draining"]


# --- the real thing --------------------------------------------------------------------


@pytest.fixture
async def redirecting(broker: EmbeddedBroker) -> AsyncIterator[ScriptedBroker]:
    """A lookup service that sends every client to the real broker, which
    the proxy therefore learns from an answer rather than its settings."""

    async def script(request: pb.CommandLookupTopic) -> pb.CommandLookupTopicResponse:
        return redirect_to(broker.url)

    service = ScriptedBroker(script)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.serve)
        yield service
        nursery.cancel_scope.cancel()


async def test_lookup_on_one_worker_connect_on_another(
    redirecting: ScriptedBroker, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    proxy = await trio.to_thread.run_sync(
        lambda: start_proxy(
            redirecting.url, tmp_path, "--workers", "2", "--record", str(tmp_path / "rec")
        )
    )
    try:
        pids = await trio.to_thread.run_sync(worker_pids, proxy, 2)
        assert sorted(pids) == [0, 1], proxy.log()
        address = Address("127.0.0.1", proxy.port)
        # Only worker 0 accepts: the lookup is answered there (and learns the broker).
        os.kill(pids[1], signal.SIGSTOP)
        try:
            wait_stopped(pids[1])
            looking = FrameStream(await trio.open_tcp_stream(address.host, address.port))
            hello = pb.CommandConnect(client_version="tests", protocol_version=21)
            await looking.send(encode(command(Type.Value("CONNECT"), hello)))
            with trio.fail_after(10):
                assert (await looking.receive_frame()).name == "CONNECTED"  # type: ignore[union-attr]
            await lookup(looking, "persistent://public/default/split", 1)
            result = await answer(looking)
            assert result.brokerServiceUrl == broker.url
        finally:
            os.kill(pids[1], signal.SIGCONT)
        # Only worker 1 accepts: it serves the CONNECT naming the learned broker.
        os.kill(pids[0], signal.SIGSTOP)
        try:
            wait_stopped(pids[0])
            relayed = FrameStream(await trio.open_tcp_stream(address.host, address.port))
            hello.proxy_to_broker_url = f"127.0.0.1:{broker.port}"
            await relayed.send(encode(command(Type.Value("CONNECT"), hello)))
            with trio.fail_after(10):
                reply = await relayed.receive_frame()
            assert reply is not None and reply.name == "CONNECTED", reply
            await relayed.aclose()
        finally:
            os.kill(pids[0], signal.SIGCONT)
        await looking.aclose()

        # The real client, through both workers, end to end.
        def produce_consume() -> list[bytes]:
            topic = "persistent://public/default/split-real"
            with client(proxy.url) as c:
                consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
                producer = c.create_producer(topic, batching_enabled=False)
                for i in range(20):
                    producer.send(f"w{i}".encode())
                return [consumer.receive(timeout_millis=10_000).data() for _ in range(20)]

        got = await trio.to_thread.run_sync(produce_consume)
        assert sorted(got) == sorted(f"w{i}".encode() for i in range(20))
    finally:
        assert await trio.to_thread.run_sync(proxy.terminate) == 0
    # One recording from two workers: two captures, connection ids of both
    # parities (worker 0 numbers 1, 3, 5…; worker 1 numbers 2, 4, 6…), no clashes.
    recording = load(tmp_path / "rec", need_payloads=False)
    captures = {c.key[0] for c in recording.connections}
    assert len(captures) == 2
    ids = [c.key[1] for c in recording.connections]
    assert len(ids) == len(set(ids))
    by_capture = {cap: {i % 2 for c, i in (c.key for c in recording.connections) if c == cap}
                  for cap in captures}  # fmt: skip
    assert sorted(len(p) for p in by_capture.values()) == [1, 1]
    assert {p for parities in by_capture.values() for p in parities} == {0, 1}
    assert "Traceback" not in proxy.log()


@pytest.fixture
def workers_proxy(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[tuple[ProxyProcess, int]]:
    admin = free_port()
    token = tmp_path / "admin-token"
    token.write_text(TOKEN)
    proxy = start_proxy(broker.url, tmp_path, "--workers", "2", "--admin", f"127.0.0.1:{admin}",
                        "--drain-timeout", "5", "--admin-token-file", str(token))  # fmt: skip
    try:
        wait_ready(admin)  # both workers up: before that, one may serve all the traffic
        yield proxy, admin
    finally:
        stop_workers(proxy)


def stop_workers(proxy: ProxyProcess) -> None:
    """Kill the supervisor and the workers it started, by PID; no traceback logged."""
    proxy.kill()
    for pid in worker_pids(proxy, 2, timeout=0).values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert "Traceback" not in proxy.log(), proxy.log()


def test_a_killed_worker_is_restarted_and_no_send_fails(
    workers_proxy: tuple[ProxyProcess, int], topic: str
) -> None:
    proxy, admin = workers_proxy
    pids = worker_pids(proxy, 2)
    assert len(pids) == 2
    total = 600
    failures: list[BaseException] = []
    sent: list[bytes] = []
    progress = threading.Event()
    with client(proxy.url) as c:
        producer = c.create_producer(topic, batching_enabled=False, send_timeout_millis=30_000)

        def produce() -> None:
            for i in range(total):
                body = f"k-{i}".encode()
                try:
                    producer.send(body)
                    sent.append(body)
                except Exception as exc:  # asserted below
                    failures.append(exc)
                if i in (100, 300):
                    progress.set()
                time.sleep(0.003)

        thread = threading.Thread(target=produce)
        thread.start()
        # Kill each worker once while the producer sends: one of them holds
        # its connections.
        for index in (0, 1):
            assert progress.wait(30)
            progress.clear()
            os.kill(pids[index], signal.SIGKILL)
            deadline = time.monotonic() + 30
            while worker_pids(proxy, 2, timeout=0).get(index) == pids[index]:
                assert time.monotonic() < deadline, "the killed worker was not restarted"
                time.sleep(0.1)
        thread.join(120)
        assert not failures, failures[:3]
        assert len(sent) == total
    # Read back afterwards, on a connection no kill touched: a consumer cut
    # off mid-delivery depends on pulsar-lite's redelivery, not on Sluice.
    with client(proxy.url) as c:
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        received: set[bytes] = set()
        deadline = time.monotonic() + 60
        while len(received) < total and time.monotonic() < deadline:
            try:
                message = consumer.receive(timeout_millis=2000)
            except pulsar.Timeout:
                continue
            received.add(message.data())
            consumer.acknowledge(message)
        assert received == set(sent)
    samples = scrape(proxy, admin)
    assert value(samples, "sluice_worker_restarts_total") == 2
    assert value(samples, "sluice_workers", state="ready") == 2
    assert "worker 0 exited (killed by SIGKILL)" in proxy.log()


def test_a_stuck_or_restarted_worker_keeps_the_scrape_and_its_counts(
    workers_proxy: tuple[ProxyProcess, int],
) -> None:
    """A worker that does not answer (stopped here) is left out of the
    scrape after SCRAPE_TIMEOUT; the scrape answered nothing at all (the
    supervisor waited 10 s per worker, the admin request gave up first).
    Its counters count with what it said last, and a restarted worker's
    are kept: summed counters never go down (Prometheus saw a reset)."""
    proxy, admin = workers_proxy
    pids = worker_pids(proxy, 2)

    def connect() -> RawClient:
        made = RawClient(proxy.port)
        made.connect()
        return made

    clients = one_client_per_worker(pids, connect)
    try:
        deadline = time.monotonic() + 30
        while value(scrape(proxy, admin), "sluice_connections_opened_total", listener="plain") < 2:
            assert time.monotonic() < deadline, "the two connections were not counted"
            time.sleep(0.1)
        before = value(scrape(proxy, admin), "sluice_connections_opened_total", listener="plain")
        with stopped([pids[0]]):
            started = time.monotonic()
            samples = scrape(proxy, admin)
            took = time.monotonic() - started
        assert took < SCRAPE_TIMEOUT + 3, took
        # ... and counts with what it said last: the sum does not go down.
        assert value(samples, "sluice_connections_opened_total", listener="plain") >= before
        assert value(samples, "sluice_workers", state="configured") == 2
        # A worker restarted leaves its counts behind (no counter reset).
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while worker_pids(proxy, 2, timeout=0).get(0) == pids[0] or (
            value(samples := scrape(proxy, admin), "sluice_workers", state="ready") < 2
        ):
            assert time.monotonic() < deadline, "worker 0 was not restarted"
            assert value(samples, "sluice_connections_opened_total", listener="plain") >= before
            time.sleep(0.1)
        assert value(samples, "sluice_connections_opened_total", listener="plain") >= before
    finally:
        for made in clients:
            made.close()


def test_merged_metrics_match_the_clients_counts(
    workers_proxy: tuple[ProxyProcess, int], topic: str
) -> None:
    proxy, admin = workers_proxy
    clients, per_client = 4, 25
    for n in range(clients):  # separate clients: connections spread over the workers
        with client(proxy.url) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            for i in range(per_client):
                producer.send(f"{n}-{i}".encode())
    samples = scrape(proxy, admin)
    messages = value(
        samples, "sluice_topic_messages_total", topic=topic, direction="client_to_broker"
    )
    assert messages == clients * per_client
    assert value(samples, "sluice_sessions_total", kind="proxied") == clients
    assert value(samples, "sluice_sessions_total", kind="lookup") == clients
    assert value(samples, "sluice_upstream_up") == 1
    status, _ = http_get(f"http://127.0.0.1:{admin}/readyz")
    assert status == 200


def test_sigterm_drains_every_worker(workers_proxy: tuple[ProxyProcess, int], topic: str) -> None:
    proxy, _ = workers_proxy
    pids = worker_pids(proxy, 2)
    with client(proxy.url) as c:
        producer = c.create_producer(topic, batching_enabled=False)
        producer.send(b"before")
        started = time.monotonic()
        assert proxy.terminate(timeout=30) == 0
        assert time.monotonic() - started < 5 + 5
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    log = proxy.log()
    assert log.count("SIGTERM: draining") == 1, log  # the supervisor's
    # Each worker told on its stdin (a signal may have reached it already).
    assert log.count("the supervisor drains: draining") == 2, log


def test_a_draining_proxy_with_workers_refuses_new_clients_at_once(
    workers_proxy: tuple[ProxyProcess, int], topic: str
) -> None:
    """SIGTERM stops accepting at once, workers or not: while a send waits
    for its receipt (delayed by a fault rule, so the drain lasts), a new
    client is refused and the port is free for a new proxy. (The
    supervisor kept its copy of the listener: the kernel took connections
    that nobody would accept until the drain ended.)"""
    proxy, admin = workers_proxy
    port = int(proxy.url.rsplit(":", 1)[1])
    where = f"127.0.0.1:{admin}"
    rule = {"match": {"command": "SEND_RECEIPT"}, "action": "delay", "delay_ms": 4000}
    call(where, "POST", "/faults", TOKEN, rule)
    with client(proxy.url) as c:
        producer = c.create_producer(topic, batching_enabled=False)
        producer.send_async(b"waits", lambda result, message_id: None)
        # Its receipt held by the rule: the drain waits for it. (A fixed
        # half second was not always enough for the send to get there.)
        wait_until(lambda: call(where, "GET", "/faults")["rules"][0]["hits"] >= 1, 30,
                   "the send's receipt held by the delay rule")  # fmt: skip
        os.kill(proxy.pid, signal.SIGTERM)
        deadline = time.monotonic() + 3
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except ConnectionRefusedError:
                break
            assert time.monotonic() < deadline, "still accepting after SIGTERM"
            time.sleep(0.05)
        assert proxy.process.poll() is None  # still draining, no longer accepting
    assert proxy.process.wait(timeout=30) == 0


def test_fault_rules_reach_every_worker_and_their_hits_add_up(
    workers_proxy: tuple[ProxyProcess, int], topic: str
) -> None:
    proxy, admin = workers_proxy
    where = f"127.0.0.1:{admin}"
    pids = worker_pids(proxy, 2)
    rule = {"match": {"command": "SEND_RECEIPT"}, "action": "delay", "delay_ms": 1}
    assert call(where, "POST", "/faults", TOKEN, rule)["id"] == "f1"
    for n in range(4):  # separate clients: their connections land on either worker
        with client(proxy.url) as c:
            producer = c.create_producer(topic, batching_enabled=False)
            for i in range(5):
                producer.send(f"{n}-{i}".encode())
    (listed,) = call(where, "GET", "/faults")["rules"]
    assert listed["hits"] == 20
    # A restarted worker gets the rule set too.
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while (
        worker_pids(proxy, 2, timeout=0).get(0) == pids[0]
        or value(scrape(proxy, admin), "sluice_workers", state="ready") < 2
    ):
        assert time.monotonic() < deadline, "worker 0 was not restarted"
        time.sleep(0.1)
    new_pid = worker_pids(proxy, 2, timeout=0)[0]
    os.kill(pids[1], signal.SIGSTOP)  # only the new worker 0 accepts now
    try:
        wait_stopped(pids[1])
        with client(proxy.url) as c:
            c.create_producer(topic, batching_enabled=False).send(b"after restart")
        # Worker 1 stopped: left out after SCRAPE_TIMEOUT, counting with
        # what it said last; the old worker 0's hits kept: 20 + 1.
        started = time.monotonic()
        (listed,) = call(where, "GET", "/faults")["rules"]
        assert time.monotonic() - started < SCRAPE_TIMEOUT + 3
        assert listed["hits"] == 21 and new_pid != pids[0]
    finally:
        os.kill(pids[1], signal.SIGCONT)
    (listed,) = call(where, "GET", "/faults")["rules"]
    assert listed["hits"] == 21
    assert call(where, "DELETE", "/faults", TOKEN) == {"deleted": 1}
    assert call(where, "GET", "/faults") == {"rules": []}


async def test_a_worker_that_resets_the_admin_call_is_an_oserror() -> None:
    """A worker killed while the supervisor polls it resets the connection.
    That must reach the supervisor as OSError (a worker gone), which its
    pollers expect; trio's BrokenResourceError took the whole proxy down."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def reset_the_first_caller() -> None:
        conn, _ = listener.accept()
        conn.recv(1024)  # the request arrived: now die without an answer
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # linger 0: RST, as from a killed process

    thread = threading.Thread(target=reset_the_first_caller)
    thread.start()
    try:
        with pytest.raises(OSError, match=re.escape("worker admin at 127.0.0.1")):
            await http(Address("127.0.0.1", port), "GET", "/readyz")
    finally:
        await trio.to_thread.run_sync(thread.join, 10)
        listener.close()


@pytest.mark.e2e
async def test_cursus_workers_share_the_per_broker_ports(tmp_path: Path) -> None:
    """Two workers in front of three Cursus nodes: the producer follows
    replies to the two other leaders' ports (of --listener-ports, bound by
    the supervisor). Each worker is then killed in turn: the restarted ones
    serve the ports their dead siblings gave the brokers, no broker gets a
    second port, and everything produced is streamed back."""
    low = free_port()
    async with open_cluster(3, keepalive=0.3) as cluster:
        ports = f"{low}-{low + 15}"
        proxy = await in_thread(start_proxy, f"cursus://{cluster.address}", tmp_path,
                                "--workers", "2", "--listener-ports", ports)  # fmt: skip
        pids: dict[int, int] = {}
        try:
            pids = await in_thread(worker_pids, proxy, 2)
            assert len(pids) == 2, proxy.log()
            address = f"127.0.0.1:{proxy.port}"
            first = [f"w{i}" for i in range(12)]
            assert await in_thread(produce, address, "spread", first, 3) == 12
            assert {cluster.leader_of("spread", p).index for p in range(3)} == {0, 1, 2}
            for index in (0, 1):
                os.kill(pids[index], signal.SIGKILL)
                with trio.fail_after(30):
                    while (await in_thread(worker_pids, proxy, 2, 0)).get(index) == pids[index]:
                        await trio.sleep(0.1)
            pids = await in_thread(worker_pids, proxy, 2)
            second = [f"x{i}" for i in range(12)]
            assert await in_thread(produce, address, "spread", second, 3) == 12
            await collect_all(address, "spread", "g", ConsumerMode.STREAMING, first + second,
                              "24 messages streamed")  # fmt: skip
            given = set(re.findall(r"port (\d+) stands for broker (\S+)", proxy.log()))
            assert len(given) == 2, given  # one port for each of the two other nodes
            assert all(low <= int(port) <= low + 15 for port, _ in given)
        finally:
            kill_with_workers(proxy, pids)
        assert "Traceback" not in proxy.log(), proxy.log()


# --- a supervisor killed with SIGKILL --------------------------------------------------

# docs/reliability.md: after a SIGKILL of the supervisor, its ports are free
# within this many seconds (the workers see the end-of-file on their stdin at
# once and close their listeners first; the fallback check runs every second).
PORT_FREE_WITHIN = 2.0


def bindable(port: int) -> bool:
    """Whether a new proxy could listen on loopback ``port`` now (with
    SO_REUSEADDR, as trio's listeners and the supervisor's are)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            probe.listen()
        except OSError:
            return False
        return True


def gone_by_end_of_file(log: str, supervisor: int) -> list[int]:
    """The workers (by index) that saw the supervisor go by the end of file on
    their stdin, not by the once-a-second fallback (a new parent)."""
    said = rf"w(\d+) [\w.]+: the supervisor \(pid {supervisor}\) is gone \(end of file on stdin\)"
    return sorted(int(w) for w in re.findall(said, log))


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie waits for init only


@dataclass
class Killed:
    """What a SIGKILL of the supervisor left: seconds until its ports could be
    bound again and until its last worker had exited."""

    ports_free: float
    workers_gone: float


def kill_supervisor(proxy: ProxyProcess, workers: dict[int, int], ports: list[int],
                    drain_timeout: float) -> Killed:  # fmt: skip
    """SIGKILL the supervisor and time the aftermath; asserts the bound on
    the ports and that every worker exits within its drain timeout."""
    proxy.kill()
    killed = time.monotonic()
    waiting = set(ports)
    while waiting:
        waiting = {port for port in waiting if not bindable(port)}
        freed = time.monotonic() - killed
        assert freed < PORT_FREE_WITHIN or not waiting, f"ports {sorted(waiting)} still taken"
        time.sleep(0.01)
    deadline = killed + drain_timeout + 5
    while any(alive(pid) for pid in workers.values()):
        assert time.monotonic() < deadline, f"workers outlived their supervisor: {workers}"
        time.sleep(0.02)
    return Killed(freed, time.monotonic() - killed)


@dataclass
class SupervisorKill:
    """Producers through both workers of a supervisor SIGKILLed mid-run, and
    a new proxy on the same port (the scenario of the test and of
    bench/soak.py)."""

    producers: int
    attempted: int
    acked: set[bytes]
    failures: list[BaseException]
    consumed: set[bytes]
    killed: Killed
    log: str
    supervisor: int
    workers: dict[int, int]  # index -> pid


def kill_a_supervisor_under_load(
    broker_url: str, tmp_path: Path, topic: str, per_producer: int = 150
) -> SupervisorKill:
    port, admin = free_port(), free_port()
    proxy = start_proxy(broker_url, tmp_path, "--workers", "2", "--drain-timeout", "3",
                        "--admin", f"127.0.0.1:{admin}", port=port)  # fmt: skip
    successor: ProxyProcess | None = None
    pids = worker_pids(proxy, 2)
    clients: list[pulsar.Client] = []
    try:
        wait_ready(admin)

        def connect() -> pulsar.Producer:
            c = pulsar.Client(proxy.url, operation_timeout_seconds=30, logger=QUIET)
            clients.append(c)
            return c.create_producer(topic, batching_enabled=False, send_timeout_millis=60_000)

        producers = one_client_per_worker(pids, connect)
        assert all(holds_a_client(pid, port) for pid in pids.values())
        acked: set[bytes] = set()
        failures: list[BaseException] = []
        progress = threading.Event()

        def produce(n: int, producer: pulsar.Producer) -> None:
            for i in range(per_producer):
                body = f"{n}-{i}".encode()
                try:
                    producer.send(body)
                    acked.add(body)
                except Exception as exc:  # the caller's to judge
                    failures.append(exc)
                if i == per_producer // 3:
                    progress.set()
                time.sleep(0.005)

        threads = [threading.Thread(target=produce, args=(n, p)) for n, p in enumerate(producers)]
        for thread in threads:
            thread.start()
        assert progress.wait(30)
        killed = kill_supervisor(proxy, pids, [port, admin], drain_timeout=3)
        successor = start_proxy(broker_url, tmp_path, port=port)
        for thread in threads:
            thread.join(300)
        consumed: set[bytes] = set()
        with client(successor.url) as c:
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            deadline = time.monotonic() + 60
            while not consumed >= acked and time.monotonic() < deadline:
                with contextlib.suppress(pulsar.Timeout):
                    message = consumer.receive(timeout_millis=2000)
                    consumed.add(message.data())
                    consumer.acknowledge(message)
        return SupervisorKill(len(producers), per_producer * len(producers), acked, failures,
                              consumed, killed, proxy.log(), proxy.pid, pids)  # fmt: skip
    finally:
        for c in clients:
            c.close()
        kill_with_workers(proxy, pids)
        if successor is not None:
            successor.kill()


def test_a_killed_supervisor_takes_its_workers_and_frees_the_port(
    broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    """SIGKILL the supervisor while producers send through both workers: the
    workers close the port at once, drain and exit; a new proxy on the same
    port takes the clients' resends, and nothing acknowledged is lost."""
    o = kill_a_supervisor_under_load(broker.url, tmp_path, topic)
    print(f"port free {o.killed.ports_free * 1000:.0f} ms, workers gone "
          f"{o.killed.workers_gone * 1000:.0f} ms after the SIGKILL")  # fmt: skip
    assert not o.failures, o.failures[:3]
    assert len(o.acked) == o.attempted
    assert o.consumed >= o.acked, f"{len(o.acked - o.consumed)} acknowledged, not stored"
    # Two workers, each seen gone (kill_supervisor waits for both pids); the
    # workers write to the supervisor's log file, which outlives it: each saw
    # the end of file on its stdin (the fallback would free the ports too).
    assert sorted(o.workers) == [0, 1] and len(set(o.workers.values())) == 2, o.workers
    assert o.supervisor not in o.workers.values()
    assert gone_by_end_of_file(o.log, o.supervisor) == [0, 1], o.log
    assert "Traceback" not in o.log


@pytest.mark.e2e
async def test_a_killed_cursus_supervisor_frees_every_per_broker_port(tmp_path: Path) -> None:
    """The same for Cursus: a producer sends through the per-broker ports of
    two workers, the supervisor is SIGKILLed, every port is free within the
    bound, and a new proxy on the same ports takes the producer's resends."""
    low, port = free_port(), free_port()
    ports = f"{low}-{low + 15}"
    async with open_cluster(3, keepalive=0.3) as cluster:
        upstream = f"cursus://{cluster.address}"
        # The ports the brokers were given outlive the proxy: the producer
        # below knows two of them when its proxy dies.
        keep = ("--listener-ports", ports, "--broker-ports-file", str(tmp_path / "broker-ports"))
        workers = (*keep, "--workers", "2", "--drain-timeout", "3")
        proxy = await in_thread(partial(start_proxy, upstream, tmp_path, *workers, port=port))
        successor: ProxyProcess | None = None
        pids: dict[int, int] = {}
        try:
            pids = await in_thread(worker_pids, proxy, 2)
            address = f"127.0.0.1:{port}"
            first = [f"a{i}" for i in range(12)]
            assert await in_thread(produce, address, "spread", first, 3) == 12
            given = [int(p) for p, _ in re.findall(r"port (\d+) stands for broker (\S+)",
                                                    proxy.log())]  # fmt: skip
            assert len(given) == 2, proxy.log()
            second = [f"b{i}" for i in range(300)]
            producing = trio.Event()
            workers_gone = threading.Event()
            acked: list[int] = []

            def produce_across() -> None:
                producer = Producer(ProducerConfig(topic="spread", brokers=[address], partitions=3,
                                                   linger_ms=5, flush_timeout_ms=60_000,
                                                   max_retries=30, max_backoff_ms=500))  # fmt: skip
                try:
                    for i, payload in enumerate(second):
                        producer.send(payload)
                        if i == 100:
                            trio.from_thread.run_sync(producing.set)
                            # The rest on the same producer, which still
                            # knows the brokers by the old proxy's ports.
                            assert workers_gone.wait(30)
                        time.sleep(0.003)
                    producer.flush()
                    acked.append(producer.unique_ack_count)
                finally:
                    producer.close()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(in_thread, produce_across)
                await producing.wait()
                killed = await in_thread(kill_supervisor, proxy, pids, [port, *given], 3)
                print(f"ports free {killed.ports_free * 1000:.0f} ms after the SIGKILL")
                workers_gone.set()
                successor = await in_thread(
                    partial(start_proxy, upstream, tmp_path, *keep, port=port)
                )
            assert acked == [300]
            await collect_all(address, "spread", "g", ConsumerMode.STREAMING, first + second,
                              "312 messages streamed")  # fmt: skip
        finally:
            kill_with_workers(proxy, pids)
            if successor is not None:
                successor.kill()
        assert sorted(pids) == [0, 1] and len(set(pids.values())) == 2, pids
        assert gone_by_end_of_file(proxy.log(), proxy.pid) == [0, 1], proxy.log()


# --- admin ports -----------------------------------------------------------------------


def listening(pid: int) -> set[tuple[str, int]]:
    """The IPv4 addresses process ``pid`` listens on."""
    return {local for local, remote in tcp_connections(pid) if remote == ("0.0.0.0", 0)}


def test_workers_open_no_admin_port_unless_asked(broker: EmbeddedBroker, tmp_path: Path) -> None:
    """Without --admin no process listens anywhere but on the proxy's port,
    and the --faults rules still reach every worker (with their configuration)."""
    rules = tmp_path / "faults.json"
    rules.write_text(json.dumps([{"match": {"command": "PRODUCER"}, "action": "error",
                                  "error": "AuthorizationError"}]))  # fmt: skip
    proxy = start_proxy(broker.url, tmp_path, "--workers", "2", "--drain-timeout", "2",
                        "--faults", str(rules))  # fmt: skip
    try:
        pids = worker_pids(proxy, 2)
        assert len(pids) == 2, proxy.log()
        for pid in (proxy.pid, *pids.values()):
            assert listening(pid) == {("127.0.0.1", proxy.port)}, (pid, listening(pid))
        for n in range(4):  # separate clients: their connections land on either worker
            with client(proxy.url) as c, pytest.raises(pulsar.AuthorizationError):
                c.create_producer(f"persistent://public/default/no-admin-{n}")
        assert proxy.terminate() == 0
    finally:
        stop_workers(proxy)


def test_with_admin_the_workers_admin_ports_are_private(
    workers_proxy: tuple[ProxyProcess, int],
) -> None:
    proxy, admin = workers_proxy
    pids = worker_pids(proxy, 2)
    assert listening(proxy.pid) == {("127.0.0.1", proxy.port), ("127.0.0.1", admin)}
    for pid in pids.values():
        ports = listening(pid) - {("127.0.0.1", proxy.port)}
        assert len(ports) == 1 and {host for host, _ in ports} == {"127.0.0.1"}, ports
        assert admin not in {port for _, port in ports}


def test_the_supervisors_reload_outcomes_are_series_at_zero_from_the_start() -> None:
    """With --workers the supervisor counts reloads; its refused series must
    be there before the first refusal, or an increase() over it misses a
    pod's first refused reload."""
    from prometheus_client import generate_latest

    supervisor = Supervisor(ProxyConfig(broker=parse_broker_url("pulsar://127.0.0.1:6650")), 2)
    text = generate_latest(supervisor.registry).decode()
    assert 'sluice_config_reloads_total{outcome="refused",protocol="pulsar"} 0.0' in text, text
