"""What a panel's title says it shows is what its query computes."""

from __future__ import annotations

import json
from pathlib import Path

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
