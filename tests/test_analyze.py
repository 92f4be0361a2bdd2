"""`sluice analyze` over real recordings, checked against `sluice inspect`.

Real components only: local Spark, a Spark standalone cluster started from
PySpark's own distribution (loopback, stopped by PID), and Debian's headless
Chromium opening the report.
"""

from __future__ import annotations

import base64
import collections
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from sluice.analyze.decode import decode_segment
from sluice.analyze.standalone import ConnectServer, StandaloneCluster, loopback_env
from sluice.brokers.embedded import EmbeddedBroker
from sluice.protocols.pulsar import Type
from sluice.recording import format as recording
from sluice.recording.format import recording_files
from tests.helpers.support import SLUICE, RawClient, client, start_proxy

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


def record(broker: EmbeddedBroker, tmp: Path, tag: str, *options: str) -> Path:
    p = start_proxy(broker.url, tmp, "--record", str(tmp / tag), *options)
    try:
        traffic(p.url, p.port, broker, tag)
        assert p.terminate() == 0
    finally:
        p.kill()
    return tmp / tag


GOLDEN = Path(__file__).parent / "golden" / "analyze"  # tests/golden/capture_analyze.py


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The fixed recordings (two captures, one cut mid-record, and a file that
    is no recording) analysed, and what ``sluice inspect`` shows of them."""
    tmp = tmp_path_factory.mktemp("pipeline")
    inputs = tmp / "inputs"
    shutil.copytree(GOLDEN / "inputs", inputs)
    manifest = json.loads((GOLDEN / "manifest.json").read_text())
    out = tmp / "out"
    events = tmp / "events"  # Spark's event log: the jobs it ran
    events.mkdir()
    submit = (
        f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir={events.as_uri()} "
        "--conf spark.eventLog.compress=false --conf spark.eventLog.rolling.enabled=false "
        "pyspark-shell"
    )
    result = analyze(inputs.as_uri(), out, "local[2]", {"PYSPARK_SUBMIT_ARGS": submit})
    expected = []
    for name in [*manifest["clean"], manifest["truncated"]]:
        shown = subprocess.run(
            [*SLUICE, "inspect", str(inputs / name), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        expected += [json.loads(line) for line in shown.stdout.splitlines()]
    tables = {name: rows_of(out / name) for name in TABLES}
    yield {
        "tables": tables,
        "expected": expected,
        "out": out,
        "stderr": result.stderr,
        "inputs": inputs,
        "tmp": tmp,
        "events": events,
    }


TABLES = ("frames", "connections", "topic_minute", "latency", "errors", "files", "bad_segments")


def analyze(
    source: str, out: Path, master: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`sluice analyze` as a user runs it, with Spark kept on 127.0.0.1."""
    result = subprocess.run(
        [*SLUICE, "analyze", source, "--out", str(out), "--master", master],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**loopback_env(), **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def rows_of(table: Path) -> list[dict[str, Any]]:
    """A Parquet table Spark wrote, read with pyarrow."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    rows: list[dict[str, Any]] = pq.read_table(table).to_pylist()
    return rows


def golden_tables(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Every table ``sluice analyze`` wrote under ``out``, as JSON-able rows in
    a fixed order; a segment's path as its file name (the inputs move)."""
    tables = {}
    for table in sorted(p for p in out.iterdir() if p.is_dir()):
        rows = []
        for row in rows_of(table):
            where = row["file"].rsplit("/", 1)[0] + "/" if row.get("file") else None
            rows.append({k: v.isoformat() if hasattr(v, "isoformat")
                         else v.replace(where, "") if where and isinstance(v, str) else v
                         for k, v in row.items()})  # fmt: skip
        tables[table.name] = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))
    return tables


# How many Spark jobs a run takes. Each job over the cached, decoded
# segments costs planning, code generation and compilation in the driver
# JVM whatever the data's size; on a small machine those, not the data, took
# most of the time (issue #41). Before the tables were built in fewer passes
# a run took 45 to 48 jobs; now fewer (bench/analyze.py prints the count per
# run). A change that adds passes should be a deliberate one: it fails here.
MAX_JOBS = 42


def spark_jobs(event_log: Path) -> list[str]:
    """The name (call site) of every job Spark started, from its event log."""
    names = []
    for path in sorted(p for p in event_log.rglob("*") if p.is_file()):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["Event"] == "SparkListenerJobStart":
                names.append(event["Stage Infos"][-1]["Stage Name"])
    return names


def test_analyze_runs_a_bounded_number_of_spark_jobs(analyzed: dict[str, Any]) -> None:
    jobs = spark_jobs(analyzed["events"])
    assert jobs, "no event log written"
    assert len(jobs) <= MAX_JOBS, "\n".join(jobs)


def test_every_table_is_the_golden_one_row_for_row(analyzed: dict[str, Any]) -> None:
    """The tables of the fixed recordings as stored when they were made; a
    change to the pipeline keeps every row (approximate percentiles: 1%)."""
    golden = json.loads((GOLDEN / "tables.json").read_text())
    got = golden_tables(analyzed["out"])
    assert sorted(got) == sorted(golden)
    for name, rows in golden.items():
        assert len(got[name]) == len(rows), name
        for mine, theirs in zip(got[name], rows, strict=True):
            if name == "latency":
                assert mine.keys() == theirs.keys()
                for key, value in theirs.items():
                    if isinstance(value, float):
                        assert math.isclose(mine[key], value, rel_tol=0.01), (name, key)
                    else:
                        assert mine[key] == value, (name, key)
            else:
                assert mine == theirs, name
    assert len(golden["frames"]) > 100 and golden["latency"] and golden["errors"]


@pytest.fixture(scope="module")
def quiet_spark_writer(analyzed: dict[str, Any]) -> dict[str, Any]:
    """One more run over the fixed recordings, as two users would make it:
    ``--quiet`` on a terminal, and with the frames table written by Spark's
    own writer (``SLUICE_ANALYZE_IO=spark``: where the executors cannot
    write it themselves, a remote output)."""
    out = analyzed["tmp"] / "spark-writer-out"
    code, shown = run_on_a_terminal(
        [*SLUICE, "analyze", analyzed["inputs"].as_uri(), "--out", str(out),
         "--master", "local[2]", "--quiet"],
        env={"SLUICE_ANALYZE_IO": "spark"},
    )  # fmt: skip
    assert code == 0, shown[-3000:]
    return {"out": out, "shown": shown}


def test_sparks_own_writer_gives_the_same_tables(
    analyzed: dict[str, Any], quiet_spark_writer: dict[str, Any]
) -> None:
    out = quiet_spark_writer["out"]

    def executors_files(where: Path) -> list[str]:  # part-<hash of the segment's path>.parquet
        return [
            p.name for p in where.iterdir() if re.fullmatch(r"part-[0-9a-f]{20}\.parquet", p.name)
        ]

    assert len(executors_files(analyzed["out"] / "frames")) == 4  # a segment with frames each
    assert executors_files(out / "frames") == []
    assert list((out / "frames").glob("part-0*.snappy.parquet"))  # Spark's own names
    assert golden_tables(out) == golden_tables(analyzed["out"])


def test_spark_connect_gives_the_golden_tables(analyzed: dict[str, Any]) -> None:
    """`--remote sc://…` against a Spark Connect server started from PySpark's
    own distribution on 127.0.0.1 (its own driver on local[2]), stopped by PID."""
    out = analyzed["tmp"] / "connect-out"
    with ConnectServer(analyzed["tmp"] / "connect", master="local[2]") as server:
        assert server.process is not None
        pid = server.process.pid
        result = subprocess.run(
            [*SLUICE, "analyze", str(analyzed["inputs"]), "--out", str(out),
             "--remote", server.url],
            capture_output=True, text=True, timeout=600, check=False, env=loopback_env(),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:] + server.logs()
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    # An output this process may not reach: an empty filtered table replaces an earlier run's.
    assert golden_tables(out) == {**golden_tables(analyzed["out"]), "filtered": []}
    assert "decoded: 5 segments read (2 bad" in result.stderr
    assert (out / "report.html").exists()


def run_on_a_terminal(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    """``args`` with stderr on a pseudo-terminal (as a person runs it): exit code, stderr."""
    import pty
    import select
    import time

    leader, follower = pty.openpty()
    process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=follower, env={**loopback_env(), **(env or {})}
    )  # fmt: skip
    os.close(follower)
    seen = bytearray()
    deadline = time.monotonic() + 600
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"still running after 600 s; on its terminal: {seen[-3000:]!r}"
            if not select.select([leader], [], [], min(left, 1.0))[0]:
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end closed: the process is done with it
                break
            if not chunk:
                break
            seen += chunk
        return process.wait(timeout=max(1.0, deadline - time.monotonic())), seen.decode(
            errors="replace"
        )
    finally:
        os.close(leader)
        if process.poll() is None:  # a failed test: nothing left running
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def on_a_cluster(analyzed: dict[str, Any]) -> dict[str, Any]:
    """One run over the fixed recordings on a Spark standalone cluster (a
    master and a worker from PySpark's distribution on 127.0.0.1, stopped by
    PID), with stderr on a pseudo-terminal as a person runs it: the
    standalone cluster's tables and the progress line, from one Spark run.
    (This process is the driver there as on ``local[N]``: the progress line
    reads the same status store and accumulator, progress.py.)"""
    out = analyzed["tmp"] / "cluster-out"
    with StandaloneCluster(analyzed["tmp"] / "cluster", workers=1, cores=2) as cluster:
        processes = list(cluster.processes)
        code, shown = run_on_a_terminal(
            [*SLUICE, "analyze", analyzed["inputs"].as_uri(), "--out", str(out),
             "--master", cluster.url]
        )  # fmt: skip
    assert code == 0, shown[-3000:]
    return {"out": out, "shown": shown, "processes": processes}


def test_progress_line_on_a_terminal_and_not_with_quiet(
    analyzed: dict[str, Any], quiet_spark_writer: dict[str, Any], on_a_cluster: dict[str, Any]
) -> None:
    total = sum(p.stat().st_size for p in analyzed["inputs"].iterdir())
    shown, out = on_a_cluster["shown"], on_a_cluster["out"]
    drawn = [part for line in shown.split("\n") for part in line.split("\r")]
    tasks = [
        p
        for p in drawn
        if re.search(r"decoding and reducing the segments: stage \d+, \d+/\d+ tasks", p)
    ]
    assert tasks, shown[-3000:]
    assert any(f"{total / 1e3:,.1f} kB read" in p for p in drawn), shown[-3000:]  # every byte
    assert "[analyze] wrote connections: 5 rows" in shown  # the stage lines stay
    report = (out / "report.html").read_text()
    assert "Where the analysis took its time" in report
    for stage in ("decode and reduce every segment", "table connections", "queries for the report"):
        assert stage in report, stage

    shown = quiet_spark_writer["shown"]
    assert "\r" not in shown.replace("\r\n", "\n") and "tasks" not in shown
    assert "wrote connections" not in shown and "131 frames, 5 connections" in shown
    # Not a terminal (the fixture's run): the stage lines, no progress line.
    assert "\r" not in analyzed["stderr"] and "[analyze] wrote connections" in analyzed["stderr"]


def read_tables(out: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table under ``out`` as sorted rows, for comparing two runs."""
    tables = {}
    for name in TABLES:
        rows = [tuple(sorted(r.items())) for r in rows_of(out / name)]
        tables[name] = sorted(rows, key=repr)
    return tables


def differences(a: Path, b: Path) -> list[str]:
    """What differs between two runs' tables (approximate percentiles within 1%)."""
    found = []
    left, right = read_tables(a), read_tables(b)
    for name in TABLES:
        if name == "latency":
            same = len(left[name]) == len(right[name]) and all(
                x[0] == y[0]
                and all(
                    math.isclose(p, q, rel_tol=0.01) if isinstance(p, float) else p == q
                    for (_, p), (_, q) in zip(x[1:], y[1:], strict=True)
                )
                for x, y in zip(left[name], right[name], strict=True)
            )
        else:
            same = left[name] == right[name]
        if not same:
            only = [set(left[name]) - set(right[name]), set(right[name]) - set(left[name])]
            found.append(f"{name}: {len(left[name])} rows vs {len(right[name])}; only in the "
                         f"first: {sorted(only[0], key=repr)[:3]}, only in the second: "
                         f"{sorted(only[1], key=repr)[:3]}")  # fmt: skip
    return found


def render(page: Path, screenshot: Path | None = None) -> tuple[str, str]:
    """Open ``page`` in headless Chromium: its DOM and Chromium's log (console included)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("chromium is not installed (./dev installs Debian's chromium package)")
    with tempfile.TemporaryDirectory() as profile:
        base = [chromium, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
                f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                "--virtual-time-budget=5000"]  # fmt: skip
        shown = subprocess.run(
            [*base, "--dump-dom", page.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert shown.returncode == 0, shown.stderr[-3000:]
        if screenshot is not None:
            shot = subprocess.run(
                [
                    *base,
                    f"--screenshot={screenshot.resolve()}",
                    "--window-size=1200,3600",
                    "--hide-scrollbars",
                    page.resolve().as_uri(),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert shot.returncode == 0, shot.stderr[-3000:]
    return shown.stdout, shown.stderr


def console_messages(log: str) -> list[str]:
    return [line for line in log.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


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
    assert {c["protocol"] for c in connections} == {"pulsar"}


def test_damaged_segments_are_reported_rows(analyzed: dict[str, Any]) -> None:
    bad = analyzed["tables"]["bad_segments"]
    assert sorted((Path(b["file"]).name == "garbage.sluice", b["damaged"]) for b in bad) == [
        (False, False),
        (True, True),
    ]
    [garbage] = [b for b in bad if b["damaged"]]
    assert "not a Sluice recording" in garbage["why"]
    [cut] = [b for b in bad if not b["damaged"]]
    assert cut["truncated_bytes"] > 0 and cut["frames"] > 0 and cut["protocol"] == "pulsar"
    files = analyzed["tables"]["files"]
    assert sum(f["frames"] or 0 for f in files) == len(analyzed["tables"]["frames"])


def test_progress_lines_name_each_stage_with_counts(analyzed: dict[str, Any]) -> None:
    stderr = analyzed["stderr"]
    frames = len(analyzed["tables"]["frames"])
    files = len(analyzed["tables"]["files"])
    assert f"found {files} segments" in stderr
    assert re.search(
        rf"decoded: {files} segments read \(2 bad, [\d.]+ MB\), {frames:,} frames", stderr
    )
    for name in TABLES:
        rows = len(analyzed["tables"][name])
        assert f"wrote {name}: {rows:,} rows" in stderr


PICTURES = (
    "Throughput over time per topic",
    "Request latency distributions per command",
    "Error codes over time",
    "Connection churn",
    "Top talkers",
)


def test_report_has_the_pictures(analyzed: dict[str, Any]) -> None:
    report = (analyzed["out"] / "report.html").read_text()
    for title in PICTURES:
        found = re.search(f'<img alt="{title}" src="data:image/png;base64,([^"]+)"', report)
        assert found, title
        png = base64.b64decode(found.group(1))
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
        assert width >= 600 and height >= 100, (title, width, height)
    for needed in ("Latency", "Busiest topics", "ChecksumError", "garbage.sluice"):
        assert needed in report, needed
    assert re.search(r"pulsar \d+", report)
    assert "<script" not in report and "http://" not in report and "https://" not in report


def test_report_renders_in_headless_chromium(analyzed: dict[str, Any]) -> None:
    # The check itself: a page that logs to the console is caught.
    noisy = analyzed["tmp"] / "noisy.html"
    noisy.write_text('<!doctype html><body><script>console.error("seen")</script>')
    assert any('"seen"' in line for line in console_messages(render(noisy)[1]))

    shot = analyzed["out"] / "report.png"
    dom, log = render(analyzed["out"] / "report.html", shot)
    assert console_messages(log) == []
    assert dom.count("data:image/png;base64,") == len(PICTURES)
    assert "Sluice traffic report" in dom
    assert shot.stat().st_size > 50_000  # pictures, not a blank page


def test_standalone_cluster_gives_the_local_tables(
    analyzed: dict[str, Any], on_a_cluster: dict[str, Any]
) -> None:
    """A master and a worker from PySpark's distribution on 127.0.0.1,
    stopped by PID: the decoding runs in an executor of its own, not in
    the driver's JVM."""
    out = on_a_cluster["out"]
    assert all(p.poll() is not None for p in on_a_cluster["processes"])
    assert "decoded:" in on_a_cluster["shown"]
    assert differences(analyzed["out"], out) == []
    assert (out / "report.html").exists()


def _v0(records: list[dict[str, Any]]) -> bytes:
    """A version-0 recording: frames kept their direction as `dir` then."""
    old = []
    for record in records:
        record = dict(record)
        if record["k"] == "header":
            record["version"] = 0
        elif record["k"] == "frame":
            record["dir"] = record.pop("d")
        old.append(record)
    return recording.dumps(old)


def segment_row(batches: list[Any]) -> dict[str, Any]:
    """What the decoder says about the segment itself (its last row)."""
    row: dict[str, Any] = json.loads(batches[-1].to_pylist()[-1]["extra"])
    return row


def test_decoder_reads_through_the_format_upgraders(
    analyzed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = max(recording_files(analyzed["inputs"]), key=lambda p: p.stat().st_size)
    records = list(recording.read_records(first))
    current = list(decode_segment("now", first.read_bytes()))

    def upgrade(record: dict[str, Any]) -> dict[str, Any]:
        if record.get("k") == "frame":
            record["d"] = record.pop("dir")
        return record

    monkeypatch.setitem(recording.UPGRADERS, 0, upgrade)
    upgraded = list(decode_segment("now", _v0(records)))
    assert upgraded[0].to_pylist() == current[0].to_pylist()
    assert upgraded[0].num_rows == sum(1 for r in records if r["k"] == "frame")
    assert segment_row(upgraded)["version"] == 0
    assert not segment_row(upgraded)["damaged"]
    monkeypatch.delitem(recording.UPGRADERS, 0)
    refused = segment_row(list(decode_segment("old", _v0(records))))
    assert refused["damaged"] and "no upgrade from recording format 0" in refused["why"]
    newer = recording.dumps([{**records[0], "version": recording.VERSION + 1}, *records[1:]])
    refused = segment_row(list(decode_segment("new", newer)))
    assert refused["damaged"] and "newer than this Sluice reads" in refused["why"]


def test_local_paths_are_taken_literally_not_url_decoded() -> None:
    """Spark (Hadoop's ``Path``) takes ``#``, ``%`` and spaces in a path as
    they are: so do the executors opening what it listed, and the command."""
    from sluice.analyze.decode import local_path
    from sluice.commands.analyze import _spark_path

    assert local_path("file:/x/run#1/a.sluice") == "/x/run#1/a.sluice"
    assert local_path("file:///x/pct%41/with space/ü.sluice") == "/x/pct%41/with space/ü.sluice"
    assert local_path("file://localhost/x/a%20b") == "/x/a%20b"
    assert local_path("/x/run#1") == "/x/run#1" and local_path("rel/a%41") == "rel/a%41"
    assert local_path("s3a://bucket/key") is None and local_path("hdfs:/x") is None
    here = Path.cwd()
    assert _spark_path("a dir/run#1 %41") == str(here / "a dir" / "run#1 %41")
    assert _spark_path("file:/tmp/x") == "file:/tmp/x"  # a URL, not ./file:/tmp/x
    assert _spark_path("s3a://b/k%20") == "s3a://b/k%20"


def test_a_local_path_with_a_colon_is_a_local_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run-12:30`` is a folder here, not a URL of scheme ``run-12``: made
    absolute for Spark, and said missing (exit 2) when it is not there."""
    import sluice.commands.analyze as command
    from sluice.analyze.decode import local_path
    from sluice.analyze.job import NoRecordings

    for path in ("run-12:30", "backup:2025", "a/b:c"):
        assert local_path(path) == path
    for url in ("file:/x", "file:///x", "s3a://b/k", "hdfs://nn/x", "hdfs:/x", "gs://b/k",
                "abfs://c@a.dfs.core.windows.net/x"):  # fmt: skip
        assert command._spark_path(url) == url
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run-12:30").mkdir()
    handed: list[list[str]] = []

    def spark(paths: list[str], *_: Any) -> Any:  # what would go to Spark, without it
        handed.append(paths)
        raise NoRecordings(paths)

    monkeypatch.setattr(command, "analyze", spark)
    assert command.main(["backup:2025", "--out", "out"]) == 2
    assert capsys.readouterr().err == "sluice analyze: no such file or directory: backup:2025\n"
    assert handed == []
    assert command.main(["run-12:30", "--out", "out"]) == 2  # no recordings in it
    assert handed == [[str(tmp_path / "run-12:30")]]
    capsys.readouterr()
    (tmp_path / "taken").write_text("a file")  # said before Spark is started
    assert command.main(["run-12:30", "--out", "taken"]) == 2
    assert capsys.readouterr().err == (
        "sluice analyze: --out taken: not a directory (the tables are a folder)\n"
    )
    assert len(handed) == 1


SMALL = GOLDEN / "inputs" / "sluice-20261128T172607-bf2cfe0d70e7-0001.sluice"
FLIPPED = GOLDEN / "inputs" / "sluice-20261128T172607-bf2cfe0d70e7-0003.sluice"


def of_capture(capture: str) -> bytes:
    """The small segment, whole, as a segment of a capture of its own."""
    records = list(recording.read_records(SMALL))
    records[0] = {**records[0], "capture": capture}
    return recording.dumps(records)


def with_gap(dropped: int) -> bytes:
    """A segment of its own capture in which the recorder dropped ``dropped`` frames."""
    records = list(recording.read_records(SMALL))
    records[0] = {**records[0], "capture": "withgap"}
    gap = {"k": "gap", "t": records[4]["t"], "dropped": dropped}
    return recording.dumps([*records[:5], gap, *records[5:]])


@pytest.fixture(scope="module")
def awkward(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One `sluice analyze` run over inputs and an output named with a
    space, ``#``, ``%``, a non-ASCII letter and Hadoop's glob characters
    (Spark globs every path it reads: such a local name is that name)."""
    tmp = tmp_path_factory.mktemp("awkward")
    inputs = tmp / "run#1 pct%41 ü [1]"
    inputs.mkdir()
    shutil.copy(SMALL, inputs / SMALL.name)
    flipped = bytearray(FLIPPED.read_bytes())
    flipped[1869] = 40  # a frame's summary: 'invalid' becomes the number 40
    (inputs / "flipped.sluice").write_bytes(flipped)
    (inputs / "gone.sluice").symlink_to(tmp / "nowhere.sluice")
    (inputs / "empty.sluice").write_bytes(b"")
    (inputs / "gap.sluice").write_bytes(with_gap(5000))
    named = tmp / "capture?{3}.rec"  # named on the command line: read whatever its name
    shutil.copy(GOLDEN / "inputs" / "sluice-20261128T172607-bf2cfe0d70e7-0002.sluice", named)
    out = tmp / "out dir#2 %20 [*]"
    (out / "filtered").mkdir(parents=True)  # an earlier run's, whose recordings had some
    (out / "filtered" / "part-00000-old.parquet").write_bytes(b"PAR1")
    # And a file and a folder named by a URL of a scheme other than file:
    # (Hadoop's viewfs:// over a local folder: the path Spark's file systems
    # take for s3a://, hdfs:// or gs://).
    elsewhere = tmp_path_factory.mktemp("viewfs")
    store = elsewhere / "store"
    (store / "folder").mkdir(parents=True)
    (store / "elsewhere.rec").write_bytes(of_capture("elsewhere"))
    (store / "folder" / "remote.sluice").write_bytes(of_capture("remote"))
    (store / "folder" / "notes.rec").write_bytes(of_capture("notes"))  # in a folder: not read
    conf = elsewhere / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        f"spark.hadoop.fs.viewfs.mounttable.t.link./r {store.as_uri()}\n"
    )
    result = subprocess.run(
        [*SLUICE, "analyze", str(inputs), str(named), "viewfs://t/r/elsewhere.rec",
         "viewfs://t/r/folder", "--out", str(out), "--master", "local[2]"],
        capture_output=True, text=True, timeout=600, check=False,
        env={**loopback_env(), "SPARK_CONF_DIR": str(conf)},
    )  # fmt: skip
    return {"result": result, "inputs": inputs, "out": out, "tmp": tmp}


@pytest.mark.e2e
def test_paths_with_odd_characters_are_read_and_written_in_place(awkward: dict[str, Any]) -> None:
    result, out = awkward["result"], awkward["out"]
    assert result.returncode == 0, result.stderr[-3000:]
    made = sorted([awkward["inputs"].name, out.name, "capture?{3}.rec"])
    assert sorted(p.name for p in awkward["tmp"].iterdir()) == made
    for table in ("frames", "files", "connections", "topic_minute"):
        assert (out / table / "_SUCCESS").exists(), table
    assert (out / "report.html").exists()
    files = {Path(f["file"]).name: f for f in rows_of(out / "files")}
    assert not files[SMALL.name]["damaged"]
    assert files[SMALL.name]["file"] == f"file:{awkward['inputs'] / SMALL.name}"
    frames = collections.Counter(Path(f["file"]).name for f in rows_of(out / "frames"))
    assert frames[SMALL.name] == files[SMALL.name]["frames"] > 0


@pytest.mark.e2e
def test_a_changed_byte_is_a_damaged_segment_not_a_failed_job(awkward: dict[str, Any]) -> None:
    result, out = awkward["result"], awkward["out"]
    assert result.returncode == 0, result.stderr[-3000:]
    files = {Path(f["file"]).name: f for f in rows_of(out / "files")}
    flipped = files["flipped.sluice"]
    assert flipped["damaged"] and "of the wrong type" in flipped["why"], flipped
    assert flipped["frames"] > 0  # what it held up to the damage is kept
    bad = sorted(Path(b["file"]).name for b in rows_of(out / "bad_segments"))  # not gap.sluice
    assert bad == ["empty.sluice", "flipped.sluice"]


def _segment_of(content: bytes) -> tuple[dict[str, Any], list[Any]]:
    """What the decoder says about a segment, and its frame rows."""
    from sluice.analyze.decode import parse_file

    rows = list(parse_file("x.sluice", content))
    [segment] = [row[4] for tag, row in rows if tag == "S"]
    return segment, [row for tag, row in rows if tag == "F"]


def test_values_of_the_wrong_type_make_a_damaged_segment() -> None:
    """Values the format's reader lets through but that fit no column end
    the segment there as damage: under Spark, an exception here would fail
    the whole job."""
    flipped = bytearray(FLIPPED.read_bytes())
    flipped[1869] = 40
    segment, frames = _segment_of(bytes(flipped))
    assert segment["damaged"] and frames and len(frames) == segment["frames"]

    records = list(recording.read_records(SMALL))
    conn = next(r for r in records if r["k"] == "conn")
    at = records.index(conn) + 1
    frame = {"k": "frame", "c": conn["c"], "d": 0, "t": conn["t"], "w": conn["w"], "n": 10,
             "raw": b"", "s": {"cmd": "PING", "rid": -5}}  # fmt: skip
    segment, frames = _segment_of(recording.dumps([*records[:at], frame, *records[at:]]))
    assert segment["damaged"] and "damaged at frame 1 (a frame record with 'rid'" in segment["why"]
    assert frames == []

    acted = {"k": "filter", "c": conn["c"], "d": 0, "t": conn["t"], "w": conn["w"],
             "filter": "schema", "action": "rejected", "n": 1, "topic": 7,
             "reason": "bad"}  # fmt: skip
    segment, frames = _segment_of(recording.dumps([*records[:at], acted, *records[at:]]))
    assert segment["damaged"] and "a filter record with 'topic' of the wrong type" in segment["why"]
    segment, _ = _segment_of(
        recording.dumps([*records[:at], {**acted, "topic": "t", "reason": 3}, *records[at:]])
    )
    assert "a filter record with 'reason' of the wrong type" in segment["why"]


def test_side_rows_are_checked_with_a_table_worked_out_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A segment of short connections holds two side rows (conn, close) per
    frame: each row's values from its record are checked with the column's
    check, worked out once, not by looking up the column's type for every
    value of every row (that made such a segment's decode twice as slow)."""
    from sluice.analyze import decode

    records = list(recording.read_records(SMALL))
    conn = next(r for r in records if r["k"] == "conn")
    at = {"t": conn["t"], "w": conn["w"]}
    short: list[dict[str, Any]] = []
    for c in range(500):
        short += [{**conn, "c": c},
                  {"k": "frame", "c": c, "d": 0, **at, "n": 10, "raw": b"", "s": {"cmd": "PING"}},
                  {"k": "close", "c": c, **at, "reason": "closed"}]  # fmt: skip
    looked_up: list[Any] = []
    fits = decode._fits

    def looking_up(value: Any, kind: Any) -> bool:
        looked_up.append(kind)
        return fits(value, kind)

    monkeypatch.setattr(decode, "_fits", looking_up)
    segment = recording.dumps([records[0], *short])
    rows = list(decode.parse_file("x.sluice", segment))
    assert looked_up == []  # no column's type looked up per value
    tags = collections.Counter(tag for tag, _ in rows)
    assert tags == {"F": 500, "C": 500, "X": 500, "S": 1} and not rows[-1][1][4]["damaged"]
    checked: collections.Counter[str] = collections.Counter()

    def counted(name: str, check: Any) -> tuple[str, Any]:
        def counting(value: Any) -> bool:
            checked[name] += 1
            return bool(check(value))

        return name, counting

    monkeypatch.setattr(decode, "_FROM_RECORD", tuple(counted(*c) for c in decode._FROM_RECORD))
    assert list(decode.parse_file("x.sluice", segment)) == rows
    assert checked == {"conn": 1000, "wall_ns": 1000, "mono_ns": 1000}  # constants are not


@pytest.mark.e2e
def test_a_file_named_is_read_whatever_its_name(awkward: dict[str, Any]) -> None:
    result, out = awkward["result"], awkward["out"]
    assert result.returncode == 0, result.stderr[-3000:]
    files = {Path(f["file"]).name: f for f in rows_of(out / "files")}
    named = files["capture?{3}.rec"]
    assert named["frames"] > 0 and not named["damaged"]
    assert f"sluice analyze: {awkward['inputs'] / 'gone.sluice'}: a link to nothing, skipped" in (
        result.stderr
    )


@pytest.mark.e2e
def test_nothing_to_analyse_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a recording")
    result = subprocess.run(
        [*SLUICE, "analyze", str(empty), "--out", str(tmp_path / "out"), "--master", "local[1]"],
        capture_output=True, text=True, timeout=600, check=False, env=loopback_env(),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"sluice analyze: {empty}: no recordings (*.sluice) here"
    )


@pytest.mark.e2e
def test_an_empty_segment_is_said_to_be_empty(awkward: dict[str, Any]) -> None:
    """Spark's scan skips empty files: not 'over the binaryFile limit', and
    its path spelled as every other row's."""
    result, out = awkward["result"], awkward["out"]
    assert result.returncode == 0, result.stderr[-3000:]
    files = {Path(f["file"]).name: f for f in rows_of(out / "files")}
    empty = files["empty.sluice"]
    assert empty["file"] == f"file:{awkward['inputs'] / 'empty.sluice'}"
    assert empty["why"] == f"{empty['file']}: empty file, not a Sluice recording", empty
    assert empty["damaged"] and empty["bytes"] == 0 and empty["frames"] == 0


def test_the_decoder_counts_frames_the_recorder_dropped() -> None:
    segment, frames = _segment_of(with_gap(5000))
    assert segment["dropped_frames"] == 5000 and not segment["damaged"] and frames
    assert _segment_of(SMALL.read_bytes())[0]["dropped_frames"] == 0


@pytest.mark.e2e
def test_frames_dropped_while_recording_are_said(awkward: dict[str, Any]) -> None:
    result, out = awkward["result"], awkward["out"]
    assert result.returncode == 0, result.stderr[-3000:]
    files = {Path(f["file"]).name: f for f in rows_of(out / "files")}
    assert files["gap.sluice"]["dropped_frames"] == 5000
    assert files[SMALL.name]["dropped_frames"] == 0
    assert re.search(r"decoded: .*, 5,000 frames dropped while recording \[", result.stderr)
    assert re.search(r"\(2 damaged, 0 truncated, 5000 frames dropped while recording\) in",
                     result.stderr.splitlines()[-1])  # fmt: skip
    assert "5,000 frames were dropped while recording" in (out / "report.html").read_text()


def test_a_segment_that_fails_on_an_executor_is_named(tmp_path: Path) -> None:
    """An error reducing a segment (here: its frames file cannot be written)
    names the segment, in one line."""
    import pyarrow as pa

    from sluice.analyze.partials import SegmentFailed, frames_file, reduce_batches

    path = f"file:{SMALL}"
    Path(frames_file(str(tmp_path), path)).mkdir()  # a folder where the file goes
    listed = pa.RecordBatch.from_pylist([{"path": path, "length": SMALL.stat().st_size}])
    with pytest.raises(SegmentFailed) as failed:
        list(reduce_batches([listed], str(tmp_path)))
    assert str(failed.value).startswith(f"{path}: IsADirectoryError: ")
    assert "\n" not in str(failed.value)


def test_an_executor_failure_is_said_in_one_line() -> None:
    """A Python worker's exception as Spark raises it in the driver: its
    first line says only that there was one; the last is the error."""
    from pyspark.errors import PythonException

    from sluice.commands.analyze import failure

    worker = ("An exception was thrown from the Python worker:\nTraceback (most recent call "
              'last):\n  File "/x/partials.py", line 90, in reduce_batches\n{}\n')  # fmt: skip
    named = "sluice.analyze.partials.SegmentFailed: file:/r/a.sluice: ArrowTypeError: bad"
    assert failure(PythonException(worker.format(named))) == "file:/r/a.sluice: ArrowTypeError: bad"
    other = "pyarrow.lib.ArrowInvalid: Could not convert"
    assert failure(PythonException(worker.format(other) + "\n\n")) == other
    assert failure(ValueError("first line\nsecond")) == "first line"
    # A JVM error as Py4J words it: the Java exception's message, not the call.
    java = (
        "An error occurred while calling o185.parquet.\n: org.apache.hadoop.fs.ParentNot"
        "DirectoryException: Parent path is not a directory: file:/o\n\tat org.x(X.java:1)"
    )
    assert failure(ValueError(java)) == "Parent path is not a directory: file:/o"
    bare = "An error occurred while calling o9.load.\n: java.lang.NullPointerException\n\tat a"
    assert failure(ValueError(bare)) == "NullPointerException"
    assert failure(ValueError()) == "ValueError()"


@pytest.mark.e2e
def test_no_filtered_table_is_left_from_an_earlier_run(awkward: dict[str, Any]) -> None:
    result, out = awkward["result"], awkward["out"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "files").is_dir() and not (out / "filtered").exists()


def test_a_segment_gone_since_the_listing_is_a_damaged_row(tmp_path: Path) -> None:
    """A segment pruned (or unreadable) between Spark's listing and its
    reading is a bad segment, not a failed job."""
    import pyarrow as pa

    from sluice.analyze.partials import reduce_batches

    gone = f"file:{tmp_path / 'pruned.sluice'}"
    listed = pa.RecordBatch.from_pylist([{"path": gone, "length": 4061}])
    batches = list(reduce_batches([listed], str(tmp_path)))
    segment = json.loads(batches[-1].to_pylist()[-1]["extra"])
    assert segment["damaged"] and segment["bytes"] == 0
    assert segment["why"] == f"{gone}: not readable (No such file or directory)"


@pytest.mark.e2e
def test_nothing_to_analyse_is_said_before_spark_starts(tmp_path: Path) -> None:
    """Folders with no recording in them (nothing, other files, a folder
    within, a ``file:`` URL): the one line at once, before the JVM starts
    and says anything of its own."""
    empty, other = tmp_path / "empty", tmp_path / "other"
    (other / "deeper").mkdir(parents=True)
    empty.mkdir()
    (other / "notes.txt").write_text("not a recording")
    (other / "deeper" / "old.sluice.bak").write_bytes(b"")
    paths = [str(empty), other.as_uri()]
    result = subprocess.run(
        [*SLUICE, "analyze", *paths, "--out", str(tmp_path / "out"), "--master", "local[1]"],
        capture_output=True, text=True, timeout=600, check=False, env=loopback_env(),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr == f"sluice analyze: {', '.join(paths)}: no recordings (*.sluice) here\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_a_file_named_by_another_scheme_is_read_whatever_its_name(awkward: dict[str, Any]) -> None:
    """A URL of a scheme other than ``file:`` naming a file is read whatever
    its name, as a local file named is; a folder of that scheme is searched
    for ``*.sluice``."""
    result, out = awkward["result"], awkward["out"]
    assert result.returncode == 0, result.stderr[-3000:]
    files = sorted(f["file"] for f in rows_of(out / "files") if f["file"].startswith("viewfs:"))
    assert files == ["viewfs://t/r/elsewhere.rec", "viewfs://t/r/folder/remote.sluice"], files


@pytest.mark.e2e
def test_a_failed_task_is_said_once_without_sparks_own_lines(tmp_path: Path) -> None:
    """A job that fails on its input (here an ``--out`` too deep for a
    segment's frames file: the executor's write fails) ends with Sluice's
    one line naming the segment, without Spark's own lines about the
    failed task (its trace and the Python worker's) before it."""
    out = tmp_path / "out"
    while len(str(out)) < 4050 - 201:
        out /= "d" * 200
    out /= "d" * (4050 - len(str(out)) - 1)
    out.mkdir(parents=True)
    result = subprocess.run(
        [*SLUICE, "analyze", str(SMALL), "--out", str(out), "--master", "local[1]", "--quiet"],
        capture_output=True, text=True, timeout=600, check=False, env=loopback_env(),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    assert re.match(rf"sluice analyze: file:{SMALL}: OSError: \[Errno 36\] ", lines[-1]), lines[-1]
    task = re.compile(r" (ERROR|WARN) (Executor|TaskSetManager|BlockManager):|Traceback|^\s+at ")
    spark_said = [line for line in lines[:-1] if task.search(line)]
    assert not spark_said, "\n".join(spark_said[:5])
