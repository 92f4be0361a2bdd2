"""``sluice inspect``: recordings as a readable timeline, JSON lines, a summary, or pcapng."""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import datetime as dt
import difflib
import json
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sluice.commands import output_problem, path_arg
from sluice.config import count, seconds_or_zero
from sluice.errors import ConfigError
from sluice.protocols import registry
from sluice.protocols.faults import topic_matches
from sluice.protocols.filtering import topic_of
from sluice.recording.format import (
    Gone,
    ReadResult,
    Record,
    RecordingError,
    Unfinished,
    read_records,
)
from sluice.recording.pcapng import PcapngWriter
from sluice.recording.reader import Repeats, holds_nothing, in_capture_order, listed
from sluice.recording.writer import private

log = logging.getLogger("sluice.inspect")
ARROWS = {0: "C→B", 1: "B→C"}
DIRECTIONS = {0: "client_to_broker", 1: "broker_to_client"}
# The HTTP listener's records (docs/recording-format.md), by what --command names them.
WEB_KINDS = {"http": "HTTP", "ws": "WS", "ws_end": "WS"}
GONE = "removed while being read (retention), skipped"
# The records that open and close a connection.
FLOW_KINDS = ("conn", "close")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recording", type=path_arg, help="a recording file or a directory of them")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="one JSON object per record")
    out.add_argument("--summary", action="store_true", help="only the summary")
    out.add_argument(
        "--pcap",
        type=path_arg,
        metavar="OUT.pcapng",
        help="write the traffic as synthetic TCP packets (IPv4, IPv6) for Wireshark (default: off)",
    )
    parser.add_argument(
        "--with-bytes",
        action="store_true",
        help="with --json: include each frame's recorded bytes (base64)",
    )
    sel = parser.add_argument_group("filters")
    sel.add_argument(
        "--connection",
        type=count,  # an id: a negative one would match nothing, without a word
        action="append",
        metavar="N",
        help="only connection N (repeatable; default: all)",
    )
    sel.add_argument(
        "--command",
        dest="commands",
        action="append",
        metavar="NAME",
        help="only these commands, e.g. SEND, or HTTP (the HTTP listener's exchanges), WS "
        "(WebSocket frames) (repeatable; default: all)",
    )
    sel.add_argument(
        "--topic",
        help="only frames of this topic, or of its partitions; a glob "
        "(persistent://t/ns/orders-*), and without :// the topic's local name (orders, "
        "orders-*), as fault rules take it "
        "(default: all)",
    )
    sel.add_argument(
        "--since",
        type=seconds_or_zero,
        metavar="SECONDS",
        help="only from this many seconds after the capture started (default: the start)",
    )
    sel.add_argument(
        "--until",
        type=seconds_or_zero,
        metavar="SECONDS",
        help="only up to this offset (default: the end)",
    )
    parser.add_argument("--wall", action="store_true", help="show wall-clock times")


@dataclass
class Filters:
    connections: set[int] | None = None
    commands: set[str] | None = None
    topic: str | None = None
    since: float | None = None
    until: float | None = None

    def keeps_conn(self, record: Record) -> bool:
        """Whether ``record``'s connection is one of those asked for."""
        return self.connections is None or record.get("c") in self.connections

    def keep(self, record: Record, offset: float) -> bool:
        if self.since is not None and offset < self.since:
            return False
        if self.until is not None and offset > self.until:
            return False
        if record["k"] == "gap":
            # Frames of any connection and topic may be among those not
            # recorded: without the gap, a filtered view would show none
            # missing where some are.
            return True
        if not self.keeps_conn(record):
            return False
        if record["k"] in WEB_KINDS:  # the HTTP listener's: --command HTTP or WS
            wanted = WEB_KINDS[record["k"]]
            return self.topic is None and (self.commands is None or wanted in self.commands)
        if record["k"] != "frame":
            return self.commands is None and self.topic is None
        summary = record["s"]
        if self.commands is not None and summary.get("cmd") not in self.commands:
            return False
        return self.topic is None or _of_topic(summary.get("topic"), self.topic)


def _of_topic(name: object, topic: str) -> bool:
    """Whether a frame's topic ``name`` is ``topic`` (a name, ``tenant/ns/topic``, a glob,
    or a local name without ``://``) or one of its partitions
    (a partitioned topic's frames name its partitions only)."""
    if not isinstance(name, str):
        return False
    if "://" not in topic and topic.count("/") == 2:  # tenant/ns/topic, as clients take it
        topic = f"persistent://{topic}"
    if name == topic or topic_of(name) == topic:
        return True
    if "://" in topic and not any(c in topic for c in "*?["):
        return False  # a whole name, no glob: only itself (no topic name has these)
    # A glob, or a local name: as fault rules match topics.
    return topic_matches(topic, name) or topic_matches(topic, topic_of(name))


@dataclass
class Summary:
    frames: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    bytes: collections.Counter[str] = field(default_factory=collections.Counter)
    invalid: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    connections: set[tuple[str, int]] = field(default_factory=set)
    # Chunked messages: (command, direction) -> chunks, and whole messages
    # (their last chunk seen).
    chunks: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    chunked: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    faults: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    # Messages message filters acted on: (filter, action, reason) -> messages.
    filtered: collections.Counter[tuple[str, str, str]] = field(default_factory=collections.Counter)
    # The HTTP listener's: exchanges by (kind, status class), WebSocket
    # frames by (direction, opcode).
    http: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    websocket: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    dropped: int = 0
    files: int = 0
    truncated: list[tuple[Path, int]] = field(default_factory=list)
    gone: list[Path] = field(default_factory=list)  # removed while being read
    reading: Path | None = None  # the file whose records come now

    def add(self, capture: str, record: Record) -> None:
        kind = record["k"]
        if kind == "frame":
            summary = record["s"]
            direction = DIRECTIONS[record["d"]]
            self.frames[(summary["cmd"], direction)] += 1
            self.bytes[direction] += record["n"]
            if "invalid" in summary:
                self.invalid[summary["invalid"]] += 1
            if "error" in summary:
                self.errors[f"{summary['cmd']} {summary['error']}"] += 1
            if "chunk" in summary:
                _, index, count, _ = summary["chunk"]
                self.chunks[(summary["cmd"], direction)] += 1
                self.chunked[(summary["cmd"], direction)] += index == count - 1
            self.connections.add((capture, record["c"]))
        elif kind == "conn":
            self.connections.add((capture, record["c"]))
        elif kind == "gap":
            self.dropped += record["dropped"]
        elif kind == "fault":
            self.faults[(record["rule"], record["action"])] += 1
        elif kind == "filter":
            key = (record["filter"], record["action"], record.get("reason", ""))
            self.filtered[key] += record.get("n", 1)
        elif kind == "http":
            self.http[(record["kind"], status_class(record["status"]))] += 1
        elif kind == "ws":
            self.websocket[(DIRECTIONS[record["d"]], record["op"])] += 1

    def write(self, out: TextIO) -> None:
        total = sum(self.frames.values())
        out.write(
            f"\n{total} frames on {len(self.connections)} connections in {self.files} file(s)\n"
        )
        for direction in DIRECTIONS.values():
            out.write(f"  {direction}: {self.bytes[direction]} bytes\n")
        out.write("frames by command:\n")
        for (cmd, direction), n in sorted(self.frames.items()):
            out.write(f"  {cmd:<34} {direction:<17} {n}\n")
        for (cmd, direction), n in sorted(self.chunked.items()):
            chunks = self.chunks[(cmd, direction)]
            out.write(f"chunked messages: {n} in {chunks} {cmd} frames ({direction})\n")
        if self.invalid:
            out.write(
                "invalid frames: " + ", ".join(f"{k} {v}" for k, v in self.invalid.items()) + "\n"
            )
        if self.errors:
            out.write(
                "broker errors: " + ", ".join(f"{k} x{v}" for k, v in self.errors.items()) + "\n"
            )
        if self.faults:
            out.write(
                "injected faults: "
                + ", ".join(f"{rule} {action} x{n}" for (rule, action), n in self.faults.items())
                + "\n"
            )
        if self.filtered:
            out.write(
                "messages filters acted on: "
                + ", ".join(
                    f"{name} {action}{f' ({reason})' if reason else ''} x{n}"
                    for (name, action, reason), n in sorted(self.filtered.items())
                )
                + "\n"
            )
        if self.http:
            out.write(
                f"{sum(self.http.values())} HTTP exchanges: "
                + ", ".join(f"{k} {s} {n}" for (k, s), n in sorted(self.http.items()))
                + "\n"
            )
        if self.websocket:
            out.write(
                "WebSocket frames: "
                + ", ".join(f"{d} {op} {n}" for (d, op), n in sorted(self.websocket.items()))
                + "\n"
            )
        if self.dropped:
            out.write(f"NOT RECORDED: {self.dropped} frames (the recorder fell behind)\n")
        for path in self.gone:
            out.write(f"{path}: {GONE}\n")
        for path, n in self.truncated:
            if n == 0:
                out.write(f"{path}: empty, an incomplete record (writer stopped before a flush)\n")
            else:
                out.write(f"{path}: ends with {n} bytes of an incomplete record (writer stopped)\n")


def records(
    paths: list[Path], summary: Summary, target: Path | None = None
) -> Iterator[tuple[str, Record]]:
    """(capture id, record) for every record in the files, in file order. A
    connection's ``conn`` record comes once: the copies that later segments
    of its capture open with (so that each reads on its own) are left out;
    so do the records that an earlier flight-recorder snapshot of the same
    capture held (``Repeats``: overlapping snapshots hold the same ones).
    Several files none of which holds a whole record are a RecordingError
    naming ``target`` (default: their first's directory), once all are read."""
    opened: set[tuple[str, int]] = set()
    repeats = Repeats()
    skipped: list[Unfinished | Gone] = []  # files of no whole record, or removed
    for path in paths:
        result = ReadResult(path)
        capture = ""
        summary.reading = path
        if len(paths) > 1 and _empty(path):
            # A segment whose writer was killed before its first flush:
            # counted, not an error. Alone, it holds no recording: read, it
            # says so (Unfinished), as replay does.
            summary.files += 1
            summary.truncated.append((path, 0))
            skipped.append(Unfinished(f"{path}: empty file, not a Sluice recording", 0))
            continue
        try:
            for record in read_records(path, result):
                if repeats.repeated(record):
                    continue
                kind = record["k"]
                if kind == "header":
                    capture = record["capture"]
                elif kind == "conn":
                    key = (capture, record["c"])
                    if key in opened:
                        continue
                    opened.add(key)
                yield capture, record
        except (Unfinished, Gone) as exc:  # (raised before any record of the file)
            if len(paths) == 1:
                raise
            skipped.append(exc)
            if isinstance(exc, Gone):
                summary.gone.append(path)
            else:
                summary.files += 1
                summary.truncated.append((path, exc.size))
            continue
        summary.files += 1
        if result.truncated_bytes:
            summary.truncated.append((path, result.truncated_bytes))
    if paths and len(skipped) == len(paths):  # (a lone one is refused as it is read)
        raise holds_nothing(target if target is not None else paths[0].parent, skipped)


def _empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False  # read_records says why


def _ids(summary: dict[str, Any]) -> str:
    parts = [f"{key}={summary[key]}" for key in ("rid", "pid", "seq", "cid") if key in summary]
    if "mid" in summary:
        parts.append("mid=" + ":".join(str(x) for x in summary["mid"][:2]))
    if summary.get("msgs", 1) != 1 and "chunk" not in summary:
        parts.append(f"msgs={summary['msgs']}")
    return " ".join(parts)


def timeline_line(record: Record, when: str, conn: str) -> str:
    kind = record["k"]
    if kind == "conn":
        via = f" via={record['via']}" if record.get("via") else ""
        return (
            f"{when}  {conn:<6} open  {record['kind']} client={record['client']}{via} "
            f"broker={record['broker']} ({record['listener']})"
        )
    if kind == "close":
        return f"{when}  {conn:<6} close {record.get('reason', '')}"
    if kind == "gap":
        return f"{when}  !! {record['dropped']} frames were not recorded here"
    if kind == "fault":
        topic = f"  {record['topic']}" if "topic" in record else ""
        return (
            f"{when}  {conn:<6} {ARROWS[record['d']]} FAULT {record['action']} by rule "
            f"{record['rule']} on {record['cmd']}{topic}"
        )
    if kind == "filter":
        topic = f"  {record['topic']}" if "topic" in record else ""
        reason = f" ({record['reason']})" if record.get("reason") else ""
        count = record.get("n", 1)
        messages = f"{count} message{'s' if count != 1 else ''}"
        sent = ""
        if "sent" in record:
            sent = f", sent on as {record['sent']['n']} bytes (received above)"
        return (
            f"{when}  {conn:<6} {ARROWS[record['d']]} FILTER {record['action']} {messages} "
            f"by {record['filter']}{reason}{topic}{sent}"
        )
    if kind in ("trigger", "snapshot"):
        skip = {"k", "t", "w", "c", "rule", "on", "reason", "seconds"}
        facts = " ".join(f"{k}={v}" for k, v in record.items() if k not in skip)
        if kind == "trigger":
            return (f"{when}  {conn:<6} !! SNAPSHOT RULE {record.get('rule', '?')} "
                    f"({record.get('on', '?')}) {facts}")  # fmt: skip
        seconds = record.get("seconds", 0)
        span = f"{seconds:.1f}" if isinstance(seconds, int | float) else "?"
        return (f"{when}  !! SNAPSHOT of {span} s, "
                f"{record.get('reason', '')} {facts}".rstrip())  # fmt: skip
    if kind == "http":
        return http_line(record, when, conn)
    if kind == "ws":
        extras = [f"close {record['close']}"] if "close" in record else []
        if record.get("redacted"):
            extras.append("credentials redacted")
        if "p" in record:
            extras.append("payload not recorded")
        return (
            f"{when}  {conn:<6} {ARROWS[record['d']]} WS {record['op']:<6} {record['n']:>7}B  "
            f"{'  '.join(extras)}"
        ).rstrip()
    if kind == "ws_end":
        return f"{when}  {conn:<6} WebSocket session ended ({record.get('reason', '')})"
    if kind != "frame":
        return f"{when}  {conn:<6} ({kind} record)"  # a kind newer than this reader
    summary = record["s"]
    status = f"INVALID {summary['invalid']}: {summary['why']}" if "invalid" in summary else "ok"
    if "error" in summary:
        status = f"error {summary['error']}"
    extras = []
    if "topic" in summary:
        extras.append(summary["topic"])
    if "chunk" in summary:
        uuid, index, count, total = summary["chunk"]
        extras.append(f"chunk {index + 1}/{count} of message {uuid} ({total}B in all)")
    if "payload" in summary:
        extras.append(f"payload {summary['payload']['size']}B not recorded")
    if summary.get("redacted"):
        extras.append("credentials redacted")
    if "withheld" in summary:
        extras.append(f"bytes not recorded: {summary['withheld']}")
    return (
        f"{when}  {conn:<6} {ARROWS[record['d']]} {summary['cmd']:<30} {_ids(summary):<28} "
        f"{record['n']:>7}B  {status}  {'  '.join(extras)}"
    ).rstrip()


def http_line(record: Record, when: str, conn: str) -> str:
    """An HTTP exchange: the request, the status the client got, how long."""
    took = (record["te"] - record["t"]) / 1e6
    extras = [f"{took:.1f} ms", f"req {_size(record, 'req')}B", f"res {_size(record, 'res')}B"]
    if record.get("hops"):
        extras.append(f"redirected {len(record['hops'])}")
    if "refused" in record:
        extras.append(f"answered by Sluice: {record['refused']}")
    if "ended" in record:
        extras.append(f"ended: {record['ended']}")
    if record.get("redacted"):
        extras.append("credentials redacted")
    status = record["status"] or "no answer"
    return (
        f"{when}  {conn:<6} HTTP {record['method'] or '-'} {record['path'] or '-'} → {status} "
        f"{record['kind']}  {'  '.join(extras)}"
    )


def _size(record: Record, key: str) -> object:
    """The size of an HTTP exchange's request or answer (``?``: a damaged
    record has none)."""
    part = record.get(key)
    return part.get("n", "?") if isinstance(part, dict) else "?"


def status_class(status: int) -> str:
    return f"{status // 100}xx" if status else "none"


def _payload(p: list[Any]) -> dict[str, Any]:
    """A ``p`` (size, digest) as JSON; a damaged one (empty, a digest that
    is no bytes) as far as it goes."""
    digest = p[1] if len(p) > 1 else None
    return {"size": p[0] if p else None,
            **({"sha256": digest.hex()} if isinstance(digest, bytes) else {})}  # fmt: skip


def _message(part: Record, with_bytes: bool) -> dict[str, Any]:
    """An HTTP exchange's request or response as JSON."""
    headers: dict[str, str] = {}
    for pair in part.get("h", ()):
        if isinstance(pair, list | tuple) and len(pair) == 2:  # (a damaged one: left out)
            name, value = str(pair[0]), str(pair[1])
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
    out: dict[str, Any] = {"headers": headers, "size": part.get("n")}
    if isinstance(part.get("raw"), bytes) and with_bytes:
        out["raw"] = base64.b64encode(part["raw"]).decode()
    if isinstance(part.get("p"), list) and part["p"]:
        out["payload"] = _payload(part["p"])
    return out


def json_line(capture: str, record: Record, with_bytes: bool) -> str:
    out: dict[str, Any] = {"capture": capture}
    for key, value in record.items():
        if key in ("req", "res") and record["k"] == "http" and isinstance(value, dict):
            out["request" if key == "req" else "response"] = _message(value, with_bytes)
            continue
        if key == "p" and record["k"] in ("ws", "frame"):  # (a frame's: recorded by name)
            out["payload"] = _payload(value)
            continue
        if record["k"] == "filter" and key in ("n", "sent"):
            if key == "n":
                out["messages"] = value
            else:  # the frame as it went on
                sent = {"size": value["n"]}
                if "p" in value:
                    sent["payload"] = _payload(value["p"])
                if with_bytes and "raw" in value:
                    sent["raw"] = base64.b64encode(value["raw"]).decode()
                out["sent"] = sent
            continue
        if key == "raw" and isinstance(value, bytes):
            if with_bytes:
                out["raw"] = base64.b64encode(value).decode()
            continue
        if key == "s" and isinstance(value, dict):  # (a kind newer than this reader's: as it is)
            out.update(value)
            continue
        out[_LONG_KEYS.get(key, key)] = value
    if record["k"] in ("frame", "ws"):
        out["direction"] = DIRECTIONS[record["d"]]
    if record["k"] == "http":
        out["kind"], out["request_kind"] = "http", record["kind"]
    elif record["k"] == "conn":  # the connection's kind beside the record's
        out["kind"], out["connection_kind"] = "conn", record["kind"]
    try:
        return json.dumps(out, default=str)
    except TypeError:  # a map keyed by bytes (a damaged record, or a kind newer than this reader)
        return json.dumps(_text_keys(out), default=str)


# The keys JSON takes as they are.
_JSON_KEYS = (str, int, float, bool, type(None))


def _text_keys(value: Any) -> Any:
    """``value`` with the keys of its maps that JSON has no place for
    (bytes, msgpack's extension types) written as their values are (``str``)."""
    if isinstance(value, list):
        return [_text_keys(v) for v in value]
    if isinstance(value, dict):
        return {k if isinstance(k, _JSON_KEYS) else str(k): _text_keys(v) for k, v in value.items()}
    return value


_LONG_KEYS = {"k": "kind", "c": "conn", "d": "dir", "t": "mono_ns", "w": "wall_ns", "n": "size",
              "h": "http_conn", "x": "exchange", "ta": "answered_mono_ns", "te": "ended_mono_ns",
              "op": "opcode"}  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if args.with_bytes and not args.json:
        print("sluice inspect: --with-bytes goes with --json", file=sys.stderr)
        return 2
    try:
        # Each capture's files in the order written: what a snapshot repeats
        # of an earlier one's is left out (``records``), not the earlier's.
        paths = in_capture_order(listed(args.recording))
    except RecordingError as exc:
        print(f"sluice inspect: {exc}", file=sys.stderr)
        return 2
    if not paths:
        print(f"sluice inspect: no recordings (*.sluice) in {args.recording}", file=sys.stderr)
        return 2
    if args.since is not None and args.until is not None and args.since > args.until:
        print(f"sluice inspect: --since {args.since:g} is after --until {args.until:g}: "
              "no time is in between", file=sys.stderr)  # fmt: skip
        return 2
    if args.commands:
        problem = _unknown_command(args.commands, paths, args.recording)
        if problem is not None:
            print(f"sluice inspect: argument --command: {problem}", file=sys.stderr)
            return 2
    filters = Filters(
        connections=set(args.connection) if args.connection else None,
        commands={c.upper() for c in args.commands} if args.commands else None,
        topic=args.topic,
        since=args.since,
        until=args.until,
    )
    if args.pcap is not None:
        problem = output_problem(args.pcap, "--pcap", args.recording)
        if problem is not None:
            print(f"sluice inspect: {problem}", file=sys.stderr)
            return 2
    summary = Summary()
    out = sys.stdout
    # Written next to its place and moved there once whole: a capture that
    # turns out damaged leaves no partial file, and any earlier one as it was.
    # What is no regular file (a pipe, /dev/stdout, a device) is written in
    # place: a file moved there would take the place of the device or link.
    in_place = args.pcap is not None and args.pcap.exists() and not args.pcap.is_file()
    partial = args.pcap.with_name(f".{args.pcap.name}.partial") if args.pcap else None
    if in_place:
        partial = args.pcap
    pcap_file = open(partial, "wb", opener=private) if partial is not None else None  # noqa: SIM115
    pcap: _Pcap | None = None
    spec = registry.get(registry.DEFAULT_PROTOCOL)  # the protocol of the file being read
    start_ns: int | None = None
    captures: set[str] = set()
    read = False  # every record
    try:
        for capture, record in records(paths, summary, args.recording):
            if record["k"] == "header":
                captures.add(capture)
                if start_ns is None:
                    start_ns = record["started"]
                spec = registry.get(str(record.get("protocol", registry.DEFAULT_PROTOCOL)))
                if pcap_file is not None and pcap is None:
                    pcap = _Pcap(PcapngWriter(pcap_file, spec.pcap_note), paths)
                if pcap is not None:
                    pcap.header(record, summary.reading, spec)
                continue
            wall = record.get("w", start_ns or 0)
            start = start_ns if start_ns is not None else wall
            offset = (wall - start) / 1e9
            if not filters.keep(record, offset):
                # A capture's connections open and close whatever frames the
                # filters keep: without them the kept frames have no flow.
                if pcap is not None and record["k"] in FLOW_KINDS and filters.keeps_conn(record):
                    pcap.add(capture, record)
                continue
            summary.add(capture, record)
            conn = f"c{record['c']}" if "c" in record else ""
            if "h" in record:  # the HTTP listener's connections
                conn = f"h{record['h']}"
            if len(captures) > 1 and conn:
                conn = f"{capture[:4]}:{conn}"
            if pcap is not None:
                pcap.add(capture, record)
            elif args.json:
                out.write(json_line(capture, record, args.with_bytes) + "\n")
            elif not args.summary:
                when = (
                    dt.datetime.fromtimestamp(wall / 1e9, dt.UTC).isoformat()
                    if args.wall
                    else f"{offset:+12.6f}"
                )
                out.write(timeline_line(record, when, conn) + "\n")
        read = True
    except RecordingError as exc:
        print(f"sluice inspect: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if pcap_file is None:
            raise
        print(f"sluice inspect: --pcap {args.pcap}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        if pcap_file is not None and not read:
            with contextlib.suppress(OSError):  # (what did not go out: said above)
                pcap_file.close()
            if not in_place:
                partial.unlink(missing_ok=True)  # type: ignore[union-attr]
    if pcap_file is not None:
        try:
            pcap_file.close()  # (its last writes may fail only now)
        except OSError as exc:
            if not in_place:
                partial.unlink(missing_ok=True)  # type: ignore[union-attr]
            print(f"sluice inspect: --pcap {args.pcap}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    if partial is not None and pcap is None:  # no capture read: nothing to write
        if not in_place:
            partial.unlink(missing_ok=True)
        print(f"sluice inspect: no recording with a header in {args.recording}: "
              f"{args.pcap} not written", file=sys.stderr)  # fmt: skip
        return 2
    if pcap is not None or args.json:
        for path in summary.gone:
            print(f"sluice inspect: {path}: {GONE}", file=sys.stderr)
    if pcap is not None:
        if not in_place:
            os.replace(partial, args.pcap)  # type: ignore[arg-type]
        if pcap.placeheld:
            named = ", ".join(f"c{conn}" for _, conn in pcap.placeheld[:10])
            more = f" and {len(pcap.placeheld) - 10} more" if len(pcap.placeheld) > 10 else ""
            print(f"sluice inspect: --pcap: {len(pcap.placeheld)} connection(s) opened before "
                  f"the files read, their opening not found in earlier segments of their "
                  f"capture ({named}{more}): their packets have placeholder addresses (client "
                  f"{PLACEHOLDER_HOST}, the recording's broker)", file=sys.stderr)  # fmt: skip
        print(f"wrote {pcap.writer.packets} packets to {args.pcap}", file=sys.stderr)
    elif args.json:
        for path, n in summary.truncated:
            print(
                f"sluice inspect: {path}: incomplete last record ({n} bytes) skipped",
                file=sys.stderr,
            )
    else:
        summary.write(out)
    return 0


# The most names a --command refusal lists; past it, the closest ones.
MAX_LISTED = 20


def _unknown_command(given: list[str], paths: list[Path], target: Path) -> str | None:
    """Why a ``--command`` name can match no frame of the capture (a name no
    command of its protocols has, nor HTTP or WS), as argparse says a bad
    choice; None when each can. Names match in any case; a name the
    protocol does not list that a recorded frame carries (a type its schema
    lacks, a word only the broker judges) is looked for in the capture."""
    specs = _protocols(paths)
    web = list(dict.fromkeys(WEB_KINDS.values()))
    known: set[str] = set(web)
    for spec in specs:
        known |= spec.faults.commands | (spec.counted or frozenset())
    unlisted = {name.upper() for name in given} - known
    if not unlisted:
        return None
    unlisted -= _recorded(paths, unlisted, target)
    bad = next((name for name in given if name.upper() in unlisted), None)
    if bad is None:
        return None
    names = sorted(known - set(web))
    if len(names) + len(web) <= MAX_LISTED:
        return f"invalid choice: {bad!r} (choose from {', '.join([*names, *web])})"
    close = difflib.get_close_matches(bad.upper(), [*names, *web], n=3)
    hint = f"did you mean {' or '.join(close)}?" if close else "--summary lists those it holds"
    titles = " or ".join(spec.title for spec in specs)
    return f"invalid choice: {bad!r} (not a command of {titles}, nor {' or '.join(web)}; {hint})"


def _protocols(paths: list[Path]) -> list[registry.ProtocolSpec]:
    """The protocols the files' headers name (none read: every protocol)."""
    found: dict[str, registry.ProtocolSpec] = {}
    for path in paths:
        try:
            for record in read_records(path, ReadResult(path)):
                if record["k"] == "header":
                    name = str(record.get("protocol", registry.DEFAULT_PROTOCOL))
                    found.setdefault(name, registry.get(name))
                break
        except (RecordingError, ConfigError, OSError):
            continue  # (the reading that follows says why)
    return list(found.values()) or list(registry.protocols().values())


def _recorded(paths: list[Path], names: set[str], target: Path) -> set[str]:
    """Those of ``names`` that a frame of the capture carries."""
    found: set[str] = set()
    try:
        for _, record in records(paths, Summary(), target):
            if record["k"] == "frame" and record["s"].get("cmd") in names:
                found.add(record["s"]["cmd"])
                if found == names:
                    break
    except (RecordingError, OSError):
        pass  # (the reading that follows says why)
    return found


# The client address given a connection whose ``conn`` record is nowhere
# to be found (TEST-NET-1, RFC 5737: no real host); its port is the
# connection id's, so that each is its own conversation.
PLACEHOLDER_HOST = "192.0.2.1"


class _Pcap:
    """What ``--pcap`` writes: each connection a TCP conversation, opened
    by its ``conn`` record. A connection opened before the files read (one
    segment of a capture given alone, its opening in an earlier one) is
    opened by its record in the earlier segments of the same capture beside
    the file, or, failing that, with placeholder addresses (``placeheld``,
    said once): its frames are never left out."""

    def __init__(self, writer: PcapngWriter, paths: list[Path]) -> None:
        self.writer = writer
        self.placeheld: list[tuple[str, int]] = []
        self._reading = set(paths)
        self._opened: set[tuple[str, Any]] = set()
        self._spec = registry.get(registry.DEFAULT_PROTOCOL)
        self._broker = ""  # the upstream broker the file's header names
        self._file: Path | None = None
        self._segment = 1
        # (directory, capture, segment) -> connection id -> its conn record
        self._earlier: dict[tuple[Path, str, int], dict[int, Record]] = {}

    def header(self, record: Record, path: Path | None, spec: registry.ProtocolSpec) -> None:
        self._spec, self._file = spec, path
        self._broker = str(record.get("broker") or "")
        segment = record.get("segment", 1)
        self._segment = segment if isinstance(segment, int) else 1

    def add(self, capture: str, record: Record) -> None:
        kind = record["k"]
        key = (capture, record.get("c"))
        if kind == "conn":
            self._open(key, record)
        elif kind == "frame":
            if key not in self._opened:
                self._open_late(capture, record)
            raw = record.get("raw", b"")
            wire = self._spec.standalone(raw) if self._spec.standalone is not None else raw
            self.writer.data(key, record["d"] == 0, wire, record["w"])
        elif kind == "close":
            self.writer.close(key, record["w"])

    def _open(self, key: tuple[str, Any], record: Record) -> None:
        self._opened.add(key)
        broker = record["broker"] or f"0.0.0.0:{self._spec.default_port}"
        self.writer.open(key, record["client"], broker, record["w"])

    def _open_late(self, capture: str, frame: Record) -> None:
        conn: int = frame["c"]
        found = self._earlier_openings(capture).get(conn)
        if found is not None:
            self._open((capture, conn), {**found, "w": frame["w"]})
            return
        self.placeheld.append((capture, conn))
        client = f"{PLACEHOLDER_HOST}:{1024 + conn % 64000}"
        self._open((capture, conn), {"client": client, "broker": self._broker, "w": frame["w"]})

    def _earlier_openings(self, capture: str) -> dict[int, Record]:
        """The ``conn`` records of the capture's segments before the one
        read now, in its directory and not read here (read once)."""
        if self._file is None:
            return {}
        where = (self._file.parent, capture, self._segment)
        if where in self._earlier:
            return self._earlier[where]
        found: dict[int, Record] = {}
        self._earlier[where] = found
        if self._segment <= 1:
            return found
        for path in sorted(self._file.parent.glob(f"*-{capture}-*.sluice")):
            if path in self._reading:
                continue
            try:
                for record in read_records(path):
                    kind = record["k"]
                    if kind == "header" and (
                        record.get("capture") != capture
                        or not isinstance(record.get("segment"), int)
                        or record["segment"] >= self._segment
                    ):
                        break  # another capture's, or not earlier
                    if kind == "conn":
                        found.setdefault(record["c"], record)
            except (RecordingError, OSError) as exc:
                log.debug("%s: not read for the connections it opened: %s", path, exc)
        return found
