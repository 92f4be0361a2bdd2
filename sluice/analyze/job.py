"""The analysis job: recordings in, Parquet tables and a report out.

``analyze`` is what ``sluice analyze`` runs (``sluice/commands/analyze.py``,
also the ``spark-submit`` entry point). Each PATH is any path Spark's file
systems read (a file, a directory searched recursively for ``*.sluice``,
``file://…``, ``s3a://…``, ``hdfs://…``, ``gs://…``). Segments are read with
Spark's ``binaryFile`` source and decoded whole into Arrow record batches on
the executors (``mapInArrow``, see ``decode.py``); every table is built from
those with DataFrame operations. A damaged or truncated segment is counted
and reported in ``bad_segments`` (what it held up to the damage is kept),
never fatal. Nothing but small aggregates (for the report) is collected to
the driver.

Tables (Parquet, under DIR): ``frames``, ``connections``, ``topic_minute``,
``latency``, ``errors``, ``files`` (every segment read),
``bad_segments``, ``http`` (the HTTP listener's exchanges, one row each) and
``filtered`` (what message filters did: one row per filter record, with its
connection, topic, filter, action, reason and messages; only when the
recordings hold any, an earlier run's removed otherwise); and ``report.html``.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.analyze.jvm import ClassCache, class_cache
from sluice.protocols import registry

TABLES = ("frames", "connections", "topic_minute", "latency", "errors", "files", "bad_segments",
          "http", "filtered")  # fmt: skip
# Spark's binaryFile source cannot hold a file of 2 GiB or more in a row.
MAX_SEGMENT_BYTES = 2**31 - 1
SEGMENT_COLUMNS = ["file", "capture", "segment", "protocol", "version", "records", "frames",
                   "bytes", "truncated_bytes", "dropped_frames", "damaged", "why"]  # fmt: skip
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC"
TOP_TOPICS = 8  # series in the throughput picture; the rest are "other"


def _bucket_seconds(span_s: float) -> int:
    """A round time step giving at most ~120 points over ``span_s``."""
    for step in (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 86400):
        if span_s / step <= 120:
            return step
    return 86400 * math.ceil(span_s / 86400 / 120)


# Settings of the job's own session; with Spark Connect only these can be
# set by the client (the server's static ones are the server's).
SESSION_CONFIG = {
    "spark.sql.shuffle.partitions": "8",
    # The partials are cached once and scanned for every table: plain
    # columns cost memory, compressing them costs CPU on every scan.
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    # One segment per Arrow batch into the decoder where Spark reads them: a
    # batch holds whole files, and a few large ones must not add up past
    # Arrow's limits.
    "spark.sql.execution.arrow.maxRecordsPerBatch": "1",
}


# How long the Spark Connect server may take to accept a connection.
CONNECT_TIMEOUT_S = 10.0
# Environment variables that send gRPC through a proxy: then the server's
# address is the proxy's to reach, not this process's.
GRPC_PROXY_VARIABLES = ("grpc_proxy", "https_proxy", "http_proxy", "GRPC_PROXY", "HTTPS_PROXY",
                        "HTTP_PROXY")  # fmt: skip


class Unreachable(Exception):
    """The Spark Connect server of ``--remote`` does not accept connections."""


def check_reachable(remote: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`Unreachable` (one line) unless the host and port of an
    ``sc://HOST:PORT`` URL accept a TCP connection within ``timeout``.

    Spark Connect's client retries an unanswered call for ten minutes and
    more before it gives up; a server that is not there is said at once.
    Through a gRPC proxy (its variables set) nothing is checked here."""
    import socket

    if any(os.environ.get(name) for name in GRPC_PROXY_VARIABLES):
        return
    parsed = urllib.parse.urlsplit(remote)
    try:
        host, port = parsed.hostname, parsed.port or 15002  # Spark Connect's default port
    except ValueError as exc:  # a port that is not a number
        raise Unreachable(f"--remote {remote}: {exc}") from None
    if not host:
        raise Unreachable(f"--remote {remote}: no host in it (sc://HOST:PORT)")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except TimeoutError:
        raise Unreachable(
            f"--remote {remote}: no Spark Connect server answered at {host}:{port} "
            f"within {timeout:g} s"
        ) from None
    except OSError as exc:
        raise Unreachable(
            f"--remote {remote}: cannot connect to {host}:{port} ({exc.strerror or exc})"
        ) from None


def check_master_reachable(master: str | None, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`Unreachable` (one line) unless a standalone master of
    ``--master spark://HOST:PORT[,HOST:PORT…]`` (one of them, with high
    availability) accepts a TCP connection within ``timeout``; other
    masters are not checked here.

    Spark's client tries a master that is not there for over a minute,
    prints its Java traces all the while, and then fails the job with only
    ``Cannot call methods on a stopped SparkContext``."""
    import socket

    if master is None or not master.startswith("spark://"):
        return
    failures = []
    for address in master[len("spark://") :].split(","):
        parsed = urllib.parse.urlsplit(f"spark://{address}")
        try:
            host, port = parsed.hostname, parsed.port
        except ValueError:
            host, port = None, None
        if not host or port is None:
            raise Unreachable(f"--master {master}: {address!r} is not HOST:PORT")
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            return
        except TimeoutError:
            failures.append(f"no Spark master answered at {host}:{port} within {timeout:g} s")
        except OSError as exc:
            failures.append(f"cannot connect to {host}:{port} ({exc.strerror or exc})")
    raise Unreachable(f"--master {master}: {'; '.join(failures)}")


def spark_session(
    master: str | None, remote: str | None = None, cache: ClassCache | None = None
) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if remote:
        check_reachable(remote)
    check_master_reachable(master)
    from pyspark.sql import SparkSession

    if remote:
        builder = SparkSession.builder.remote(remote).appName("sluice-analyze")
        for key, value in SESSION_CONFIG.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()
    builder = SparkSession.builder.appName("sluice-analyze")
    # The driver JVM lives for one job: C2's optimising compiles cost more
    # CPU than they win back over it (see docs/analyze.md). Takes effect
    # where this process starts the JVM (not under spark-submit).
    java_options = os.environ.get("SLUICE_SPARK_DRIVER_JAVA_OPTIONS", DRIVER_JAVA_OPTIONS)
    if cache is not None:  # jvm.py: the classes it loads, kept for the next run
        java_options = f"{cache.java_options()} {java_options}".strip()  # the user's last
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    if master:
        builder = builder.master(master)
    if master is None or master.startswith("local"):
        if master is None:
            builder = builder.master("local[*]")
        # In local mode the driver JVM does the executors' work too.
        memory = os.environ.get("SLUICE_SPARK_DRIVER_MEMORY", "4g")
        builder = builder.config("spark.driver.memory", memory)
    # Our own progress line (progress.py) instead of Spark's bar.
    builder = builder.config("spark.ui.enabled", "false").config(
        "spark.ui.showConsoleProgress", "false"
    )
    for key, value in SESSION_CONFIG.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    quiet_task_failures(spark)
    return spark


# The driver's loggers that fill the terminal with a failed task's error
# (its trace, and the Python worker's, several times over) before the one
# line ``sluice analyze`` says it in, and their levels here.
TASK_FAILURE_LOGGERS = {
    "org.apache.spark.executor.Executor": "OFF",  # Exception in task (local mode)
    "org.apache.spark.scheduler.TaskSetManager": "OFF",  # Lost task, aborting job
    "org.apache.spark.storage.BlockManager": "ERROR",  # Putting block failed due to exception
    "org.apache.spark.sql.execution.datasources.FileFormatWriter": "OFF",  # Aborting job
}


def quiet_task_failures(spark: Any) -> None:
    """Spark's own lines about a failed task turned off, through its
    logging's configuration (log4j 2): the job's error says it, once, in
    one line. A driver logging some other way keeps them."""
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]

    try:
        log4j = spark.sparkContext._jvm.org.apache.logging.log4j
        for name, level in TASK_FAILURE_LOGGERS.items():
            log4j.core.config.Configurator.setLevel(name, log4j.Level.getLevel(level))
    except Py4JError:
        return


def analyze(
    paths: list[str],
    out: str,
    master: str | None,
    say: Any,
    remote: str | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """The job on ``master`` (a local Spark or a cluster's), or through Spark
    Connect at ``remote``; ``progress``: a :class:`progress.Progress` to feed."""
    if remote is None and nothing_to_read(paths):  # said before Spark starts
        raise NoRecordings(paths)
    cache = class_cache(os.environ) if remote is None else None
    spark = spark_session(master, remote, cache)
    done = False
    try:
        if progress is not None:
            progress.watch(spark)
        result = _analyze(spark, paths, out, say, remote is not None, progress)
        done = True
        return result
    finally:
        if progress is not None:
            progress.stop()
        gateway = getattr(spark.sparkContext, "_gateway", None) if cache else None
        jvm = getattr(gateway, "proc", None)
        spark.stop()
        if cache is not None and cache.making is not None and jvm is not None:
            if done:
                say(f"keeping the JVM's classes for faster starts (once): {cache.archive}")
                cache.keep(jvm)
            else:  # a failed run does not wait for its JVM to write an archive
                jvm.kill()


def _analyze(
    spark: Any, paths: list[str], out: str, tell: Any, connected: bool, progress: Any
) -> dict[str, Any]:
    # Arrow (and numpy) are imported here, not with the module: every
    # ``sluice`` command builds its parser from this module, and a proxy
    # should not carry them.
    from pyspark import StorageLevel
    from pyspark.sql import Observation
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from sluice.analyze.decode import (
        EXTRA_SCHEMA,
        FRAME_COLUMNS,
        HTTP_COLUMNS,
        HTTP_SCHEMA,
        is_url,
        local_path,
    )
    from sluice.analyze.partials import SPARK_SCHEMA, reduce_batches, write_empty_frames

    started = time.monotonic()

    stages: list[tuple[str, float]] = []  # (what was done, when it ended), for the report

    def say(text: str, done: str | None = None, doing: str | None = None) -> None:
        """A line on what was done (``done``: its name in the report's
        timings), and what the progress line says is being done next."""
        now = time.monotonic() - started
        if done is not None:
            stages.append((done, now))
        tell(f"{text} [{now:.1f} s]")
        if doing is not None and progress is not None:
            progress.now(doing)

    say(f"reading recordings from {', '.join(paths)}", doing="listing the segments")
    # A file named on the command line is read whatever its name; folders
    # are searched for *.sluice. (Through Spark Connect the paths are the
    # server's, and this process cannot ask what they are: all are searched.)
    named, searched = ([], paths) if connected else split_paths(paths, _is_file_in(spark))
    listings = []
    # A local path is the name it says (Spark would take ``run[1]`` for a
    # pattern); a URL is Spark's to take as written.
    as_named = [p if is_url(p) else literal(p) for p in named]
    as_searched = [p if is_url(p) else literal(p) for p in searched]
    if named:
        listings.append(spark.read.format("binaryFile").load(as_named))
    if searched:
        listings.append(
            spark.read.format("binaryFile")
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", "*.sluice")
            .load(as_searched)
        )
    listing = listings[0] if len(listings) == 1 else listings[0].unionByName(listings[1])
    found = listing.inputFiles()  # the listing Spark made: no job, no content read
    if not found:
        raise NoRecordings(paths)
    say(f"found {len(found)} segments", "list the segments", "decoding and reducing the segments")

    # Where the executors reach the files themselves (local paths, file://)
    # they read the segments and write the frames table's files (one per
    # segment) without Spark's reader and writer; elsewhere (s3a://,
    # hdfs://, gs://) Spark's binaryFile source hands them the contents and
    # Spark's writer writes the frames.
    # Through Spark Connect this process is not the driver: paths are the
    # server's, and Spark does the reading and writing.
    by_spark = connected or os.environ.get("SLUICE_ANALYZE_IO") == "spark"
    local_io = not by_spark and all(local_path(p) is not None for p in paths)
    frames_dir = None if by_spark else local_path(out)
    if frames_dir is not None:
        frames_dir = os.path.join(frames_dir, "frames")
        shutil.rmtree(frames_dir, ignore_errors=True)
        os.makedirs(frames_dir)

    # Bytes read by the executors themselves, for the progress line.
    read = progress.accumulator(spark) if progress is not None and local_io else None

    # Where the executors read the files themselves, a flight-recorder
    # snapshot passes over what an earlier one of its capture held (they
    # read those too); where Spark hands them the contents, each is read
    # whole, and what overlapping snapshots both hold is said below. (A
    # default, not a name the decoder closes over: fixed once made.)
    read_here = tuple(map(_as_listed, found)) if local_io else ()

    def reduce(batches: Any, among: tuple[str, ...] = read_here) -> Any:
        from sluice.analyze.decode import read_among

        read_among(among)
        return reduce_batches(batches, frames_dir, read)

    # Every segment decoded and reduced to partial aggregates, once; the
    # tables are these merged.
    segments_in = (
        listing.select("path", "length")
        if local_io
        else listing.filter(F.col("length") <= MAX_SEGMENT_BYTES).select(
            "path", "length", "content"
        )
    )
    parts = segments_in.mapInArrow(reduce, SPARK_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    record = F.col("record")
    counts = {
        r["record"]: r
        for r in parts.groupBy("record")
        .agg(
            F.count("*").alias("rows"),
            F.sum(F.get_json_object("extra", "$.damaged").cast("boolean").cast("int")).alias(
                "damaged"
            ),
            F.sum(
                F.when(F.get_json_object("extra", "$.truncated_bytes").cast("long") > 0, 1)
            ).alias("truncated"),
            F.sum(F.get_json_object("extra", "$.frames").cast("long")).alias("frames"),
            F.min("wall_ns").alias("first_ns"),
            F.max("last_ns").alias("last_ns"),
            F.sum(F.get_json_object("extra", "$.bytes").cast("long")).alias("bytes"),
            F.sum(F.get_json_object("extra", "$.dropped_frames").cast("long")).alias("dropped"),
            F.collect_set(F.when(record == "segment", F.col("file"))).alias("files"),
        )
        .collect()
    }

    def rows(kind: str, column: str = "rows") -> int:
        row = counts.get(kind)
        return int(row[column] or 0) if row is not None else 0

    segments_read = rows("segment")
    total_bytes = rows("segment", "bytes")
    # (Not ``read``: the decoder below is a closure over that name, and
    # through Spark Connect it is pickled again with every query: a new
    # value there is another plan, not the cached one, and every segment
    # would be decoded again for every table.)
    decoded = set(counts["segment"]["files"]) if "segment" in counts else set()
    # Listed but not decoded: empty files (Spark's scan skips them), and
    # where Spark reads the segments, those over its binaryFile limit
    # (filtered out above; asked for only when some file is missing).
    unread = sorted(f for f in map(_as_listed, found) if f not in decoded)
    too_large: dict[str, int] = {}
    if unread and not local_io:
        too_large = {
            r["path"]: r["length"]
            for r in listing.filter(F.col("length") > MAX_SEGMENT_BYTES)
            .select("path", "length")
            .collect()
        }
    bad = rows("segment", "damaged") + rows("segment", "truncated") + len(unread)
    frames_total = rows("segment", "frames")
    dropped = rows("segment", "dropped")
    say(
        f"decoded: {segments_read} segments read ({bad} bad, {total_bytes / 1e6:,.1f} MB), "
        f"{frames_total:,} frames, "
        f"{rows('conn'):,} connection records, {rows('close'):,} closes, "
        f"{rows('http'):,} HTTP exchanges, {dropped:,} frames dropped while recording",
        "decode and reduce every segment",
        "writing the tables",
    )
    twice = 0  # records counted once for each overlapping snapshot holding them
    if not local_io:
        ring = F.get_json_object("extra", "$.ring").cast("long")
        held = F.get_json_object("extra", "$.ring_records").cast("long")
        twice = repeated_in_snapshots([
            (r["file"], r["capture"], r["ring"], r["held"])
            for r in parts.filter((record == "segment") & ring.isNotNull())
            .select("file", "capture", ring.alias("ring"), held.alias("held"))
            .collect()
        ])  # fmt: skip
        if twice:
            print(f"sluice analyze: warning: {twice:,} records are in more than one "
                  "flight-recorder snapshot of one capture and counted once for each (read "
                  "from the contents Spark hands over, not passed over): analyze one "
                  "snapshot directory at a time, or local files", file=sys.stderr)  # fmt: skip
    written: dict[str, int] = {}

    def write(df: Any, name: str) -> Any:
        path = f"{out}/{name}"
        counted = Observation(name)  # counted while writing, not by another job
        df.observe(counted, F.count(F.lit(1)).alias("rows")).write.mode("overwrite").parquet(path)
        written[name] = int(counted.get["rows"])
        say(f"wrote {name}: {written[name]:,} rows", f"table {name}", "writing the tables")
        # Read back with the schema it was written with (as Spark writes
        # files: every column nullable): inferring it is a job of its own.
        schema = T.StructType([T.StructField(f.name, f.dataType) for f in df.schema.fields])
        return spark.read.schema(schema).parquet(literal(path))  # as written, not a pattern

    if frames_dir is None:
        write(parts.filter(record == "frame").select(*FRAME_COLUMNS), "frames")
    else:
        if not frames_total:
            write_empty_frames(frames_dir)
        Path(frames_dir, "_SUCCESS").touch()
        written["frames"] = frames_total
        say(f"wrote frames: {frames_total:,} rows", "table frames (its files by the executors)")

    def of(kind: str) -> Any:
        return parts.filter(record == kind)

    def side(rows: Any) -> Any:
        """Rows that are not frames, their ``extra`` JSON as columns."""
        return rows.withColumn("x", F.from_json("extra", EXTRA_SCHEMA)).select(
            "record", "capture", "file", "conn", "wall_ns", "x.*"
        )

    segments = of("segment")
    if unread:
        rows_unread = [
            ("segment", path, json.dumps({"bytes": too_large[path], "damaged": True,
                                          "why": f"{path}: not read, over Spark's binaryFile "
                                          "limit"}))
            if path in too_large
            else _empty_segment(path)
            for path in unread
        ]  # fmt: skip
        segments = segments.unionByName(
            spark.createDataFrame(rows_unread, "record string, file string, extra string"),
            allowMissingColumns=True,
        )
    files = side(segments).select(*SEGMENT_COLUMNS)
    status = write(files, "files")
    bad_segments = write(
        status.filter(F.col("damaged") | (F.col("truncated_bytes") > 0)), "bad_segments"
    )

    # The connections table without joins: the segments' counts per
    # connection summed (a hash aggregation: fixed-width values only), then
    # those few rows with the connection and close rows in one group-by. A
    # connection is a row where it has a ``conn`` record (re-stated
    # unchanged at the start of every segment); its frame counts are null
    # where it has no frames, its close null where it was not closed.
    key = ["capture", "conn"]
    counts_per_conn = (
        of("conn_frames")
        .groupBy(*key)
        .agg(
            F.sum("frames").alias("frames"),
            F.sum("bytes").alias("bytes"),
            F.sum("from_client").alias("frames_from_client"),
            F.sum("errors").alias("broker_errors"),
            F.sum("invalids").alias("invalid_frames"),
            F.max("last_ns").alias("last_ns"),
        )
    )
    x = F.from_json("extra", EXTRA_SCHEMA)
    opened = F.when(
        record == "conn",
        F.struct(
            F.col("wall_ns").alias("opened_ns"),
            x["protocol"].alias("protocol"),
            x["client"].alias("client"),
            x["broker"].alias("broker"),
            x["kind"].alias("kind"),
            x["listener"].alias("listener"),
        ),
    )
    closed = F.when(
        record == "close",
        F.struct(F.col("wall_ns").alias("closed_ns"), x["reason"].alias("reason")),
    )
    events = parts.filter(record.isin("conn", "close")).select(
        *key, opened.alias("o"), closed.alias("c")
    )
    stats = ["frames", "bytes", "frames_from_client", "broker_errors", "invalid_frames", "last_ns"]
    per_conn = (
        events.unionByName(counts_per_conn, allowMissingColumns=True)
        .groupBy(*key)
        .agg(
            F.min("o").alias("o"),  # one value: the re-statements are equal
            *(F.max(name).alias(name) for name in stats),  # one row has them, or none
            F.min("c").alias("c"),
        )
        .filter(F.col("o").isNotNull())
    )
    connections = write(
        per_conn.select(
            *key,
            "o.protocol",
            "o.client",
            "o.broker",
            "o.kind",
            "o.listener",
            "o.opened_ns",
            "frames",
            "bytes",
            "frames_from_client",
            "broker_errors",
            "invalid_frames",
            "c.closed_ns",
            "c.reason",
            ((F.coalesce("c.closed_ns", "last_ns") - F.col("o.opened_ns")) / F.lit(1e9)).alias(
                "duration_s"
            ),
        ),
        "connections",
    )

    # The HTTP listener's exchanges, one row each; an upgrade's row counts
    # its WebSocket session's frames (ws rows: per segment and connection).
    h = F.from_json("extra", HTTP_SCHEMA)
    sessions = (
        of("ws")
        .select(*key, h["frames"].alias("frames"), h["bytes"].alias("bytes"))
        .groupBy(*key)
        .agg(F.sum("frames").alias("ws_frames"), F.sum("bytes").alias("ws_bytes"))
    )
    upgraded = F.col("status") == 101
    exchanges = write(
        of("http")
        .select(*key, "wall_ns", *(h[name].alias(name) for name in HTTP_COLUMNS))
        .join(sessions, key, "left")
        .select(
            "*",
            F.when(upgraded, F.coalesce("ws_frames", F.lit(0)))
            .otherwise(0)
            .alias("websocket_frames"),
            F.when(upgraded, F.coalesce("ws_bytes", F.lit(0)))
            .otherwise(0)
            .alias("websocket_bytes"),
        )
        .drop("ws_frames", "ws_bytes"),
        "http",
    )

    # Messages: the frames that carry them, in each protocol (both ways).
    topic_minute = write(
        of("topic_minute")
        .groupBy("topic", F.timestamp_seconds("at").alias("minute"), "direction")
        .agg(
            F.sum("messages").alias("messages"),
            F.sum("bytes").alias("bytes"),
            F.sum("frames").alias("frames"),
        ),
        "topic_minute",
    )

    samples = request_latencies(parts, F).persist(StorageLevel.MEMORY_AND_DISK)
    latency = write(
        samples.groupBy("command").agg(
            F.count("*").alias("count"),
            F.percentile_approx("seconds", 0.5).alias("p50"),
            F.percentile_approx("seconds", 0.9).alias("p90"),
            F.percentile_approx("seconds", 0.99).alias("p99"),
            F.max("seconds").alias("max"),
        ),
        "latency",
    )

    errors = write(
        of("error")
        .groupBy("code", "command", "topic", "capture", "conn")
        .agg(F.sum("frames").alias("count")),
        "errors",
    )

    # One row per filter record, as recorded: few, so no shuffle. Written
    # only when the recordings hold some (a capture made with --filter), so
    # that the job's others cost no Spark job more; otherwise a table left
    # by an earlier run into the same DIR is removed (where this process
    # reaches it; elsewhere an empty one replaces it).
    acted: dict[tuple[str, str, str, str], int] = {}
    out_here = None if connected else local_path(out)
    acts = of("filter").select(
        "capture", "conn", "direction", "topic",
        F.get_json_object("extra", "$.filter").alias("filter"),
        F.col("command").alias("action"), F.col("error").alias("reason"), "messages", "wall_ns",
    )  # fmt: skip
    if not rows("filter") and out_here is not None:
        shutil.rmtree(os.path.join(out_here, "filtered"), ignore_errors=True)
    elif not rows("filter"):
        write(acts, "filtered")
    else:
        filtered = write(acts, "filtered")
        for r in filtered.select("filter", "action", "reason", "topic", "messages").collect():
            acted_on = (r["filter"], r["action"], r["reason"] or "", r["topic"] or "")
            acted[acted_on] = acted.get(acted_on, 0) + int(r["messages"] or 0)

    say("building the report", doing="queries for the report")
    first_ns = counts["conn_frames"]["first_ns"] if "conn_frames" in counts else None
    span = (rows("conn_frames", "last_ns") - first_ns) / 1e9 if first_ns is not None else 0.0
    step = _bucket_seconds(span)
    top_topics = [
        r.asDict()
        for r in topic_minute.groupBy("topic")
        .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
        .orderBy(F.desc("messages"), "topic")
        .limit(10)
        .collect()
    ]
    shown = [t["topic"] for t in top_topics[:TOP_TOPICS]]
    # One pass over the frames for every picture over time: per time step,
    # command, direction, topic (one of the busiest; for the rest null, and
    # ``other_topic`` true: a topic may well be named "other") and error code.
    over_time = [
        r.asDict()
        for r in of("second")
        .groupBy(
            F.floor(F.col("at") / F.lit(step)).alias("step"),
            "command",
            "direction",
            F.when(F.col("topic").isin(shown), F.col("topic")).alias("topic"),
            (F.col("topic").isNotNull() & ~F.col("topic").isin(shown)).alias("other_topic"),
            "code",
        )
        .agg(
            F.sum("frames").alias("frames"),
            F.sum("messages").alias("messages"),
            F.sum("bytes").alias("bytes"),
        )
        .collect()
    ]
    listed = [r.asDict() for r in bad_segments.collect()]
    status_class = F.concat((F.col("status") / 100).cast("int").cast("string"), F.lit("xx"))
    summary = {
        "frames": frames_total,
        "dropped_frames": dropped,
        "repeated_records": twice,
        "http": {
            "exchanges": written["http"],
            "by_kind": [
                r.asDict()
                for r in exchanges.groupBy("kind", status_class.alias("status"))
                .agg(
                    F.count("*").alias("count"),
                    F.max("seconds").alias("max_seconds"),
                    F.sum("websocket_frames").alias("websocket_frames"),
                )
                .orderBy("kind", "status")
                .collect()
            ],
        },
        "connections": written["connections"],
        "files": written["files"],
        "bytes": total_bytes,
        "step": step,
        "over_time": over_time,
        "damaged": [r for r in listed if r["damaged"]],
        "truncated": [r for r in listed if (r["truncated_bytes"] or 0) > 0],
        "protocols": [
            r.asDict()
            for r in connections.groupBy("protocol").count().orderBy("protocol").collect()
        ],
        "latency": [r.asDict() for r in latency.orderBy(F.desc("count"), "command").collect()],
        "latency_histogram": [
            r.asDict()
            for r in samples.groupBy(
                "command",
                F.floor(F.log10(F.greatest(F.col("seconds"), F.lit(1e-7))) * 10).alias("bin"),
            )
            .count()
            .collect()
        ],
        "top_topics": top_topics,
        "filtered": [
            {"filter": f, "action": a, "reason": r, "topic": t, "messages": n}
            for (f, a, r, t), n in sorted(acted.items(), key=lambda kv: (-kv[1], kv[0]))[:50]
        ],
        "errors": [
            r.asDict()
            for r in errors.groupBy("code")
            .agg(F.sum("count").alias("count"))
            .orderBy(F.desc("count"), "code")
            .collect()
        ],
        "churn": [
            r.asDict()
            for r in connections.select(F.col("opened_ns").alias("at"), F.lit(1).alias("d"))
            .unionByName(
                connections.filter(F.col("closed_ns").isNotNull()).select(
                    F.col("closed_ns").alias("at"), F.lit(-1).alias("d")
                )
            )
            .groupBy(F.floor(F.col("at") / F.lit(step * 10**9)).alias("step"))
            .agg(
                F.sum(F.when(F.col("d") > 0, 1).otherwise(0)).alias("opened"),
                F.sum(F.when(F.col("d") < 0, 1).otherwise(0)).alias("closed"),
            )
            .collect()
        ],
        "top_talkers": [
            r.asDict()
            for r in connections.withColumn(
                "host", F.regexp_extract("client", r"^\[?(.*?)\]?:\d+$", 1)
            )
            .groupBy("host")
            .agg(
                F.count("*").alias("connections"),
                F.sum("frames").alias("frames"),
                F.sum("bytes").alias("bytes"),
            )
            .orderBy(F.desc("bytes"), "host")
            .limit(10)
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
    }
    samples.unpersist()
    parts.unpersist()
    summary["seconds"] = time.monotonic() - started
    say(
        f"tables written: {', '.join(f'{n} {c:,}' for n, c in written.items())}",
        "queries for the report",
    )
    ends = [0.0, *(end for _, end in stages)]
    summary["stages"] = [
        {"stage": name, "seconds": end - ends[i]} for i, (name, end) in enumerate(stages)
    ]
    return summary


def _empty_segment(path: str) -> tuple[str, str, str]:
    """The segment row of an empty file, as the executors would make it."""
    from sluice.analyze.decode import decode_segment

    row = list(decode_segment(path, b""))[-1].to_pylist()[-1]
    return row["record"], row["file"], row["extra"]


class NoRecordings(Exception):
    """Nothing to analyse: no PATH holds a recording."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__(f"{', '.join(paths)}: no recordings (*.sluice) here")
        self.paths = paths


def nothing_to_read(paths: list[str]) -> bool:
    """Whether the PATHs are known, before Spark starts, to hold no
    recording: each a local folder (a plain path or ``file:``) in which no
    ``*.sluice`` leads anywhere (searched as Spark will, links followed).
    A file, a URL of another scheme, a path not there or a folder not read
    whole is not known to: Spark's listing says."""
    from sluice.analyze.decode import local_path

    for path in paths:
        local = local_path(path)
        if local is None or not os.path.isdir(local):
            return False
        seen: set[str] = set()
        unread: list[OSError] = []
        for where, folders, names in os.walk(local, onerror=unread.append, followlinks=True):
            real = os.path.realpath(where)
            if real in seen:  # (a link to a folder above it)
                folders.clear()
                continue
            seen.add(real)
            for name in names:
                if name.endswith(".sluice") and os.path.exists(os.path.join(where, name)):
                    return False
        if unread:
            return False
    return True


def split_paths(
    paths: list[str], is_file: Callable[[str], bool] | None = None
) -> tuple[list[str], list[str]]:
    """The PATHs that are files, to be read whatever their name, and the
    rest, to be searched for ``*.sluice`` (folders). ``is_file`` says
    whether a URL of another scheme than ``file:`` names a file (without
    it: none does); one whose name ends in ``.sluice`` is searched for
    (its folder's search, given too, reads it once, not twice).

    A local file inside a folder given too is left to the folder's search,
    so that it is read once, not twice."""
    from sluice.analyze.decode import local_path

    local = {p: local_path(p) for p in paths}
    folders = [os.path.realpath(f) for f in local.values() if f is not None and os.path.isdir(f)]
    named: list[str] = []
    searched: list[str] = []
    for path, file in local.items():
        if file is None:
            remote_file = not path.endswith(".sluice") and is_file is not None and is_file(path)
            (named if remote_file else searched).append(path)
            continue
        if not os.path.isfile(file):
            searched.append(path)
            continue
        real = os.path.realpath(file)
        inside = any(os.path.commonpath([real, folder]) == folder for folder in folders)
        if inside and file.endswith(".sluice"):
            continue  # the folder's search reads it
        if path not in named:
            named.append(path)
    return named, searched


def _is_file_in(spark: Any) -> Callable[[str], bool]:
    """Whether a URL names a file, as the Hadoop file system that ``spark``
    has for its scheme says (one status asked, no job); not where it cannot
    say (no such path, no file system for the scheme): Spark's listing
    says why then."""
    from py4j.protocol import Py4JError

    context = spark.sparkContext

    def is_file(url: str) -> bool:
        try:
            path = context._jvm.org.apache.hadoop.fs.Path(url)
            system = path.getFileSystem(context._jsc.hadoopConfiguration())
            return bool(system.getFileStatus(path).isFile())
        except Py4JError:
            return False

    return is_file


# Hadoop's glob characters (and its escape): Spark globs every path it reads.
_GLOB = re.compile(r"([\\\[\]{}*?])")


def literal(path: str) -> str:
    """``path`` as Spark reads it literally, not as a pattern: its glob
    characters escaped (Hadoop's ``GlobPattern`` takes ``\\x`` for ``x``),
    so that a folder ``run[1]`` is that folder."""
    return _GLOB.sub(r"\\\1", path)


def repeated_in_snapshots(snapshots: list[tuple[str, str, int, int]]) -> int:
    """Of flight-recorder snapshots each read whole (file, capture, the
    ``ring`` number of its first numbered record, how many it holds): the
    records that another one of the same capture among them held too
    (``Repeats``; in any order, the same count: those held, less the
    different ones among them)."""
    from sluice.recording.reader import Repeats

    repeats = Repeats()
    numbered = {"k": "numbered"}  # (any record: only its place counts)
    found = 0
    for _, capture, ring, held in sorted(snapshots, key=lambda snapshot: snapshot[0]):
        repeats.repeated({"k": "header", "capture": capture})
        repeats.repeated({"k": "snapshot", "ring": ring})
        found += sum(repeats.repeated(numbered) for _ in range(held or 0))
    return found


def _as_listed(uri: str) -> str:
    """A file of ``inputFiles()``, a URI (``file:///x/run%231``), as the
    listing's rows spell it (Hadoop's ``Path``: ``file:/x/run#1``)."""
    parsed = urllib.parse.urlsplit(uri)
    if not parsed.scheme:
        return uri
    authority = f"//{parsed.netloc}" if parsed.netloc else ""
    return f"{parsed.scheme}:{authority}{urllib.parse.unquote(parsed.path)}"


def request_latencies(parts: Any, F: Any) -> Any:
    """(command, seconds) for every request paired with its answer.

    The segments' partials merged (``partials.py``): per publish (a
    ``send_pair``: capture, connection, producer id, sequence id) and per
    other request (a ``request_pair``: capture, connection, request id), the
    earliest asking and the earliest answering time; a pair is a request
    answered no earlier than asked. A publish's command is its position among
    the publishing commands (a hash aggregation: fixed-width values only);
    another request's, the earliest asking frame's (frames of one read share
    a time, so a tie goes to the command's name), with the min of a struct
    over these few rows.
    """
    publishing, _ = registry.publishes()
    names = F.array(*(F.lit(name) for name in publishing))
    pair = ["capture", "conn", "a", "b"]
    asked = F.min("asked").alias("asked")
    answered = F.min("answered").alias("answered")
    sends = (
        parts.filter(F.col("record") == "send_pair")
        .groupBy(*pair)
        .agg(F.min("ask").alias("at"), asked, answered)
        .select(F.element_at(names, F.col("at").cast("int")).alias("command"), "asked", "answered")
    )
    requests = (
        parts.filter(F.col("record") == "request_pair")
        .groupBy(*pair)
        .agg(
            F.min(F.when(F.col("asked").isNotNull(), F.struct("asked", "command"))).alias("first"),
            asked,
            answered,
        )
        .select(F.col("first.command").alias("command"), "asked", "answered")
    )
    paired = sends.unionByName(requests)
    return paired.filter(F.col("answered") >= F.col("asked")).select(
        "command", ((F.col("answered") - F.col("asked")) / F.lit(1e9)).alias("seconds")
    )
