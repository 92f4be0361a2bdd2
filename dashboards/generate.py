"""Write Sluice's Grafana dashboards (``dashboards/grafana/*.json``).

    python dashboards/generate.py

The JSON files are the product and are committed; this script is how they
are kept consistent (same variables, units and query style on every panel).
tests/test_dashboards.py fails when the committed files differ from what
this writes, and evaluates every query against a real Prometheus.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "grafana"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Every query is scoped to the chosen proxies and protocols (Pulsar, Cursus).
SEL = 'instance=~"$instance",protocol=~"$protocol"'
RATE = "$__rate_interval"


@dataclass
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (expr, legend)
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""
    width: int = 12
    height: int = 8
    extra: dict[str, Any] = field(default_factory=dict)


def _panel(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": chr(65 + i)}
            for i, (expr, legend) in enumerate(panel.targets)
        ],
    }
    if panel.kind == "stat":
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}
    out.update(panel.extra)
    return out


def _variable(name: str, label: str, query: str, *, multi: bool = True) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": multi,
        "multi": multi,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"} if multi else {},
        "sort": 1,
    }


def dashboard(
    uid: str, title: str, panels: list[Panel], variables: list[dict[str, Any]]
) -> dict[str, Any]:
    laid: list[dict[str, Any]] = []
    x = y = row_height = 0
    for pid, panel in enumerate(panels, start=1):
        if x + panel.width > 24:
            x, y, row_height = 0, y + row_height, 0
        laid.append(_panel(panel, pid, x, y))
        x += panel.width
        row_height = max(row_height, panel.height)
    return {
        "uid": uid,
        "title": title,
        "tags": ["sluice", "pulsar", "cursus"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                _variable("protocol", "Protocol", "label_values(sluice_build_info, protocol)"),
                _variable("instance", "Proxy", "label_values(sluice_build_info, instance)"),
                *variables,
            ]
        },
        "panels": laid,
    }


def _quantile(q: float, histogram: str, by: str = "") -> str:
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) (rate({histogram}_bucket{{{SEL}}}[{RATE}])))"


def overview() -> dict[str, Any]:
    p = [
        Panel("Frames per second", [
            (f"sum by (direction) (rate(sluice_frames_total{{{SEL}}}[{RATE}]))", "{{direction}}"),
        ], "ops", description="Every frame relayed, both directions."),
        Panel("Throughput", [
            (f"sum by (direction) (rate(sluice_bytes_total{{{SEL}}}[{RATE}]))", "{{direction}}"),
        ], "Bps"),
        Panel("Frames by command", [
            (f"topk(10, sum by (command) (rate(sluice_frames_total{{{SEL}}}[{RATE}])))",
             "{{command}}"),
        ], "ops"),
        Panel("Request latency p50 / p99 (broker + network, at the proxy)", [
            (_quantile(0.5, "sluice_request_duration_seconds", "command"), "p50 {{command}}"),
            (_quantile(0.99, "sluice_request_duration_seconds", "command"), "p99 {{command}}"),
        ], "s"),
        Panel("Proxy's own delay p99", [
            (_quantile(0.99, "sluice_relay_delay_seconds", "direction"), "{{direction}}"),
        ], "s", description="From reading a chunk to writing it on: the time Sluice adds."),
        Panel("Active connections", [
            (f"sum by (listener) (sluice_connections_active{{{SEL}}})", "{{listener}}"),
        ]),
        Panel("Connections opened / rejected", [
            (f"sum(rate(sluice_connections_opened_total{{{SEL}}}[{RATE}]))", "opened"),
            (f"sum by (reason) (rate(sluice_connections_rejected_total{{{SEL}}}[{RATE}]))",
             "rejected: {{reason}}"),
        ], "cps"),
        Panel("Validation failures", [
            (f"sum by (kind, direction) (rate(sluice_validation_failures_total{{{SEL}}}[{RATE}]))",
             "{{kind}} {{direction}}"),
        ], "ops", description="Invalid frames; from clients they are rejected by default."),
        Panel("Broker errors", [
            (f"sum by (command, error) (rate(sluice_broker_errors_total{{{SEL}}}[{RATE}]))",
             "{{command}}: {{error}}"),
        ], "ops"),
        Panel("Injected faults", [
            (f"sum by (rule, action) (rate(sluice_faults_injected_total{{{SEL}}}[{RATE}]))",
             "{{rule}} {{action}}"),
        ], "ops", description="Frames fault rules acted on (sluice faults list shows the "
           "rules). Anything here was done on purpose, not by the broker."),
        Panel("Lookups", [
            (f"sum by (outcome) (rate(sluice_lookups_total{{{SEL}}}[{RATE}]))", "{{outcome}}"),
        ], "ops"),
        Panel("Lookup time: total vs upstream p99", [
            (_quantile(0.99, "sluice_lookup_duration_seconds", "part"), "{{part}}"),
        ], "s"),
        Panel("Upstream", [
            (f"min(sluice_upstream_up{{{SEL}}})", "up"),
            (_quantile(0.99, "sluice_upstream_dial_seconds"), "dial p99 (s)"),
            (f"sum(rate(sluice_upstream_dial_failures_total{{{SEL}}}[{RATE}]))", "dial failures/s"),
        ], kind="stat", width=8, height=5),
        Panel("Running versions", [
            (f"count by (version) (sluice_build_info{{{SEL}}})", "{{version}}"),
        ], kind="stat", width=8, height=5),
        Panel("Sessions", [
            (f"sum by (kind) (rate(sluice_sessions_total{{{SEL}}}[{RATE}]))", "{{kind}}"),
        ], "cps", width=8, height=5),
    ]  # fmt: skip
    return dashboard("sluice-overview", "Sluice / Overview", p, [])


def topics() -> dict[str, Any]:
    sel = f'{SEL}, topic=~"$topic"'
    p = [
        Panel("Messages per second", [
            (f"sum by (topic, direction) (rate(sluice_topic_messages_total{{{sel}}}[{RATE}]))",
             "{{topic}} {{direction}}"),
        ], "ops", description="client_to_broker: published; broker_to_client: delivered."),
        Panel("Bytes per second", [
            (f"sum by (topic, direction) (rate(sluice_topic_bytes_total{{{sel}}}[{RATE}]))",
             "{{topic}} {{direction}}"),
        ], "Bps"),
        Panel("Average frame size", [
            (f"sum by (topic, direction) (rate(sluice_topic_bytes_total{{{sel}}}[{RATE}])) / "
             f"sum by (topic, direction) (rate(sluice_topic_messages_total{{{sel}}}[{RATE}]))",
             "{{topic}} {{direction}}"),
        ], "bytes"),
        Panel("Busiest topics", [
            (f"topk(10, sum by (topic) (rate(sluice_topic_messages_total{{{SEL}}}[{RATE}])))",
             "{{topic}}"),
        ], "ops", description="Beyond --topic-metrics-limit topics share the label 'other'."),
    ]  # fmt: skip
    variables = [_variable("topic", "Topic", "label_values(sluice_topic_messages_total, topic)")]
    return dashboard("sluice-topics", "Sluice / Topics", p, variables)


def recorder() -> dict[str, Any]:
    p = [
        Panel("Frames recorded per second", [
            (f"sum(rate(sluice_recorder_frames_total{{{SEL}}}[{RATE}]))", "recorded"),
        ], "ops"),
        Panel("Bytes written per second", [
            (f"sum(rate(sluice_recorder_bytes_total{{{SEL}}}[{RATE}]))", "written"),
        ], "Bps"),
        Panel("Frames dropped", [
            (f"sum(increase(sluice_recorder_dropped_frames_total{{{SEL}}}[{RATE}]))", "dropped"),
        ], description="Recording never stalls traffic: a slow or full disk drops frames here."),
        Panel("Writer queue", [
            (f"max(sluice_recorder_queue_frames{{{SEL}}})", "frames waiting"),
        ]),
    ]  # fmt: skip
    return dashboard("sluice-recorder", "Sluice / Recorder", p, [])


DASHBOARDS = {
    "sluice-overview.json": overview,
    "sluice-topics.json": topics,
    "sluice-recorder.json": recorder,
}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, text in render().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
