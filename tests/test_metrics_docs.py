"""docs/metrics.md against the metrics a proxy defines: every metric has a
row that says its real name and type, every row names a real metric, and
the label values the rows list are the ones the proxy uses."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.addresses import Address
from sluice.protocols.pulsar.urls import parse_broker_url
from sluice.protocols.registry import protocols
from sluice.proxy.config import ProxyConfig
from sluice.proxy.metrics import CLOSE_REASONS, HTTP_REFUSALS, HttpMetrics, Metrics
from sluice.proxy.workers import Supervisor

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


def test_every_row_names_a_metric_the_proxy_serves(supervisor: Supervisor) -> None:
    served = exposed() | {
        family.name + ("_total" if family.type == "counter" else ""): family.type
        for family in supervisor.registry.collect()
    }
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


SOURCE = DOC.parent.parent / "sluice"


def literal_arguments(pattern: str) -> set[str]:
    """The string literals the source passes where ``pattern`` (a regex with
    one group) matches, over every module of the package."""
    found: set[str] = set()
    for path in SOURCE.rglob("*.py"):
        found.update(re.findall(pattern, path.read_text()))
    return found


def listed_values(cell: str, after: str) -> set[str]:
    """``listed``, a value's protocol (``Pulsar: x``) left out."""
    return {word.rpartition(":")[2].strip() for word in listed(cell, after)}


def test_rejection_reasons_listed_are_the_ones_counted() -> None:
    """Every reason a connection is refused for, in any protocol, is in the
    row (Cursus's ``no_listener``, a reply naming a broker Sluice has no
    listener for, was counted but not listed)."""
    counted = literal_arguments(r'\bRejected\("(\w+)"\)')
    for spec in protocols().values():
        metrics = Metrics(protocol=spec)
        for family in metrics.exposed.collect():
            if family.name == "sluice_connections_rejected":
                counted.update(sample.labels["reason"] for sample in family.samples)
    assert {"no_listener", "relay_refused", "tls_passthrough", "limit"} <= counted
    labels = rows()["sluice_connections_rejected_total"][1]
    assert listed_values(labels, "reason") == counted


def test_each_protocols_own_rejections_are_there_at_zero_from_the_start() -> None:
    """increase() needs a sample before the first refusal; Cursus's
    ``no_listener`` had none until one happened."""
    for spec in protocols().values():
        own = literal_arguments(r'\bRejected\("(\w+)"\)') & set(
            re.findall(r'Rejected\("(\w+)"\)', _protocol_source(spec.name))
        )
        metrics = Metrics(protocol=spec)
        present = {
            sample.labels["reason"]
            for family in metrics.exposed.collect()
            if family.name == "sluice_connections_rejected"
            for sample in family.samples
        }
        assert own <= present, (spec.name, own - present)


def _protocol_source(name: str) -> str:
    return "".join(p.read_text() for p in (SOURCE / "protocols" / name).rglob("*.py"))


def test_session_kinds_listed_are_the_ones_counted() -> None:
    """sluice_sessions_total counts a connection by ``conn.kind`` when its
    core says it opened: Cursus's are ``relay``, which the row did not list."""
    kinds = {
        word
        for assigned in literal_arguments(r"\bconn\.kind = ([^\n]+)")
        for word in re.findall(r'"(\w+)"', assigned)
    }
    assert {"lookup", "proxied", "relay"} <= kinds
    labels = rows()["sluice_sessions_total"][1]
    documented = listed_values(labels, "kind")
    # "stream": a Cursus relay that asked for a stream, after it opened as
    # a relay (Opened is told once): never a session's kind.
    assert documented == kinds - {"stream"}


@pytest.fixture(scope="module")
def supervisor() -> Iterator[Supervisor]:
    """A --workers supervisor of two workers, not started (for its registry)."""
    config = ProxyConfig(
        broker=parse_broker_url("pulsar://127.0.0.1:6650"), listen=Address("127.0.0.1", 0)
    )
    made = Supervisor(config, 2)
    yield made
    shutil.rmtree(made._state, ignore_errors=True)  # the workers' state it made, unused


def test_the_supervisors_own_metrics_have_rows(supervisor: Supervisor) -> None:
    """With --workers the supervisor serves its own metrics besides the
    workers' sum: sluice_workers and sluice_worker_restarts_total had no row."""
    table = rows()
    wrong = []
    for family in supervisor.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        if name not in table:
            wrong.append(f"{name}: no row")
        elif table[name][0] != family.type:
            wrong.append(f"{name}: the row says {table[name][0]!r}, it is a {family.type}")
        if name == "sluice_workers":
            states = {sample.labels["state"] for sample in family.samples}
            assert listed_values(table[name][1], "state") == states
    assert {"sluice_workers", "sluice_worker_restarts_total"} <= {
        f.name + ("_total" if f.type == "counter" else "") for f in supervisor.registry.collect()
    }
    assert not wrong, "\n".join(wrong)
