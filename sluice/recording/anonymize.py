"""``sluice record anonymize IN OUT``: a copy of a capture that can leave the
company.

Every record is rewritten with deterministic pseudonyms
(``sluice/protocols/pseudonyms.py``): tenants, namespaces, topics, producer,
subscription and consumer names, roles, message keys, hosts and addresses,
and the message properties chosen by pattern; frames through their
protocol's anonymizer (``ProtocolSpec.anonymize``), the recording's own
fields here (the header's host and addresses, connections' clients and
brokers, the HTTP listener's paths and headers, free text). Payloads are
never kept: a frame's (and an HTTP body's, a WebSocket frame's) is left out
and only its size kept, with its SHA-256 under ``hash``.

The capture is read twice: once to learn every original (free text can only
be scrubbed of originals the table already holds), once to write, no
further than the records the first read found (a live capture grows). The
result is an ordinary recording: ``inspect``, ``view``, ``replay`` and
``serve`` read it.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from sluice.protocols import registry
from sluice.protocols.pseudonyms import Pseudonyms
from sluice.recording.format import (
    SUFFIX,
    Gone,
    PayloadPolicy,
    ReadResult,
    Record,
    RecordingError,
    Unfinished,
    pack,
    read_records,
    recording_files,
)
from sluice.recording.writer import private

# Why a frame's bytes are not kept.
UNPARSED = "anonymized: its bytes did not parse, so none of them could be kept"
# The web API's paths that name a topic, a namespace or a tenant.
_DOMAINS = ("persistent", "non-persistent")
_WS_SUBSCRIBERS = ("consumer", "reader")
# Segments a namespace follows (a function's, source's, sink's: its name after).
_FUNCTIONS = ("functions", "sources", "sinks")
_NAMESPACED = (*_DOMAINS, "namespaces", "namespace", "schemas", "resource-quotas", *_FUNCTIONS)
# The transactions API's segments a topic follows without its domain
# (persistent), and those of them whose topic a subscription follows.
_TRANSACTION_TOPICS = frozenset({
    "transactionInBufferStats", "transactionBufferStats", "transactionBufferInternalStats",
    "transactionInPendingAckStats", "pendingAckStats", "pendingAckInternalStats",
})  # fmt: skip
_PENDING_ACKS = frozenset({"transactionInPendingAckStats", "pendingAckStats",
                           "pendingAckInternalStats"})  # fmt: skip
# Segments the next one of which is a name, and its kind: a role granted
# permissions, a cluster (a broker's address after it under brokers), a
# subscription, a failure domain or isolation policy, a bookie.
_NEXT = {
    "permissions": "role", "clusters": "cluster", "brokers": "cluster",
    "subscription": "subscription", "unsubscribe": "subscription",
    "clearBacklog": "subscription", "failureDomains": "name",
    "namespaceIsolationPolicies": "name", "racks-info": "address",
}  # fmt: skip
# The API's own words where a name could be: never replaced.
_API_WORDS = frozenset({
    "subscription", "builtins", "connectors", "builtinsources", "builtinsinks",
    "reloadBuiltInFunctions", "reloadBuiltInSources", "reloadBuiltInSinks", "configuration",
    "health", "ready", "leaderBroker", "internal-configuration", "runtime", "backlog-quota-check",
    "version", "shutdown", "cluster", "allocator", "brokers",
})  # fmt: skip
# Query keys of the WebSocket API that carry a name, and the kind of it.
_QUERY_NAMES = {"producerName": "producer", "consumerName": "consumer", "readerName": "consumer"}
# Header values that are an address (or a list of them: each replaced;
# Forwarded's elements, "for=...;proto=...", whole).
_ADDRESS_HEADERS = frozenset({
    "host", "x-forwarded-for", "x-forwarded-host", "x-real-ip", "forwarded", "x-client-ip",
    "true-client-ip", "x-cluster-client-ip", "cf-connecting-ip", "fastly-client-ip",
    "x-original-forwarded-for", "x-forwarded-server", "x-original-host", "x-host",
})  # fmt: skip
# Record fields that are codes, never names.
_CODES = frozenset({"k", "cmd", "kind", "action", "on", "op", "error", "method"})
# Labels: the fields of annotations that hold a user's words (a rule's id,
# a filter's name or label, a reason), by record kind; replaced whole.
_LABELS = {
    "trigger": ("rule", "fault"),  # fault: the id of the fault rule that fired it
    "snapshot": ("reason", "rule", "fault"),
    "fault": ("rule",),
    "filter": ("filter", "reason"),
}
# What Sluice writes in them itself, which no user chose and which holds
# no topic, schema or message, kept: a snapshot's reason when asked for
# without one; the ids it gives rules without one (fault rules f1 on
# /faults, file-1 by their place in a --faults file; snapshot rules t1);
# the filters it ships (pyproject.toml's sluice.filters entry points) and
# the name of none ("?"); and a filter record's reasons it gives (a
# refusal's code, as its metrics' reason label; whether a filter that
# raised failed open or closed). A filter's message, which names topics
# and schemas, is never recorded.
_OWN_REASONS = frozenset({"on demand"})
_OWN_IDS = re.compile(r"(?:f|file-|t)[0-9]+")
_OWN_FILTERS = frozenset({"schema", "encrypt", "?"})
_OWN_FILTER_REASONS = frozenset({
    "open", "closed", "filter_error", "too_large", "chunked", "unreadable", "encrypted",
    "undecryptable", "no_schema", "schema_unsupported", "schema_unavailable",
    # sluice.filters.schemas: a payload that does not match its schema
    "not_avro", "trailing_bytes", "not_json", "missing_field", "wrong_type", "not_protobuf",
    "unknown_field", "wrong_size", "not_utf8", "not_key_value",
})  # fmt: skip


# What is kept of payloads: their shape with zeros for contents (a capture
# with payloads), or their size and digest, or their size.
FILLER = "filler"
PAYLOAD_CHOICES = (FILLER, PayloadPolicy.HASH.value, PayloadPolicy.NONE.value)


@dataclass
class Options:
    key: bytes
    payloads: str = FILLER  # one of PAYLOAD_CHOICES
    property_values: tuple[str, ...] = ("*",)
    property_keys: tuple[str, ...] = ()

    @property
    def filler(self) -> bool:
        return self.payloads == FILLER

    @property
    def digest(self) -> bool:
        """Whether a payload left out keeps its SHA-256."""
        return self.payloads != PayloadPolicy.NONE.value


@dataclass
class Report:
    files: int = 0
    records: int = 0
    frames: int = 0
    withheld: int = 0  # frames whose bytes did not parse: none kept
    payloads: int = 0  # payloads (frames, bodies, WebSocket frames) left out
    truncated: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # files left out: no whole record, removed

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "records": self.records,
            "frames": self.frames,
            "frames_withheld": self.withheld,
            "payloads_left_out": self.payloads,
            "truncated": self.truncated,
            "skipped": self.skipped,
        }


class Anonymizer:
    """One capture's records rewritten; ``names`` holds what was replaced."""

    def __init__(self, options: Options, protocol: str) -> None:
        self.options = options
        self.names = Pseudonyms(options.key, options.property_values, options.property_keys)
        spec = registry.get(protocol)
        if spec.anonymize is None:
            raise RecordingError(
                f"{spec.title} captures cannot be anonymized by this Sluice: its frames' "
                "names are not known to it"
            )
        self._frame: Callable[[bytes, Pseudonyms, bool], tuple[bytes, bytes | None] | None]
        self._summary: Callable[[dict[str, Any], Pseudonyms], dict[str, Any]]
        self._frame, self._summary = spec.load(spec.anonymize)
        # What takes the credentials out of an ``http`` record (an older
        # Sluice recorded them as they came) before its names are replaced:
        # the web port's own redaction, which the registry gives.
        self._web_redacted = registry.web_redaction()
        self.report = Report()
        self._filler = False  # this file's payloads kept as shapes (set by its header)

    def record(self, record: Record) -> Record:
        kind = record.get("k")
        self.report.records += 1
        rewrite = _REWRITES.get(str(kind), Anonymizer._other)
        return rewrite(self, dict(record))

    # --- by kind ---------------------------------------------------------------------

    def _header(self, r: Record) -> Record:
        names = self.names
        r["host"] = names.host(r.get("host", ""))
        r["listen"] = [names.address(a) for a in r.get("listen", []) or []]
        r["broker"] = names.url(r.get("broker", ""))
        had = r.get("payloads")
        if had == PayloadPolicy.FULL.value and not self.options.filler:
            r["payloads"] = self.options.payloads
        elif had == PayloadPolicy.HASH.value and not self.options.digest:
            r["payloads"] = PayloadPolicy.NONE.value
        r["anonymized"] = self.options.payloads
        self._filler = self.options.filler and had == PayloadPolicy.FULL.value
        return r

    def _frame_record(self, r: Record) -> Record:
        self.report.frames += 1
        summary = self._summary(r.get("s") or {}, self.names)
        raw = r.get("raw", b"")
        if raw:
            done = self._frame(raw, self.names, self._filler)
            if done is None:
                r["raw"] = b""
                summary["withheld"] = UNPARSED
                summary.pop("payload", None)
                self.report.withheld += 1
            else:
                r["raw"], payload = done
                if payload is not None:
                    summary["payload"] = self._payload_summary(payload)
        if isinstance(summary.get("payload"), dict) and not self.options.digest:
            summary["payload"] = {"size": summary["payload"].get("size", 0)}
        r["s"] = summary
        for key in ("p", "invalid", "why", "redacted"):  # in the summary already
            r.pop(key, None)
        return r

    def _conn(self, r: Record) -> Record:
        names = self.names
        r["client"] = names.address(r.get("client", ""))
        if "via" in r:
            r["via"] = self._typed(r["via"], names.address)
        r["broker"] = names.url(r.get("broker", ""))
        for key in ("producers", "consumers"):
            if isinstance(r.get(key), dict):
                r[key] = {k: self._typed(v, names.topic) for k, v in r[key].items()}
        return self._scrubbed(r, skip=("client", "via", "broker", "producers", "consumers"))

    def _annotation(self, r: Record) -> Record:
        """fault, filter, trigger, snapshot: a topic, free text; rule ids,
        filter names and reasons: pseudonyms (``_labelled``)."""
        if r.get("topic"):
            r["topic"] = self._typed(r["topic"], self.names.topic)
        sent = r.get("sent")
        if isinstance(sent, dict):  # a filter's changed frame, as it went on
            r["sent"] = self._sent(dict(sent))
        labelled = self._labelled(r)
        return self._scrubbed(r, skip=("topic", "sent", *labelled))

    def _labelled(self, r: Record) -> tuple[str, ...]:
        """The labels of an annotation (``_LABELS``): a rule's id (a fault
        rule's, a ``--snapshot-on`` rule's), a snapshot's reason (an admin
        request's, or its rule's id), a filter's name or label and the
        reason it gave: text a user chose, which may name what no field of
        the capture names, so that scrubbing it of the names learned would
        leave those. Each is replaced whole by a ``name-…`` pseudonym, one
        per original wherever it is (a fault rule's id in its fault records
        and in the trigger and snapshot it fired; a rule's id and the reason
        it gave its snapshot), but for what Sluice writes itself
        (``_sluices``). Returns the keys replaced."""
        kind = str(r.get("k"))
        done = []
        for key in _LABELS.get(kind, ()):
            value = r.get(key)
            if isinstance(value, str):
                if not _sluices(kind, key, value):
                    r[key] = self.names.name("name", value)
                done.append(key)
        return tuple(done)

    def _sent(self, sent: Record) -> Record:
        raw = sent.get("raw", b"")
        done = self._frame(raw, self.names, self._filler) if raw else None
        sent["raw"] = done[0] if done is not None else b""
        if raw and done is None:  # as a frame record's: said, and counted
            sent["withheld"] = UNPARSED
            self.report.withheld += 1
        if done is not None and done[1] is not None:
            sent["p"] = self._payload_list(done[1])
        elif isinstance(sent.get("p"), list) and not self.options.digest:
            sent["p"] = sent["p"][:1]
        return sent

    def _http(self, r: Record) -> Record:
        if self._web_redacted is not None:  # credentials first, as today's recorder leaves them out
            r = self._web_redacted(r)
        names = self.names
        r["client"] = names.address(r.get("client", ""))
        r["path"] = self._path(r.get("path", ""))
        if "hops" in r:
            r["hops"] = self._pairs(r["hops"], lambda u, t: [self._url(u), self._path(t)])
        for side in ("req", "res"):
            part = r.get(side)
            if not isinstance(part, dict):
                if part is not None:  # damaged: whatever it holds, as an unknown field's
                    r[side] = self._scrub_value(part, drop_bytes=True)
                continue
            part = dict(part)
            if "h" in part:
                part["h"] = self._pairs(part["h"], lambda n, v: [n, self._header_value(n, v)])
            self._body(part)
            r[side] = part
        if isinstance(r.get("refused"), str):
            r["refused"] = names.scrub(r["refused"])
        return r

    def _ws(self, r: Record) -> Record:
        self._body(r)
        return r

    def _other(self, r: Record) -> Record:
        """Kinds without names (close, gap, ws_end) and kinds this Sluice
        does not know: every string scrubbed, bytes left out."""
        return self._scrubbed(r, skip=(), drop_bytes=True)

    # --- parts -----------------------------------------------------------------------

    def _typed(self, value: Any, rewrite: Callable[[str], str]) -> Any:
        """A string field rewritten by ``rewrite``; one of another type (a
        damaged record: no reader checks these fields) as an unknown field's."""
        if isinstance(value, str):
            return rewrite(value)
        return self._scrub_value(value, drop_bytes=True)

    def _pairs(self, value: Any, rewrite: Callable[[str, str], list[str]]) -> Any:
        """A list of string pairs (headers, redirect hops), each rewritten by
        ``rewrite``; anything of another shape (a damaged record) as an
        unknown field's, so that the copy is still written without it."""
        if not isinstance(value, list):
            return self._scrub_value(value, drop_bytes=True)
        return [
            rewrite(*item)
            if isinstance(item, list | tuple)
            and len(item) == 2
            and all(isinstance(x, str) for x in item)
            else self._scrub_value(item, drop_bytes=True)
            for item in value
        ]

    def _payload_summary(self, payload: bytes) -> dict[str, Any]:
        self.report.payloads += 1
        if not self.options.digest:
            return {"size": len(payload)}
        return {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}

    def _payload_list(self, payload: bytes) -> list[Any]:
        self.report.payloads += 1
        if not self.options.digest:
            return [len(payload)]
        return [len(payload), hashlib.sha256(payload).digest()]

    def _body(self, part: Record) -> None:
        """A body or a WebSocket frame's payload: left out, its size (and
        digest) kept, as ``p``."""
        raw = part.pop("raw", None)
        if isinstance(raw, bytes):
            part["p"] = self._payload_list(raw)
        elif isinstance(part.get("p"), list) and not self.options.digest:
            part["p"] = part["p"][:1]

    def _header_value(self, name: str, value: str) -> str:
        if name.lower() in _ADDRESS_HEADERS:
            return ",".join(self.names.address(v.strip()) for v in value.split(","))
        if name.lower() == "via":
            return ", ".join(self._via(v.strip()) for v in value.split(","))
        if name.lower() in ("location", "referer", "origin"):
            return self._url(value) if "://" in value else self._path(value)
        return self.names.scrub(value)

    def _url(self, url: str) -> str:
        """A URL of the web side: its host replaced (user information, query
        and fragment left out, as ``Pseudonyms.url`` leaves them), its path
        read as a web API path."""
        try:
            parts = urlsplit(url)
        except ValueError:  # not a URL: all of it, as Pseudonyms.url
            return self.names.url(url)
        base = self.names.url(urlunsplit((parts.scheme, parts.netloc, "", "", "")))
        return base + (self._path(parts.path) if parts.path else "")

    def _via(self, element: str) -> str:
        """One of ``Via``'s elements, ``protocol received-by [(comment)]``:
        the intermediary's host replaced, the comment scrubbed."""
        protocol, _, rest = element.partition(" ")
        by, _, comment = rest.strip().partition(" ")
        if not by:
            return self.names.scrub(element)
        return " ".join(filter(None, (protocol, self.names.address(by), self.names.scrub(comment))))

    def _path(self, path: str) -> str:
        """A web API path: the topic, namespace, tenant, subscription, role,
        cluster, broker and function its segments name replaced
        (percent-decoded first, as the broker reads them, so that they take
        the names' pseudonyms in frames; the v1 API's names, with their
        cluster, as v1 topics in frames), and the names a WebSocket session
        goes by in the query; the rest scrubbed."""
        target, sep, query = path.partition("?")
        parts = target.split("/")
        names = self.names
        # The v1 API names a topic property/cluster/namespace/topic (the
        # REST produce API, /topics/..., has no version in its path).
        v1 = "destination" in parts or not ({"v2", "v3"} & set(parts) or parts[1:2] == ["topics"])
        topic_size = 4 if v1 else 3
        i = 0
        while i < len(parts):
            segment = parts[i]
            named = _named(parts, i + 1, topic_size)  # the segments after this one
            after = named[0] if named and named[0] not in _API_WORDS else ""
            in_domain = segment in _DOMAINS or segment in ("schemas", *_TRANSACTION_TOPICS)
            if in_domain and len(named) == topic_size:
                domain = segment if segment in _DOMAINS else _DOMAINS[0]
                topic = names.topic(f"{domain}://{'/'.join(named)}")
                parts[i + 1 : i + 1 + topic_size] = topic.split("://", 1)[1].split("/")
                subscriber = segment in _PENDING_ACKS or (
                    i >= 1 and parts[i - 1] in _WS_SUBSCRIBERS
                )
                at = i + 1 + topic_size
                if subscriber and at < len(parts) and parts[at]:
                    parts[at] = names.name("subscription", unquote(parts[at]))
                i = at
                continue
            if i >= 1 and parts[i - 1] == "packages":  # packages/{type}/{namespace}/{name}
                segment = "functions"  # the type: read on as a function's
            if segment == "namespaces" and named[1:2] == ["antiAffinity"]:
                # namespaces/{cluster}/antiAffinity/{group}: a cluster's group
                parts[i + 1] = names.name("cluster", named[0])
                if len(named) > 2:
                    parts[i + 3] = names.name("name", named[2])
                i += 4
                continue
            if segment in _NAMESPACED and len(named) >= topic_size - 1:
                namespace = names.namespace("/".join(named[: topic_size - 1]))
                parts[i + 1 : i + topic_size] = namespace.split("/")
                i += topic_size
                if segment in _FUNCTIONS and i < len(parts) and parts[i]:
                    parts[i] = names.name("name", unquote(parts[i]))
                    i += 1
                continue
            if segment in (*_NAMESPACED, "tenants", "properties") and after:
                parts[i + 1] = names.name("tenant", after)
                i += 2
                continue
            if segment in _NEXT and after:
                kind = _NEXT[segment]
                parts[i + 1] = (
                    names.address(after) if kind == "address" else names.name(kind, after)
                )
                i += 2
                if segment == "brokers" and i < len(parts) and parts[i]:  # then a broker
                    parts[i] = names.address(unquote(parts[i]))
                    i += 1
                continue
            i += 1
        return names.scrub("/".join(parts)) + (sep + self._query(query) if sep else "")

    def _query(self, query: str) -> str:
        """A web request's query: the producer, consumer and reader names a
        WebSocket session goes by replaced, the rest scrubbed."""
        out = []
        for item in query.split("&"):
            key, eq, value = item.partition("=")
            kind = _QUERY_NAMES.get(key)
            if kind is not None and value:
                out.append(f"{key}{eq}{quote(self.names.name(kind, unquote(value)), safe='')}")
            else:
                out.append(self.names.scrub(item))
        return "&".join(out)

    def _scrubbed(self, r: Record, skip: tuple[str, ...], drop_bytes: bool = False) -> Record:
        for key, value in list(r.items()):
            if key in skip or key in _CODES:
                continue
            r[key] = self._scrub_value(value, drop_bytes)
        return r

    def _scrub_value(self, value: Any, drop_bytes: bool, depth: int = 0) -> Any:
        if isinstance(value, str):
            return self.names.scrub(value)
        if isinstance(value, bytes):
            return b"" if drop_bytes else value
        if isinstance(value, list | dict) and depth >= _MAX_DEPTH:
            # msgpack nests up to 1,024 levels, past Python's recursion
            # limit: no record Sluice writes comes near.
            raise RecordingError(f"a record holds a value nested more than {_MAX_DEPTH} deep")
        if isinstance(value, list):
            return [self._scrub_value(v, drop_bytes, depth + 1) for v in value]
        if isinstance(value, dict):
            return {k: self._scrub_value(v, drop_bytes, depth + 1) for k, v in value.items()}
        return value


# How deep a value in a record may nest for anonymize to read it.
_MAX_DEPTH = 100


def _sluices(kind: str, key: str, value: str) -> bool:
    """Whether an annotation's label (``_LABELS``) is what Sluice writes
    itself, no user's words, kept as it is."""
    if kind == "filter":
        return value in (_OWN_FILTERS if key == "filter" else _OWN_FILTER_REASONS)
    return value in _OWN_REASONS or _OWN_IDS.fullmatch(value) is not None


def _named(parts: list[str], start: int, count: int) -> list[str]:
    """Up to ``count`` path segments from ``start`` on that are not empty,
    percent-decoded: the tenant (cluster), namespace and topic a path may
    name."""
    named: list[str] = []
    for part in parts[start : start + count]:
        if not part:
            break
        named.append(unquote(part))
    return named


_REWRITES: dict[str, Callable[[Anonymizer, Record], Record]] = {
    "header": Anonymizer._header,
    "frame": Anonymizer._frame_record,
    "conn": Anonymizer._conn,
    "fault": Anonymizer._annotation,
    "filter": Anonymizer._annotation,
    "trigger": Anonymizer._annotation,
    "snapshot": Anonymizer._annotation,
    "http": Anonymizer._http,
    "ws": Anonymizer._ws,
}


def anonymize(
    source: Path, out: Path, options: Options, progress: Callable[[str], None] = lambda _: None
) -> tuple[Report, Pseudonyms]:
    """Write an anonymized copy of the capture at ``source`` (a file or a
    directory of them, kept in the same layout) into the new directory
    ``out``. Raises RecordingError (bad input) and OSError (writing)."""
    files = recording_files(source)
    if not files:
        raise RecordingError(f"{source}: no recordings (*.sluice) here")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RecordingError(f"{out}: exists and is not an empty directory")
    if out.resolve().is_relative_to(source.resolve()) and source.is_dir():
        raise RecordingError(f"{out}: inside {source}, which would then hold both")
    found = (_protocol(path, len(files)) for path in files)
    protocols = {protocol for protocol in found if protocol is not None}
    if len(protocols) > 1:
        raise RecordingError(f"{source}: captures of several protocols ({', '.join(protocols)})")
    if not protocols:
        raise RecordingError(f"{source}: no file here holds a whole record")
    anonymizer = Anonymizer(options, protocols.pop())
    targets = []
    relatives = [path.relative_to(source) if source.is_dir() else Path(path.name) for path in files]
    ranks = _ranks(relatives)
    skipped: dict[Path, str] = {}  # files of no whole record, or removed: why
    # What the first read of each file saw: its records are all the second
    # one writes, so that a file still growing (a live capture) never puts a
    # record into the copy whose names were not learned.
    seen: dict[Path, ReadResult] = {}
    anonymizer.names.learning = True  # nothing written yet: free text left as it is
    for n, (path, relative) in enumerate(zip(files, relatives, strict=True), 1):
        progress(f"reading {n}/{len(files)}: {path.name}")  # learn every original first
        targets.append(out / _renamed(relative, anonymizer.names, ranks))
        seen[path] = ReadResult(path)
        try:
            for record in read_records(path, seen[path]):
                anonymizer.record(record)
        except (Unfinished, Gone) as exc:  # (raised before any record of the file)
            if len(files) == 1:
                raise
            skipped[path] = _why_skipped(exc)
    anonymizer.names.learning = False
    anonymizer.report = report = Report(files=len(files) - len(skipped))
    for n, (path, target) in enumerate(zip(files, targets, strict=True), 1):
        progress(f"writing {n}/{len(files)}: {target}")
        result = ReadResult(path)
        # (A generator: closed below, whether or not it was read to its end.)
        records = cast("Generator[Record, None, None]", read_records(path, result))
        try:
            first = next(records, None) if path not in skipped else None
        except (Unfinished, Gone) as exc:  # removed (or cut) since its first read
            if len(files) == 1:
                raise
            skipped[path] = _why_skipped(exc)
            report.files -= 1
        if path in skipped:
            # Named by its copy's name: the report holds no original.
            report.skipped.append(f"{target.relative_to(out)}: {skipped[path]}, left out")
            continue
        learned = seen[path]
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        try:
            with open(partial, "wb", opener=private) as handle:
                every = itertools.chain([first] if first is not None else [], records)
                for record in itertools.islice(every, learned.records):
                    handle.write(pack(anonymizer.record(record)))
        finally:
            records.close()
        os.replace(partial, target)
        left = _left_out(path, learned)
        if left:
            grew = "written since it was first read (a live capture)"
            what = grew if left > learned.truncated_bytes else "an incomplete record"
            report.truncated.append(
                f"{target.relative_to(out)}: its last {left} bytes, {what}, left out"
            )
    return report, anonymizer.names


def _left_out(path: Path, learned: ReadResult) -> int:
    """How many bytes of ``path`` follow the records its first read found
    (``learned``): an unfinished record then, and whatever was appended
    since."""
    try:
        size = path.stat().st_size
    except OSError:  # removed since: what the first read saw is all that is known
        return max(learned.truncated_bytes, 0)
    return max(size - learned.offset, 0)


# The names Sluice gives what it writes: a snapshot's directory (its reason
# as a slug between the time and the id) and a segment's file.
_SNAPSHOT_DIR = re.compile(r"^snapshot-(\d{8}T\d{6})(?:-.*)?-([0-9a-f]{6}|[0-9a-f]{12})$")
_SEGMENT_FILE = re.compile(r"^sluice-\d{8}T\d{6}-[0-9a-f]{12}(?:-\d+)+" + re.escape(SUFFIX) + "$")


def _ranks(relatives: list[Path]) -> dict[tuple[str, ...], str]:
    """Each path's (and each directory's above it) place among the names
    beside it, as a number of one width per directory: readers take a
    capture's files in name order, which the pseudonyms of names an owner
    chose (``incident-1.sluice``, ``incident-2.sluice``) would not keep."""
    siblings: dict[tuple[str, ...], set[str]] = {}
    for relative in relatives:
        for n, part in enumerate(relative.parts):
            siblings.setdefault(relative.parts[:n], set()).add(part)
    ranks: dict[tuple[str, ...], str] = {}
    for parent, names in siblings.items():
        width = len(str(len(names)))
        for n, name in enumerate(sorted(names), 1):
            ranks[(*parent, name)] = f"{n:0{width}d}"
    return ranks


def _renamed(relative: Path, names: Pseudonyms, ranks: dict[tuple[str, ...], str]) -> Path:
    """A recording's path below the capture, as the copy has it: a
    snapshot's directory without its reason, Sluice's file names as they
    are, any other name (its owner's choice: a customer, an incident) a
    pseudonym after its place among the names beside it (``ranks``), so
    that the copy's files are read in the order the capture's are."""
    parts = []
    for n, part in enumerate(relative.parts):
        last = n == len(relative.parts) - 1
        snapshot = _SNAPSHOT_DIR.match(part)
        if snapshot and not last:
            parts.append(f"snapshot-{snapshot.group(1)}-{snapshot.group(2)}")
        elif last and _SEGMENT_FILE.match(part):
            parts.append(part)
        else:
            stem = part[: -len(SUFFIX)] if last and part.endswith(SUFFIX) else part
            rank = ranks[relative.parts[: n + 1]]
            parts.append(f"{rank}-{names.name('name', stem)}" + (SUFFIX if last else ""))
    return Path(*parts)


def _protocol(path: Path, files: int) -> str | None:
    """The protocol a file's header names; None for a file of no whole
    record (or one removed) among others, which is left out."""
    try:
        for record in read_records(path):
            return str(record.get("protocol", registry.DEFAULT_PROTOCOL))
    except (Unfinished, Gone):
        if files == 1:
            raise
        return None
    return registry.DEFAULT_PROTOCOL


def _why_skipped(exc: Unfinished | Gone) -> str:
    """Why a file is left out, without its name (the report's lines name
    the copy's)."""
    if isinstance(exc, Gone):
        return "removed while the capture was read"
    return "no whole record yet (a segment just opened, or one cut inside its header)"


def originals_in(data: bytes, originals: list[str]) -> list[str]:
    """Which of ``originals`` occur in ``data`` (a check, for the report)."""
    text = data.decode("utf-8", errors="replace")
    return [o for o in originals if len(o) >= 3 and re.search(re.escape(o), text)]
