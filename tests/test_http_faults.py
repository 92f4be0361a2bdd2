"""Fault rules on the HTTP listener (``match.protocol`` "http"), against
Apache Pulsar 4.0.8: a request held back, answered by Sluice with the
rule's status, or its connection closed unanswered; rules that name no
protocol keep to the binary port."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sluice.brokers.apache_pulsar import ApachePulsar
from sluice.protocols import registry
from sluice.protocols.faults import FaultError, parse_rule
from tests.test_http import start_web_proxy

RULES = [
    {"id": "slow-clusters", "match": {"protocol": "http", "command": "admin",
                                      "topic": "/admin/v2/clusters"},
     "action": "delay", "delay_ms": 800},
    {"id": "no-tenants", "match": {"protocol": "http", "topic": "/admin/v2/tenants"},
     "action": "error", "error": "503", "times": 1},
    {"id": "lost-lookup", "match": {"protocol": "http", "command": "LOOKUP"},
     "action": "drop", "times": 1},
    # Every frame of the binary port, and no HTTP request: it names no protocol.
    {"id": "every-frame", "match": {}, "action": "delay", "delay_ms": 10_000},
]  # fmt: skip


def get(url: str) -> tuple[int, str, float]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            status, body = answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read().decode(errors="replace")
    return status, body, time.monotonic() - started


def test_http_rules_delay_answer_and_drop(apache_pulsar: ApachePulsar, tmp_path: Path) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(RULES))
    web = start_web_proxy(apache_pulsar, tmp_path, apache_pulsar.http_url, "--faults", str(rules))
    try:
        status, body, took = get(web.url + "/admin/v2/clusters")
        assert (status, body) == (200, '["standalone"]') and took >= 0.8, (status, took)
        status, body, _ = get(web.url + "/admin/v2/tenants")
        assert (status, body) == (503, "Sluice: injected by sluice (fault rule no-tenants)\n")
        status, _, took = get(web.url + "/admin/v2/tenants")
        assert status == 200 and took < 8, (status, took)  # times: 1; every-frame did not hold it
        lookup = "/lookup/v2/topic/persistent/public/default/faulty"
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
            get(web.url + lookup)
        assert get(web.url + lookup)[0] == 200
        injected = {(r, a): web.metric("sluice_faults_injected_total", rule=r, action=a)
                    for r, a in (("slow-clusters", "delay"), ("no-tenants", "error"),
                                 ("lost-lookup", "drop"), ("every-frame", "delay"))}  # fmt: skip
        assert injected == {("slow-clusters", "delay"): 1, ("no-tenants", "error"): 1,
                            ("lost-lookup", "drop"): 1, ("every-frame", "delay"): 0}  # fmt: skip
        assert web.metric("sluice_http_refused_total", reason="fault") == 1
    finally:
        web.proxy.kill()
    assert "Traceback" not in web.proxy.log()


@pytest.mark.parametrize(
    ("rule", "why"),
    [
        ({"match": {"protocol": "http"}, "action": "corrupt"},
         "http rules may delay, disconnect, drop, error, not corrupt"),
        ({"match": {"protocol": "http"}, "action": "throttle", "rate": 10}, "not throttle"),
        ({"match": {"protocol": "http", "direction": "to_client"}, "action": "drop"},
         "http rules match to_broker"),
        ({"match": {"protocol": "http"}, "action": "error", "error": "ServiceNotReady"},
         "unknown error code 'ServiceNotReady'"),
        ({"match": {"protocol": "http", "command": "SEND"}, "action": "drop"},
         "unknown command 'SEND' for http"),
        ({"match": {"command": "ADMIN"}, "action": "drop"}, "unknown command 'ADMIN'"),
    ],
)  # fmt: skip
def test_http_rules_that_cannot_be(rule: dict[str, object], why: str) -> None:
    with pytest.raises(FaultError, match=why):
        parse_rule(rule, registry.all_faults())


def test_an_http_rule_reads_back_as_written() -> None:
    rule = parse_rule(RULES[1], registry.all_faults())
    assert rule.match.protocol == "http" and rule.match.command is None
    assert rule.error == "503" and rule.match.topic == "/admin/v2/tenants"
    written = {k: v for k, v in rule.to_json().items() if k not in ("hits", "seen")}
    assert parse_rule(written, registry.all_faults()).to_json() == rule.to_json()
