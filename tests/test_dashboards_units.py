"""What a panel's title says it shows is what its query computes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

GRAFANA = Path(__file__).resolve().parent.parent / "dashboards" / "grafana"


def test_bytes_per_message_is_called_a_message_size() -> None:
    """sluice_topic_messages_total counts a batch's messages one by one, so
    topic bytes over topic messages is bytes per message, not per frame (a
    batch of 100 messages is one frame of 100 times that)."""
    found = []
    for path in sorted(GRAFANA.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                if "/" in target["expr"] and "sluice_topic_messages_total" in target["expr"]:
                    found.append((panel["title"], panel["fieldConfig"]["defaults"]["unit"]))
    assert found
    for title, unit in found:
        assert "message" in title.lower() and "frame" not in title.lower(), title
        assert unit == "bytes"


def unit_of(panel: dict[str, Any], ref_id: str) -> str:
    """The unit Grafana shows query ``ref_id`` of ``panel`` in: an override
    matching its refId, else the panel's."""
    for override in panel["fieldConfig"]["overrides"]:
        matcher = override["matcher"]
        if matcher == {"id": "byFrameRefID", "options": ref_id}:
            for prop in override["properties"]:
                if prop["id"] == "unit":
                    return str(prop["value"])
    return str(panel["fieldConfig"]["defaults"]["unit"])


def test_quantiles_of_seconds_are_shown_in_seconds() -> None:
    """A quantile of a ``*_seconds`` histogram is seconds: shown with any
    other unit (the Upstream stat's dial p99 was "short"), 0.25 s reads as
    a bare 0.25 next to a 0/1 gauge and a rate."""
    found = 0
    for path in sorted(GRAFANA.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                if re.search(r"histogram_quantile\(.*_seconds_bucket", target["expr"]):
                    found += 1
                    unit = unit_of(panel, target["refId"])
                    assert unit == "s", (path.name, panel["title"], target["expr"], unit)
    assert found >= 7


def test_rates_and_gauges_are_not_shown_in_seconds() -> None:
    """The other way round: a rate or a gauge in a panel whose unit is
    seconds (an override that misses its query) would read as a time."""
    for path in sorted(GRAFANA.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                if "histogram_quantile" not in target["expr"]:
                    unit = unit_of(panel, target["refId"])
                    assert unit != "s", (path.name, panel["title"], target["expr"])


def test_no_count_over_a_window_that_moves_with_the_zoom() -> None:
    """increase() over $__rate_interval is a count over a window Grafana
    picks from the time range shown (and the scrape interval): the same
    drops read 4 at one zoom and 40 at another, in a unit ("short") that
    says neither. A rate per second reads the same at every zoom."""
    for path in sorted(GRAFANA.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                assert not re.search(r"increase\([^\]]*\[\$__rate_interval\]", target["expr"]), (
                    path.name,
                    panel["title"],
                    target["expr"],
                )
