"""The analysis job: recordings in, Parquet tables and a report out.

    sluice analyze PATH... --out DIR [--master URL]
    spark-submit sluice/pipeline/job.py PATH... --out DIR          # same job

PATH is any Hadoop-compatible path (a file, a directory searched
recursively for ``*.sluice``, ``s3a://…``, ``hdfs://…``). Files are read
with Spark's ``binaryFile`` source and decoded on the executors in
parallel; a damaged or truncated file is counted and skipped (what it held
up to the damage is kept), never fatal. Nothing but small aggregates (for the
report) is collected to the driver.

Tables (Parquet, under DIR): ``frames``, ``connections``, ``topic_minute``,
``latency``, ``errors``, plus ``files`` (what was read, what was damaged);
and ``report.html``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SIGNED = 2**63


def _signed(value: Any) -> int | None:
    """uint64 ids as Spark longs (the all-ones 'no request' id becomes -1)."""
    if value is None:
        return None
    number = int(value)
    return number - 2**64 if number >= SIGNED else number


def parse_file(path: str, content: bytes) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """Rows of one recording: ("F", frame), ("C", connection), ("X", close), ("S", status)."""
    from sluice.recording.format import ReadResult, RecordingError, read_records_from

    result = ReadResult(Path(path))
    capture = ""
    damaged = ""
    try:
        for record in read_records_from(content, path, result):
            kind = record["k"]
            if kind == "header":
                capture = record["capture"]
            elif kind == "frame":
                s = record["s"]
                yield (
                    "F",
                    (
                        capture,
                        path,
                        record["c"],
                        "client_to_broker" if record["d"] == 0 else "broker_to_client",
                        record["t"],
                        record["w"],
                        s.get("cmd"),
                        record["n"],
                        _signed(s.get("rid")),
                        _signed(s.get("pid")),
                        _signed(s.get("seq")),
                        _signed(s.get("cid")),
                        s.get("topic"),
                        int(s.get("msgs", 1)) if s.get("cmd") in ("SEND", "MESSAGE") else 0,
                        s.get("invalid"),
                        s.get("error"),
                    ),
                )
            elif kind == "conn":
                yield (
                    "C",
                    (
                        capture,
                        record["c"],
                        record["client"],
                        record["broker"],
                        record["kind"],
                        record["listener"],
                        record["w"],
                    ),
                )
            elif kind == "close":
                yield "X", (capture, record["c"], record["w"], record.get("reason", ""))
    except RecordingError as exc:
        damaged = str(exc)
    yield "S", (path, result.records, result.truncated_bytes, bool(damaged), damaged)


def analyze(paths: list[str], out: str, master: str | None, say: Any) -> dict[str, Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    builder = SparkSession.builder.appName("sluice-analyze")
    if master:
        builder = builder.master(master)
    if master is None or master.startswith("local"):
        if master is None:
            builder = builder.master("local[*]")
        # In local mode the driver JVM does the executors' work too.
        memory = os.environ.get("SLUICE_SPARK_DRIVER_MEMORY", "4g")
        builder = builder.config("spark.driver.memory", memory)
    spark = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    started = time.monotonic()
    say(f"reading recordings from {', '.join(paths)}")
    files = (
        spark.read.format("binaryFile")
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.sluice")
        .load(paths)
    )
    total_bytes = _first(files.select(F.sum("length"))) or 0
    rows = (
        files.select("path", "content")
        .rdd.flatMap(lambda r: parse_file(r.path, bytes(r.content)))
        .cache()
    )

    frame_schema = T.StructType(
        [
            T.StructField("capture", T.StringType()),
            T.StructField("file", T.StringType()),
            T.StructField("conn", T.LongType()),
            T.StructField("direction", T.StringType()),
            T.StructField("mono_ns", T.LongType()),
            T.StructField("wall_ns", T.LongType()),
            T.StructField("command", T.StringType()),
            T.StructField("size", T.LongType()),
            T.StructField("request_id", T.LongType()),
            T.StructField("producer_id", T.LongType()),
            T.StructField("sequence_id", T.LongType()),
            T.StructField("consumer_id", T.LongType()),
            T.StructField("topic", T.StringType()),
            T.StructField("messages", T.LongType()),
            T.StructField("invalid", T.StringType()),
            T.StructField("error", T.StringType()),
        ]
    )
    conn_schema = (
        "capture string, conn long, client string, broker string, kind string, "
        "listener string, opened_ns long"
    )
    close_schema = "capture string, conn long, closed_ns long, reason string"
    file_schema = "file string, records long, truncated_bytes long, damaged boolean, why string"

    def table(tag: str, schema: Any) -> Any:
        return spark.createDataFrame(rows.filter(lambda r: r[0] == tag).map(lambda r: r[1]), schema)

    def write(df: Any, name: str) -> None:
        say(f"writing {name}")
        df.write.mode("overwrite").parquet(f"{out}/{name}")

    # Decoding happens in Python once: each table below is derived from the
    # Parquet just written, in the JVM, instead of converting rows again.
    write(table("F", frame_schema), "frames")
    write(table("S", file_schema), "files")
    write(table("C", conn_schema).dropDuplicates(["capture", "conn"]), "_opened")
    write(table("X", close_schema).dropDuplicates(["capture", "conn"]), "_closed")
    rows.unpersist()
    frames = spark.read.parquet(f"{out}/frames").cache()
    status = spark.read.parquet(f"{out}/files")
    conns = spark.read.parquet(f"{out}/_opened")
    closes = spark.read.parquet(f"{out}/_closed")

    per_conn = frames.groupBy("capture", "conn").agg(
        F.count("*").alias("frames"),
        F.sum("size").alias("bytes"),
        F.sum(F.when(F.col("direction") == "client_to_broker", 1).otherwise(0)).alias(
            "frames_from_client"
        ),
        F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)).alias("broker_errors"),
        F.sum(F.when(F.col("invalid").isNotNull(), 1).otherwise(0)).alias("invalid_frames"),
        F.max("wall_ns").alias("last_ns"),
    )
    connections = (
        conns.join(per_conn, ["capture", "conn"], "left")
        .join(closes, ["capture", "conn"], "left")
        .withColumn(
            "duration_s",
            (F.coalesce("closed_ns", "last_ns") - F.col("opened_ns")) / F.lit(1e9),
        )
    )
    write(connections, "connections")

    topic_minute = (
        frames.filter(F.col("command").isin("SEND", "MESSAGE") & F.col("topic").isNotNull())
        .withColumn("minute", F.timestamp_seconds(F.floor(F.col("wall_ns") / 6e10) * 60))
        .groupBy("topic", "minute", "direction")
        .agg(
            F.sum("messages").alias("messages"),
            F.sum("size").alias("bytes"),
            F.count("*").alias("frames"),
        )
    )
    write(topic_minute, "topic_minute")

    latency_samples = request_latencies(frames, F)
    latency = latency_samples.groupBy("command").agg(
        F.count("*").alias("count"),
        F.percentile_approx("seconds", 0.5).alias("p50"),
        F.percentile_approx("seconds", 0.9).alias("p90"),
        F.percentile_approx("seconds", 0.99).alias("p99"),
        F.max("seconds").alias("max"),
    )
    write(latency, "latency")

    errors = (
        frames.filter(F.col("error").isNotNull() | F.col("invalid").isNotNull())
        .withColumn("code", F.coalesce(F.col("error"), F.concat(F.lit("invalid:"), "invalid")))
        .groupBy("code", "command", "topic", "capture", "conn")
        .count()
    )
    write(errors, "errors")

    say("building the report")
    summary = {
        "frames": frames.count(),
        "connections": connections.count(),
        "files": status.count(),
        "damaged": [r.asDict() for r in status.filter("damaged").collect()],
        "truncated": [r.asDict() for r in status.filter("truncated_bytes > 0").collect()],
        "by_command": [
            r.asDict()
            for r in frames.groupBy("command", "direction")
            .count()
            .orderBy(F.desc("count"))
            .collect()
        ],
        "per_minute": [
            r.asDict()
            for r in topic_minute.groupBy("minute", "direction")
            .agg(F.sum("messages").alias("messages"))
            .orderBy("minute")
            .collect()
        ],
        "latency": [r.asDict() for r in latency.orderBy(F.desc("count")).collect()],
        "top_topics": [
            r.asDict()
            for r in topic_minute.groupBy("topic")
            .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
            .orderBy(F.desc("messages"))
            .limit(10)
            .collect()
        ],
        "errors": [
            r.asDict()
            for r in errors.groupBy("code")
            .agg(F.sum("count").alias("count"))
            .orderBy(F.desc("count"))
            .collect()
        ],
        "invalid_sessions": [
            r.asDict()
            for r in connections.filter("invalid_frames > 0")
            .select("capture", "conn", "client", "invalid_frames")
            .orderBy(F.desc("invalid_frames"))
            .limit(50)
            .collect()
        ],
        "bytes": total_bytes,
        "seconds": time.monotonic() - started,
    }
    frames.unpersist()
    spark.stop()
    for scratch in ("_opened", "_closed"):
        _remove(f"{out}/{scratch}")
    return summary


def _remove(path: str) -> None:
    """Drop a scratch table written next to the results (local paths only)."""
    if "://" not in path:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def _first(df: Any) -> Any:
    row = df.first()
    return None if row is None else row[0]


def request_latencies(frames: Any, F: Any) -> Any:
    """(command, seconds) for every request paired with its answer."""
    keys = ["capture", "conn", "request_id"]
    requests = frames.filter(
        (F.col("direction") == "client_to_broker") & F.col("request_id").isNotNull()
    ).select(*keys, "command", F.col("mono_ns").alias("asked"))
    answers = (
        frames.filter((F.col("direction") == "broker_to_client") & F.col("request_id").isNotNull())
        .groupBy(*keys)
        .agg(F.min("mono_ns").alias("answered"))
    )
    send_keys = ["capture", "conn", "producer_id", "sequence_id"]
    sends = frames.filter(
        (F.col("direction") == "client_to_broker") & (F.col("command") == "SEND")
    ).select(*send_keys, F.col("mono_ns").alias("asked"))
    receipts = (
        frames.filter(F.col("command").isin("SEND_RECEIPT", "SEND_ERROR"))
        .groupBy(*send_keys)
        .agg(F.min("mono_ns").alias("answered"))
    )
    paired = (
        requests.join(answers, keys)
        .select("command", "asked", "answered")
        .unionByName(
            sends.join(receipts, send_keys).select(
                F.lit("SEND").alias("command"), "asked", "answered"
            )
        )
    )
    return paired.filter(F.col("answered") >= F.col("asked")).select(
        "command", ((F.col("answered") - F.col("asked")) / F.lit(1e9)).alias("seconds")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sluice analyze", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="recording files or directories (any Hadoop-compatible path)",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="where tables and report go; required, no default",
    )
    parser.add_argument(
        "--master",
        metavar="URL",
        help="Spark master (default: local[*], or what spark-submit says)",
    )


def run(args: argparse.Namespace) -> int:
    from sluice.pipeline.report import write_report

    def say(text: str) -> None:
        print(f"[analyze] {text}", file=sys.stderr, flush=True)

    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("sluice analyze needs PySpark: pip install 'sluice[pipeline]'", file=sys.stderr)
        return 2
    local = [p for p in args.paths if "://" not in p]
    missing = [p for p in local if not Path(p).exists()]
    if missing:
        print(f"sluice analyze: no such file or directory: {missing[0]}", file=sys.stderr)
        return 2
    out = args.out
    try:
        summary = analyze(
            [str(Path(p).resolve()) if p in local else p for p in args.paths],
            str(Path(out).resolve()) if "://" not in out else out,
            args.master,
            say,
        )
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        print(f"sluice analyze: {first}", file=sys.stderr)
        return 1
    if "://" not in out:
        write_report(summary, Path(out) / "report.html")
        say(f"report: {Path(out) / 'report.html'}")
    damaged = len(summary["damaged"])
    say(
        f"{summary['frames']} frames, {summary['connections']} connections from "
        f"{summary['files']} files ({damaged} damaged, {len(summary['truncated'])} truncated) "
        f"in {summary['seconds']:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
