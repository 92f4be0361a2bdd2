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
    # Queries whose unit is not the panel's: their index -> unit (a stat
    # panel that shows a gauge, a latency and a rate side by side).
    units: dict[int, str] = field(default_factory=dict)


def _panel(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {"unit": panel.unit},
            "overrides": [
                {
                    "matcher": {"id": "byFrameRefID", "options": chr(65 + i)},
                    "properties": [{"id": "unit", "value": unit}],
                }
                for i, unit in sorted(panel.units.items())
            ],
        },
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
        Panel("Relay thread", [
            (f"sum(sluice_relay_thread_carried{{{SEL}}})", "directions carried"),
            (f"sum(rate(sluice_relay_thread_handbacks_total{{{SEL}}}[{RATE}]))",
             "handed back to trio /s"),
        ], description="Established plain-TCP connections are read by a relay thread, "
           "two directions each; a direction goes back to trio for a write that must wait "
           "(a slow reader), a fault's delay or the end of its connection."),
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
        Panel("Message filters", [
            (f"sum by (filter) (rate(sluice_filter_messages_total{{{SEL}}}[{RATE}]))",
             "{{filter}} ran on"),
            (f"sum by (filter, reason) (rate(sluice_filter_rejected_total{{{SEL}}}[{RATE}]))",
             "{{filter}} refused: {{reason}}"),
            (f"sum by (filter) (rate(sluice_filter_replaced_total{{{SEL}}}[{RATE}]))",
             "{{filter}} changed"),
            (f"sum by (filter) (rate(sluice_filter_errors_total{{{SEL}}}[{RATE}]))",
             "{{filter}} raised"),
        ], "ops", description="Messages --filter filters ran on, refused (a SEND answered "
           "with SEND_ERROR, a delivery skipped), changed, or raised on (docs/filters.md). "
           "A filter that never runs matches none of the traffic's topics or roles."),
        Panel("Lookups", [
            (f"sum by (outcome) (rate(sluice_lookups_total{{{SEL}}}[{RATE}]))", "{{outcome}}"),
        ], "ops"),
        Panel("Lookup time: total vs upstream p99", [
            (_quantile(0.99, "sluice_lookup_duration_seconds", "part"), "{{part}}"),
        ], "s"),
        Panel("Upstream", [
            (f"min(sluice_upstream_up{{{SEL}}})", "up"),
            (_quantile(0.99, "sluice_upstream_dial_seconds"), "dial p99"),
            (f"sum(rate(sluice_upstream_dial_failures_total{{{SEL}}}[{RATE}]))", "dial failures"),
        ], kind="stat", width=8, height=5, units={1: "s", 2: "ops"}),
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
        Panel("Average message size", [
            (f"sum by (topic, direction) (rate(sluice_topic_bytes_total{{{sel}}}[{RATE}])) / "
             f"sum by (topic, direction) (rate(sluice_topic_messages_total{{{sel}}}[{RATE}]))",
             "{{topic}} {{direction}}"),
        ], "bytes", description="Bytes of SEND and MESSAGE frames per message: a batch's "
           "frame shared among the messages it carries."),
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
        Panel("Frames dropped per second", [
            (f"sum(rate(sluice_recorder_dropped_frames_total{{{SEL}}}[{RATE}]))", "dropped"),
        ], "ops", description="Recording never stalls traffic: a slow or full disk drops "
           "frames here. The alert SluiceRecorderDroppingFrames fires on any."),
        Panel("Writer queue", [
            (f"max(sluice_recorder_queue_frames{{{SEL}}})", "frames waiting"),
        ]),
    ]  # fmt: skip
    return dashboard("sluice-recorder", "Sluice / Recorder", p, [])


def http() -> dict[str, Any]:
    """The HTTP listener (--http-listen): Pulsar's web port, and WebSocket."""
    requests = f"sluice_http_requests_total{{{SEL}}}"
    p = [
        Panel("HTTP requests per second", [
            (f"sum by (kind, status) (rate({requests}[{RATE}]))", "{{kind}} {{status}}"),
        ], "reqps", description="Answered, by kind (admin, lookup, websocket, other) and "
           "status class. A WebSocket upgrade the broker accepted counts as 1xx."),
        Panel("HTTP 5xx share", [
            (f'sum(rate(sluice_http_requests_total{{{SEL},status="5xx"}}[{RATE}])) / '
             f"sum(rate({requests}[{RATE}]))", "5xx"),
        ], "percentunit", description="Of every answer, the broker's own 5xx and Sluice's "
           "(502 broker unreachable or redirects refused, 503 connection cap, 504 timeout). "
           "The alert SluiceHttp5xxRate fires above 5% at 0.1 requests/s or more."),
        Panel("HTTP latency p50 / p99", [
            (_quantile(0.5, "sluice_http_request_duration_seconds", "kind"), "p50 {{kind}}"),
            (_quantile(0.99, "sluice_http_request_duration_seconds", "kind"), "p99 {{kind}}"),
        ], "s", description="Request read to answer written, redirects followed included."),
        Panel("Redirects followed", [
            (f"sum(rate(sluice_http_redirects_followed_total{{{SEL}}}[{RATE}]))", "followed"),
        ], "ops", description="Brokers' 307/308 that Sluice followed itself: the client saw "
           "one answer."),
        Panel("HTTP bytes per second", [
            (f"sum by (direction) (rate(sluice_http_bytes_total{{{SEL}}}[{RATE}]))",
             "{{direction}}"),
        ], "Bps", description="Read from and written to HTTP clients."),
        Panel("Refused by Sluice", [
            (f"sum by (reason) (rate(sluice_http_refused_total{{{SEL}}}[{RATE}]))",
             "{{reason}}"),
        ], "ops", description="Requests Sluice answered itself with an error (malformed, "
           "too large, timeouts, redirect loops) and connections it refused."),
        Panel("HTTP connections and WebSocket sessions open", [
            (f"sum(sluice_http_connections_active{{{SEL}}})", "HTTP connections"),
            (f"sum(sluice_http_websocket_sessions_active{{{SEL}}})", "WebSocket sessions"),
        ], description="A WebSocket session holds its HTTP connection."),
        Panel("WebSocket frames per second", [
            (f"sum by (direction, opcode) "
             f"(rate(sluice_http_websocket_frames_total{{{SEL}}}[{RATE}]))",
             "{{direction}} {{opcode}}"),
        ], "ops", description="Whole frames relayed after the upgrade."),
        Panel("WebSocket bytes per second", [
            (f"sum by (direction) (rate(sluice_http_websocket_bytes_total{{{SEL}}}[{RATE}]))",
             "{{direction}}"),
        ], "Bps", width=8),
        Panel("WebSocket sessions opened / ended", [
            (f"sum(rate(sluice_http_websocket_sessions_total{{{SEL}}}[{RATE}]))", "opened"),
            (f"sum by (reason) "
             f"(rate(sluice_http_websocket_sessions_ended_total{{{SEL}}}[{RATE}]))",
             "ended: {{reason}}"),
        ], "cps", width=16),
    ]  # fmt: skip
    return dashboard("sluice-http", "Sluice / HTTP", p, [])


DASHBOARDS = {
    "sluice-overview.json": overview,
    "sluice-topics.json": topics,
    "sluice-recorder.json": recorder,
    "sluice-http.json": http,
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
