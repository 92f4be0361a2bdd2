"""``report.html``: the page someone opens first after ``sluice analyze``.

Plain HTML with inline SVG charts: no JavaScript, no plotting library, opens
anywhere (attach it to a ticket).
"""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path
from typing import Any

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;max-width:72em;color:#222}
h1{font-size:1.6em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse}
td,th{padding:.2em .8em;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left} .bad{color:#b00020} .muted{color:#777}
"""


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    if not rows:
        return '<p class="muted">none</p>'
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title in columns)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(_fmt(row.get(key)))}</td>" for key, _ in columns)
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value * 1000:.2f} ms" if value < 10 else f"{value:.1f}"
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    return str(value)


def _line_chart(
    points: dict[str, list[tuple[str, float]]], width: int = 720, height: int = 220
) -> str:
    """A small multi-series line chart as SVG."""
    series = {name: values for name, values in points.items() if values}
    if not series:
        return '<p class="muted">no messages</p>'
    labels = sorted({label for values in series.values() for label, _ in values})
    top = max(v for values in series.values() for _, v in values) or 1.0
    pad = 40
    step = (width - 2 * pad) / max(1, len(labels) - 1)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    parts = [
        f'<svg width="{width}" height="{height}" role="img">',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        'stroke="#999"/>',
        f'<text x="4" y="{pad}" font-size="11">{top:g}</text>',
    ]
    for n, (name, values) in enumerate(sorted(series.items())):
        index = {label: v for label, v in values}
        scale = (height - 2 * pad) / top
        coords = " ".join(
            f"{pad + i * step:.1f},{height - pad - index.get(label, 0) * scale:.1f}"
            for i, label in enumerate(labels)
        )
        color = colors[n % len(colors)]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        parts.append(
            f'<text x="{width - pad - 150}" y="{16 + 14 * n}" font-size="11" '
            f'fill="{color}">{html.escape(name)}</text>'
        )
    parts.append(
        f'<text x="{pad}" y="{height - 10}" font-size="11">{html.escape(labels[0])}</text>'
    )
    parts.append(
        f'<text x="{width - pad - 110}" y="{height - 10}" font-size="11">'
        f"{html.escape(labels[-1])}</text></svg>"
    )
    return "".join(parts)


def write_report(summary: dict[str, Any], path: Path) -> None:
    per_minute: dict[str, list[tuple[str, float]]] = {}
    for row in summary["per_minute"]:
        label = _fmt(row["minute"])
        name = "published" if row["direction"] == "client_to_broker" else "delivered"
        per_minute.setdefault(name, []).append((label, float(row["messages"])))
    damaged = summary["damaged"]
    sections = [
        f"<h1>Sluice traffic report</h1><p>{summary['frames']} frames on "
        f"{summary['connections']} connections, from {summary['files']} recording files "
        f"({summary['bytes'] / 1e6:.1f} MB), analysed in {summary['seconds']:.1f} s.</p>",
        "<h2>Messages per minute</h2>" + _line_chart(per_minute),
        "<h2>Latency (request to answer, at the proxy)</h2>"
        + _table(
            summary["latency"],
            [
                ("command", "command"),
                ("count", "count"),
                ("p50", "p50"),
                ("p90", "p90"),
                ("p99", "p99"),
                ("max", "max"),
            ],
        ),
        "<h2>Busiest topics</h2>"
        + _table(
            summary["top_topics"],
            [("topic", "topic"), ("messages", "messages"), ("bytes", "bytes")],
        ),
        "<h2>Errors</h2>" + _table(summary["errors"], [("code", "code"), ("count", "count")]),
        "<h2>Sessions with validation failures</h2>"
        + _table(
            summary["invalid_sessions"],
            [
                ("capture", "capture"),
                ("conn", "connection"),
                ("client", "client"),
                ("invalid_frames", "invalid frames"),
            ],
        ),
        "<h2>Frames by command</h2>"
        + _table(
            summary["by_command"],
            [("command", "command"), ("direction", "direction"), ("count", "frames")],
        ),
        "<h2>Files</h2>"
        + (
            f'<p class="bad">{len(damaged)} damaged file(s) skipped after their last good record:'
            "</p>"
            + _table(damaged, [("file", "file"), ("records", "records read"), ("why", "problem")])
            if damaged
            else "<p>no damaged files</p>"
        )
        + (
            _table(
                summary["truncated"],
                [("file", "truncated file"), ("truncated_bytes", "incomplete bytes at the end")],
            )
            if summary["truncated"]
            else ""
        ),
    ]
    page = (
        f"<!doctype html><meta charset=utf-8><title>Sluice traffic report</title>"
        f"<style>{_STYLE}</style>" + "".join(sections)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
