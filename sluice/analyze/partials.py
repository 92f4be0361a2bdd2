"""Executor side of ``sluice analyze``: each segment reduced to what the tables need.

A segment's frames are decoded into one Arrow batch (``decode.py``); here,
still on the executor, that batch is

- written as the segment's own Parquet file of the ``frames`` table when the
  output is on a file system this process reaches (``frames_dir``), or else
  handed to Spark with the rest, to be written by Spark's writer (remote
  outputs: ``s3a://``, ``hdfs://``, ``gs://``);
- reduced with Arrow's grouped aggregations to partial aggregates per segment,
  which Spark merges across segments into the tables: per connection (frame
  and byte counts, errors, the last frame), per topic, minute and direction
  (messages, bytes, frames), per error code, per second of the report's
  pictures, and per request (the first asking and first answering time, for
  the latency pairs).

So a million frames cross into the JVM as a few hundred thousand narrow
rows, and only once. Every partial merges with sum, min or max, so a table
is the same whichever segments an executor got, in whatever order.

The rows yielded have the columns of :data:`SCHEMA` (``decode.SCHEMA`` and
the partials' own columns); ``record`` names what a row is: the kinds of
``decode.py`` (``frame`` only without ``frames_dir``), and
``conn_frames``, ``topic_minute``, ``error``, ``second``, ``send_pair``,
``request_pair``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from sluice.analyze.decode import (
    _FIELDS,
    COUNTED,
    FRAME_COLUMNS,
    SCHEMA,
    decode_segment,
    segments,
    spark_schema,
)
from sluice.protocols import registry

_PARTIAL_FIELDS: list[tuple[str, pa.DataType]] = [
    ("frames", pa.int64()),  # frames counted
    ("bytes", pa.int64()),  # their sizes summed
    ("from_client", pa.int64()),  # of them client to broker
    ("errors", pa.int64()),  # of them with a broker error
    ("invalids", pa.int64()),  # of them invalid
    ("last_ns", pa.int64()),  # the latest frame's wall clock
    ("at", pa.int64()),  # minute or second (Unix time)
    ("code", pa.string()),  # error code (or invalid:<why>)
    ("a", pa.int64()),  # a request's key: producer id or request id
    ("b", pa.int64()),  # ... and sequence id (or 0)
    ("ask", pa.int64()),  # a publish's command: its position among the publishing ones
    ("asked", pa.int64()),  # the first asking frame's monotonic time
    ("answered", pa.int64()),  # the first answering frame's monotonic time
]
SCHEMA_ALL = pa.schema(_FIELDS + _PARTIAL_FIELDS)
SPARK_SCHEMA = spark_schema(_FIELDS + _PARTIAL_FIELDS)
FRAMES_SCHEMA = pa.schema([SCHEMA.field(name) for name in FRAME_COLUMNS])
PUBLISHING, ANSWERING = registry.publishes()


def frames_file(frames_dir: str, path: str) -> str:
    """The segment's file of the ``frames`` table: named by its path, so a
    task run again writes the same file again."""
    return os.path.join(frames_dir, f"part-{hashlib.sha1(path.encode()).hexdigest()[:20]}.parquet")


def reduce_batches(
    batches: Iterable[pa.RecordBatch], frames_dir: str | None, read: Any = None
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: batches of (path, length, content) to partials;
    ``read``: an accumulator to add each segment's size to, or None."""
    for path, content in segments(batches):
        if read is not None:
            read.add(len(content))
        try:
            yield from reduce_segment(path, content, frames_dir)
        except Exception as exc:  # a fault of ours, not the segment's damage: say which one
            raise SegmentFailed(f"{path}: {type(exc).__name__}: {exc}") from exc


class SegmentFailed(Exception):
    """A segment whose reduction failed (not damage, which is a row): its
    path and the error, one line, as the job's error says it."""


def reduce_segment(path: str, content: Any, frames_dir: str | None) -> Iterator[pa.RecordBatch]:
    for batch in decode_segment(path, content):
        if batch.num_rows and batch.column("record")[0].as_py() == "frame":
            frames = pa.Table.from_batches([batch])
            if frames_dir is None:
                yield _widen(batch)
            else:
                write_frames(frames, frames_file(frames_dir, path))
            yield from (_widen(b) for b in partials(frames) if b.num_rows)
        else:
            yield _widen(batch)


def write_frames(frames: pa.Table, target: str) -> None:
    """One segment's ``frames`` rows as a Parquet file, whole or not at all."""
    partial = f"{target}.{os.getpid()}.tmp"
    pq.write_table(frames.select(FRAME_COLUMNS), partial, compression="snappy")
    os.replace(partial, target)


def write_empty_frames(frames_dir: str) -> None:
    """The ``frames`` table with no rows (nothing decoded): its schema only."""
    write_frames(FRAMES_SCHEMA.empty_table(), os.path.join(frames_dir, "part-empty.parquet"))


def _widen(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with every column of :data:`SCHEMA_ALL` (absent ones null)."""
    count = batch.num_rows
    names = set(batch.schema.names)
    arrays = [
        batch.column(name) if name in names else pa.nulls(count, kind)
        for name, kind in _FIELDS + _PARTIAL_FIELDS
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA_ALL)


def _grouped(
    table: pa.Table,
    keys: list[str],
    aggregations: list[tuple[str, str, str]],
    use_threads: bool = True,
) -> pa.Table:
    """``table`` grouped by ``keys``: the keys, then each (column, function,
    name) aggregation under its name."""
    result = table.group_by(keys, use_threads=use_threads).aggregate(
        [(column, function) for column, function, _ in aggregations]
    )
    columns = {key: result.column(key) for key in keys}
    for column, function, name in aggregations:
        columns[name] = result.column(f"{column}_{function}")
    return pa.table(columns)


def _batch(record: str, table: pa.Table, capture: str) -> pa.RecordBatch:
    count = table.num_rows
    columns = {"record": pa.repeat(pa.scalar(record), count),
               "capture": pa.repeat(pa.scalar(capture), count)}  # fmt: skip
    for name in table.column_names:
        columns[name] = table.column(name).combine_chunks()
    return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))


def partials(frames: pa.Table) -> Iterator[pa.RecordBatch]:
    """One segment's frames (one capture) as partial aggregates."""
    capture = frames.column("capture")[0].as_py()
    outbound = pc.equal(frames.column("direction"), "client_to_broker")
    error, invalid = frames.column("error"), frames.column("invalid")
    failed = pc.or_(pc.is_valid(error), pc.is_valid(invalid))
    code = pc.if_else(pc.is_valid(error), error,
                      pc.binary_join_element_wise("invalid:", invalid, ""))  # fmt: skip
    wall = frames.column("wall_ns")
    table = frames.append_column("outbound", pc.cast(outbound, pa.int64()))
    table = table.append_column("is_error", pc.cast(pc.is_valid(error), pa.int64()))
    table = table.append_column("is_invalid", pc.cast(pc.is_valid(invalid), pa.int64()))
    table = table.append_column("code", pc.if_else(failed, code, pa.scalar(None, pa.string())))

    per_conn = _grouped(table, ["conn"], [
        ("size", "count", "frames"), ("size", "sum", "bytes"), ("outbound", "sum", "from_client"),
        ("is_error", "sum", "errors"), ("is_invalid", "sum", "invalids"),
        ("wall_ns", "min", "wall_ns"), ("wall_ns", "max", "last_ns"),
    ])  # fmt: skip
    yield _batch("conn_frames", per_conn, capture)

    counted = pc.and_(pc.is_in(table.column("command"), pa.array(sorted(COUNTED), pa.string())),
                      pc.is_valid(table.column("topic")))  # fmt: skip
    minute = pc.multiply(pc.divide(wall, pa.scalar(60 * 10**9, pa.int64())), 60)
    messages = table.filter(counted).append_column("at", minute.filter(counted))
    per_minute = _grouped(messages, ["topic", "at", "direction"], [
        ("messages", "sum", "messages"), ("size", "sum", "bytes"), ("size", "count", "frames"),
    ])  # fmt: skip
    yield _batch("topic_minute", per_minute, capture)

    failures = _grouped(table.filter(failed), ["code", "command", "topic", "conn"],
                        [("size", "count", "frames")])  # fmt: skip
    yield _batch("error", failures, capture)

    second = pc.divide(wall, pa.scalar(10**9, pa.int64()))
    per_second = _grouped(table.append_column("at", second),
                          ["at", "command", "direction", "topic", "code"], [
        ("size", "count", "frames"), ("messages", "sum", "messages"), ("size", "sum", "bytes"),
    ])  # fmt: skip
    yield _batch("second", per_second, capture)

    yield from _pairs(table, outbound, capture)


def _pairs(table: pa.Table, outbound: pa.ChunkedArray, capture: str) -> Iterator[pa.RecordBatch]:
    """Per request in this segment: the first asking and answering times.

    A publish and its answers (``ProtocolSpec.publish``) share (connection,
    producer id, sequence id); other requests and their answers share
    (connection, request id). The asking command of a publish is its
    position among the publishing commands (1 first); of another request,
    the command of the earliest asking frame (by time, then name).
    """
    command = table.column("command")
    send = pc.is_in(command, pa.array(PUBLISHING, pa.string()))
    receipt = pc.is_in(command, pa.array(sorted(ANSWERING), pa.string()))
    by_send = pc.or_(send, receipt)
    keyed = pc.or_(by_send, pc.is_valid(table.column("request_id")))
    mono = table.column("mono_ns")
    none = pa.scalar(None, pa.int64())
    asks = pc.if_else(by_send, pc.and_(send, outbound), outbound)
    answers = pc.if_else(by_send, receipt, pc.invert(outbound))
    position = pc.add(pc.index_in(command, pa.array(PUBLISHING, pa.string())), 1)
    frame = pa.table({
        "conn": table.column("conn"),
        "by_send": by_send,
        "a": pc.if_else(by_send, table.column("producer_id"), table.column("request_id")),
        "b": pc.if_else(by_send, table.column("sequence_id"), pa.scalar(0, pa.int64())),
        "ask": pc.if_else(asks, pc.cast(position, pa.int64()), none),
        "asked": pc.if_else(asks, mono, none),
        "answered": pc.if_else(answers, mono, none),
        "command": pc.if_else(asks, command, pa.scalar(None, pa.string())),
    }).filter(keyed)  # fmt: skip
    sends = frame.filter(frame.column("by_send"))
    per_send = _grouped(sends, ["conn", "a", "b"], [
        ("ask", "min", "ask"), ("asked", "min", "asked"), ("answered", "min", "answered"),
    ])  # fmt: skip
    yield _batch("send_pair", per_send, capture)
    requests = frame.filter(pc.invert(frame.column("by_send")))
    answered = _grouped(requests, ["conn", "a", "b"], [("answered", "min", "answered")])
    # The earliest asking frame and its command: sorted, then the first of each key.
    asking = requests.filter(pc.is_valid(requests.column("asked"))).sort_by(
        [("conn", "ascending"), ("a", "ascending"), ("b", "ascending"),
         ("asked", "ascending"), ("command", "ascending")]
    )  # fmt: skip
    first = _grouped(asking, ["conn", "a", "b"],
                     [("asked", "first", "asked"), ("command", "first", "command")],
                     use_threads=False)  # fmt: skip
    per_request = answered.join(first, ["conn", "a", "b"], join_type="left outer")
    yield _batch("request_pair", per_request.select(["conn", "a", "b", "asked", "answered",
                                                      "command"]), capture)  # fmt: skip
