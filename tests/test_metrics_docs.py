"""docs/metrics.md against the metrics a proxy defines: every metric has a
row that says its real name and type, every row names a real metric, and
the label values the rows list are the ones the proxy uses."""

from __future__ import annotations

import re
from pathlib import Path

from sluice.proxy.metrics import CLOSE_REASONS, HTTP_REFUSALS, HttpMetrics, Metrics

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def rows() -> dict[str, tuple[str, str, str]]:
    """The metrics table: name -> (type, labels, meaning), a row naming
    several metrics counted once for each."""
    table: dict[str, tuple[str, str, str]] = {}
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `sluice_"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        names, kind, labels, meaning = cells[0], cells[1], cells[2], "|".join(cells[3:])
        for name in re.findall(r"`([^`]+)`", names):
            table[name] = (kind, labels, meaning)
    return table


def exposed() -> dict[str, str]:
    """What /metrics serves, HTTP listener included: exposed name -> type."""
    metrics = Metrics()
    HttpMetrics(metrics.registry)
    names = {}
    for family in metrics.exposed.collect():
        suffix = "_total" if family.type == "counter" else ""
        names[family.name + suffix] = family.type
    return names


def test_every_metric_has_a_row_with_its_name_and_type() -> None:
    table = rows()
    wrong = []
    for name, kind in exposed().items():
        if name not in table:
            wrong.append(f"{name}: no row")
        elif table[name][0] != kind:
            wrong.append(f"{name}: the row says {table[name][0]!r}, it is a {kind}")
    assert not wrong, "\n".join(wrong)


def test_every_row_names_a_metric_the_proxy_serves() -> None:
    served = exposed()
    assert sorted(name for name in rows() if name not in served) == []


def listed(cell: str, after: str) -> set[str]:
    """The words of ``cell`` in the parentheses that follow ``after``."""
    match = re.search(re.escape(after) + r" \(([^)]*)\)", cell)
    assert match, (after, cell)
    return {word.strip(" `;") for word in re.split(r"[,;]", match[1])}


def test_close_reasons_listed_are_the_ones_counted() -> None:
    meaning = rows()["sluice_connections_closed_total"][2]
    documented = {
        word for word in re.findall(r"`(\w+)`", meaning) if not word.startswith("sluice_")
    }
    assert documented == set(CLOSE_REASONS)


def test_http_refusal_reasons_listed_are_the_ones_counted() -> None:
    labels = rows()["sluice_http_refused_total"][1]
    assert listed(labels, "reason") == set(HTTP_REFUSALS)


def test_the_latency_alert_row_names_the_commands_the_rule_watches() -> None:
    rules = (DOC.parent.parent / "dashboards" / "prometheus" / "alerts.yml").read_text()
    match = re.search(r'sluice_request_duration_seconds_bucket\{command=~"([^"]+)"', rules)
    assert match
    row = next(line for line in DOC.read_text().splitlines() if "| SluiceLatencyP99High |" in line)
    named = set(re.findall(r"\b[A-Z][A-Z_]+\b", row.split("|")[2]))
    assert named == set(match[1].split("|"))
