"""What filters did, in a recording: kept as received and as sent, marked,
and shown by ``sluice inspect``, ``sluice view``'s index and ``sluice
analyze``'s executors. pulsar-lite is enough here: nothing asks for schemas."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pulsar
import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from sluice.analyze.decode import decode_batches
from sluice.brokers.embedded import EmbeddedBroker
from sluice.recording.format import read_records, recording_files
from sluice.view.index import Index
from tests.helpers.support import SLUICE, client, start_proxy
from tests.test_analyze import analyze, rows_of

WORDS = 'tests.helpers.filters:Words:{"topics": ["*filtered-*"], "direction": "produce"}'


def _inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SLUICE, "inspect", *args], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip


@pytest.fixture
def recorded(broker: EmbeddedBroker, tmp_path: Path) -> Path:
    """A capture of a producer whose messages a filter changed and refused."""
    rec = tmp_path / "rec"
    proxy = start_proxy(broker.url, tmp_path, "--record", str(rec), "--record-payloads", "hash",
                        "--record-flush-interval", "0.1", "--filter", WORDS)  # fmt: skip
    try:
        with client(proxy.url) as c:
            topic = "persistent://public/default/filtered-rec"
            producer = c.create_producer(topic, batching_enabled=False)
            producer.send(b"plain")
            producer.send(b"shout this")
            with pytest.raises(pulsar.PulsarException):
                producer.send(b"a bad word")
        assert proxy.terminate() == 0
    finally:
        proxy.kill()
    return rec


def test_a_changed_and_a_refused_message_are_recorded_and_shown(recorded: Path) -> None:
    records = [r for path in recording_files(recorded) for r in read_records(path)]
    kinds = [(r["k"], r.get("action")) for r in records if r["k"] in ("frame", "filter")]
    notes = [r for r in records if r["k"] == "filter"]
    assert [(r["action"], r.get("reason"), r["filter"]) for r in notes] == [
        ("replaced", None, "tests.helpers.filters:Words"),
        ("rejected", "word", "tests.helpers.filters:Words"),
    ]
    # Each note follows the frame it is about (the SEND as the client sent it).
    for note in notes:
        before = kinds[kinds.index(("filter", note["action"])) - 1]
        assert before == ("frame", None)
    changed = notes[0]["sent"]
    assert changed["n"] > 0 and len(changed["p"]) == 2  # the payload policy: hashed
    # inspect: a FILTER line after each, the summary counts them, JSON keeps them.
    timeline = _inspect(str(recorded)).stdout
    assert "FILTER replaced 1 message by tests.helpers.filters:Words" in timeline
    assert "FILTER rejected 1 message by tests.helpers.filters:Words (word)" in timeline
    assert "tests.helpers.filters:Words rejected (word) x1" in timeline
    as_json = [json.loads(line) for line in _inspect(str(recorded), "--json").stdout.splitlines()]
    (replaced,) = [r for r in as_json if r["kind"] == "filter" and r["action"] == "replaced"]
    assert replaced["messages"] == 1 and replaced["sent"]["payload"]["size"] == len(b"SHOUT THIS")


def test_view_marks_the_frames_and_analyze_counts_them(recorded: Path) -> None:
    index = Index(recorded)
    index.build()
    rows = [index.row(i) for i in range(index.frames)]
    marked = [r for r in rows if "filtered" in r["flags"]]
    assert [r["cmd"] for r in marked] == ["SEND", "SEND"]
    assert [n.text for n in index.notes if n.kind == "filter"] == [
        "filter tests.helpers.filters:Words replaced 1 message(s)",
        "filter tests.helpers.filters:Words rejected 1 message(s) (word)",
    ]
    paths = [str(p) for p in recording_files(recorded)]
    contents = [p.read_bytes() for p in recording_files(recorded)]
    batch = pa.RecordBatch.from_pydict(
        {"path": paths, "length": [len(c) for c in contents], "content": contents}
    )
    rows_out = [row for b in decode_batches([batch]) for row in b.to_pylist()]
    filtered = [r for r in rows_out if r["record"] == "filter"]
    assert [(r["command"], r["error"], r["messages"], r["direction"]) for r in filtered] == [
        ("replaced", None, 1, "client_to_broker"),
        ("rejected", "word", 1, "client_to_broker"),
    ]
    assert {json.loads(r["extra"])["filter"] for r in filtered} == {"tests.helpers.filters:Words"}


def test_analyze_writes_the_filtered_table_and_the_report_section(
    recorded: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    analyze(str(recorded), out, "local[1]")
    rows = rows_of(out / "filtered")
    assert sorted((r["action"], r["reason"], r["messages"], r["filter"]) for r in rows) == [
        ("rejected", "word", 1, "tests.helpers.filters:Words"),
        ("replaced", None, 1, "tests.helpers.filters:Words"),
    ]
    assert {r["topic"] for r in rows} == {"persistent://public/default/filtered-rec"}
    report = (out / "report.html").read_text()
    assert "Message filters" in report and "no message filter acted" not in report
