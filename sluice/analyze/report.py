"""``report.html``: the page someone opens first after ``sluice analyze``.

One self-contained HTML file (attach it to a ticket): pictures drawn with
matplotlib and embedded as PNG data URLs — throughput over time per topic,
request latency distributions per command with their p50 and p99, error
codes over time, connection churn, top talkers — then the tables behind
them. No JavaScript, nothing fetched from anywhere.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import html
import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from sluice.protocols import registry

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;max-width:72em;color:#222}
h1{font-size:1.6em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse}
td,th{padding:.2em .8em;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left} .bad{color:#b00020} .muted{color:#777}
figure{margin:1em 0} img{max-width:100%;height:auto}
"""
WIDTH = 10.0  # inches, at 100 dpi
_OTHER = "(others)"  # the legend's line for the rest (a line of its own whatever it is named)
MAX_SERIES = 8


FILTERED_COLUMNS = [(name, name) for name in ("filter", "action", "reason", "topic", "messages")]


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
        # Every float in these tables is seconds (latencies, HTTP exchanges).
        return f"{value * 1000:.2f} ms" if value < 10 else f"{value:.1f} s"
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    return str(value)


def _picture(title: str, draw: Callable[[Figure], None], height: float = 3.2) -> str:
    """A matplotlib figure as an inline PNG."""
    figure = Figure(figsize=(WIDTH, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    draw(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{data}"></figure>'


def _literal(text: str) -> str:
    """Wire data (a topic, an error code, a command) as matplotlib text drawn
    as it is: text between two ``$`` would be parsed as math (and a bad
    formula fails the whole report)."""
    return text.replace("$", r"\$")


def _when(step: int, index: int) -> float:
    """Step ``index`` as a matplotlib date number (days since 1970-01-01 UTC)."""
    return index * step / 86400


def _time_axis(ax: Axes, step: int) -> None:
    ax.xaxis_date(tz=dt.UTC)  # not matplotlibrc's timezone: the label says UTC
    ax.set_xlabel(f"time (UTC), {step} s steps")
    ax.grid(True, alpha=0.3)
    for label in ax.get_xticklabels():
        label.set_rotation(20)
        label.set_horizontalalignment("right")


def _series(
    rows: list[dict[str, Any]], name: Callable[[dict[str, Any]], str | None], value: str
) -> tuple[list[int], dict[str | None, dict[int, float]]]:
    """Steps in order, and {series name: {step: summed value}}; the name
    None is the rest ("other"), kept apart from a series named "other"."""
    out: dict[str | None, dict[int, float]] = {}
    for row in rows:
        points = out.setdefault(name(row), collections.defaultdict(float))
        points[int(row["step"])] += float(row[value] or 0)
    steps = sorted({step for points in out.values() for step in points})
    return steps, out


def _counted(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows over time of frames that carry messages, with a topic: one
    of the busiest, or the rest (``other_topic``: a topic may be named "other")."""
    messages = registry.message_commands()
    return [
        r
        for r in summary["over_time"]
        if r["command"] in messages and (r["topic"] or r.get("other_topic"))
    ]


def throughput_lines(
    summary: dict[str, Any], direction: str
) -> tuple[list[int], list[tuple[str, dict[int, float]]]]:
    """The throughput picture's steps and its lines one way (legend label,
    messages per step), busiest first, the rest last as ``(others)``."""
    rows = [r for r in _counted(summary) if r["direction"] == direction]
    steps, series = _series(rows, lambda r: r["topic"] or None, "messages")
    order = sorted(series, key=lambda t: (t is None, -sum(series[t].values()), t or ""))
    return steps, [
        (_OTHER if topic is None else _literal(topic.removeprefix("persistent://")), series[topic])
        for topic in order
    ]


def throughput_values(
    summary: dict[str, Any], direction: str
) -> tuple[list[int], list[tuple[str, list[float | None]]]]:
    """The throughput picture's lines one way, as drawn: every step from the
    recordings' first frame to their last, and per line (``throughput_lines``)
    its messages per second at each, 0 where frames were recorded but none
    carried its messages, None (the line broken) where no frame at all was:
    a night the recorder was off is not drawn as traffic going on."""
    _, lines = throughput_lines(summary, direction)
    recorded = {int(r["step"]) for r in summary["over_time"]}
    if not lines or not recorded:
        return [], []
    step = int(summary["step"])
    steps = list(range(min(recorded), max(recorded) + 1))
    return steps, [
        (label, [points.get(s, 0.0) / step if s in recorded else None for s in steps])
        for label, points in lines
    ]


def throughput_picture(summary: dict[str, Any]) -> str:
    step = int(summary["step"])
    if not _counted(summary):
        return '<p class="muted">no messages</p>'

    def draw(figure: Figure) -> None:
        axes = figure.subplots(1, 2, sharey=True)
        for ax, direction, title in (
            (axes[0], "client_to_broker", "published"),
            (axes[1], "broker_to_client", "delivered"),
        ):
            steps, lines = throughput_values(summary, direction)
            for label, values in lines:
                ax.plot(
                    [_when(step, s) for s in steps],
                    [math.nan if v is None else v for v in values],
                    label=label,
                    marker="." if len(steps) < 30 else None,
                )
            ax.set_title(title)
            ax.set_ylabel("messages/s")
            _time_axis(ax, step)
            if lines:
                ax.legend(fontsize=7, loc="upper left")

    return _picture("Throughput over time per topic", draw, 3.6)


def latency_picture(summary: dict[str, Any]) -> str:
    latency = summary["latency"][:6]
    if not latency:
        return '<p class="muted">no request had an answer</p>'
    bins: dict[str, dict[int, int]] = collections.defaultdict(dict)
    for row in summary["latency_histogram"]:
        bins[row["command"]][int(row["bin"])] = int(row["count"])

    def draw(figure: Figure) -> None:
        columns = min(3, len(latency))
        grid = figure.subplots((len(latency) + columns - 1) // columns, columns, squeeze=False)
        for n, ax in enumerate(grid.flat):
            if n >= len(latency):
                ax.set_visible(False)
                continue
            row = latency[n]
            counts = bins.get(row["command"], {})
            edges = sorted(counts)
            ax.bar(
                [10 ** (b / 10) for b in edges],
                [counts[b] for b in edges],
                width=[10 ** ((b + 1) / 10) - 10 ** (b / 10) for b in edges],
                align="edge",
                color="#9ecae1",
            )
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
            for name, color in (("p50", "#2ca02c"), ("p99", "#d62728")):
                if row.get(name) is not None:
                    ax.axvline(
                        row[name],
                        color=color,
                        linestyle="--",
                        label=f"{name} {row[name] * 1000:.2f} ms",
                    )
            ax.set_title(_literal(f"{row['command']} ({row['count']:,})"), fontsize=10)
            ax.set_xlabel("seconds")
            ax.legend(fontsize=7)

    rows = (len(latency) + 2) // 3
    return _picture("Request latency distributions per command", draw, 2.6 * rows + 0.4)


def errors_picture(summary: dict[str, Any]) -> str:
    step = int(summary["step"])
    rows = [r for r in summary["over_time"] if r["code"]]
    if not rows:
        return '<p class="muted">no errors</p>'
    totals = collections.Counter[str]()
    for row in rows:
        totals[row["code"]] += int(row["frames"])
    top = {code for code, _ in totals.most_common(MAX_SERIES)}
    steps, series = _series(rows, lambda r: r["code"] if r["code"] in top else "other", "frames")

    def draw(figure: Figure) -> None:
        ax = figure.subplots()
        width = step * 0.9 / 86400
        base = [0.0] * len(steps)
        for code in sorted(series, key=lambda c: -totals.get(c or "", 0)):
            heights = [series[code].get(s, 0.0) for s in steps]
            ax.bar(
                [_when(step, s) for s in steps],
                heights,
                width=width,
                bottom=base,
                label=_literal(code or ""),
                align="edge",
            )
            base = [b + h for b, h in zip(base, heights, strict=True)]
        ax.set_ylabel("frames per step")
        ax.legend(fontsize=7, loc="upper left")
        _time_axis(ax, step)

    return _picture("Error codes over time", draw)


def churn_picture(summary: dict[str, Any]) -> str:
    step = int(summary["step"])
    churn = sorted(summary["churn"], key=lambda r: r["step"])
    if not churn:
        return '<p class="muted">no connections</p>'

    def draw(figure: Figure) -> None:
        ax = figure.subplots()
        when = [_when(step, int(r["step"])) for r in churn]
        width = step * 0.9 / 86400
        ax.bar(
            when,
            [r["opened"] for r in churn],
            width=width,
            align="edge",
            color="#2ca02c",
            label="opened",
        )
        ax.bar(
            when,
            [-r["closed"] for r in churn],
            width=width,
            align="edge",
            color="#d62728",
            label="closed",
        )
        ax.set_ylabel("connections per step")
        ax.axhline(0, color="#999", linewidth=0.8)
        twin = ax.twinx()
        open_now, level = [], 0
        for row in churn:
            level += int(row["opened"]) - int(row["closed"])
            open_now.append(level)
        twin.step(when, open_now, where="post", color="#1f77b4", label="open")
        twin.set_ylabel("open (seen in these recordings)")
        handles = ax.get_legend_handles_labels()
        extra = twin.get_legend_handles_labels()
        ax.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=7, loc="upper left")
        _time_axis(ax, step)

    return _picture("Connection churn", draw)


def talkers_picture(summary: dict[str, Any]) -> str:
    talkers = summary["top_talkers"]
    if not talkers:
        return '<p class="muted">no connections</p>'

    def draw(figure: Figure) -> None:
        ax = figure.subplots()
        names = [_literal(f"{r['host'] or '?'} ({r['connections']} conn)") for r in talkers]
        names = names[::-1]
        ax.barh(names, [(r["bytes"] or 0) / 1e6 for r in talkers][::-1], color="#9467bd")
        ax.set_xlabel("MB on the wire, both directions")
        ax.grid(True, axis="x", alpha=0.3)

    return _picture("Top talkers", draw, 0.35 * len(talkers) + 1.2)


def _dropped(frames: int) -> str:
    """What the recordings' gap records say: frames the recorder could not write."""
    if not frames:
        return ""
    return (f'<p class="bad">{frames:,} frames were dropped while recording (the recorder\'s '
            "writer fell behind): these recordings, and the tables, miss them; the "
            "<code>files</code> table's <code>dropped_frames</code> says where.</p>")  # fmt: skip


def _repeated(records: int) -> str:
    """Records counted once for each of the overlapping flight-recorder
    snapshots holding them (where Spark handed the executors the files):
    what the warning on the terminal says."""
    if not records:
        return ""
    return (f'<p class="bad">{records:,} records are in more than one flight-recorder snapshot '
            "of one capture and counted once for each (read from the contents Spark hands "
            "over, not passed over): the tables and this report count them more than once; "
            "analyze one snapshot directory at a time, or local files.</p>")  # fmt: skip


def write_report(summary: dict[str, Any], path: Path) -> None:
    damaged = summary["damaged"]
    protocols = ", ".join(f"{r['protocol']} {r['count']}" for r in summary["protocols"])
    sections = [
        f"<h1>Sluice traffic report</h1><p>{summary['frames']:,} frames on "
        f"{summary['connections']:,} connections ({html.escape(protocols or 'none')}), from "
        f"{summary['files']} recording segments ({summary['bytes'] / 1e6:,.1f} MB), analysed "
        f"in {summary['seconds']:.1f} s.</p>"
        + _dropped(summary.get("dropped_frames", 0))
        + _repeated(summary.get("repeated_records", 0)),
        "<h2>Throughput over time per topic</h2>" + throughput_picture(summary),
        "<h2>Latency (request to answer, at the proxy)</h2>"
        + latency_picture(summary)
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
        "<h2>Errors over time</h2>"
        + errors_picture(summary)
        + _table(summary["errors"], [("code", "code"), ("count", "count")]),
        "<h2>Message filters</h2>"
        + (
            _table(summary.get("filtered", []), FILTERED_COLUMNS)
            if summary.get("filtered")
            else '<p class="muted">no message filter acted</p>'
        ),
        "<h2>Connection churn</h2>" + churn_picture(summary),
        "<h2>Top talkers</h2>"
        + talkers_picture(summary)
        + _table(
            summary["top_talkers"],
            [
                ("host", "client"),
                ("connections", "connections"),
                ("frames", "frames"),
                ("bytes", "bytes"),
            ],
        ),
        "<h2>Busiest topics</h2>"
        + _table(
            summary["top_topics"],
            [("topic", "topic"), ("messages", "messages"), ("bytes", "bytes")],
        ),
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
        http_section(summary.get("http")),
        "<h2>Frames by command</h2>"
        + _table(
            by_command(summary),
            [("command", "command"), ("direction", "direction"), ("count", "frames")],
        ),
        "<h2>Bad segments</h2>"
        + (
            f'<p class="bad">{len(damaged)} damaged segment(s), read up to the damage:</p>'
            + _table(damaged, [("file", "file"), ("records", "records read"), ("why", "problem")])
            if damaged
            else "<p>no damaged segments</p>"
        )
        + (
            _table(
                summary["truncated"],
                [("file", "truncated file"), ("truncated_bytes", "incomplete bytes at the end")],
            )
            if summary["truncated"]
            else ""
        ),
        "<h2>Where the analysis took its time</h2>"
        + _table(
            [{**r, "seconds": f"{r['seconds']:.1f}"} for r in summary.get("stages", [])],
            [("stage", "stage"), ("seconds", "seconds")],
        ),
    ]
    page = (
        "<!doctype html><html lang=en><meta charset=utf-8><title>Sluice traffic report</title>"
        f"<link rel=icon href='data:,'><style>{_STYLE}</style><body>" + "".join(sections)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")  # as the page says, whatever the locale


def http_section(http: dict[str, Any] | None) -> str:
    """The HTTP listener's exchanges by kind and status class (none: nothing)."""
    if not http or not http["exchanges"]:
        return ""
    return f"<h2>HTTP exchanges</h2><p>{http['exchanges']:,} exchanges.</p>" + _table(
        http["by_kind"],
        [
            ("kind", "kind"),
            ("status", "status"),
            ("count", "exchanges"),
            ("max_seconds", "slowest s"),
            ("websocket_frames", "WebSocket frames"),
        ],
    )


def by_command(summary: dict[str, Any]) -> list[dict[str, Any]]:
    counts = collections.Counter[tuple[str, str]]()
    for row in summary["over_time"]:
        counts[(row["command"], row["direction"])] += int(row["frames"])
    return [
        {"command": command, "direction": direction, "count": count}
        for (command, direction), count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
