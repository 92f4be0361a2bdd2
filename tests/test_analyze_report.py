"""``report.html`` from a summary, without Spark: wire data drawn and shown as it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sluice.analyze.report import _time_axis, throughput_lines, write_report


def _summary(topic: str, code: str, command: str) -> dict[str, Any]:
    return {
        "frames": 3, "dropped_frames": 0, "connections": 1, "files": 1, "bytes": 30,
        "seconds": 1.0, "step": 1, "protocols": [{"protocol": "pulsar", "count": 1}],
        "over_time": [
            {"step": 5, "command": "SEND", "direction": "client_to_broker", "topic": topic,
             "code": None, "frames": 3, "messages": 3, "bytes": 9},
            {"step": 6, "command": "SEND_ERROR", "direction": "broker_to_client", "topic": topic,
             "code": code, "frames": 1, "messages": 0, "bytes": 9},
        ],
        "latency": [{"command": command, "count": 1, "p50": 0.001, "p90": 0.001, "p99": 0.001,
                     "max": 0.001}],
        "latency_histogram": [{"command": command, "bin": -30, "count": 1}],
        "errors": [{"code": code, "count": 1}], "filtered": [], "churn": [],
        "top_talkers": [{"host": "10.0.0.$1$", "connections": 1, "frames": 3, "bytes": 30}],
        "top_topics": [{"topic": topic, "messages": 3, "bytes": 9}],
        "invalid_sessions": [], "damaged": [], "truncated": [], "http": None, "stages": [],
    }  # fmt: skip


def test_dollar_signs_in_wire_names_do_not_break_the_report(tmp_path: Path) -> None:
    """matplotlib takes text between two ``$`` for math: a topic, error code
    or command name from the wire with ``$\\frac$`` in it failed the whole
    report (a parse error) before labels were drawn literally."""
    topic = "persistent://t/n/a$\\frac$b<script>"
    page = tmp_path / "report.html"
    write_report(_summary(topic, "Err$\\sqrt$x", "GET$\\frac$"), page)
    text = page.read_text()
    assert "persistent://t/n/a$\\frac$b&lt;script&gt;" in text
    assert "<script>" not in text


def test_time_axes_are_utc_whatever_matplotlibrc_says() -> None:
    """The pictures' time axes say "time (UTC)": their ticks were in
    matplotlib's configured ``timezone`` (a user's matplotlibrc), hours off."""
    with matplotlib.rc_context({"timezone": "Asia/Tokyo"}):
        figure = Figure()
        FigureCanvasAgg(figure)
        ax = figure.subplots()
        ax.plot([0.0, 1 / 24], [1, 2])  # 1970-01-01 00:00 to 01:00 UTC
        _time_axis(ax, 60)
        figure.canvas.draw()
        ticks = [label.get_text() for label in ax.get_xticklabels()]
    assert "time (UTC)" in ax.get_xlabel()
    assert ticks[0] == "01 00:00" and ticks[-1] == "01 01:00", ticks


@pytest.mark.e2e
def test_the_report_is_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """The page says ``charset=utf-8``; it was written in the locale's
    encoding, so a topic named in Chinese failed the report under an ASCII
    (or Latin-1) locale, or came out as other letters. One short Python
    process under the C locale without UTF-8 mode."""
    topic = "persistent://t/n/主题-ü"
    page = tmp_path / "report.html"
    summary = json.dumps(_summary(topic, "Err", "GET"))
    script = (
        "import json, sys; from pathlib import Path; "
        "from sluice.analyze.report import write_report; "
        "write_report(json.loads(sys.argv[1]), Path(sys.argv[2]))"
    )
    env = {**os.environ, "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    done = subprocess.run([sys.executable, "-c", script, summary, str(page)], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert topic in page.read_bytes().decode("utf-8")


def test_a_topic_named_other_is_not_the_rest_of_the_topics() -> None:
    """The throughput picture draws the busiest topics and the rest as one
    more line; the job named the rest "other", so a topic named "other" (a
    Cursus topic may well be) was summed into it and drawn last. The rest
    comes as ``other_topic`` rows now, a line of its own."""
    over_time = [
        {"step": 0, "command": "BATCH", "direction": "client_to_broker", "topic": topic,
         "other_topic": rest, "code": None, "frames": 1, "messages": n, "bytes": 1}
        for topic, rest, n in (("orders", False, 9), ("other", False, 5), (None, True, 7),
                               (None, False, 100))
    ]  # fmt: skip
    summary = {"step": 1, "over_time": over_time}
    steps, lines = throughput_lines(summary, "client_to_broker")
    assert steps == [0]
    assert lines == [("orders", {0: 9.0}), ("other", {0: 5.0}), ("(others)", {0: 7.0})]
    assert throughput_lines(summary, "broker_to_client") == ([], [])


def test_latencies_of_ten_seconds_or_more_say_their_unit(tmp_path: Path) -> None:
    """The latency table showed 12.5 s as a bare "12.5" next to "9500.00 ms"
    (9.5 s): a reader took it for 12.5 ms."""
    summary = _summary("persistent://t/n/a", "Err", "LOOKUP")
    summary["latency"] = [{"command": "LOOKUP", "count": 2, "p50": 0.0125, "p90": 9.5,
                           "p99": 12.5, "max": 12.5}]  # fmt: skip
    page = tmp_path / "report.html"
    write_report(summary, page)
    text = page.read_text(encoding="utf-8")
    assert "<td>12.50 ms</td><td>9500.00 ms</td><td>12.5 s</td><td>12.5 s</td>" in text
