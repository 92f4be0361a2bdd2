"""Dashboards and alert rules against a real Prometheus scraping a real proxy."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pulsar
import pytest
import websocket
from prometheus_client.parser import text_string_to_metric_families

from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.brokers.embedded import EmbeddedBroker, free_port, wait_for_port
from sluice.protocols.pulsar import Type, command, encode, pb
from sluice.proxy.metrics import Metrics
from tests.helpers.support import (
    PrometheusProcess,
    ProxyProcess,
    RawClient,
    client,
    http_get,
    start_prometheus,
    start_proxy,
)

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "dashboards"
RULES = DASHBOARDS / "prometheus"
T = Type.Value


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate", DASHBOARDS / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_committed_dashboards_are_what_generate_py_writes() -> None:
    for name, text in generator().render().items():
        committed = DASHBOARDS / "grafana" / name
        assert committed.read_text() == text, f"{name} is stale: run dashboards/generate.py"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is not installed (./dev setup installs prometheus)"
    return subprocess.run(
        [binary, *args], cwd=RULES, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.e2e
def test_alert_rules_are_valid_and_each_alert_fires_in_its_unit_test() -> None:
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    rules = (RULES / "alerts.yml").read_text()
    tests = (RULES / "alerts_test.yml").read_text()
    for alert in re.findall(r"alert: (\w+)", rules):
        assert f"alertname: {alert}" in tests, f"{alert} has no unit test"


# --- a proxy carrying real traffic, scraped by a real Prometheus ------------


def scrape(proxy: ProxyProcess, admin: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = http_get(f"http://127.0.0.1:{admin}/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # Every metric a proxy serves says its protocol; lookups here leave it out.
            labels = dict(sample.labels)
            protocol = labels.pop("protocol", None)
            if not family.name.startswith("sluice_worker"):  # the supervisor's own
                assert protocol == "pulsar", sample
            samples[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def harmless_faults(tmp_path: Path) -> list[str]:
    """A harmless fault rule, so that the "Injected faults" panel has data:
    the arguments that give it."""
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"id": "lookup-1ms", "match": {"command": "LOOKUP"},
                                   "action": "delay", "delay_ms": 1}]))  # fmt: skip
    return ["--faults", str(faults)]


@pytest.fixture
def admin_proxy(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[tuple[ProxyProcess, int]]:
    admin = free_port()
    p = start_proxy(
        broker.url, tmp_path, "--admin", f"127.0.0.1:{admin}", *harmless_faults(tmp_path)
    )
    yield p, admin
    p.kill()
    assert "Traceback" not in p.log()


def some_filters() -> list[str]:
    """Filters on ``*-filtered`` topics, so that the "Message filters" panel
    has data (messages changed, refused, raised on): the arguments that give them."""
    words = json.dumps({"topics": ["*-filtered"], "direction": "produce"})
    raises = json.dumps({"topics": ["*-filtered"], "direction": "produce", "on-error": "open"})
    return ["--filter", f"tests.helpers.filters:Words:{words}",
            "--filter", f"tests.helpers.filters:Raises:{raises}"]  # fmt: skip


def filtered_traffic(proxy: ProxyProcess, topic: str) -> None:
    """A message of ``some_filters`` each changes, refuses and raises on."""
    with client(proxy.url) as c:
        producer = c.create_producer(f"{topic}-filtered", batching_enabled=False)
        producer.send(b"shout")  # changed, and the next filter raises (fails open)
        with pytest.raises(pulsar.PulsarException):
            producer.send(b"bad")  # refused


def varied_traffic(proxy: ProxyProcess, broker: EmbeddedBroker, topic: str) -> None:
    """Produce, consume, a corrupt SEND and a broker error, all through the proxy."""
    with client(proxy.url) as c:
        producer = c.create_producer(topic, batching_enabled=False)
        for i in range(20):
            producer.send(f"m{i}".encode())
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        for _ in range(20):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    with RawClient(proxy.port) as raw:
        name = raw.producer(broker.port, topic)
        raw.send_message(name, 1, 0, b"x", corrupt=True)
        assert raw.receive_type("SEND_ERROR").body.error == pb.ChecksumError
        # A real broker error: pulsar-lite answers SEEK for an unknown consumer
        # with ERROR UnknownError.
        seek = pb.CommandSeek(consumer_id=42, request_id=2, message_publish_time=1)
        raw.send(encode(command(T("SEEK"), seek)))
        assert raw.receive_type("ERROR").body.request_id == 2


@pytest.fixture
def web_proxy(
    broker: EmbeddedBroker, ws_broker: ApachePulsar, tmp_path: Path
) -> Iterator[tuple[ProxyProcess, int, int]]:
    """The admin proxy of ``admin_proxy`` with an HTTP listener too (--http-listen):
    binary traffic to pulsar-lite, HTTP to Apache Pulsar through a redirecting
    web server (test_http's Redirector), so that Sluice follows redirects.
    (process, admin port, HTTP port)."""
    from tests.test_http import Redirector  # test_http imports this module

    redirector = Redirector(ws_broker.http_url)
    thread = threading.Thread(target=redirector.serve_forever, daemon=True)
    thread.start()
    admin, http_port = free_port(), free_port()
    p = start_proxy(
        broker.url, tmp_path, "--admin", f"127.0.0.1:{admin}", *harmless_faults(tmp_path),
        *some_filters(),
        "--http-listen", f"127.0.0.1:{http_port}", "--broker-http", redirector.url,
        "--allow-broker", "127.0.0.1",
    )  # fmt: skip
    try:
        wait_for_port("127.0.0.1", http_port, 20, p.process)
        yield p, admin, http_port
    finally:
        p.kill()
        redirector.shutdown()
        redirector.server_close()
        thread.join(timeout=10)
    assert "Traceback" not in p.log(), p.log()


def http_traffic(http_port: int, name: str) -> websocket.WebSocket:
    """Admin and lookup requests (2xx, 4xx, and a redirect loop's 502) and
    WebSocket sessions, through the proxy; every request is redirected once
    before it reaches the broker. The WebSocket producer it returns is open."""
    base = f"http://127.0.0.1:{http_port}"
    for path, status in [
        ("/admin/v2/clusters", 200),
        (f"/admin/v2/tenants/no-such-tenant-{name}", 404),
        (f"/lookup/v2/topic/persistent/public/default/{name}", 200),
        ("/loop", 502),
    ]:
        assert http_get(base + path)[0] == status, path
    ws = f"ws://127.0.0.1:{http_port}/ws/v2"
    reader = websocket.create_connection(
        f"{ws}/reader/persistent/public/default/{name}?messageId=earliest", timeout=30
    )
    reader.close()
    producer = websocket.create_connection(
        f"{ws}/producer/persistent/public/default/{name}", timeout=30
    )
    for i in range(5):
        producer.send(json.dumps({"payload": "eA==", "context": str(i)}))
        assert json.loads(producer.recv())["result"] == "ok"
    return producer


def fill(expr: str, topic: str) -> str:
    return (
        expr.replace("$__rate_interval", "20s")
        .replace("$instance", ".*")
        .replace("$protocol", ".*")
        # As Grafana interpolates a regex value into a PromQL string literal.
        .replace("$topic", re.escape(topic).replace("\\", "\\\\"))
    )


def test_every_dashboard_query_returns_data(
    web_proxy: tuple[ProxyProcess, int, int], broker: EmbeddedBroker, tmp_path: Path, topic: str
) -> None:
    proxy, admin, http_port = web_proxy
    prom = start_prometheus(tmp_path, [f"127.0.0.1:{admin}"], [RULES / "alerts.yml"])
    producer = None
    try:
        varied_traffic(proxy, broker, topic)
        filtered_traffic(proxy, topic)
        # The HTTP counters were scraped before their traffic: rate() sees it.
        deadline = time.monotonic() + 30
        while not prom.query("sluice_http_requests_total"):
            assert time.monotonic() < deadline, "prometheus never scraped the proxy"
            time.sleep(0.2)
        producer = http_traffic(http_port, f"dashboards-{uuid.uuid4().hex[:8]}")
        # Series born during the traffic (broker errors) need samples on both
        # sides of their first increment before rate() has anything to say.
        deadline = time.monotonic() + 30
        while not prom.query("count_over_time(sluice_broker_errors_total[20s]) >= 3") or not (
            prom.query("count_over_time(sluice_filter_rejected_total[20s]) >= 3")
        ):
            assert time.monotonic() < deadline, "prometheus never scraped the proxy three times"
            time.sleep(0.5)
        # The rules file loaded into the real Prometheus, too.
        groups = prom.api("/api/v1/rules")["groups"]
        loaded = sorted(r["name"] for g in groups for r in g["rules"])
        assert loaded == sorted(re.findall(r"alert: (\w+)", (RULES / "alerts.yml").read_text()))
        # The corrupt SEND of varied_traffic fires the checksum alert, on
        # what the proxy really counted (no "for:": at once).
        deadline = time.monotonic() + 30
        while not any(
            a["labels"]["alertname"] == "SluiceChecksumFailures"
            and a["labels"].get("direction") == "client_to_broker"
            and a["state"] == "firing"
            for a in prom.api("/api/v1/alerts")["alerts"]
        ):
            assert time.monotonic() < deadline, prom.api("/api/v1/alerts")
            time.sleep(0.5)
        # Every query of the HTTP dashboard shows its traffic: above zero
        # (rates do for 20 s after it).
        http_board = json.loads((DASHBOARDS / "grafana" / "sluice-http.json").read_text())
        idle = [t["expr"] for p in http_board["panels"] for t in p["targets"]]
        assert len(idle) >= 12
        deadline = time.monotonic() + 30
        while idle := [e for e in idle if not shows_traffic(prom, fill(e, topic))]:
            assert time.monotonic() < deadline, "HTTP queries that never showed traffic:\n" + (
                "\n".join(idle)
            )
            time.sleep(0.5)
        empty = []
        checked = 0
        for path in sorted((DASHBOARDS / "grafana").glob("*.json")):
            board = json.loads(path.read_text())
            for variable in board["templating"]["list"]:
                match = re.fullmatch(
                    r"label_values\((\w+), (\w+)\)", variable.get("definition", "")
                )
                if match:
                    values = prom.api(f"/api/v1/label/{match[2]}/values", **{"match[]": match[1]})
                    assert values, f"{path.name}: variable {variable['name']} has no values"
                    if variable["name"] == "topic":
                        assert topic in values
            for panel in board["panels"]:
                for target in panel["targets"]:
                    checked += 1
                    if not prom.query(fill(target["expr"], topic)):
                        empty.append(f"{path.name} / {panel['title']}: {target['expr']}")
        assert checked >= 38
        assert not empty, "queries without data:\n" + "\n".join(empty)
    finally:
        if producer is not None:
            producer.close()
        prom.kill()


def shows_traffic(prom: PrometheusProcess, expr: str) -> bool:
    """Whether some series of ``expr`` is above zero now."""
    return any(not math.isnan(v := float(s["value"][1])) and v > 0 for s in prom.query(expr))


def test_metric_values_match_the_traffic(admin_proxy: tuple[ProxyProcess, int], topic: str) -> None:
    proxy, admin = admin_proxy
    sends, batched_messages = 25, 40
    with client(proxy.url) as c:
        producer = c.create_producer(topic, batching_enabled=False)
        for i in range(sends):
            producer.send(f"m{i}".encode())
        batched = c.create_producer(
            topic + "-batched",
            batching_enabled=True,
            batching_max_messages=10,
            batching_max_publish_delay_ms=1000,
        )
        for i in range(batched_messages):
            batched.send_async(f"b{i}".encode(), lambda res, mid: None)
        batched.flush()
        # Subscribing after publishing: pulsar-lite then delivers each entry once.
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        for _ in range(sends):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    c2b, b2c = "client_to_broker", "broker_to_client"

    def counted(samples: dict[Any, float]) -> bool:
        """The proxy has counted every frame the client has seen answered."""
        send_frames = value(samples, "sluice_frames_total", command="SEND", direction=c2b)
        return send_frames > 0 and (
            value(samples, "sluice_frames_total", command="SEND_RECEIPT", direction=b2c),
            value(samples, "sluice_request_duration_seconds_count", command="SEND"),
            value(samples, "sluice_frames_total", command="MESSAGE", direction=b2c),
        ) == (send_frames, send_frames, sends)

    # The client has its answers once the proxy has relayed them, which may
    # be a moment before the proxy's counters say so: wait for them.
    deadline = time.monotonic() + 10
    while not counted(samples := scrape(proxy, admin)) and time.monotonic() < deadline:
        time.sleep(0.05)
    send_frames = value(samples, "sluice_frames_total", command="SEND", direction=c2b)
    batches = send_frames - sends
    assert 4 <= batches < batched_messages  # batching really batched
    assert (
        value(samples, "sluice_frames_total", command="SEND_RECEIPT", direction=b2c) == send_frames
    )
    assert value(samples, "sluice_topic_messages_total", topic=topic, direction=c2b) == sends
    assert (
        value(samples, "sluice_topic_messages_total", topic=topic + "-batched", direction=c2b)
        == batched_messages
    )
    assert value(samples, "sluice_topic_messages_total", topic=topic, direction=b2c) == sends
    assert value(samples, "sluice_frames_total", command="MESSAGE", direction=b2c) == sends
    # One latency observation per receipt.
    assert value(samples, "sluice_request_duration_seconds_count", command="SEND") == send_frames
    assert value(samples, "sluice_request_duration_seconds_count", command="PRODUCER") == 2
    assert value(samples, "sluice_request_duration_seconds_count", command="SUBSCRIBE") == 1
    assert value(samples, "sluice_lookups_total", outcome="answered") >= 2
    assert value(samples, "sluice_upstream_up") == 1
    sent_bytes = value(samples, "sluice_bytes_total", command="SEND", direction=c2b)
    topic_bytes = value(samples, "sluice_topic_bytes_total", topic=topic, direction=c2b) + value(
        samples, "sluice_topic_bytes_total", topic=topic + "-batched", direction=c2b
    )
    assert sent_bytes == topic_bytes > 0


def test_topics_past_the_label_limit_are_not_remembered() -> None:
    """The label limit caps memory too: a proxy that sees many short-lived
    topics (reply topics) kept every one it ever saw (300k: 92 MB)."""
    metrics = Metrics(topic_limit=3)
    for i in range(2000):
        for direction in ("client_to_broker", "broker_to_client"):
            metrics.topic_traffic(f"persistent://public/default/reply-{i}", direction, 1, 10)
    assert len(metrics.topic_label._known) == 3
    assert len(metrics._topic_tallies) == 6
    counts = {(s.labels["topic"], s.labels["direction"]): s.value
              for f in metrics.topics.collect() if f.name == "sluice_topic_messages"
              for s in f.samples}  # fmt: skip
    assert counts[("other", "client_to_broker")] == 1997
    assert counts[("persistent://public/default/reply-0", "broker_to_client")] == 1
    assert sum(counts.values()) == 4000


def test_topic_label_limit(broker: EmbeddedBroker, tmp_path: Path, topic: str) -> None:
    admin = free_port()
    p = start_proxy(
        broker.url, tmp_path, "--admin", f"127.0.0.1:{admin}", "--topic-metrics-limit", "2"
    )
    try:
        with client(p.url) as c:
            for i in range(4):
                c.create_producer(f"{topic}-{i}", batching_enabled=False).send(b"x")
        samples = scrape(p, admin)
        labelled = {
            dict(labels)["topic"]
            for (name, labels) in samples
            if name == "sluice_topic_messages_total"
        }
        assert labelled == {f"{topic}-0", f"{topic}-1", "other"}
        assert (
            value(
                samples, "sluice_topic_messages_total", topic="other", direction="client_to_broker"
            )
            == 2
        )
    finally:
        p.kill()


def test_health_and_readiness(admin_proxy: tuple[ProxyProcess, int], tmp_path: Path) -> None:
    _proxy, admin = admin_proxy
    base = f"http://127.0.0.1:{admin}"
    assert http_get(f"{base}/healthz") == (200, "ok\n")
    # Ready once the first probe of the broker has answered, not before.
    deadline = time.monotonic() + 15
    while (answer := http_get(f"{base}/readyz")) != (200, "ready\n"):
        assert answer[0] == 503 and "upstream" in answer[1], answer
        assert time.monotonic() < deadline, answer
        time.sleep(0.1)
    assert http_get(f"{base}/nope")[0] == 404
    assert http_get(f"{base}/metrics", method="POST")[0] == 405
    assert http_get(f"{base}/metrics", method="HEAD") == (200, "")
    # A proxy whose broker is down is alive but not ready.
    dead_admin = free_port()
    dead = start_proxy(
        f"pulsar://127.0.0.1:{free_port()}",
        tmp_path,
        "--no-check-broker",
        "--connect-timeout",
        "1",
        "--admin",
        f"127.0.0.1:{dead_admin}",
    )
    try:
        assert http_get(f"http://127.0.0.1:{dead_admin}/healthz")[0] == 200
        deadline = time.monotonic() + 15
        while "unreachable" not in (answer := http_get(f"http://127.0.0.1:{dead_admin}/readyz"))[1]:
            assert answer[0] == 503 and "not checked yet" in answer[1], answer
            assert time.monotonic() < deadline, answer
            time.sleep(0.1)
        assert answer[0] == 503
        samples = scrape(dead, dead_admin)
        assert value(samples, "sluice_upstream_up") == 0
        assert value(samples, "sluice_upstream_dial_failures_total") >= 1
    finally:
        dead.kill()


def test_a_refused_reload_is_a_series_from_the_start() -> None:
    """A rule or panel over increase(...{outcome="refused"}) needs a sample
    before the first refusal, so the series is there at zero from start, or
    a pod's first refused reload never shows."""
    from prometheus_client import generate_latest

    text = generate_latest(Metrics().exposed).decode()
    for outcome in ("applied", "unchanged", "refused"):
        assert (
            f'sluice_config_reloads_total{{outcome="{outcome}",protocol="pulsar"}} 0.0' in text
        ), text
