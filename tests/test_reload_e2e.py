"""Configuration reload under load, against Apache Pulsar: a producer and a
consumer at a steady rate through Sluice while the configuration changes
ten times (by file, SIGHUP and the admin endpoint; one change refused).
No connection the changes did not concern is dropped, no message is lost,
and each change is in force (a fault rule answering producers of other
topics, then gone) within the stated time. Then the same with --workers:
every worker takes the same generation."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pulsar

from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.brokers.embedded import free_port
from tests.helpers.support import (
    QUIET,
    ProxyProcess,
    http_get,
    one_client_per_worker,
    start_proxy,
    worker_pids,
)
from tests.test_apache_pulsar import assert_all_valid
from tests.test_dashboards import scrape

# A change is in force within this: the file is looked at every 2 s, then
# the reload itself (settings parsed, checked, put in force).
IN_FORCE_WITHIN = 5.0
TOKEN = "reload-admin-token"
# A producer on a topic matching this is refused while the rule is in force.
PROBE = "reload-probe-*"
REFUSE_PROBES = {"id": "refuse-probes", "match": {"command": "PRODUCER", "topic": PROBE},
                 "action": "error", "error": "AuthorizationError"}  # fmt: skip


class Settings:
    """The --config file and the fault rules file it names."""

    def __init__(self, tmp: Path) -> None:
        self.path = tmp / "sluice.toml"
        self.rules = tmp / "faults.json"
        self.token = tmp / "admin.token"
        self.token.write_text(TOKEN + "\n")

    def write(self, rules: list[dict[str, Any]], **settings: Any) -> None:
        self.rules.write_text(json.dumps(rules))
        lines = [f"{k.replace('_', '-')} = {json.dumps(v)}" for k, v in settings.items()]
        body = "\n".join(["[proxy]", f"faults = {json.dumps(str(self.rules))}", *lines]) + "\n"
        part = self.path.with_suffix(".part")
        part.write_text(body)
        part.replace(self.path)  # a new file: its inode changes with it


def generation(admin: int) -> dict[str, Any]:
    status, body = http_get(f"http://127.0.0.1:{admin}/config")
    assert status == 200, body
    answer: dict[str, Any] = json.loads(body)
    return answer


def admin_reload(admin: int) -> tuple[int, dict[str, Any]]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{admin}/config/reload", method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def wait_generation(admin: int, number: int, since: float) -> float:
    """Seconds from ``since`` until generation ``number`` is in force."""
    deadline = since + IN_FORCE_WITHIN
    while (seen := generation(admin))["generation"] != number:
        assert time.monotonic() < deadline, f"generation {number} not in force: {seen}"
        time.sleep(0.05)
    return time.monotonic() - since


def probe_refused(url: str) -> bool:
    """Whether a new client's producer on a probe topic is refused."""
    c = pulsar.Client(url, operation_timeout_seconds=10, logger=QUIET)
    try:
        c.create_producer(f"persistent://public/default/reload-probe-{uuid.uuid4().hex[:8]}")
    except pulsar.AuthorizationError:
        return True
    finally:
        c.close()
    return False


class Load:
    """A producer and a consumer on one topic through Sluice, at a steady rate."""

    def __init__(self, url: str, rate: float = 50.0) -> None:
        self.topic = f"persistent://public/default/reload-load-{uuid.uuid4().hex[:8]}"
        self.client = pulsar.Client(url, operation_timeout_seconds=30, logger=QUIET)
        earliest = pulsar.InitialPosition.Earliest
        self.consumer = self.client.subscribe(self.topic, "s", initial_position=earliest)
        self.producer = self.client.create_producer(self.topic, batching_enabled=False)
        self.sent: list[bytes] = []
        self.received: list[bytes] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._interval = 1 / rate
        self._threads = [threading.Thread(target=self._produce, daemon=True),
                         threading.Thread(target=self._consume, daemon=True)]  # fmt: skip
        for thread in self._threads:
            thread.start()

    def _produce(self) -> None:
        while not self._stop.is_set():
            body = f"m-{len(self.sent)}".encode()
            try:
                self.producer.send(body)
            except Exception as exc:
                self.errors.append(f"send: {exc!r}")
                return
            self.sent.append(body)
            time.sleep(self._interval)

    def _consume(self) -> None:
        while True:
            try:
                msg = self.consumer.receive(timeout_millis=500)
            except pulsar.Timeout:
                if self._stop.is_set() and len(self.received) >= len(self.sent):
                    return
                continue
            except Exception as exc:
                self.errors.append(f"receive: {exc!r}")
                return
            self.received.append(msg.data())
            self.consumer.acknowledge(msg)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        self.client.close()


def reloading_proxy(broker: ApachePulsar, tmp: Path, *extra: str) -> tuple[ProxyProcess, int]:
    admin = free_port()
    proxy = start_proxy(broker.url, tmp, "--config", str(Settings(tmp).path),
                        "--admin", f"127.0.0.1:{admin}", "--admin-token-file",
                        str(tmp / "admin.token"), *extra)  # fmt: skip
    return proxy, admin


def test_ten_changes_under_load_drop_nothing_and_are_in_force_in_time(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    settings = Settings(tmp_path)
    settings.write([], max_connections_per_ip=1000)
    record = tmp_path / "rec"
    proxy, admin = reloading_proxy(apache_pulsar, tmp_path, "--record", str(record),
                                   "--record-flush-interval", "0.2")  # fmt: skip
    took: list[float] = []
    try:
        load = Load(proxy.url)
        try:
            assert not probe_refused(proxy.url)
            number, refusing = 1, False
            for change in range(10):
                started = time.monotonic()
                if change == 3:  # a value that does not check out: refused, nothing changes
                    settings.write([] if refusing else [REFUSE_PROBES],
                                   max_connections_per_ip="lots")  # fmt: skip
                    status, answer = admin_reload(admin)
                    assert status == 400 and answer["outcome"] == "refused", answer
                    assert answer["errors"] and "max-connections-per-ip" in answer["errors"][0]
                    assert generation(admin)["generation"] == number
                    assert probe_refused(proxy.url) == refusing
                    continue
                rules = [REFUSE_PROBES] if change % 2 == 0 else []
                settings.write(rules, max_connections_per_ip=1000 - change)
                how = ("file", "SIGHUP", "admin")[change % 3]
                if how == "SIGHUP":
                    os.kill(proxy.pid, signal.SIGHUP)
                elif how == "admin":
                    status, answer = admin_reload(admin)
                    assert status == 200 and answer["outcome"] == "applied", answer
                number += 1
                took.append(wait_generation(admin, number, started))
                assert generation(admin)["source"] == how
                refusing = bool(rules)
                assert probe_refused(proxy.url) == refusing, (change, how)
            assert number == 10
            time.sleep(0.5)  # a few more messages after the last change
        finally:
            load.stop()
        assert not load.errors, load.errors
        metrics = scrape(proxy, admin)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    # Nothing lost, nothing twice (Apache Pulsar, every message acknowledged).
    assert load.received == load.sent and len(load.sent) > 100, (len(load.sent), load.errors)
    reloads = {labels: v for (n, labels), v in metrics.items()
               if n == "sluice_config_reloads_total"}  # fmt: skip
    assert reloads[(("outcome", "applied"),)] == 9 and reloads[(("outcome", "refused"),)] == 1
    assert metrics[("sluice_config_generation", ())] == 10
    # The load's producer and consumer lived on their first connections.
    frames = assert_all_valid(record)
    for command in ("PRODUCER", "SUBSCRIBE"):
        on_topic = [f for f in frames if f["cmd"] == command and f.get("topic") == load.topic]
        assert len(on_topic) == 1, (command, on_topic)
    print(f"in force after {', '.join(f'{t:.2f}' for t in took)} s")
    assert max(took) < IN_FORCE_WITHIN


def test_every_worker_takes_the_same_generation(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    settings = Settings(tmp_path)
    settings.write([])
    proxy, admin = reloading_proxy(apache_pulsar, tmp_path, "--workers", "2")
    try:
        pids = worker_pids(proxy, 2)
        assert len(pids) == 2
        load = Load(proxy.url, rate=20)
        try:
            for number, (rules, how) in enumerate(
                [([REFUSE_PROBES], "SIGHUP"), ([], "admin"), ([REFUSE_PROBES], "file")], start=2
            ):
                started = time.monotonic()
                if how == "admin":  # the rules file alone: the watch of --config starts none
                    settings.rules.write_text(json.dumps(rules))
                else:
                    settings.write(rules)
                if how == "SIGHUP":
                    os.kill(proxy.pid, signal.SIGHUP)
                elif how == "admin":
                    status, answer = admin_reload(admin)
                    assert status == 200 and answer["outcome"] == "applied", answer
                    assert not answer["errors"], answer  # every worker reported
                wait_generation(admin, number, started)
                # A client on each worker: the rule is in force on both.
                refused = one_client_per_worker(pids, lambda: probe_refused(proxy.url))
                assert refused == [bool(rules)] * 2, (number, how, refused)
        finally:
            load.stop()
        assert not load.errors, load.errors
        metrics = scrape(proxy, admin)
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    assert load.received == load.sent and load.sent
    assert metrics[("sluice_config_generation", ())] == 4
    applied = metrics[("sluice_config_reloads_total", (("outcome", "applied"),))]
    assert applied == 3, metrics
