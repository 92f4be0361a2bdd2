"""`sluice analyze` on local Spark over real recordings, checked against `sluice inspect`."""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from sluice.embedded import EmbeddedBroker
from sluice.protocols.pulsar import Type
from sluice.recording.format import recording_files
from tests.support import SLUICE, RawClient, client, start_proxy

T = Type.Value


def traffic(proxy_url: str, port: int, broker: EmbeddedBroker, tag: str) -> None:
    topic = f"persistent://public/default/analyzed-{tag}"
    with client(proxy_url) as c:
        plain = c.create_producer(topic, batching_enabled=False)
        for i in range(12):
            plain.send(f"{tag}-{i}".encode())
        batched = c.create_producer(
            topic, batching_enabled=True, batching_max_messages=5, batching_max_publish_delay_ms=500
        )
        for i in range(10):
            batched.send_async(f"{tag}-b{i}".encode(), lambda res, mid: None)
        batched.flush()
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        for _ in range(22):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    with RawClient(port) as raw:  # one corrupt SEND: an invalid frame and an error answer
        name = raw.producer(broker.port, topic, producer_id=7)
        raw.send_message(name, 7, 0, b"x", corrupt=True)
        raw.receive_type("SEND_ERROR")


def record(broker: EmbeddedBroker, tmp: Path, tag: str) -> Path:
    p = start_proxy(broker.url, tmp, "--record", str(tmp / tag))
    try:
        traffic(p.url, p.port, broker, tag)
        assert p.terminate() == 0
    finally:
        p.kill()
    return tmp / tag


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("pipeline")
    with EmbeddedBroker() as broker:
        clean = record(broker, tmp, "a")
        other = record(broker, tmp, "b")  # a separate capture
    inputs = tmp / "inputs"
    inputs.mkdir()
    for path in recording_files(clean):
        shutil.copy(path, inputs / path.name)
    [b_file] = recording_files(other)
    data = b_file.read_bytes()
    truncated = inputs / b_file.name
    truncated.write_bytes(data[: int(len(data) * 0.6)])  # cut mid-record
    (inputs / "garbage.sluice").write_bytes(b"\x00\x01 this was never a recording \xc1" * 10)
    out = tmp / "out"
    result = subprocess.run(
        [*SLUICE, "analyze", str(inputs), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected = []
    for target in (clean, truncated):
        shown = subprocess.run(
            [*SLUICE, "inspect", str(target), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        expected += [json.loads(line) for line in shown.stdout.splitlines()]
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    tables = {
        name: [r.asDict() for r in spark.read.parquet(str(out / name)).collect()]
        for name in ("frames", "connections", "topic_minute", "latency", "errors", "files")
    }
    spark.stop()
    yield {"tables": tables, "expected": expected, "out": out, "stderr": result.stderr}


def frames_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == "frame"]


def test_frames_match_inspect(analyzed: dict[str, Any]) -> None:
    expected = collections.Counter(
        (r["cmd"], r["direction"]) for r in frames_of(analyzed["expected"])
    )
    got = collections.Counter((r["command"], r["direction"]) for r in analyzed["tables"]["frames"])
    assert got == expected
    assert expected[("SEND", "client_to_broker")] > 0


def test_topic_minutes_match_inspect(analyzed: dict[str, Any]) -> None:
    expected: collections.Counter[tuple[str, int, str]] = collections.Counter()
    for r in frames_of(analyzed["expected"]):
        if r["cmd"] in ("SEND", "MESSAGE") and r.get("topic"):
            expected[(r["topic"], r["wall_ns"] // 60_000_000_000 * 60, r["direction"])] += r.get(
                "msgs", 1
            )
    got = collections.Counter(
        {
            (r["topic"], int(r["minute"].timestamp()), r["direction"]): r["messages"]
            for r in analyzed["tables"]["topic_minute"]
        }
    )
    assert got == expected
    published = sum(n for (topic, _, d), n in got.items() if d == "client_to_broker")
    assert published >= 22  # batches count their messages


def test_latency_counts_match_request_answer_pairs(analyzed: dict[str, Any]) -> None:
    asked: dict[tuple[Any, ...], tuple[str, int]] = {}
    answered: dict[tuple[Any, ...], int] = {}
    key: tuple[Any, ...]
    for r in frames_of(analyzed["expected"]):
        conn = (r["capture"], r["conn"])
        if r["cmd"] == "SEND" and r["direction"] == "client_to_broker":
            asked[(*conn, "send", r["pid"], r["seq"])] = ("SEND", r["mono_ns"])
        elif r["cmd"] in ("SEND_RECEIPT", "SEND_ERROR"):
            key = (*conn, "send", r["pid"], r["seq"])
            answered[key] = min(answered.get(key, r["mono_ns"]), r["mono_ns"])
        elif "rid" in r and r["direction"] == "client_to_broker":
            asked[(*conn, "rid", r["rid"])] = (r["cmd"], r["mono_ns"])
        elif "rid" in r:
            key = (*conn, "rid", r["rid"])
            answered[key] = min(answered.get(key, r["mono_ns"]), r["mono_ns"])
    expected = collections.Counter(
        cmd for key, (cmd, t0) in asked.items() if key in answered and answered[key] >= t0
    )
    got = {r["command"]: r["count"] for r in analyzed["tables"]["latency"]}
    assert got == dict(expected)
    for row in analyzed["tables"]["latency"]:
        assert 0 <= row["p50"] <= row["p99"] <= row["max"]


def test_damaged_and_truncated_files_are_counted_not_fatal(analyzed: dict[str, Any]) -> None:
    files = analyzed["tables"]["files"]
    damaged = [f for f in files if f["damaged"]]
    assert len(damaged) == 1 and damaged[0]["file"].endswith("garbage.sluice")
    assert len([f for f in files if f["truncated_bytes"] > 0]) == 1
    assert "1 damaged, 1 truncated" in analyzed["stderr"]


def test_connections_errors_and_report(analyzed: dict[str, Any]) -> None:
    connections = analyzed["tables"]["connections"]
    assert all(c["duration_s"] is None or c["duration_s"] >= 0 for c in connections)
    invalid = sum(1 for r in frames_of(analyzed["expected"]) if "invalid" in r)
    assert invalid >= 1
    assert sum(c["invalid_frames"] or 0 for c in connections) == invalid
    codes = {e["code"] for e in analyzed["tables"]["errors"]}
    assert {"invalid:checksum", "ChecksumError"} <= codes
    report = (analyzed["out"] / "report.html").read_text()
    for needed in (
        "Messages per minute",
        "<svg",
        "Latency",
        "Busiest topics",
        "Errors",
        "Sessions with validation failures",
        "garbage.sluice",
    ):
        assert needed in report
